"""The ``ags`` command line as it stands: listing, JSON output, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from cli.main import cli
from objstore import Store

AGS = str(Path(sys.executable).with_name("ags"))  # the console script uv installed


def make_store(path: Path) -> tuple[str, str]:
    with Store.open(path) as s:
        a = s.new_session(title="alpha", root="/src/a")
        s.append(a, {"role": "user", "content": "hi"})
        b = s.new_session(title="beta")
        s.archive(b)
    return a, b


def test_sessions_lists_and_hides_archived(tmp_path):
    a, b = make_store(tmp_path / "store")
    runner = CliRunner()
    result = runner.invoke(cli, ["--store", str(tmp_path / "store"), "sessions"])
    assert result.exit_code == 0, result.output
    assert a[:12] in result.output and "alpha" in result.output
    assert b[:12] not in result.output
    result = runner.invoke(cli, ["--store", str(tmp_path / "store"), "sessions", "--all", "--json"])
    rows = json.loads(result.output)
    assert {r["id"] for r in rows} == {a, b}
    assert next(r for r in rows if r["id"] == a)["messages"] == 1


def test_store_comes_from_the_environment(tmp_path):
    a, _ = make_store(tmp_path / "store")
    result = CliRunner().invoke(cli, ["sessions"], env={"AGS_STORE": str(tmp_path / "store")})
    assert a[:12] in result.output


def test_errors_are_one_line_without_traceback(tmp_path):
    not_a_store = tmp_path / "mine"
    not_a_store.mkdir()
    (not_a_store / "notes.txt").write_text("keep me")
    proc = subprocess.run(
        [AGS, "--store", str(not_a_store), "sessions"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("ags: ") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in not_a_store.iterdir()) == ["notes.txt"]
