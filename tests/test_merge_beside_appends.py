"""A writer merges its store's small sealed packs while it appends, so a long-running
writer keeps few packs (each holds two file descriptors: one that never merged died
of EMFILE after ~250,000 appends under the usual limit of 1,024 open files)."""

from __future__ import annotations

import random
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from killed_child import run_and_kill

from objstore import Store, object_store, seal_helper
from objstore.errors import StoreWarning
from objstore.files import FileLock
from objstore.fsck import check_store


def pack_files(path: Path) -> list[Path]:
    return sorted((path / "objects" / "pack").glob("*.idx"))


def append_many(store: Store, sids: list[str], n: int) -> dict[str, list[Any]]:
    sent: dict[str, list[Any]] = {sid: [] for sid in sids}
    for i in range(n):
        sid = sids[i % len(sids)]
        message = {"role": "user", "content": f"{i} " + "long line of text " * (i % 40)}
        store.append(sid, message)
        sent[sid].append(message)
    return sent


@pytest.fixture
def small_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_store, "MAX_PACK_BYTES", 4096)  # a seal every few appends


def count_seals(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The block packs sealed from here on, as the seals return them."""
    sealed: list[Path] = []
    real = object_store.ObjectStore._sealed_pack

    def counted(self: object, w: object, **how: bool) -> Path:
        path = real(self, w, **how)  # type: ignore[arg-type]
        sealed.append(path)
        return path

    monkeypatch.setattr(object_store.ObjectStore, "_sealed_pack", counted)
    return sealed


@pytest.mark.usefixtures("small_packs")
def test_a_long_writer_keeps_its_packs_few_and_every_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sealed = count_seals(monkeypatch)
    path = tmp_path / "store"
    most = 0
    with Store.open(path) as store:
        sids = [store.new_session() for _ in range(3)]
        sent: dict[str, list[Any]] = {sid: [] for sid in sids}
        for _ in range(12):
            for sid, messages in append_many(store, sids, 150).items():
                sent[sid] += messages
            most = max(most, len(pack_files(path)))
            # The handle reads what it merged from the merged pack, and nothing twice.
            assert all(store.context(sid) == sent[sid] for sid in sids)
        store.objects._finish_seal()  # the handle takes in what its last seal did
        held = store.objects._sealed
        assert sorted(p.path.stem for p in held.values()) == [p.stem for p in pack_files(path)]
    # Many more packs were sealed than were ever there at once: merged as they came.
    assert len(sealed) >= 40
    assert most <= 4 + 1 + 8, f"{most} packs at once of {len(sealed)} sealed"
    with Store.open(path) as store:
        assert all(store.context(sid) == sent[sid] for sid in sids)
        assert check_store(store).ok


@pytest.mark.usefixtures("small_packs")
def test_another_handle_reads_beside_the_merges(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as writer, Store.open(path) as reader:
        sid = writer.new_session()
        sent: list[Any] = []
        for _ in range(10):
            sent += append_many(writer, [sid], 40)[sid]
            assert reader.context(sid) == sent


def helper_full(*args: object, **kwargs: object) -> None:
    raise seal_helper.SealHelperFailed("OSError: No space left on device")


@pytest.mark.usefixtures("small_packs")
def test_a_merge_that_fails_leaves_the_packs_and_the_appends_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = object_store.ObjectStore._merge

    def full(self: object, packs: object, **kwargs: object) -> object:
        if threading.current_thread().name.startswith("ags seal"):
            raise OSError(28, "No space left on device")
        return real(self, packs, **kwargs)  # type: ignore[arg-type]  # the close's repack

    monkeypatch.setattr(object_store.ObjectStore, "_merge", full)
    monkeypatch.setattr(seal_helper.SealHelper, "merge", helper_full)  # the same full disk
    path = tmp_path / "store"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Store.open(path) as store:
            sid = store.new_session()
            sent = append_many(store, [sid], 1500)[sid]
            assert store.context(sid) == sent
            packs = len(pack_files(path))
    assert any(
        issubclass(w.category, StoreWarning) and "No space left" in str(w.message) for w in caught
    )
    assert packs >= 20  # nothing merged, nothing lost
    monkeypatch.undo()
    with Store.open(path) as store:
        assert store.context(sid) == sent
        assert check_store(store).ok


MERGING_APPENDER = r"""
import sys
from objstore import Store, object_store, repack
object_store.MAX_PACK_BYTES = 4096  # a seal every few appends
repack.MAX_PACKS = 2  # and a merge after most of them
real = object_store.ObjectStore._delete_packs
def deleting(self, packs):
    sys.stdout.write(f"merged {len(packs)}\n")
    sys.stdout.flush()
    real(self, packs)
object_store.ObjectStore._delete_packs = deleting
store = Store.open(sys.argv[1])
sid, start = sys.argv[2], int(sys.argv[3])
for i in range(start, start + 100_000):
    node = store.append(sid, {"role": "user", "content": f"{i} " + "x" * (i % 500)})
    sys.stdout.write(f"{i} {node}\n")
    sys.stdout.flush()
"""


def test_a_kill_beside_the_merges_loses_no_acknowledged_append(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
    acknowledged: list[str] = []
    rng = random.Random(11)
    merges = start = 0
    for _ in range(6):
        lines = run_and_kill(
            MERGING_APPENDER, [str(path), sid, str(start)], rng, after=200, within=0.5
        )
        for line in lines:
            first, second = line.split()
            if first == "merged":
                merges += 1
                continue
            acknowledged.append(second)
            start = max(start, int(first) + 1)
        with Store.open(path) as store:
            chain = [entry.id for entry in store.log(sid)][::-1]
            assert chain[: len(acknowledged)] == acknowledged
            acknowledged = chain  # a write the kill caught before its answer counts too
    assert merges >= 6, "the appender merged next to none of its packs"
    with Store.open(path) as store:
        assert check_store(store).ok


@pytest.mark.usefixtures("small_packs")
def test_a_seal_that_fails_before_its_merge_lets_go_of_the_repack_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
        append_many(store, [sid], 1500)  # packs enough that a merge comes with each seal
        real = object_store.ObjectStore._sealed_pack
        failed = threading.Event()

        def failing(self: object, w: object, **how: bool) -> Path:
            if store.objects._merging is not None and not failed.is_set():
                failed.set()
                raise OSError(28, "No space left on device")
            return real(self, w, **how)  # type: ignore[arg-type]

        monkeypatch.setattr(object_store.ObjectStore, "_sealed_pack", failing)
        with pytest.raises(OSError, match="No space left"):
            for _ in range(2000):  # until the next seal fails and an append hears of it
                append_many(store, [sid], 1)
        assert failed.is_set()
        lock = FileLock(path / "locks" / "repack")
        assert lock.acquire(blocking=False), "the failed seal kept the repack lock"
        lock.release()
