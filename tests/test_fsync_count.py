"""What the README promises about durability costs, counted: one fsync per append."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from objstore import Store, files, packs
from objstore.pack_format import RECORD_HEAD, TYPE_REF
from objstore.refs import LOCK_STRIPES


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


def test_an_append_costs_one_fsync(
    tmp_path: Path, fsyncs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """And one write of its records to its pack, then their first byte (FORMAT.md 5.1):
    a thread appending alone leads every group of appends (objstore/combining.py), a
    group of one."""
    writes: list[tuple[int, int]] = []
    real_write = os.pwrite

    def counting_write(fd: int, data: bytes, offset: int) -> int:
        writes.append((fd, len(data)))
        return real_write(fd, data, offset)

    monkeypatch.setattr(packs.os, "pwrite", counting_write)
    with Store.open(tmp_path / "store") as store:
        sid = store.new_session(title="counted")
        store.append(sid, {"role": "user", "content": "the first takes the lock, makes a pack"})
        for i in range(40):  # spans every 16th, new states now and then
            fsyncs.clear()
            writes.clear()
            state = {"i": i} if i % 7 == 0 else None
            store.append(sid, {"role": "user", "content": f"message {i}"}, state=state)
            assert len(fsyncs) == 1, f"append {i} made {len(fsyncs)} fsyncs"
            pack = store.objects._writer
            assert pack is not None
            to_pack = [n for fd, n in writes if fd == pack._fd]
            assert len(to_pack) == 2 and to_pack[1] == 1, f"append {i} wrote {to_pack}"
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


def test_eight_threads_share_fsyncs_and_each_append_returns_durable(tmp_path: Path) -> None:
    """Group commit: while fsyncs run (two at most, shared_fsync.py) the other threads
    write, and the next fsync covers them all. Each fsync is made slow here so that
    the sharing does not depend on the machine; each append must still return only
    after an fsync that began once its records were in the pack."""
    real = os.fsync
    lock = threading.Lock()
    durable: dict[int, int] = {}  # pack fd -> bytes an fsync that has returned covered
    count = [0]

    def slow_fsync(fd: int) -> None:
        size = os.fstat(fd).st_size  # what this fsync covers, at least
        time.sleep(0.005)
        real(fd)
        with lock:
            count[0] += 1
            durable[fd] = max(durable.get(fd, 0), size)

    per_thread = 25
    late: list[str] = []
    with Store.open(tmp_path / "store") as store:
        sids = [store.new_session(title=f"thread {t}") for t in range(8)]
        for sid in sids:  # the writer locks and the pack, before counting
            store.append(sid, {"role": "user", "content": "first"})

        def work(t: int) -> None:
            for i in range(per_thread):
                node = store.append(sids[t], {"role": "user", "content": f"{t} {i}"})
                w = store.objects._writer
                assert w is not None
                # The session's ref update is the record right after its node's.
                at = w.index[node][0] + w.index[node][1]
                _type, _id, length = RECORD_HEAD.unpack(os.pread(w._fd, RECORD_HEAD.size, at))
                with lock:
                    if _type != TYPE_REF or durable.get(w._fd, 0) < at + RECORD_HEAD.size + length:
                        late.append(node)

        os.fsync = slow_fsync
        try:
            threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            os.fsync = real
        assert late == [], f"{len(late)} appends returned before an fsync covered them"
        appends = 8 * per_thread
        assert count[0] <= appends // 2, f"{count[0]} fsyncs for {appends} appends"
    with Store.open(tmp_path / "store") as store:
        assert all(store.session(sid).messages == per_thread + 1 for sid in sids)


def _stripe(sid: str) -> int:
    return blake3.blake3(f"sessions/{sid}".encode()).digest()[0] % LOCK_STRIPES


def test_an_append_writes_while_another_of_its_lock_stripe_waits_for_its_fsync(
    tmp_path: Path,
) -> None:
    """Two sessions whose refs share one of the 256 stripe locks: while one thread's
    append waits for its fsync (held here until released), another thread's append
    to the other session still writes its records, and both return once durable.
    (With a lock file per thread the second waited for the first's fsync, holding
    the handle's turn, and every other thread waited behind it.)"""
    real = os.fsync
    gate, held = threading.Event(), threading.Event()

    def held_fsync(fd: int) -> None:
        held.set()
        gate.wait(30)
        real(fd)

    with Store.open(tmp_path / "store") as store:
        seen: dict[int, str] = {}
        while True:
            sid = store.new_session()
            if _stripe(sid) in seen:
                first, second = seen[_stripe(sid)], sid
                break
            seen[_stripe(sid)] = sid
        for sid in (first, second):  # the writer locks and the pack, before holding fsyncs
            store.append(sid, {"role": "user", "content": "hello"})
        writer = store.objects._writer
        assert writer is not None
        os.fsync = held_fsync
        try:
            one = threading.Thread(
                target=store.append, args=(first, {"role": "user", "content": "1"})
            )
            one.start()
            assert held.wait(30), "the first append never reached its fsync"
            written = writer._in_file  # bytes in the file, not held ones
            two = threading.Thread(
                target=store.append, args=(second, {"role": "user", "content": "2"})
            )
            two.start()
            deadline = time.monotonic() + 10
            while writer._in_file == written and time.monotonic() < deadline:
                time.sleep(0.01)
            grew = writer._in_file > written
            assert one.is_alive(), "the first append returned before its fsync"
        finally:
            gate.set()
            os.fsync = real
        one.join(30)
        two.join(30)
        assert grew, "the second append did not write while the first waited for its fsync"
        assert not one.is_alive() and not two.is_alive()
    with Store.open(tmp_path / "store") as store:
        assert [store.session(sid).messages for sid in (first, second)] == [2, 2]


def test_a_seal_replays_its_journal_with_one_sync_of_the_ref_directory_and_again_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sealing writes the ref file of every session the pack journaled, synced before
    the directory is synced once; replaying the same journal again (a recovery that
    finds the files up to date) writes no file at all."""
    with Store.open(tmp_path / "store") as store:
        sids = [store.new_session() for _ in range(4)]
        for sid in sids:
            store.append(sid, {"role": "user", "content": "hello"})
        writer = store.objects._writer
        assert writer is not None
        updates = list(writer.journaled.values())
        synced: list[str] = []
        real_dir = files.fsync_dir
        monkeypatch.setattr(files, "fsync_dir", lambda d: synced.append(str(d)) or real_dir(d))
    assert synced.count(str(tmp_path / "store" / "refs" / "sessions")) == 1
    monkeypatch.setattr(files, "fsync_dir", real_dir)
    with Store.open(tmp_path / "store") as store:
        assert all(store.refs.read_file(f"sessions/{sid}") is not None for sid in sids)
        written: list[object] = []
        real_new = files.write_new
        monkeypatch.setattr(
            files, "write_new", lambda *a, **k: written.append(a) or real_new(*a, **k)
        )
        store.refs.replay(updates)
        assert written == []
