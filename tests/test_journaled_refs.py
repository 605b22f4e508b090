"""An append writes no ref file: the record in its writer's pack is the session's
head until that pack is sealed (FORMAT.md 9). Every reader sees the newer of
the ref file and the live packs' journals; sealing brings the file up to date
and never moves it back, nor brings back a deleted session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from objstore import Store, UnknownSpec, object_store, repack
from objstore.gc import collect_garbage
from objstore.pack_format import scan_buffer


def ref_file(path: Path, sid: str) -> dict[str, object]:
    return json.loads((path / "refs" / "sessions" / sid).read_bytes())


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def marker_version(path: Path) -> int:
    return int(json.loads((path / "ags-store.json").read_bytes())["version"])


def test_an_append_writes_no_ref_file_and_every_reader_sees_it(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session(title="live")
    assert marker_version(path) == 2
    created = (path / "refs" / "sessions" / sid).stat()
    with Store.open(path) as writer:
        heads = [writer.append(sid, user(f"m{i}")) for i in range(5)]
        # an ags of store version 3 would read the stale file: it must refuse the store
        assert marker_version(path) == 4
        assert (path / "refs" / "sessions" / sid).stat().st_ino == created.st_ino
        assert ref_file(path, sid)["target"] is None, "the file still holds the creation"
        with Store.open(path) as reader:  # another handle: from the writer's journal
            info = reader.session(sid)
            assert (info.head, info.messages) == (heads[-1], 5)
            (listed,) = reader.sessions()
            assert (listed.head, listed.messages) == (heads[-1], 5)
            assert [m["content"] for m in reader.context(sid)] == [f"m{i}" for i in range(5)]
            assert reader.node_id(f"{sid}~1") == heads[-2]
            assert reader.journaled_sessions() == {sid}
        heads.append(writer.compact(sid, "so far", keep=1))
        assert writer.session(sid).head == heads[-1]
    body = ref_file(path, sid)  # sealed: the file caught up, in one write
    assert (body["target"], body["generation"]) == (heads[-1], 7)
    with Store.open(path) as reader:
        assert reader.journaled_sessions() == set()
        assert reader.session(sid).head == heads[-1]


def test_a_second_writer_goes_on_from_the_head_in_the_first_ones_journal(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
    one, two = Store.open(path), Store.open(path)
    try:
        first = one.append(sid, user("by one"))
        one.release(sid)
        second = two.append(sid, user("by two"))  # its parent is in one's journal only
        assert two.node(second).parent == first
        one.close()  # seals: the file moves to one's head...
        assert ref_file(path, sid)["target"] == first
        with Store.open(path) as reader:  # ...and two's journal is still newer
            assert reader.session(sid).head == second
        third = two.append(sid, user("two again"))
    finally:
        one.close()
        two.close()
    assert ref_file(path, sid)["target"] == third
    with Store.open(path) as store:
        assert [m["content"] for m in store.context(sid)] == ["by one", "by two", "two again"]


def test_a_pack_sealed_after_its_session_was_deleted_does_not_bring_it_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
    writer = Store.open(path)
    try:
        head = writer.append(sid, user("soon gone"))
        writer.release(sid)
        with Store.open(path) as other:
            assert other.session(sid).head == head
            other.delete(sid)
            last = other.reflog(f"sessions/{sid}")[-1]
            assert (last.old, last.new, last.gen) == (head, None, 3)
    finally:
        writer.close()
    assert not (path / "refs" / "sessions" / sid).exists()
    with Store.open(path) as store:
        with pytest.raises(UnknownSpec):
            store.session(sid)
        assert store.sessions(include_archived=True) == []


def test_a_pack_that_fills_up_writes_the_ref_files_when_it_is_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(object_store, "MAX_PACK_BYTES", 2048)  # a seal every few appends
    monkeypatch.setattr(repack, "MAX_PACKS", 1000)  # no merge beside the appends: each seal counts
    path = tmp_path / "store"
    with Store.open(path) as store:
        a, b = store.new_session(), store.new_session()
        heads = {}
        sealed, i = 0, 0
        while sealed < 3:  # the first seal waits for the seal helper to start (~0.1 s)
            for sid in (a, b):
                heads[sid] = store.append(sid, user(f"{sid} {i} " + "x" * 100))
            with Store.open(path) as reader:
                assert {s: reader.session(s).head for s in (a, b)} == heads
            sealed = len(list((path / "objects" / "pack").glob("*.idx")))
            i += 1
            assert i < 10_000, "no pack was sealed"
        # the files are at most one pack behind the journal, never ahead of it
        for sid in (a, b):
            assert ref_file(path, sid)["generation"] <= store.read_ref(f"sessions/{sid}").generation
    for sid in (a, b):
        assert ref_file(path, sid)["target"] == heads[sid]


def test_gc_beside_a_live_writer_keeps_what_its_journal_reaches(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
    with Store.open(path) as writer:
        heads = [writer.append(sid, user(f"m{i}")) for i in range(3)]
        with Store.open(path) as gc_handle:
            assert heads[-1] in gc_handle.roots()
            collect_garbage(gc_handle, grace=600)
        assert [m["content"] for m in writer.context(sid)] == ["m0", "m1", "m2"]
    with Store.open(path) as store:
        assert store.session(sid).head == heads[-1]


def test_a_journal_record_that_does_not_verify_is_no_value(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
    writer = Store.open(path)
    try:
        heads = [writer.append(sid, user(f"m{i}")) for i in range(3)]
        pack = writer.objects._writer.path  # type: ignore[union-attr]
        scan = scan_buffer(pack.read_bytes()[8:], 8)
        (off, length) = scan.refs[-1][1]
        data = bytearray(pack.read_bytes())
        data[off + length - 1] ^= 0xFF  # the last append's record, as a torn write leaves it
        pack.write_bytes(bytes(data))
        with Store.open(path) as reader:  # the pack is locked: read, not recovered
            assert reader.session(sid).head == heads[-2]
            assert reader.session(sid).messages == 2
    finally:
        writer.close()  # its seal writes the head it acknowledged, from its own memory
    with Store.open(path) as store:
        assert store.session(sid).head == heads[-1]


def test_a_title_another_process_sets_between_appends_is_kept(tmp_path: Path) -> None:
    """The writer reads the ref file again only when an lstat says it was replaced
    (refs.RefStore._read_pinned): each retitle, even to a title of the same length
    in the same clock tick, must be seen by the next append and kept."""
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session(title="t000")
    script = (
        "import sys\nfrom objstore import Store\n"
        "with Store.open(sys.argv[1]) as s:\n"
        "    for line in sys.stdin:\n"
        "        s.set_title(sys.argv[2], line.strip())\n"
        "        print('ok', flush=True)\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", script, str(path), sid],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert other.stdin is not None and other.stdout is not None
    try:
        with Store.open(path) as writer:
            writer.append(sid, user("first"))
            for i in range(1, 40):
                title = f"t{i:03d}"  # the same length: the same file size every time
                other.stdin.write(title + "\n")
                other.stdin.flush()
                assert other.stdout.readline() == "ok\n"
                writer.append(sid, user(f"m{i}"))
                info = writer.session(sid)
                assert (info.title, info.messages) == (title, i + 1)
    finally:
        other.stdin.close()
        other.wait(timeout=60)
    with Store.open(path) as reader:
        assert (reader.session(sid).title, reader.session(sid).messages) == ("t039", 40)
