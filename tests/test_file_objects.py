"""File objects and a node's ``files`` (FORMAT.md 4.2, 4.3): what a tool changed in
the project, stored once, followed by gc, fsck, export and import like any link."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import blake3
import pytest
from conftest import flip_a_bit_of_object, tree_snapshot

from objstore import (
    BadExport,
    FileChange,
    InvalidInput,
    LimitExceeded,
    Store,
    StoreFormatError,
    check_store,
    collect_garbage,
    export_session,
    import_document,
    store_usage,
)
from objstore.canonical import dumps
from objstore.limits import MAX_FILES_PER_NODE


def marker_version(path: Path) -> int:
    return int(json.loads((path / "ags-store.json").read_bytes())["version"])


def file_id(data: bytes) -> str:
    return blake3.blake3(b"file\0" + data).hexdigest()


def age_packs(path: Path, seconds: float) -> None:
    for p in (path / "objects" / "pack").iterdir():
        st = p.stat()
        os.utime(p, (st.st_atime - seconds, st.st_mtime - seconds))


def session_with_edits(path: Path) -> tuple[str, str, str]:
    """A session whose tool results created, changed and deleted files; returns the
    session, the node that changed two files and the node that deleted one."""
    with Store.open(path) as s:
        sid = s.new_session(root=str(path.parent))
        s.append(sid, {"role": "user", "content": "edit"})
        s.append(
            sid,
            {"role": "tool", "tool_call_id": "c1", "name": "write_file", "content": "ok"},
            files={"src/a.py": (None, b"print(1)\n"), "b.bin": (b"\x00\xff", b"\x00\xfe")},
        )
        two = s.node_id(sid)
        s.append(
            sid,
            {"role": "tool", "tool_call_id": "c2", "name": "edit_file", "content": "ok"},
            files={"src/a.py": (b"print(1)\n", None)},
        )
        gone = s.node_id(sid)
    return sid, two, gone


def test_file_changes_are_read_back_with_their_bytes(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sid, two, gone = session_with_edits(path)
    with Store.open(path) as s:
        assert s.node(two).files == (
            FileChange("b.bin", file_id(b"\x00\xff"), file_id(b"\x00\xfe")),
            FileChange("src/a.py", None, file_id(b"print(1)\n")),
        )
        assert s.node(gone).files == (FileChange("src/a.py", file_id(b"print(1)\n"), None),)
        assert s.file_bytes(file_id(b"\x00\xfe")) == b"\x00\xfe"
        assert s.node(s.node_id(f"{sid}~2")).files == ()
        # Stored once: the same content on two nodes is one object.
        assert s.object_ids().count(file_id(b"print(1)\n")) == 1
        with pytest.raises(Exception, match="expected a file, found a blob"):
            s.file_bytes(s.node(two).content)
        assert check_store(s).ok


def test_the_store_marker_moves_to_3_with_the_first_file_object(tmp_path: Path) -> None:
    """An ags of store version 2 would not follow ``files`` links and its gc would
    sweep file objects: it must refuse a store that has them (FORMAT.md 2)."""
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        with s.batch():  # a batch journals no ref update, which would raise it to 4
            s.append(sid, {"role": "user", "content": "no files yet"})
        assert marker_version(path) == 2
        with s.batch():
            s.append(sid, {"role": "tool", "content": "x"}, files={"f": (None, b"x")})
        assert marker_version(path) == 3
    assert marker_version(path) == 6  # its pack sealed into blocks (FORMAT.md 5.5)
    (path / "ags-store.json").write_bytes(dumps({"format": "ags-store", "version": 7}) + b"\n")
    with pytest.raises(StoreFormatError, match="store format 7; this ags reads up to 6"):
        Store.open(path)


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"/etc/passwd": (None, b"x")}, "absolute"),
        ({"../outside": (None, b"x")}, "'..' part"),
        ({"a/../../b": (None, b"x")}, "'..' part"),
        ({"a//b": (None, b"x")}, "empty"),
        ({"./a": (None, b"x")}, "'.' or '..' part"),
        ({"": (None, b"x")}, "empty"),
        ({"a\0b": (None, b"x")}, "NUL"),
        ({"a" * 4097: (None, b"x")}, "over the limit"),
        ({"d/" + "n" * 256: (None, b"x")}, "over 255 bytes"),
        ({"a": (None, None)}, "did not change"),
        ({"a": (None, "text")}, "must be bytes"),
        ({"a": b"x"}, "(before, after) pair"),
        ({7: (None, b"x")}, "must be text"),
        ({f"f{i}": (None, b"x") for i in range(MAX_FILES_PER_NODE + 1)}, "over the limit"),
    ],
)
def test_bad_file_changes_are_refused_and_write_nothing(
    tmp_path: Path, files: dict, words: str
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": "hi"})
    before = tree_snapshot(path)
    with Store.open(path) as s, pytest.raises(InvalidInput, match=re.escape(words)) as caught:
        s.append(sid, {"role": "tool", "content": "x"}, files=files)
    assert tree_snapshot(path) == before
    if "over" in words:
        assert isinstance(caught.value, LimitExceeded)


def test_gc_keeps_reachable_file_objects_and_sweeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sid, _two, _gone = session_with_edits(path)
    with Store.open(path) as s:
        other = s.new_session()
        s.append(other, {"role": "tool", "content": "x"}, files={"only/here": (None, b"lonely")})
        s.purge(other)  # gone with its reflog: nothing reaches it
    age_packs(path, 7200)
    with Store.open(path) as s:
        report = collect_garbage(s, grace=600)
        left = set(s.object_ids())
        assert file_id(b"lonely") not in left
        assert report.objects_swept >= 3  # the node, its message, the file
        for data in (b"print(1)\n", b"\x00\xff", b"\x00\xfe"):
            assert s.file_bytes(file_id(data)) == data
        assert check_store(s).ok


def test_fsck_names_a_missing_and_a_damaged_file_object(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sid, two, _gone = session_with_edits(path)
    flip_a_bit_of_object(path, file_id(b"\x00\xfe"))
    with Store.open(path) as s:
        missing = file_id(b"never stored")
        node = json.loads(s.raw_object(two)[1])
        node["files"]["c.txt"] = {"before": missing}
        node["parent"] = two
        orphan = s.put_raw("node", dumps(node))
        s.tag("orphan", orphan)
        text = "\n".join(str(p) for p in check_store(s).problems)
    damaged = file_id(b"\x00\xfe")
    assert f"{damaged}: is corrupt: its content does not hash to its id" in text
    assert f'{orphan}: files["c.txt"].before names missing {missing}' in text


def test_a_node_whose_files_break_the_format_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sid, two, _gone = session_with_edits(path)
    with Store.open(path) as s:
        node = json.loads(s.raw_object(two)[1])
        node["files"] = {"../x": {"after": file_id(b"\x00\xfe")}}
        bad = s.put_raw("node", dumps(node))
        with pytest.raises(Exception, match="not a valid node"):
            s.node(bad)
        s.tag("bad", two)  # fsck still names it among the objects
        assert any(p.where == bad for p in check_store(s).problems)


def test_export_holds_files_in_base64_and_imports_them_again(tmp_path: Path) -> None:
    sid, two, _gone = session_with_edits(tmp_path / "a")
    with Store.open(tmp_path / "a") as s:
        doc = export_session(s, sid)
    assert doc["version"] == 2
    files = {o["id"]: o for o in doc["objects"] if o["kind"] == "file"}
    assert set(files) == {file_id(b"print(1)\n"), file_id(b"\x00\xff"), file_id(b"\x00\xfe")}
    assert base64.b64decode(files[file_id(b"\x00\xfe")]["data"]) == b"\x00\xfe"
    assert "body" not in files[file_id(b"\x00\xfe")]
    text = json.dumps(doc)
    with Store.open(tmp_path / "b") as other:
        result = import_document(other, json.loads(text))
        assert result.action == "created"
        assert other.node(two).files == Store.open(tmp_path / "a").node(two).files
        assert other.file_bytes(file_id(b"\x00\xff")) == b"\x00\xff"
        assert check_store(other).ok
        assert marker_version(tmp_path / "b") == 3  # before its pack is sealed into blocks


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("altered bytes", "does not match its id"),
        ("not base64", "data"),
        ("missing file", "which is not in the file"),
        ("a blob named as a file", "names a blob, not a file"),
        ("version 1 with files", "needs export version 2"),
    ],
)
def test_a_bad_file_in_an_export_is_refused_and_changes_nothing(
    tmp_path: Path, change: str, words: str
) -> None:
    sid, two, _gone = session_with_edits(tmp_path / "a")
    with Store.open(tmp_path / "a") as s:
        doc = export_session(s, sid)
    target = file_id(b"\x00\xfe")
    at = next(i for i, o in enumerate(doc["objects"]) if o["id"] == target)
    if change == "altered bytes":
        doc["objects"][at]["data"] = base64.b64encode(b"\x00\xfd").decode()
    elif change == "not base64":
        doc["objects"][at]["data"] = "!!!"
    elif change == "missing file":
        del doc["objects"][at]
    elif change == "a blob named as a file":
        blob = {"role": "user", "content": "x"}
        blob_id = blake3.blake3(b"blob\0" + dumps(blob)).hexdigest()
        doc["objects"][at] = {"id": blob_id, "kind": "blob", "body": blob}
        for o in doc["objects"]:
            if o["id"] == two:
                o["body"]["files"]["b.bin"]["after"] = blob_id
                o["id"] = blake3.blake3(b"node\0" + dumps(o["body"])).hexdigest()
                new_two = o["id"]
        for o in doc["objects"]:  # the child names the changed node
            if o["kind"] == "node" and o["body"]["parent"] == two:
                o["body"]["parent"] = new_two
                o["id"] = blake3.blake3(b"node\0" + dumps(o["body"])).hexdigest()
                doc["head"] = o["id"]
    else:
        doc["version"] = 1
    Store.open(tmp_path / "b").close()
    before = tree_snapshot(tmp_path / "b")
    with Store.open(tmp_path / "b") as other, pytest.raises(BadExport, match=words):
        import_document(other, doc)
    assert tree_snapshot(tmp_path / "b") == before


def test_a_version_1_export_still_imports(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a") as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": "from before files"})
        doc = export_session(s, sid)
    doc["version"] = 1
    with Store.open(tmp_path / "b") as other:
        assert import_document(other, doc).action == "created"
        assert other.context(sid) == [{"role": "user", "content": "from before files"}]
        assert marker_version(tmp_path / "b") == 2  # before its pack is sealed into blocks


def test_du_counts_file_objects_once_per_session_that_reaches_them(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        big = os.urandom(50_000)  # does not compress: its size shows
        s.append(sid, {"role": "tool", "content": "x"}, files={"big.bin": (None, big)})
        s.fork(sid)
        usage = store_usage(s)
    # Two sessions reach everything once each: logical is twice unique.
    assert usage.unique_bytes > 50_000
    assert usage.logical_bytes == 2 * usage.unique_bytes
