"""A child process killed with SIGKILL at a random moment while it works: what it
printed before the kill (its acknowledgements, a line each)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time


def _read_lines(child: subprocess.Popen[str], into: list[str]) -> None:
    into.extend(child.stdout or [])


def children_of(pid: int) -> list[int]:
    """The pids of the processes whose parent is ``pid``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _stat(int(entry.name))[1] == pid:
            found.append(int(entry.name))
    return found


def until_gone(pids: list[int]) -> None:
    """Wait until none of ``pids`` runs (a zombie no parent reaps has ended too)."""
    deadline = time.monotonic() + 10
    while any(_stat(pid)[0] not in ("", "Z") for pid in pids):
        assert time.monotonic() < deadline, f"processes {pids} outlived their parent"
        time.sleep(0.01)


def _stat(pid: int) -> tuple[str, int]:
    """A process's state letter and parent pid ("" and 0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return "", 0
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command, in (), may hold spaces
    return fields[0].decode(), int(fields[1])


def run_and_kill(
    script: str, args: list[str], rng: random.Random, *, after: int, within: float
) -> list[str]:
    """Run ``python -c script args``; once it has printed ``after`` lines, wait a random
    time of up to ``within`` seconds and SIGKILL it. Its whole lines (a line torn by the
    kill was never acknowledged)."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(child, lines), daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while len(lines) < after and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.poll() is None, child.stderr.read() if child.stderr else ""
    time.sleep(rng.uniform(0.0, within))
    helpers = children_of(child.pid)  # a seal helper (objstore/seal_helper.py) it started
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    until_gone(helpers)  # they end by themselves once their process is: before any open
    reader.join(30)
    if child.stderr is not None:
        child.stderr.close()
    return [line for line in lines if line.endswith("\n")]
