"""A store handle in a child of ``os.fork`` (objstore/forks.py): the child can neither
use nor close its parent's handle, holds none of its locks, and so can never seal the
pack the parent is appending to or keep a session locked after the parent is done.

Each case runs in processes of its own (a script that forks), so that the child's
exit is a real one: ``sys.exit`` runs the handle's finalizer, as at any exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from objstore import Store, check_store

# argv: store path, what the child does; prints the session id first.
FORKING_WRITER = r"""
import gc, os, sys, time
from objstore import ForkedHandle, SearchIndex, Store

path, child_does = sys.argv[1], sys.argv[2]
store = Store.open(path)
sid = store.new_session()
print(sid, flush=True)
for i in range(3):
    store.append(sid, {"role": "user", "content": f"before {i}"})
index = SearchIndex.open(store)
index.refresh()
pid = os.fork()
if pid == 0:
    if child_does == "exit":  # the finalizer runs, at the interpreter's exit
        sys.exit(0)
    if child_does == "drop":  # the finalizer runs, now
        del store
        gc.collect()
        os._exit(0)
    if child_does == "use":
        said = []
        for name, call in (
            ("append", lambda: store.append(sid, {"role": "user", "content": "child"})),
            ("context", lambda: store.context(sid)),
            ("title", lambda: store.set_title(sid, "child")),
            ("search", lambda: index.search("before", refresh=False)),
        ):
            try:
                call()
                said.append(f"{name}: done")
            except ForkedHandle as e:
                said.append(f"{name}: ForkedHandle {e}")
        with store:  # closing is quiet, and lets go of nothing
            pass
        store.close()
        index.close()
        print(*said, sep="\n", flush=True)
        os._exit(0)
    if child_does == "wait":  # hold on to the copies until the parent is gone
        print(os.getpid(), flush=True)  # past the fork's hooks
        sys.stdin.read()
        os._exit(0)
    if child_does == "own":  # a handle of its own, and a session of its own
        with Store.open(path) as mine:
            mine.append(mine.new_session(title="child's"), {"role": "user", "content": "mine"})
        os._exit(0)
if child_does == "wait":
    time.sleep(600)  # killed here
os.waitpid(pid, 0)
for i in range(3):
    store.append(sid, {"role": "user", "content": f"after {i}"})
assert len(index.search("after")) == 3
index.close()
store.close()
print("closed", flush=True)
"""


def _run(path: Path, child_does: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", FORKING_WRITER, str(path), child_does],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout.splitlines()


def _fsck_clean(path: Path) -> None:
    with Store.open(path) as store:
        assert check_store(store).problems == []


def _contents(path: Path, sid: str) -> list[str]:
    with Store.open(path) as store:
        return [m["content"] for m in store.context(sid)]


@pytest.mark.parametrize("child_does", ["exit", "drop"])
def test_a_child_that_lets_go_of_its_copy_seals_nothing(tmp_path: Path, child_does: str) -> None:
    """The child's exit, or its dropping of the handle, ran the handle's close: it
    sealed the parent's pack (and deleted it), so the parent's next appends went to
    a deleted file, and its own close failed."""
    path = tmp_path / "store"
    out = _run(path, child_does)
    assert out[-1] == "closed"
    sid = out[0]
    assert _contents(path, sid) == [f"before {i}" for i in range(3)] + [
        f"after {i}" for i in range(3)
    ]
    _fsck_clean(path)


def test_a_child_cannot_use_its_parents_handle(tmp_path: Path) -> None:
    path = tmp_path / "store"
    out = _run(path, "use")
    sid, said, closed = out[0], out[1:-1], out[-1]
    assert closed == "closed"
    names = [line.partition(": ")[0] for line in said]
    assert names == ["append", "context", "title", "search"]
    for line in said:
        what = line.partition(": ")[2]
        assert what.startswith("ForkedHandle this store handle was opened by process "), line
        assert "must open the store itself" in what
    assert _contents(path, sid) == [f"before {i}" for i in range(3)] + [
        f"after {i}" for i in range(3)
    ]
    with Store.open(path) as store:
        assert store.session(sid).title is None
    _fsck_clean(path)


def test_a_child_may_open_the_store_itself(tmp_path: Path) -> None:
    path = tmp_path / "store"
    out = _run(path, "own")
    assert out[-1] == "closed"
    with Store.open(path) as store:
        (child,) = [s for s in store.sessions() if s.title == "child's"]
        assert [m["content"] for m in store.context(child.id)] == ["mine"]
    assert _contents(path, out[0]) == [f"before {i}" for i in range(3)] + [
        f"after {i}" for i in range(3)
    ]
    _fsck_clean(path)


def test_a_child_holds_none_of_its_parents_locks(tmp_path: Path) -> None:
    """The parent is killed while its child lives on with copies of its files: the
    session's writer lock and the parent's pack are free all the same, so another
    process writes the session, and the pack is recovered. Before, the child's copy
    of the lock file kept the session locked (SessionBusy) until the child exited."""
    path = tmp_path / "store"
    parent = subprocess.Popen(
        [sys.executable, "-c", FORKING_WRITER, str(path), "wait"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert parent.stdout is not None and parent.stdin is not None
    sid = parent.stdout.readline().strip()
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        os.kill(child, 0)  # still there, with its copies
        with Store.open(path) as store:
            store.append(sid, {"role": "user", "content": "from another process"})
        packs = sorted(p.suffix for p in (path / "objects" / "pack").iterdir())
        assert ".live" not in packs  # the parent's pack was recovered, then merged or sealed
    finally:
        parent.stdin.close()  # the child reads its end: it exits
    assert _contents(path, sid) == [f"before {i}" for i in range(3)] + ["from another process"]
    _fsck_clean(path)
