"""The listing index (FORMAT.md 17): ``Store.sessions`` reads ``cache/sessions.idx``
instead of every session ref, and what it lists is always what the refs say: after
damage to the index, after a writer killed with SIGKILL, beside gc, on a store of
format 1, and when the index on disk is an older one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from objstore import Store, StoreWarning, UnsafeStore, collect_garbage
from objstore.refs import RefStore, session_ref
from objstore.store import SessionInfo, session_info

FORMAT1 = Path(__file__).parent / "fixtures" / "format1" / "store"


def index_path(store: Path) -> Path:
    return store / "cache" / "sessions.idx"


def from_the_refs(store: Path, include_archived: bool = False) -> list[SessionInfo]:
    """The listing as the refs themselves say it, one file each, no index."""
    refs = RefStore(store / "refs", store / "logs", store / "locks", store / "tmp")
    rows = []
    for name in os.listdir(store / "refs" / "sessions"):
        rec = refs.read(session_ref(name))
        assert rec is not None
        info = session_info(rec)
        if include_archived or not info.archived:
            rows.append(info)
    return sorted(rows, key=lambda s: (s.updated, s.id), reverse=True)


def listed(store: Path, include_archived: bool = False) -> list[SessionInfo]:
    with Store.open(store) as s:
        return s.sessions(include_archived=include_archived)


def some_sessions(path: Path, n: int = 5) -> list[str]:
    with Store.open(path) as s:
        sids = []
        for i in range(n):
            sid = s.new_session(title=f"session {i}", root=f"/src/{i % 2}")
            for j in range(i + 1):
                s.append(sid, {"role": "user", "content": f"message {j} of {i}"})
            sids.append(sid)
        return sids


def test_the_index_is_made_on_the_first_listing_and_agrees_with_the_refs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    some_sessions(path)
    assert not index_path(path).exists()
    assert listed(path) == from_the_refs(path)
    assert index_path(path).exists()
    assert oct(index_path(path).stat().st_mode & 0o777) == "0o600"
    assert listed(path) == from_the_refs(path)  # and from the index


def test_every_kind_of_ref_update_shows_in_the_next_listing(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sids = some_sessions(path)
    listed(path)
    with Store.open(path) as s:
        s.append(sids[0], {"role": "assistant", "content": "one more"})
        s.set_title(sids[1], "renamed")
        s.archive(sids[2])
        s.delete(sids[3])
        fork = s.fork(sids[4])
        s.rewind(sids[4], f"{sids[4]}~2")
    for include_archived in (False, True):
        assert listed(path, include_archived) == from_the_refs(path, include_archived)
    rows = {r.id: r for r in listed(path, True)}
    assert rows[sids[0]].messages == 2 and rows[sids[1]].title == "renamed"
    assert rows[sids[2]].archived and sids[3] not in rows and fork in rows
    assert rows[sids[4]].messages == 3


def test_appends_right_after_a_listing_are_seen(tmp_path: Path) -> None:
    """Changes within the file system's timestamp granularity of the listing that made
    the index (the racy case of FORMAT.md 17) are seen."""
    path = tmp_path / "store"
    (sid,) = some_sessions(path, 1)
    with Store.open(path) as writer, Store.open(path) as reader:
        for i in range(200):
            writer.append(sid, {"role": "user", "content": f"quick {i}"})
            assert reader.sessions()[0].messages == i + 2


@pytest.mark.parametrize(
    "damage",
    ["truncated", "flipped", "empty", "garbage", "other version", "directory"],
)
def test_a_damaged_index_is_made_again(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "store"
    sids = some_sessions(path)
    listed(path)
    time.sleep(0.25)  # past the racy margin: the next index trusts every entry
    listed(path)
    idx = index_path(path)
    data = idx.read_bytes()
    if damage == "truncated":
        idx.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":
        at = data.index(b"session 3") + 8
        idx.write_bytes(data[:at] + b"9" + data[at + 1 :])  # "session 9": a lie
    elif damage == "empty":
        idx.write_bytes(b"")
    elif damage == "garbage":
        idx.write_bytes(os.urandom(5000))
    elif damage == "other version":
        import blake3

        body = data.replace(b'"version":1', b'"version":99').rpartition(b"\n")[0]
        body = body.rpartition(b"\n")[0] + b"\n"
        idx.write_bytes(body + blake3.blake3(body).hexdigest().encode() + b"\n")
    elif damage == "directory":
        idx.unlink()
        idx.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # silently: the index is only a cache
        rows = listed(path)
    assert rows == from_the_refs(path)
    assert {r.title for r in rows} == {f"session {i}" for i in range(len(sids))}
    if damage != "directory":
        assert listed(path) == from_the_refs(path)
        assert idx.read_bytes() != b"" and b"session 9" not in idx.read_bytes()


def test_an_older_index_put_back_is_not_believed(tmp_path: Path) -> None:
    """An index that names a state the refs have left (a backup restored, a copy
    taken mid-way) is checked against the refs, not trusted."""
    path = tmp_path / "store"
    sids = some_sessions(path)
    listed(path)
    time.sleep(0.25)  # past the racy margin: the index trusts every entry
    listed(path)
    old = index_path(path).read_bytes()
    with Store.open(path) as s:
        s.append(sids[1], {"role": "user", "content": "after the copy"})
        s.set_title(sids[2], "after the copy")
        s.delete(sids[3])
    listed(path)
    index_path(path).write_bytes(old)
    assert listed(path, True) == from_the_refs(path, True)


def test_a_damaged_ref_is_named_by_every_listing(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sids = some_sessions(path)
    (path / "refs" / "sessions" / sids[2]).write_bytes(b"{not json")
    for _ in range(3):  # made, then read from the index
        with pytest.warns(StoreWarning, match=f"ref sessions/{sids[2]} is unreadable"):
            rows = listed(path)
        assert {r.id for r in rows} == set(sids) - {sids[2]}
        time.sleep(0.15)


def test_sessions_made_in_a_batch_are_listed_inside_it(tmp_path: Path) -> None:
    path = tmp_path / "store"
    (old,) = some_sessions(path, 1)
    with Store.open(path) as s:
        s.sessions()
        with s.batch():
            new = s.new_session(title="staged")
            s.append(new, {"role": "user", "content": "in the batch"})
            s.set_title(old, "staged too")
            rows = {r.id: r for r in s.sessions()}
            assert rows[new].messages == 1 and rows[old].title == "staged too"
        assert {r.id: r for r in s.sessions()} == rows
    assert listed(path) == from_the_refs(path)


WRITER = """
import sys
from objstore import Store
s = Store.open(sys.argv[1])
sids = sys.argv[2:]
i = 0
while True:
    for sid in sids:
        s.append(sid, {"role": "user", "content": f"append {i}"})
    i += 1
    if i == 3:
        print("going", flush=True)
"""


def test_a_writer_killed_with_sigkill_leaves_a_listing_that_agrees(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sids = some_sessions(path, 4)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), *sids[:3]], stdout=subprocess.PIPE
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"going\n"
        with Store.open(path) as reader:
            for _ in range(20):  # listings while it writes keep the index busy
                reader.sessions()
                time.sleep(0.01)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    rows = listed(path)  # the open recovers the writer's pack first
    assert rows == from_the_refs(path)
    counts = {r.id: r.messages for r in rows}
    assert all(counts[sid] > 3 for sid in sids[:3])


def test_gc_dropping_archived_sessions_shows_in_the_listing(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sids = some_sessions(path)
    with Store.open(path) as s:
        s.archive(sids[0])
        s.archive(sids[1])
        assert len(s.sessions(include_archived=True)) == 5
        collect_garbage(s, archived_older_than=0)
        rows = s.sessions(include_archived=True)
    assert {r.id for r in rows} == set(sids[2:])
    assert listed(path, True) == from_the_refs(path, True)


def test_a_format_1_store_gets_its_index_and_lists_as_before(tmp_path: Path) -> None:
    path = tmp_path / "store"
    shutil.copytree(FORMAT1, path)
    for dirpath, _dirs, names in os.walk(path):  # as ags made it: git keeps no modes
        os.chmod(dirpath, 0o700)
        for name in names:
            os.chmod(os.path.join(dirpath, name), 0o600)
    want = from_the_refs(path, True)
    assert want and not index_path(path).exists()
    assert listed(path, True) == want
    assert index_path(path).exists()
    assert listed(path, True) == want


def test_a_link_in_place_of_the_cache_is_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "store"
    some_sessions(path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (path / "cache").rmdir() if (path / "cache").exists() else None
    (path / "cache").symlink_to(elsewhere)
    # Refused on open, as any folder of the layout that is a link (FORMAT.md 1)
    with pytest.raises(UnsafeStore, match="cache is a symbolic link"):
        Store.open(path, allow_shared=True)
    assert list(elsewhere.iterdir()) == []
