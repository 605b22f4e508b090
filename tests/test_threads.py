"""A Store may be shared between threads (its API docs say so): operations on one
handle take turns, and nothing shared between handles is unsafe. Run in a child
process, since a thread-unsafe compressor kills the interpreter (SIGSEGV)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from appending_threads import append_in_threads

from objstore import SessionArchived, Store, packs

SHARED = """
import sys, threading
from objstore import Store
store = Store.open(sys.argv[1])
sids = [store.new_session(title=f"thread {t}") for t in range(8)]
errors = []
def work(t):
    try:
        for i in range(150):
            text = f"thread {t} message {i} " + "x" * (i * 37 % 3000)
            store.append(sids[t], {"role": "user", "content": text})
            if i % 50 == 49:
                store.compact(sids[t], f"summary {t} {i}", keep=2)
            store.context(sids[t])
    except BaseException as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
for th in threads: th.start()
for th in threads: th.join()
assert not errors, errors
store.close()
with Store.open(sys.argv[1]) as s:
    for t, sid in enumerate(sids):
        log = [e.message["content"] for e in s.log(sid)]
        assert len(log) == 153, len(log)
        mine = [m for m in log if m.startswith(f"thread {t} message")]
        assert [int(m.split()[3]) for m in mine][::-1] == list(range(150))
print("ok")
"""

HANDLES = """
import sys, threading
from objstore import Store
errors = []
def work(t):
    try:
        with Store.open(sys.argv[1]) as store:
            sid = store.new_session()
            for i in range(200):
                store.append(sid, {"role": "user", "content": f"{t} {i} " + "y" * (i * 53 % 4000)})
                store.context(sid)
    except BaseException as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
for th in threads: th.start()
for th in threads: th.join()
assert not errors, errors
print("ok")
"""

SAME_SESSION = """
import sys, threading
from objstore import Store
store = Store.open(sys.argv[1])
sids = [store.new_session(title=f"shared {k}") for k in range(2)]
errors = []
def work(t):
    try:
        for i in range(60):
            store.append(sids[t % 2], {"role": "user", "content": f"{t} {i}"})
    except BaseException as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
for th in threads: th.start()
for th in threads: th.join()
assert not errors, errors
store.close()
with Store.open(sys.argv[1]) as s:
    for k, sid in enumerate(sids):
        log = [e.message["content"] for e in s.log(sid)][::-1]
        assert len(log) == 180, len(log)
        for t in range(k, 6, 2):  # each thread's messages in its order, among the others'
            assert [int(m.split()[1]) for m in log if m.split()[0] == str(t)] == list(range(60))
print("ok")
"""


def run(script: str, store: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", script, str(store)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def in_threads(work: Callable[[int], None], n: int) -> None:
    """Run ``work(0)`` to ``work(n - 1)`` in n threads at once; return when all end."""
    threads = [threading.Thread(target=work, args=(t,)) for t in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_eight_threads_append_through_one_store(tmp_path: Path) -> None:
    done = run(SHARED, tmp_path / "store")
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-3000:]


def test_eight_threads_with_a_store_each(tmp_path: Path) -> None:
    done = run(HANDLES, tmp_path / "store")
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-3000:]


def test_threads_appending_to_one_session_take_turns(tmp_path: Path) -> None:
    """Three threads per session: each append waits for the one before it (and that
    one's fsync), none is lost or reordered within its thread, nothing deadlocks."""
    done = run(SAME_SESSION, tmp_path / "store")
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-3000:]


def test_an_append_that_fails_fails_only_its_own_thread(tmp_path: Path) -> None:
    """Appends of several threads are run by one of them (objstore/combining.py): an
    append refused (an archived session) raises in the thread that made it, and
    the appends run with it, before it and after it, are written."""
    with Store.open(tmp_path / "store") as store:
        sids = [store.new_session(title=f"thread {t}") for t in range(6)]
        store.archive(sids[0])
        refused: list[BaseException] = []
        heads: dict[int, list[str]] = {t: [] for t in range(1, 6)}

        def work(t: int) -> None:
            for i in range(40):
                try:
                    node = store.append(sids[t], {"role": "user", "content": f"{t} {i}"})
                except SessionArchived as e:
                    refused.append(e)
                else:
                    heads[t].append(node)

        in_threads(work, 6)
        assert len(refused) == 40 and all(e.session == sids[0] for e in refused)
    with Store.open(tmp_path / "store") as store:
        for t in range(1, 6):
            assert [e.id for e in store.log(sids[t])][::-1] == heads[t]


class _Interrupted(Exception):
    """What this test's SIGINT handler raises, in place of KeyboardInterrupt."""


def test_a_leader_interrupted_before_its_turn_leaves_the_others_going(tmp_path: Path) -> None:
    """Ctrl-C in a thread that leads the queued appends (combining.py) while it waits
    for the handle's turn: its append raises and is not written, and the thread
    queued behind it leads. Its append used to stay queued and return None, and the
    lead went to it, no longer waiting: every later append waited for good."""
    with Store.open(tmp_path / "store") as store:
        mine, other = store.new_session(), store.new_session()
        in_batch, end_batch = threading.Event(), threading.Event()

        def hold_the_turn() -> None:
            with store.batch():  # a batch has the handle, and its turn, to itself
                in_batch.set()
                end_batch.wait(30)

        holder = threading.Thread(target=hold_the_turn, daemon=True)
        holder.start()
        assert in_batch.wait(30)
        written: list[str] = []
        behind = threading.Thread(
            target=lambda: written.append(store.append(other, {"role": "user", "content": "b"})),
            daemon=True,
        )

        def interrupt_the_leader() -> None:
            _until(lambda: store._appends._leading)  # this thread leads, waiting for the turn
            behind.start()
            _until(lambda: len(store._appends._queued) == 2)
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

        def raise_interrupted(signum: int, frame: object) -> None:
            raise _Interrupted

        previous = signal.signal(signal.SIGINT, raise_interrupted)
        try:
            interrupter = threading.Thread(target=interrupt_the_leader, daemon=True)
            interrupter.start()
            with pytest.raises(_Interrupted):
                store.append(mine, {"role": "user", "content": "interrupted"})
        finally:
            signal.signal(signal.SIGINT, previous)
            end_batch.set()
        behind.join(30)
        assert not behind.is_alive(), "the append queued behind waits for good"
        assert len(written) == 1
        assert store.append(mine, {"role": "user", "content": "again"})
        assert [e.message["content"] for e in store.log(mine)] == ["again"]
        assert [e.id for e in store.log(other)] == written


def test_a_full_disk_fails_the_appends_written_together_and_none_is_half_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of a group of appends that fails (a full disk) fails every append of
    the group, in its own thread, and leaves none of them in the pack or in the
    handle's memory: each session goes on from its last acknowledged append."""
    real_write = os.pwrite
    lock = threading.Lock()
    count = [0]

    def full_for_a_while(fd: int, data: bytes, offset: int) -> int:
        with lock:
            count[0] += 1
            full = 20 <= count[0] < 30
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data, offset)

    with Store.open(tmp_path / "store") as store:
        sids = [store.new_session(title=f"thread {t}") for t in range(8)]
        monkeypatch.setattr(packs.os, "pwrite", full_for_a_while)
        acknowledged, failed = append_in_threads(store, sids, 25, errno.ENOSPC)
        monkeypatch.undo()
        assert sum(failed) >= 10  # each failed write failed one append or more
        for t in range(8):
            assert len(acknowledged[t]) + failed[t] == 25
            assert [e.id for e in store.log(sids[t])][::-1] == acknowledged[t]
    with Store.open(tmp_path / "store") as store:
        for t in range(8):
            assert [e.id for e in store.log(sids[t])][::-1] == acknowledged[t]
        for oid in store.objects.ids():
            store.objects.get(oid)


def _run_fsync(
    shared: object,
    wanted: int,
    end: int,
    ran: list[str],
    name: str,
    gate: threading.Event | None = None,
    fail: bool = False,
) -> threading.Thread:
    """A thread that asks ``shared`` (a SharedFsync) to cover ``wanted`` bytes, with
    ``end`` written; if it is the one to run an fsync, it notes ``name``, waits for
    ``gate`` and returns (or raises, with ``fail``)."""
    errors: list[BaseException] = []

    def fsync() -> None:
        ran.append(name)
        if gate is not None:
            gate.wait(30)
        if fail:
            raise OSError(errno.EIO, "fsync failed")

    def work() -> None:
        try:
            shared.cover(wanted, end, fsync)  # type: ignore[attr-defined]
        except OSError as e:
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def _until(done: Callable[[], bool]) -> None:
    for _ in range(3000):
        if done():
            return
        threading.Event().wait(0.01)
    raise AssertionError("never happened")


def _waiting(shared: object, count: int) -> None:
    _until(lambda: sum(len(r.waiters) for r in shared._running) == count)  # type: ignore[attr-defined]


def test_an_fsync_covers_what_came_before_it_and_a_later_write_runs_its_own_beside_it() -> None:
    from objstore.shared_fsync import OVERLAP, SharedFsync

    assert OVERLAP == 2
    shared, ran, gate = SharedFsync(), [], threading.Event()
    first = _run_fsync(shared, 10, 10, ran, "first", gate)
    _until(lambda: ran == ["first"])
    covered = _run_fsync(shared, 8, 10, ran, "covered")  # written before the first began
    _waiting(shared, 1)
    # Written after the first fsync began: an fsync of its own, at once, beside it.
    later = _run_fsync(shared, 20, 30, ran, "later", gate)
    _until(lambda: ran == ["first", "later"])
    also = [_run_fsync(shared, 20 + i, 30, ran, f"also {i}") for i in range(3)]
    # Two run and neither covers it: it waits for the newest, then runs its own.
    third = _run_fsync(shared, 40, 40, ran, "third")
    _waiting(shared, 5)
    assert ran == ["first", "later"] and shared.synced == 0
    assert all(t.is_alive() for t in [covered, *also, third])
    gate.set()
    for thread in [first, covered, later, *also, third]:
        thread.join(30)
        assert not thread.is_alive()
    # Three fsyncs for seven threads: each waiter was covered by one begun after its write.
    assert ran == ["first", "later", "third"]
    assert shared.synced == 40


def test_a_failed_fsync_fails_its_waiters_and_every_later_cover_past_what_was_synced() -> None:
    """After a failed fsync nothing written since the last good one is known durable,
    and a second fsync cannot tell (Linux reports a writeback error once): a waiter
    that ran its own fsync then was told its bytes were durable."""
    from objstore.shared_fsync import SharedFsync

    shared, ran, gate = SharedFsync(), [], threading.Event()
    _run_fsync(shared, 4, 4, ran, "good").join(30)
    failing = _run_fsync(shared, 10, 10, ran, "failing", gate, fail=True)
    _until(lambda: ran == ["good", "failing"])
    waiting = _run_fsync(shared, 8, 10, ran, "waiting")
    _waiting(shared, 1)
    gate.set()
    failing.join(30)
    waiting.join(30)
    assert [type(e) for e in failing.errors] == [OSError]  # type: ignore[attr-defined]
    assert [e.errno for e in waiting.errors] == [errno.EIO]  # type: ignore[attr-defined]
    later = _run_fsync(shared, 12, 12, ran, "later")
    later.join(30)
    assert [e.errno for e in later.errors] == [errno.EIO]  # type: ignore[attr-defined]
    before = _run_fsync(shared, 3, 12, ran, "before")  # synced before the failure
    before.join(30)
    assert before.errors == []  # type: ignore[attr-defined]
    assert ran == ["good", "failing"] and shared.synced == 4


def test_a_leader_gathers_the_threads_woken_last_before_it_takes_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The threads a leader woke come back one at a time; the next leader waits for
    them to queue (combining.py), so they are written together, not each alone."""
    from objstore import combining

    monkeypatch.setattr(combining, "GATHER_WINDOW", 60.0)
    queue, gathered = combining.AppendQueue(), threading.Event()
    queue.waking(2)
    leader = threading.Thread(target=lambda: (queue.gather(), gathered.set()))
    leader.start()
    assert not gathered.wait(0.2)
    queue.join(combining.QueuedAppend(lambda let_go: None))
    assert not gathered.wait(0.2)  # one of the two is back
    queue.join(combining.QueuedAppend(lambda let_go: None))
    assert gathered.wait(30)  # both are: long before the window ends
    leader.join(30)
    assert len(queue.take()) == 2


def test_a_leader_waits_for_threads_that_do_not_come_back_only_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from objstore import combining

    monkeypatch.setattr(combining, "GATHER_WINDOW", 0.3)
    queue = combining.AppendQueue()
    queue.gather()  # nobody woken: no wait
    queue.waking(3)
    began = time.monotonic()
    queue.gather()  # none of the three appends again
    assert time.monotonic() - began >= 0.29
    monkeypatch.setattr(combining, "GATHER_WINDOW", 60.0)
    began = time.monotonic()
    queue.gather()  # they are not waited for again
    assert time.monotonic() - began < 30
