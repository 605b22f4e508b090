"""A store written by the ags of store format 5 (tests/fixtures/format5, made by the
code before format 6 with tests/fixtures/format5/make_fixture.py), whose blocks of
messages are in the array layout, stays readable, takes new writes, whose blocks of
messages are in the MessagePack layout (FORMAT.md 5.5), and then reads the same to
ags and to a second reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import second_reader
from conftest import assert_reads_as_expected, copy_fixture_store
from test_array_blocks import blocks

from objstore import Store, check_store
from objstore.pack_format import ARRAY_MARK, PACKED_MARK, array_table

FIXTURE = Path(__file__).parent / "fixtures" / "format5"


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    return copy_fixture_store(FIXTURE / "store", tmp_path / "store")


def expected() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURE / "format5-expected.json").read_text())
    return data


def blob_layouts(path: Path) -> set[bytes]:
    """The marks of the blocks of blobs in the array and MessagePack layouts."""
    return {
        content[:32]
        for _, _, content in blocks(path)
        if content[:32] in (ARRAY_MARK, PACKED_MARK) and array_table(content).kind == b"blob\0"
    }


def test_a_format_5_store_reads_as_it_did(old_store: Path) -> None:
    assert blob_layouts(old_store) == {ARRAY_MARK}
    assert_reads_as_expected(old_store, expected())


def test_a_format_5_store_takes_new_writes_and_becomes_version_6(old_store: Path) -> None:
    want = expected()
    marker = old_store / "ags-store.json"
    assert json.loads(marker.read_bytes())["version"] == 5
    sid = next(sid for sid in want if not sid.startswith("_") and want[sid]["title"] == "a fork")
    written = [
        {"role": "user", "content": f"written by this ags {i} " + "y" * i, "n": i / 4}
        for i in range(60)
    ]  # floats too: their bodies are written by the json module, not orjson
    with Store.open(old_store) as s:
        for message in written:
            s.append(sid, message)
        fork = s.fork(sid)
    # Its first block pack may hold blocks in the MessagePack layout, which an ags of
    # format 5 would take for damage: the marker rose first.
    assert json.loads(marker.read_bytes()) == {"format": "ags-store", "version": 6}
    assert blob_layouts(old_store) == {ARRAY_MARK, PACKED_MARK}
    with Store.open(old_store) as s:
        assert s.context(sid) == want[sid]["context"] + written
        assert s.context(fork) == s.context(sid)
        assert [e.message for e in s.log(sid)][60:] == want[sid]["log"]
        assert check_store(s).problems == []
    other = second_reader.Store.read(old_store)
    head = other.sessions()[sid]["target"]
    assert other.context(head) == want[sid]["context"] + written
