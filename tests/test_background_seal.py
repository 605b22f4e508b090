"""A full pack is sealed in a thread of its own while the appends go on into a new
pack (objstore/sealing.py, FORMAT.md 5.2): what that must not change.

The crash test kills a real process (SIGKILL) at random times while four threads
append through one handle whose packs fill every few appends, so that most kills
land while a seal runs beside the appends; every append the child acknowledged
must be there after the next open, and that open must leave no pack unsealed."""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from pathlib import Path

import pytest
from killed_child import run_and_kill

from objstore import Store, object_store, packs, seal_helper

APPENDER = r"""
import sys, threading
from objstore import Store, object_store, packs
object_store.MAX_PACK_BYTES = 4096  # a seal every few appends
store = Store.open(sys.argv[1])
sids = sys.argv[2].split(",")
start = int(sys.argv[3])
said = threading.Lock()
def work(t):
    for i in range(start, start + 100_000):
        node = store.append(sids[t], {"role": "user", "content": f"{t} {i} " + "x" * (i % 300)})
        with said:  # one whole line at a time
            sys.stdout.write(f"{t} {i} {node}\n")
            sys.stdout.flush()
threads = [threading.Thread(target=work, args=(t,)) for t in range(len(sids))]
for th in threads: th.start()
for th in threads: th.join()
"""


def unsealed(path: Path) -> list[Path]:
    packs = (path / "objects" / "pack").glob("*.pack")
    return [p for p in packs if not p.with_suffix(".idx").exists()]


def test_a_kill_beside_a_background_seal_loses_no_acknowledged_append(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sids = [store.new_session(title=f"thread {t}") for t in range(4)]
    acknowledged: dict[str, list[str]] = {sid: [] for sid in sids}
    rng = random.Random(5)
    two_live = 0  # kills that left a pack being sealed beside the live one
    start = 0
    for _ in range(6):
        lines = run_and_kill(
            APPENDER, [str(path), ",".join(sids), str(start)], rng, after=40, within=0.3
        )
        two_live += len(unsealed(path)) >= 2
        for line in lines:
            t, i, node = line.split()
            acknowledged[sids[int(t)]].append(node)
            start = max(start, int(i) + 1)
        with Store.open(path) as store:
            assert unsealed(path) == [], "the open recovers every pack the kill left"
            for sid in sids:
                chain = [entry.id for entry in store.log(sid)][::-1]
                assert chain[: len(acknowledged[sid])] == acknowledged[sid]
                acknowledged[sid] = chain  # a write the kill caught before its answer counts too
    assert two_live >= 1, "no kill landed while a seal ran beside the appends"


def test_a_reader_of_the_handle_sees_the_pack_being_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until the handle takes in what its seal wrote, the old pack is its own: objects
    and journaled heads read from it, in this handle and in another."""
    monkeypatch.setattr(object_store, "MAX_PACK_BYTES", 2048)
    path = tmp_path / "store"
    gate = threading.Event()
    real = object_store.ObjectStore._sealed_pack

    def held(self: object, w: object, **how: bool) -> Path:
        gate.wait(30)
        return real(self, w, **how)  # type: ignore[arg-type]

    monkeypatch.setattr(object_store.ObjectStore, "_sealed_pack", held)
    with Store.open(path) as store:
        sid = store.new_session()
        heads = []
        while store.objects._seal is None:
            text = f"m{len(heads)} " + "x" * 200
            heads.append(store.append(sid, {"role": "user", "content": text}))
        old = store.objects._seal.writer
        assert store.objects._writer is not old
        heads.append(store.append(sid, {"role": "user", "content": "into the new pack"}))
        assert [e.id for e in store.log(sid)][::-1] == heads  # read from both packs
        with Store.open(path) as reader:  # another handle: the old pack is a live one
            assert reader.session(sid).head == heads[-1]
            assert [m["content"] for m in reader.context(sid)][-1] == "into the new pack"
        gate.set()
    assert unsealed(path) == []
    with Store.open(path) as store:
        assert [e.id for e in store.log(sid)][::-1] == heads


def test_an_append_that_relies_on_the_pack_being_sealed_waits_for_its_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread's state lands in the pack that fills, and waits for that pack's
    (slow) fsync; another thread's append, in the new pack, finds the same state in
    the full one and writes no copy: it must not return before that fsync has
    (FORMAT.md 5.2)."""
    real = os.fsync
    durable: dict[int, int] = {}  # fd -> bytes an fsync that has returned covered
    syncing = threading.Event()
    slow_fd = [-1]

    def fsync(fd: int) -> None:
        size = os.fstat(fd).st_size
        if fd == slow_fd[0]:
            syncing.set()
            time.sleep(0.3)
        real(fd)
        durable[fd] = max(durable.get(fd, 0), size)

    state = {"shared": "by both threads"}
    with Store.open(tmp_path / "store") as store:
        one, two = store.new_session(), store.new_session()
        for sid in (one, two):
            store.append(sid, {"role": "user", "content": "the writer locks and the pack"})
        full = store.objects._writer
        assert full is not None
        slow_fd[0] = full._fd
        # The first append's message is there already: its state fills the pack, its
        # node starts the new one.
        monkeypatch.setattr(object_store, "MAX_PACK_BYTES", full.size + 1)
        monkeypatch.setattr(os, "fsync", fsync)
        again = {"role": "user", "content": "the writer locks and the pack"}
        first = threading.Thread(target=store.append, args=(one, again, state))
        first.start()
        assert syncing.wait(30), "the first append never reached its fsync"
        node = store.append(two, {"role": "user", "content": "2"}, state)
        state_id = store.node(node).state
        assert state_id is not None
        assert store.objects._seal is not None and store.objects._seal.writer is full
        assert state_id in full.index and state_id not in store.objects._writer.index  # type: ignore[union-attr]
        offset, length = full.index[state_id]
        assert durable.get(full._fd, 0) >= offset + length, "returned before the fsync"
        first.join(30)


def helper_fails(*args: object, **kwargs: object) -> None:
    raise seal_helper.SealHelperFailed("OSError: No space left on device")


def test_a_seal_that_fails_is_named_by_the_next_write_and_recovered_by_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background seal that fails (a full disk while writing the block pack) leaves
    the old pack as a crash would; the handle's next write raises the error, once,
    and its appends go on; the next open seals the old pack."""
    monkeypatch.setattr(object_store, "MAX_PACK_BYTES", 2048)
    real = packs.BlockPackWriter.seal
    failures = [0]

    def full_disk(self: packs.BlockPackWriter) -> None:
        if not failures[0]:
            failures[0] += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self)

    monkeypatch.setattr(packs.BlockPackWriter, "seal", full_disk)
    # The helper process (seal_helper.py) meets the same full disk, and the seal then
    # runs in the thread, where it fails.
    monkeypatch.setattr(seal_helper.SealHelper, "seal", helper_fails)
    path = tmp_path / "store"
    heads: list[str] = []
    raised: list[OSError] = []
    with Store.open(path) as store:
        sid = store.new_session()
        for i in range(60):
            try:
                heads.append(store.append(sid, {"role": "user", "content": f"m{i} " + "x" * 200}))
            except OSError as e:
                raised.append(e)
        assert [e.errno for e in raised] == [errno.ENOSPC]
        assert [e.id for e in store.log(sid)][::-1] == heads
    assert len(unsealed(path)) == 1  # the one whose seal failed
    with Store.open(path) as store:
        assert unsealed(path) == []
        assert [e.id for e in store.log(sid)][::-1] == heads
