"""A real terminal for tests: a tmux server of the test's own (its own socket),
one pane running a command, keys typed with ``send-keys`` and the screen read
with ``capture-pane``, as a person would type and see.

``pipe-pane`` records every byte the program wrote to the terminal, so a test
can also count what drawing the screen cost.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest


class Tmux:
    """One tmux pane ``width`` x ``height`` running ``command``."""

    def __init__(
        self,
        workdir: Path,
        command: list[str],
        env: dict[str, str],
        cwd: Path,
        width: int = 100,
        height: int = 30,
    ) -> None:
        if shutil.which("tmux") is None or shutil.which("less") is None:
            if os.environ.get("AGS_REQUIRE_TMUX") == "1":
                pytest.fail("tmux and less are required (AGS_REQUIRE_TMUX=1)")
            pytest.skip("tmux or less is not installed (apt-get install tmux less)")
        self.socket = workdir / "tmux.sock"
        self.record = workdir / "terminal.bytes"
        self.status = workdir / "exit-status"
        config = workdir / "tmux.conf"
        # The pane stays when the program ends, so its last screen can be read.
        config.write_text("set -g remain-on-exit on\nset -g history-limit 50000\n")
        env = {**env, "TERM": "xterm-256color", "PYTHONFAULTHANDLER": "1"}
        env.pop("TMUX", None)
        # A shell around the command writes its exit status. Ctrl-C reaches the
        # whole foreground group, that shell too: it traps SIGINT (a handler,
        # so the command still gets the default) to outlive the command.
        script = f'trap true INT; "$@"; echo $? > {shlex.quote(str(self.status))}'
        self._tmux(
            "-f", str(config), "new-session", "-d", "-x", str(width), "-y", str(height),
            "-c", str(cwd), shlex.join(["sh", "-c", script, "sh", *command]), env=env,
        )  # fmt: skip
        self._tmux("pipe-pane", "-o", f"cat >> {shlex.quote(str(self.record))}")

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            ["tmux", "-S", str(self.socket), *args],
            env=env, capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return done.stdout

    def send(self, *keys: str) -> None:
        """Type ``keys``: tmux key names (``Enter``, ``C-c``, ``Tab``) or text."""
        self._tmux("send-keys", *keys)

    def type(self, text: str) -> None:
        """Type ``text`` literally (no key names)."""
        self._tmux("send-keys", "-l", text)

    def screen(self, *, colours: bool = False) -> str:
        """What the screen shows now."""
        return self._tmux("capture-pane", "-p", *(["-e"] if colours else []))

    def scrollback(self) -> str:
        """All the pane has shown: the lines scrolled off the top, then the screen."""
        return self._tmux("capture-pane", "-p", "-S", "-")

    def wait_for(
        self, what: str | Callable[[str], bool], timeout: float = 60, *, whole: bool = False
    ) -> str:
        """Wait until the screen (``whole``: the scrollback too) shows ``what`` (a
        text, or a test of the text); return it."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.scrollback() if whole else self.screen()
            if what(text) if callable(what) else what in text:
                return text
            if time.monotonic() > deadline:
                pytest.fail(f"the terminal never showed {what!r}; it shows:\n{text}")
            time.sleep(0.1)

    def exit_status(self, timeout: float = 120) -> int:
        """The program's exit status, once it has ended."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(FileNotFoundError, ValueError):
                return int(self.status.read_text())
            if time.monotonic() > deadline:
                self._dump_stacks()
                pytest.fail(f"the program did not end; the screen:\n{self.scrollback()[-6000:]}")
            time.sleep(0.1)

    def _dump_stacks(self) -> None:
        """Have a Python program that hangs print where each thread is (with
        PYTHONFAULTHANDLER set, SIGABRT makes it dump them on the terminal)."""
        shell = self._tmux("display-message", "-p", "#{pane_pid}").strip()
        found = subprocess.run(["pgrep", "-P", shell], capture_output=True, text=True)
        for pid in found.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGABRT)
        time.sleep(1)

    def written(self) -> int:
        """Bytes the program has written to the terminal so far."""
        return self.record.stat().st_size if self.record.exists() else 0

    def close(self) -> None:
        subprocess.run(
            ["tmux", "-S", str(self.socket), "kill-server"], capture_output=True, timeout=30
        )
