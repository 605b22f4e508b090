"""A failed fsync of the pack being written (EIO from a failing disk): what was written
since the last good fsync is of unknown durability, and a second fsync cannot tell
(Linux reports a writeback error once and marks the pages clean). So every append
that fsync was to cover fails, the pack is cut back to what was durable, and the
next append starts a new pack from the heads that were durable: an append that
raised is not in the store, one that returned is, and no history has a hole."""

from __future__ import annotations

import errno
import random
import string
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from appending_threads import append_in_threads

from objstore import Store, packs
from objstore.fsck import check_store


@pytest.fixture
def failing_fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[int]]:
    """The numbers (1, 2, ...) of the fsyncs of packs being written to fail with EIO,
    from now on (a block pack's, a seal's, are not counted)."""
    fail: set[int] = set()
    count = [0]
    lock = threading.Lock()
    real = packs.PackWriter._fsync_now

    def fsync_now(self: packs.PackWriter) -> None:
        if isinstance(self, packs.BlockPackWriter):
            return real(self)
        with lock:
            count[0] += 1
            failing = count[0] in fail
        if failing:
            raise OSError(errno.EIO, "Input/output error")
        real(self)

    monkeypatch.setattr(packs.PackWriter, "_fsync_now", fsync_now)
    yield fail


def _packed_bytes(store: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (store / "objects" / "pack").iterdir())


def test_an_append_whose_fsync_failed_is_cut_and_the_next_starts_from_the_last_durable(
    tmp_path: Path, failing_fsyncs: set[int]
) -> None:
    with Store.open(tmp_path / "s") as store:
        sid = store.new_session()
        first = store.append(sid, {"role": "user", "content": "first message"})
        second = store.append(sid, {"role": "assistant", "content": "second message"})
        failing_fsyncs.add(3)
        with pytest.raises(OSError) as failed:
            store.append(sid, {"role": "user", "content": "third message"})
        assert failed.value.errno == errno.EIO
        fourth = store.append(sid, {"role": "user", "content": "fourth message"})
        assert b"third message" not in _packed_bytes(tmp_path / "s")  # cut from its pack
        assert store.node(fourth).parent == second
        assert [e.id for e in store.log(sid)] == [fourth, second, first]
    with Store.open(tmp_path / "s") as store:
        assert [e.message["content"] for e in store.log(sid)][::-1] == [
            "first message", "second message", "fourth message"
        ]  # fmt: skip
        assert store.session(sid).messages == 3
    with Store.open(tmp_path / "s") as store:
        assert check_store(store).ok


def test_threads_whose_fsync_failed_fail_and_the_others_are_all_there(
    tmp_path: Path, failing_fsyncs: set[int]
) -> None:
    with Store.open(tmp_path / "s") as store:
        sids = [store.new_session(title=f"thread {t}") for t in range(8)]
        # 240 appends in groups of at most eight threads: at least 30 fsyncs.
        failing_fsyncs.update({12, 25})
        acknowledged, failed = append_in_threads(store, sids, 30, errno.EIO)
        assert sum(failed) >= 2
    with Store.open(tmp_path / "s") as store:
        for t in range(8):
            assert len(acknowledged[t]) + failed[t] == 30
            assert [e.id for e in store.log(sids[t])][::-1] == acknowledged[t]
    with Store.open(tmp_path / "s") as store:
        assert check_store(store).ok


def test_a_failed_fsync_of_the_pack_being_sealed_is_made_good_by_its_seal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fsync that fails is of a full pack being sealed beside the writer, whose last
    records the append going on relies on: the seal writes the block pack from what
    the handle holds first, and the append returns once that is durable."""
    real = packs.PackWriter._fsync_now
    failed: list[str] = []

    def fsync_now(self: packs.PackWriter) -> None:
        if self._copy is not None and not failed:  # the first of a pack being sealed
            failed.append(self.name)
            raise OSError(errno.EIO, "Input/output error")
        real(self)

    monkeypatch.setattr(packs.PackWriter, "_fsync_now", fsync_now)
    rng = random.Random(5)
    with Store.open(tmp_path / "s") as store:
        sid = store.new_session()
        nodes = []
        while not failed and len(nodes) < 400:
            text = "".join(rng.choices(string.ascii_letters, k=20_000))
            nodes.append(store.append(sid, {"role": "user", "content": text}))
        assert failed, "no pack was sealed"
        nodes += [store.append(sid, {"role": "user", "content": f"after {i}"}) for i in range(3)]
        assert [e.id for e in store.log(sid)][::-1] == nodes
    with Store.open(tmp_path / "s") as store:
        assert [e.id for e in store.log(sid)][::-1] == nodes
        assert not (tmp_path / "s" / "objects" / "pack" / f"{failed[0]}.pack").exists()
        assert check_store(store).ok


def test_an_append_relying_on_another_writers_pack_that_cannot_be_synced_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append that finds its message in another writer's unsealed pack relies on it
    (no second copy): that pack is synced before the append's records are written.
    Synced after, a failure left them in the file, for another fsync to make durable
    without the message they name."""
    shared = {"role": "user", "content": "the same message, written by both"}
    with Store.open(tmp_path / "s") as first, Store.open(tmp_path / "s") as second:
        a = first.new_session()
        first.append(a, shared)  # in first's pack, unsealed while first is open
        b = second.new_session()
        kept = second.append(b, {"role": "user", "content": "before"})

        def failing_sync(self: packs.OpenPack) -> None:
            raise OSError(errno.EIO, "Input/output error")

        with monkeypatch.context() as patch:
            patch.setattr(packs.OpenPack, "sync", failing_sync)
            with pytest.raises(OSError):
                second.append(b, shared)
        after = second.append(b, {"role": "user", "content": "after"})
        assert [e.id for e in second.log(b)][::-1] == [kept, after]
        assert second.node(after).parent == kept
    with Store.open(tmp_path / "s") as store:
        assert [e.message["content"] for e in store.log(b)][::-1] == ["before", "after"]
        assert check_store(store).ok
