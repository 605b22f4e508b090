"""The benchmark runs end to end in quick mode and reports a number for every row."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest

from bench import peers
from bench.__main__ import main

ROWS = {
    "append_rate",
    "resume_after",
    "resume_mid-cycle",
    "resume_before",
    "fork_time",
    "fork_bytes",
    "tree_bytes",
    "listing",
    "search_cold",
    "search",
    "import_time",
    "reimport_time",
    "import_bytes",
    "web_list",
    "web_transcript_first",
    "web_transcript",
    "session_bytes",
    "resume_uncompacted",
    "live_reader",
    "closed_reader",
    "threads_8",
    "push_all",
    "push_all_requests",
    "push_all_bytes",
    "clone_all",
    "clone_all_bytes",
    "push_one",
    "push_one_requests",
    "push_one_bytes",
    "push_fork",
    "push_fork_requests",
    "push_fork_bytes",
}


def test_quick_run_reports_every_row_with_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--json", "--no-peers"]) == 0

    report = json.loads(capsys.readouterr().out)
    rows = {row["key"]: row for row in report["rows"]}
    assert set(rows) == ROWS
    for row in rows.values():
        for field in ("ags", "jsonl", "ratio"):
            value = row[field]
            assert isinstance(value, int | float) and math.isfinite(value) and value > 0, row
        assert row["status"] in {"PASS", "FAIL", "-"}
    assert report["quick"] is True
    assert report["machine"]["cores"] >= 1


def test_peers_that_cannot_be_installed_are_dashes_and_a_note(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No uv on PATH and no environment made before: the bench says so and goes on."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    try:
        assert main(["--quick", "--json", "--only", "session_bytes"]) == 0
    finally:
        peers.reset()  # nothing of this run's environment stays for another
    report = json.loads(capsys.readouterr().out)
    (row,) = report["rows"]
    assert row["peers"] == {"zettcode": None, "langgraph": None}
    assert row["ags"] > 0 and row["jsonl"] > 0
    why = "uv is not on PATH, so the peers could not be installed"
    assert any(why in note for note in report["notes"])
    assert not (tmp_path / "cache" / "ags-bench" / "peers-venv").exists()


def test_dir_runs_the_scenarios_under_it_and_names_its_file_system(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--quick", "--json", "--no-peers", "--only", "durable_appends", "--dir", str(tmp_path)]
    assert main(args) == 0

    report = json.loads(capsys.readouterr().out)
    assert report["machine"]["tempdir"] == str(tmp_path.resolve())
    assert report["machine"]["filesystem"] not in {"", "unknown"}
    assert [row["key"] for row in report["rows"]] == ["append_rate"]
    assert list(tmp_path.iterdir()) == []  # each scenario's directory removed after it
    assert tempfile.gettempdir() != str(tmp_path.resolve())  # set back after the run


def test_dir_that_is_not_a_directory_is_a_one_line_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--quick", "--dir", str(tmp_path / "missing")])
    assert exited.value.code == 2
    assert "not a directory" in capsys.readouterr().err
