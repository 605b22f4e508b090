"""Who holds a session's writer lock, and for how long.

A handle that appended holds the lock until it closes; one dropped without
closing lets go when it is collected, not when the process exits; a
fast-forward import holds it only while it moves the ref; ``Store.writing``
holds it for a block. Each test checks with a second handle (a second open
file, so a second ``flock`` owner) or a second process.
"""

from __future__ import annotations

import errno
import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from objstore import SessionBusy, Store
from objstore.exchange import export_session, import_document


def unsealed(path: Path) -> list[Path]:
    return [p for p in (path / "objects/pack").glob("*.pack") if not p.with_suffix(".idx").exists()]


def other_process_appends(path: Path, sid: str) -> str:
    """Append from a separate process; return 'ok' or the error's class name."""
    code = (
        "import sys\nfrom objstore import Store, SessionBusy\n"
        "with Store.open(sys.argv[1]) as s:\n"
        "    try:\n        s.append(sys.argv[2], {'role': 'user', 'content': 'other'})\n"
        "    except SessionBusy:\n        print('SessionBusy')\n    else:\n        print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), sid], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_a_dropped_handle_lets_go_of_its_locks_and_seals_its_pack(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
    dropped = Store.open(path)
    dropped.append(sid, {"role": "user", "content": "appended, never closed"})
    assert unsealed(path), "the handle's pack is open while the handle lives"
    assert other_process_appends(path, sid) == "SessionBusy"
    del dropped  # no close(); no gc.collect() either: dropping the last reference is enough
    assert not unsealed(path)
    assert other_process_appends(path, sid) == "ok"
    with Store.open(path) as s:
        assert [e.message["content"] for e in s.log(sid)] == ["other", "appended, never closed"]


def test_a_handle_in_a_reference_cycle_lets_go_when_collected(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
    holder: dict[str, object] = {}
    handle = Store.open(path)
    handle.append(sid, {"role": "user", "content": "x"})
    holder["self"] = holder
    holder["store"] = handle
    del handle, holder
    gc.collect()
    assert other_process_appends(path, sid) == "ok"


def test_a_fast_forward_import_does_not_keep_the_writer_lock(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    with Store.open(source) as s:
        sid = s.new_session(title="moving")
        s.append(sid, {"role": "user", "content": "one"})
        early = export_session(s, sid)
        s.append(sid, {"role": "user", "content": "two"})
        later = export_session(s, sid)
    with Store.open(target) as t:
        assert import_document(t, early).action == "created"
        assert import_document(t, later).action == "fast-forward"
        assert t.writer_locks == frozenset()
        assert other_process_appends(target, sid) == "ok"  # while t is still open


def test_writing_holds_the_lock_for_the_block_only(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        with s.writing(sid) as locked:
            assert locked == sid and s.writer_locks == {sid}
            s.append(sid, {"role": "user", "content": "inside"})
            assert other_process_appends(path, sid) == "SessionBusy"
        assert s.writer_locks == frozenset()
        assert other_process_appends(path, sid) == "ok"
        s.append(sid, {"role": "user", "content": "after"})  # reads the moved head again
        assert [e.message["content"] for e in s.log(sid)] == ["after", "other", "inside"]
        assert s.writer_locks == {sid}, "a bare append keeps the lock, as documented"


def test_writing_keeps_a_lock_the_handle_already_held(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": "first"})
        with s.writing(sid):
            s.append(sid, {"role": "user", "content": "second"})
        assert s.writer_locks == {sid}
        with pytest.raises(SessionBusy), Store.open(path) as other:
            other.append(sid, {"role": "user", "content": "refused"})


def test_a_handle_used_again_after_close_lets_go_again_on_close(tmp_path: Path) -> None:
    path = tmp_path / "store"
    s = Store.open(path)
    sid = s.new_session()
    s.append(sid, {"role": "user", "content": "first"})
    s.close()
    s.append(sid, {"role": "user", "content": "after a close"})  # takes the lock again
    assert other_process_appends(path, sid) == "SessionBusy"
    s.close()
    assert other_process_appends(path, sid) == "ok"
    assert not unsealed(path)


def test_a_writer_lock_taken_on_a_full_disk_is_held_and_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder's pid is a courtesy for the error a second writer gets: when the
    disk is too full to write it, the lock is held all the same, the append goes on,
    and another process is still refused."""
    path = tmp_path / "store"
    real_pwrite = os.pwrite
    locks_dir = str(path / "locks" / "sessions")

    def no_room_for_the_pid(fd: int, data: bytes, offset: int) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(locks_dir):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    with Store.open(path) as store:
        sid = store.new_session()
        monkeypatch.setattr(os, "pwrite", no_room_for_the_pid)
        store.append(sid, {"role": "user", "content": "on a full disk"})
        monkeypatch.undo()
        store.append(sid, {"role": "user", "content": "and after"})
        assert other_process_appends(path, sid) == "SessionBusy"
        assert len(store.context(sid)) == 2
