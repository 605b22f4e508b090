"""A store written by the ags of store format 1 (tests/fixtures/format1, made by the
code before format 2 with tests/fixtures/format1/make_fixture.py) stays readable,
takes new writes, and its export still imports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_reads_as_expected, copy_fixture_store

from objstore import Store, check_store, import_document, read_document

FIXTURE = Path(__file__).parent / "fixtures" / "format1"


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    return copy_fixture_store(FIXTURE / "store", tmp_path / "store")


def expected() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURE / "format1-expected.json").read_text())
    return data


def test_a_format_1_store_reads_as_it_did(old_store: Path) -> None:
    assert_reads_as_expected(old_store, expected())


def test_a_format_1_store_takes_new_writes_and_becomes_version_6(old_store: Path) -> None:
    want = expected()
    marker = old_store / "ags-store.json"
    assert json.loads(marker.read_bytes())["version"] == 1
    sid = next(sid for sid in want if not sid.startswith("_") and want[sid]["title"] == "a fork")
    with Store.open(old_store) as s:
        s.append(sid, {"role": "user", "content": "written by this ags"})
        s.compact(sid, "summary by this ags", keep=1)
        fork = s.fork(sid)
    # its first append kept the head in a pack's journal (FORMAT.md 9), and its
    # first block pack holds what format 1 cannot read (blocks in the MessagePack
    # layout, FORMAT.md 5.5): the marker rose, so an ags of an older format refuses the
    # store cleanly
    assert json.loads(marker.read_bytes()) == {"format": "ags-store", "version": 6}
    assert len(list((old_store / "objects" / "pack").glob("*.pack"))) == 3
    with Store.open(old_store) as s:
        assert s.context(sid)[0]["content"] == "summary by this ags"
        assert s.context(fork) == s.context(sid)
        assert [e.message for e in s.log(sid)][2:] == want[sid]["log"]
        assert check_store(s).problems == []


def test_an_export_of_format_1_still_imports(tmp_path: Path) -> None:
    with (FIXTURE / "format1-export.json").open("rb") as f:
        doc = read_document(f)
    with Store.open(tmp_path / "store") as s:
        result = import_document(s, doc)
        assert result.action == "created"
        assert [e.message for e in s.log(result.session or "")] == expected()[doc["session"]["id"]][
            "log"
        ]
