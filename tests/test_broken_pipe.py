"""A reader that stops early (``ags show X | head``) ends ags quietly, as it ends git."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from objstore import Store

AGS = str(Path(sys.executable).with_name("ags"))


def test_a_reader_that_leaves_early_gets_no_error_message(tmp_path: Path) -> None:
    store_path = tmp_path / "store"
    with Store.open(store_path) as s:
        sid = s.new_session(title="long")
        s.append(sid, {"role": "user", "content": "a line\n" * 50_000})  # far past a pipe buffer
    env = {**os.environ, "AGS_STORE": str(store_path)}
    for command in (f"show {sid}", f"log {sid}"):
        proc = subprocess.run(
            f"{AGS} {command} | head -c 1; echo ags=${{PIPESTATUS[0]}} >&2",
            shell=True, executable="/bin/bash", env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert proc.stderr.strip() == "ags=141", (command, proc.stderr)  # as git: 128 + SIGPIPE
        assert len(proc.stdout) == 1
