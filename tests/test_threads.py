"""A Store may be shared between threads (its API docs say so): operations on one
handle take turns, and nothing shared between handles is unsafe. Run in a child
process, since a thread-unsafe compressor kills the interpreter (SIGSEGV)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
