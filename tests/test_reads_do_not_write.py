"""A read never writes: recovery of what a crash or damage left happens when a store
is opened (FORMAT.md 5.2, 5.3), never inside a lookup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tree_snapshot

from objstore import ObjectMissing, Store

DIE_AFTER_APPEND = """
import os, sys
from objstore import Store
s = Store.open(sys.argv[1])
s.append(sys.argv[2], {"role": "user", "content": "written by a writer that died"})
os._exit(0)  # no close: the pack stays unsealed, as after kill -9
"""


def packs(path: Path, suffix: str) -> list[Path]:
    return sorted((path / "objects" / "pack").glob(f"*{suffix}"))


def test_a_handle_reads_a_crashed_writers_pack_without_recovering_it(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
    reader = Store.open(path)
    try:
        subprocess.run([sys.executable, "-c", DIE_AFTER_APPEND, str(path), sid], check=True)
        assert len(packs(path, ".pack")) == 1 and packs(path, ".idx") == []
        before = tree_snapshot(path)
        with pytest.raises(ObjectMissing):
            reader.node("0" * 64)  # a miss looks at the packs again
        context = reader.context(sid)  # the crashed pack's objects are read where they are
        assert context == [{"role": "user", "content": "written by a writer that died"}]
        assert tree_snapshot(path) == before, "a read wrote to the store"
    finally:
        reader.close()
    with Store.open(path) as s:  # opening is where recovery happens
        assert len(packs(path, ".idx")) == 1
        assert s.context(sid) == context


def test_a_damaged_index_is_read_around_by_a_handle_and_rebuilt_by_the_next_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": "in a sealed pack"})
    reader = Store.open(path)
    try:
        (index,) = packs(path, ".idx")
        index.write_bytes(index.read_bytes()[:100])  # truncated, after the reader mapped it
        reader.close()  # forget the mapping: the next look meets the damage
        before = tree_snapshot(path)
        with pytest.warns(UserWarning, match="reading its pack instead"):
            assert reader.context(sid) == [{"role": "user", "content": "in a sealed pack"}]
        assert tree_snapshot(path) == before, "a read rebuilt the index"
    finally:
        reader.close()
    with pytest.warns(UserWarning, match="rebuilt it from the pack"), Store.open(path) as s:
        assert s.context(sid) == [{"role": "user", "content": "in a sealed pack"}]
    assert len(index.read_bytes()) > 100
