"""What the README promises about durability costs, counted: one fsync per append."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from objstore import Store


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every fsync the process makes, files and directories alike, while the test runs."""
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    yield calls


def test_an_append_costs_one_fsync(tmp_path: Path, fsyncs: list[int]) -> None:
    with Store.open(tmp_path / "store") as store:
        sid = store.new_session(title="counted")
        store.append(sid, {"role": "user", "content": "the first takes the lock, makes a pack"})
        for i in range(40):  # spans every 16th, new states now and then
            fsyncs.clear()
            state = {"i": i} if i % 7 == 0 else None
            store.append(sid, {"role": "user", "content": f"message {i}"}, state=state)
            assert len(fsyncs) == 1, f"append {i} made {len(fsyncs)} fsyncs"
        fsyncs.clear()
        store.compact(sid, "the story so far", keep=2)
        assert len(fsyncs) == 1


def test_a_batch_syncs_at_its_end_whatever_it_holds(tmp_path: Path, fsyncs: list[int]) -> None:
    with Store.open(tmp_path / "store") as store:
        sid = store.new_session()
        store.append(sid, {"role": "user", "content": "first"})
        counts = []
        for size in (10, 100):
            fsyncs.clear()
            with store.batch():
                for i in range(size):
                    store.append(sid, {"role": "user", "content": f"bulk {size} {i}"})
                assert fsyncs == []
            counts.append(len(fsyncs))
        # the pack, then the new ref file, the ref, its reflog and their directories
        assert counts[0] == counts[1] <= 8
