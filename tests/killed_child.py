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
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    reader.join(30)
    if child.stderr is not None:
        child.stderr.close()
    return [line for line in lines if line.endswith("\n")]
