"""``ags serve`` as a real process on a free loopback port, and the system Chromium.

A test that needs the browser skips when Chromium cannot start, unless
``AGS_REQUIRE_BROWSER=1`` (which .ci/run sets): then it fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("AGS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Server:
    url: str  # the address printed at start: http://127.0.0.1:PORT/ (with ?token=...)
    proc: subprocess.Popen[str]
    stderr: list[str]

    @property
    def base(self) -> str:
        return self.url.split("?", 1)[0].rstrip("/")

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])


@contextmanager
def ags_serve(store: Path, *args: str) -> Iterator[Server]:
    """Start ``ags --store STORE serve --port 0 ARGS`` and wait until it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "--store", str(store), "serve", "--port", "0", *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    url = None
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        found = re.search(r" at (http://\S+)", line)
        if found:
            url = found.group(1)
            break
    if url is None:
        proc.wait(10)
        raise AssertionError("ags serve did not start: " + "".join(lines))
    # Keep reading stderr so the server never blocks on a full pipe.
    threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True).start()
    try:
        yield Server(url, proc, lines)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _unavailable(why: str) -> None:
    if os.environ.get("AGS_REQUIRE_BROWSER") == "1":
        pytest.fail(f"AGS_REQUIRE_BROWSER=1 but Chromium cannot run: {why}")
    pytest.skip(f"no Chromium: {why}")


@contextmanager
def chromium() -> Iterator[Any]:
    """The system Chromium driven by Playwright (whose own browser downloads cannot
    work here)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        _unavailable(str(e))
    if not os.path.exists(CHROMIUM):
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as e:  # Playwright raises its own Error for a browser that fails
            _unavailable(str(e).splitlines()[0])
        try:
            yield browser
        finally:
            browser.close()
