"""While threads of one handle append, a ref stripe's flock lingers between their
updates (refs._Stripe): another process still gets it within MAX_LINGER or so,
every retitle it makes is kept, the handle's own ref files are never read from a
stale pin, and once the appends end the handle's reaper lets go of every flock
within about MAX_LINGER."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from objstore import Store, files, refs
from objstore.refs import LOCK_STRIPES, _stripe_number, session_ref, tag_ref


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


RETITLE = """
import sys, time
from objstore import Store
waits = []
with Store.open(sys.argv[1]) as s:
    for i in range(int(sys.argv[2])):
        for sid in sys.argv[3:]:
            start = time.monotonic()
            s.set_title(sid, f"title {i}")
            waits.append(time.monotonic() - start)
print(max(waits))
"""


def test_another_process_retitles_sessions_while_threads_append(tmp_path: Path) -> None:
    """Eight threads append to eight sessions through one handle for as long as another
    process retitles each of them 15 times: that process waits a bounded time for each
    stripe (a flock kept until the appends stop would make it wait for ever, and the
    appends with it), and every append after a retitle keeps the title."""
    path = tmp_path / "store"
    store = Store.open(path)
    sids = [store.new_session(title="start") for _ in range(8)]
    other = subprocess.Popen(
        [sys.executable, "-c", RETITLE, str(path), "15", *sids],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    counts = [0] * 8
    errors: list[str] = []

    def work(t: int) -> None:
        try:
            while other.poll() is None:
                store.append(sids[t], user(f"{t} {counts[t]}"))
                counts[t] += 1
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    try:
        out, _ = other.communicate(timeout=120)
    finally:
        for thread in threads:
            thread.join()
    store.close()
    assert not errors, errors
    assert other.returncode == 0
    assert float(out) < 2.0  # the longest wait for one retitle, in seconds
    assert min(counts) > 0
    with Store.open(path) as reader:
        for sid, count in zip(sids, counts, strict=True):
            info = reader.session(sid)
            assert (info.title, info.messages) == ("title 14", count)


def test_the_handles_own_retitle_between_lingering_appends_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ref file the handle itself replaces (a retitle, not journaled) while its
    stripe's flock lingers is read again by the next append, not taken from the pin
    the append before it left. Another update held in progress keeps the flocks
    lingering, and MAX_LINGER is made long, so that they linger throughout."""
    monkeypatch.setattr(refs, "MAX_LINGER", 600.0)
    with Store.open(tmp_path / "store") as store:
        sid = store.new_session()
        holding, stop = threading.Event(), threading.Event()

        def hold(current: refs.RefRecord | None) -> None:
            holding.set()
            stop.wait(60)
            return None  # no tag before, none after: nothing written

        holder = threading.Thread(target=store.refs.transact, args=(tag_ref("held"), "", hold))
        holder.start()
        holding.wait(60)
        try:
            for i in range(20):
                store.append(sid, user(f"before {i}"))
                store.set_title(sid, f"title {i}")
                store.append(sid, user(f"after {i}"))
                info = store.session(sid)
                assert (info.title, info.messages) == (f"title {i}", 2 * i + 2)
        finally:
            stop.set()
            holder.join()


def _free_within(path: Path, numbers: set[int], seconds: float) -> float:
    """How long until another open file could flock each stripe of ``numbers`` (a
    failure if one is still flocked after ``seconds``)."""
    start = time.monotonic()
    for number in numbers:
        lock = files.FileLock(path / "locks" / f"ref-{number:02x}")
        while not lock.acquire(blocking=False):
            assert time.monotonic() - start < seconds, f"stripe {number:02x} is still flocked"
            time.sleep(0.001)
        lock.release()
    return time.monotonic() - start


def test_no_flock_is_left_held_once_the_appends_end(tmp_path: Path) -> None:
    """When the appends end, every lingering flock is let go within about MAX_LINGER
    (by the handle's reaper: no update of the handle comes to do it), though the
    handle stays open: another process can then take each stripe."""
    path = tmp_path / "store"
    with Store.open(path) as store:
        sids = [store.new_session() for _ in range(8)]

        def work(t: int) -> None:
            for i in range(100):
                store.append(sids[t], user(f"{t} {i}"))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stripes = {_stripe_number(session_ref(sid)) for sid in sids}
        assert all(0 <= n < LOCK_STRIPES for n in stripes)
        _free_within(path, stripes, 2.0)
        store.append(sids[0], user("again"))
        assert store.session(sids[0]).messages == 101
        _free_within(path, {_stripe_number(session_ref(sids[0]))}, 2.0)


def test_a_lone_appender_keeps_its_stripe_between_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread appending again and again takes its stripe's flock once per
    MAX_LINGER, not twice an append (made long here: once in all)."""
    monkeypatch.setattr(refs, "MAX_LINGER", 600.0)
    calls: list[int] = []
    flock = fcntl.flock
    with Store.open(tmp_path / "store") as store:
        sid = store.new_session()
        store.append(sid, user("first"))
        monkeypatch.setattr(fcntl, "flock", lambda fd, op: calls.append(op) or flock(fd, op))
        for i in range(50):
            store.append(sid, user(f"message {i}"))
        monkeypatch.setattr(fcntl, "flock", flock)
        assert len(calls) < 5, calls
        assert store.session(sid).messages == 51


def _reapers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "ags-ref-lingers"}


def test_the_reaper_ends_with_the_handle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread that lets go of lingering flocks ends when the handle closes, and
    the flocks with it (MAX_LINGER made long: it would linger until then)."""
    monkeypatch.setattr(refs, "MAX_LINGER", 600.0)
    path = tmp_path / "store"
    before = _reapers()
    store = Store.open(path)
    sid = store.new_session()
    store.append(sid, user("one"))
    reapers = _reapers() - before
    assert len(reapers) == 1
    store.close()
    assert not any(t.is_alive() for t in reapers)
    lock = files.FileLock(path / "locks" / f"ref-{_stripe_number(session_ref(sid)):02x}")
    assert lock.acquire(blocking=False)
    lock.release()


def test_the_reaper_ends_when_no_flock_lingers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handle left open (never closed) keeps no thread once no flock has lingered
    for REAPER_IDLE."""
    monkeypatch.setattr(refs, "REAPER_IDLE", 0.05)
    before = _reapers()
    store = Store.open(tmp_path / "store")
    sid = store.new_session()
    store.append(sid, user("one"))
    _free_within(tmp_path / "store", {_stripe_number(session_ref(sid))}, 2.0)
    deadline = time.monotonic() + 10.0
    while _reapers() - before:
        assert time.monotonic() < deadline, "the reaper still runs"
        time.sleep(0.001)
    store.append(sid, user("two"))  # a new one lets go of the flock again
    _free_within(tmp_path / "store", {_stripe_number(session_ref(sid))}, 2.0)
    store.close()


def test_a_child_of_a_fork_holds_none_of_the_flocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child of a fork closes its copies of the handle's lock files at the fork
    (forks.py): the stripe flock that lingers then is let go when the parent closes,
    though the child lives on. Before, the child's copy of the open file, which holds
    the flock as much as the parent's, kept the stripe locked until it exited."""
    monkeypatch.setattr(refs, "MAX_LINGER", 60.0)  # lingering until the close
    path = tmp_path / "store"
    store = Store.open(path)
    sid = store.new_session()
    store.append(sid, user("one"))
    number = _stripe_number(session_ref(sid))
    wait, wake = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - a child that only waits for the parent's end
        os.close(wake)
        os.read(wait, 1)
        os._exit(0)
    os.close(wait)
    try:
        store.close()
        _free_within(path, {number}, 5.0)
    finally:
        os.close(wake)
        os.waitpid(pid, 0)


def test_lingering_flocks_of_more_stripes_than_a_handle_keeps_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handle updating refs of more stripes than it keeps open closes the idle ones
    while they may still linger: each is let go, by the reaper or the close, and no
    thread fails unlocking one."""
    failures: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
        store.append(sid, user("one"))
        names = [f"t{i}" for i in range(200)]
        numbers = {_stripe_number(tag_ref(name)) for name in names}
        assert len(numbers) > refs.OPEN_STRIPES
        for name in names:
            store.tag(name, sid)
        _free_within(path, numbers, 5.0)
        assert sorted(store.tags()) == sorted(names)
    assert not failures
