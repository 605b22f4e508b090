"""A damaged store must not stop everything: one bad file is named, the rest works.

Each test damages one real file of a real store the way a disk, a crash of an
older ags or a careless hand would, then runs the library and the CLI over
it: derived data (a pack index) is rebuilt and that is said on stderr; a
damaged ref is named and every other session still listed; fsck names every
problem and goes on; no traceback anywhere.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import as_user_without_overrides

from cli.main import cli
from objstore import Store, StoreFormatError, StoreWarning
from objstore.fsck import check_store
from objstore.gc import collect_garbage
from objstore.pack_format import PACK_MAGIC, RECORD_HEAD, scan_buffer


def ags(path: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", str(path), *args])
    assert "Traceback" not in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


DIE_AFTER_APPEND = """
import os, sys
from objstore import Store
s = Store.open(sys.argv[1])
s.append(sys.argv[2], {"role": "user", "content": "journaled"})
os._exit(0)
"""


def three_sessions(path: Path) -> list[str]:
    """A store with three sessions of a few messages each, all in sealed packs."""
    sids = []
    with Store.open(path) as s:
        for name in ("alpha", "beta", "gamma"):
            sid = s.new_session(title=name)
            for i in range(3):
                s.append(sid, {"role": "user", "content": f"{name} message {i}"})
            s.set_title(sid, name.upper())  # a reflog line: appends write none
            sids.append(sid)
    return sids


def packs(path: Path) -> list[Path]:
    return sorted((path / "objects" / "pack").glob("*.pack"))


def loose_but(path: Path, missing: str) -> None:
    """Every object of the store again, as loose files, but ``missing``; no packs."""
    with Store.open(path) as s:
        kept = {oid: s.objects.get(oid) for oid in s.objects.ids() if oid != missing}
    for pack in packs(path):
        pack.unlink()
        pack.with_suffix(".idx").unlink()
    with Store.open(path) as s:
        for oid, (kind, body) in kept.items():
            assert s.objects.put(kind, body, pack=False) == oid


def fsck_problems(path: Path) -> list[str]:
    with Store.open(path) as s:
        return [str(p) for p in check_store(s).problems]


# -- pack indexes: derived data, rebuilt ----------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "fanout"])
def test_a_damaged_pack_index_is_rebuilt_and_said_so(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "store"
    sids = three_sessions(path)
    (pack,) = packs(path)
    idx = pack.with_suffix(".idx")
    good = idx.read_bytes()
    if damage == "truncated":
        idx.write_bytes(good[: len(good) // 2])
    elif damage == "empty":
        idx.write_bytes(b"")
    elif damage == "garbage":
        idx.write_bytes(secrets.token_bytes(len(good)))
    else:  # the right length and magic, a fanout that goes down
        data = bytearray(good)
        data[24:28] = (0xFFFF).to_bytes(4, "little")
        idx.write_bytes(bytes(data))
    code, out, err = ags(path, "sessions")
    assert code == 0
    assert all(sid[:8] in out for sid in sids)
    assert f"ags: warning: pack index {idx.name}" in err
    assert "rebuilt it from the pack (an index is derived data)" in err
    assert idx.read_bytes() == good, "the rebuilt index is the one the writer wrote"
    code, _out, err = ags(path, "log", sids[1])
    assert (code, err) == (0, "")  # nothing to say any more
    assert fsck_problems(path) == []


def test_a_flipped_bit_in_an_index_is_named_by_fsck(tmp_path: Path) -> None:
    path = tmp_path / "store"
    three_sessions(path)
    (pack,) = packs(path)
    idx = pack.with_suffix(".idx")
    data = bytearray(idx.read_bytes())
    data[-40] ^= 0x10  # inside the last entry's length
    idx.write_bytes(bytes(data))
    assert f"{pack.name}: index checksum does not match" in fsck_problems(path)


# -- packs a crash of an older ags, or damage, left behind -----------------------------


@pytest.mark.parametrize("content", [b"", b"AGSP", b"\0" * 8, b"\0" * 5000])
def test_a_header_less_pack_holding_nothing_is_removed(tmp_path: Path, content: bytes) -> None:
    """What a power loss left of a pack whose writer never synced (issue 9, High 4)."""
    path = tmp_path / "store"
    sids = three_sessions(path)
    empty = path / "objects" / "pack" / f"pack-{secrets.token_hex(16)}.pack"
    empty.write_bytes(content)
    code, out, err = ags(path, "sessions")
    assert (code, err) == (0, "")
    assert all(sid[:8] in out for sid in sids)
    assert not empty.exists()
    code, _out, _err = ags(path, "fsck")
    assert code == 0


def test_a_pack_with_a_damaged_header_is_left_alone_and_named(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sids = three_sessions(path)
    (pack,) = packs(path)
    pack.with_suffix(".idx").unlink()  # unsealed, so recovery looks at it
    data = bytearray(pack.read_bytes())
    data[:8] = b"GARBAGE!"
    pack.write_bytes(bytes(data))
    with pytest.warns(StoreWarning, match="damaged header"), Store.open(path) as s:
        sid = s.new_session(title="after")
        s.append(sid, {"role": "user", "content": "still works"})
    code, out, err = ags(path, "sessions")
    assert code == 0
    assert f"pack {pack.name} has a damaged header; it is left as it is (ags fsck)" in err
    assert "after" in out and all(s[:8] in out for s in sids)  # listing needs no objects
    assert pack.read_bytes()[:8] == b"GARBAGE!", "nothing readable is destroyed"
    with pytest.warns(StoreWarning):
        problems = fsck_problems(path)
    assert f"{pack.name}: pack {pack.name} has a damaged header" in problems
    code, _out, err = ags(path, "log", sids[0])
    assert code == 1 and "is missing" in err  # its objects are in the damaged pack


def test_a_damaged_ref_update_record_is_named_by_fsck(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
    # A writer that dies keeps its pack as written, journal included (a pack its
    # writer seals is compressed into blocks, without its journal: FORMAT.md 5.5).
    subprocess.run([sys.executable, "-c", DIE_AFTER_APPEND, str(path), sid], check=True)
    with Store.open(path):
        pass  # recovery seals it as it is
    (pack,) = packs(path)
    data = bytearray(pack.read_bytes())
    (ref_at,) = scan_buffer(data, 0, len(PACK_MAGIC)).ref_starts  # the ref-update record
    data[ref_at + RECORD_HEAD.size + 5] ^= 0x01
    pack.write_bytes(bytes(data))
    problems = fsck_problems(path)
    assert any(
        p.startswith(f"{pack.name}: ref-update record at offset {ref_at} is damaged")
        for p in problems
    ), problems


# -- refs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"garbage\n",
        b'{"generation":1}\n',
        b"[1,2]\n",
        b'{"generation":"x","target":null}\n',
        b'{"generation":1,"meta":{},"target":["a","list"]}\n',
    ],
    ids=["empty", "garbage", "no-target", "a-list", "generation-not-a-number", "target-a-list"],
)
def test_one_unreadable_ref_does_not_hide_the_others(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "store"
    good_a, bad, good_b = three_sessions(path)
    (path / "refs" / "sessions" / bad).write_bytes(content)
    code, out, err = ags(path, "sessions")
    assert code == 0
    assert good_a[:8] in out and good_b[:8] in out and bad[:8] not in out
    assert f"ags: warning: ref sessions/{bad} is unreadable; left out (ags fsck)" in err
    code, out, err = ags(path, "sessions", "--json")
    assert {row["id"] for row in json.loads(out)} == {good_a, good_b}
    code, _out, err = ags(path, "info", bad)
    assert code == 1 and err == f"ags: ref sessions/{bad} is unreadable\n"
    code, out, _err = ags(path, "log", good_b)
    assert code == 0 and "gamma message 2" in out
    code, out, _err = ags(path, "fsck")
    assert code == 1
    assert f"sessions/{bad}: ref sessions/{bad} is unreadable" in out
    code, out, _err = ags(path, "search", "message")
    assert code == 0 and "alpha [message] 1" in out


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("messages", "lots", "meta.messages is 'lots', not a count"),
        ("messages", -3, "meta.messages is -3, not a count"),
        ("title", 17, "meta.title is 17"),
        ("archived_at", ["x"], "meta.archived_at is ['x']"),
    ],
)
def test_damaged_session_metadata_is_named_not_a_traceback(
    tmp_path: Path, field: str, value: object, shown: str
) -> None:
    path = tmp_path / "store"
    good_a, bad, good_b = three_sessions(path)
    ref = path / "refs" / "sessions" / bad
    body = json.loads(ref.read_bytes())
    body["meta"][field] = value
    ref.write_text(json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n")
    code, out, err = ags(path, "sessions")
    assert code == 0 and good_a[:8] in out and good_b[:8] in out
    assert f"ref sessions/{bad} is damaged: {shown}" in err
    code, _out, err = ags(path, "info", bad)
    assert code == 1 and f"ref sessions/{bad} is damaged: {shown}" in err
    code, _out, err = ags(path, "run", "--help")  # (a command that does not read it)
    assert code == 0
    with Store.open(path) as s, pytest.raises(StoreFormatError, match="is damaged"):
        s.append(bad, {"role": "user", "content": "x"})
    assert any(f"sessions/{bad}: ref sessions/{bad} is damaged" in p for p in fsck_problems(path))


def test_a_deleted_ref_file_whose_reflog_lives_on_is_named_by_fsck(tmp_path: Path) -> None:
    path = tmp_path / "store"
    a, b, _c = three_sessions(path)
    with Store.open(path) as s:
        s.delete(a)  # deleted properly: the reflog ends with the delete
    assert fsck_problems(path) == []
    (path / "refs" / "sessions" / b).unlink()  # deleted by hand
    (problem,) = fsck_problems(path)
    assert problem.startswith(f"sessions/{b}: the ref file is missing, but its reflog says")


def test_a_damaged_reflog_line_is_named_by_fsck(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _a, b, _c = three_sessions(path)
    with Store.open(path) as s:
        s.set_title(b, "beta, again")
    log = path / "logs" / "sessions" / b
    lines = log.read_bytes().split(b"\n")
    lines[1] = b"{not json"
    log.write_bytes(b"\n".join(lines))
    assert f"reflog sessions/{b}: line 2 is damaged" in fsck_problems(path)


def test_fsck_names_every_problem_and_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "store"
    a, b, c = three_sessions(path)
    with Store.open(path) as s:
        d = s.new_session(title="delta")
        s.append(d, {"role": "user", "content": "delta"})
        s.tag("mark", a)
    (path / "refs" / "sessions" / a).write_bytes(b"")
    ref_b = path / "refs" / "sessions" / b
    body = json.loads(ref_b.read_bytes())
    body["meta"]["messages"] = "many"
    ref_b.write_text(json.dumps(body))
    (path / "refs" / "sessions" / c).unlink()
    (path / "refs" / "sessions" / "not-a-session").write_bytes(b"{}")
    (path / "refs" / "tags" / "mark").write_bytes(b"\0\0\0")
    first = packs(path)[0]
    first.with_suffix(".idx").write_bytes(b"short")
    with pytest.warns(StoreWarning, match="rebuilt it from the pack"), Store.open(path) as s:
        report = check_store(s)
    text = "\n".join(str(p) for p in report.problems)
    assert f"sessions/{a}: ref sessions/{a} is unreadable" in text
    assert f"sessions/{b}: ref sessions/{b} is damaged: meta.messages is 'many'" in text
    assert f"sessions/{c}: the ref file is missing" in text
    assert "sessions/not-a-session: not a session id: 'not-a-session'" in text
    assert "tags/mark: ref tags/mark is unreadable" in text
    assert len(report.problems) == 5, text
    assert report.objects > 0 and report.refs == 5  # c is gone
    code, out, _err = ags(path, "sessions")
    assert code == 0 and d[:8] in out


def test_gc_refuses_to_sweep_past_a_damaged_ref(tmp_path: Path) -> None:
    path = tmp_path / "store"
    a, _b, _c = three_sessions(path)
    (path / "refs" / "sessions" / a).write_bytes(b"garbage")
    before = {p.name for p in packs(path)}
    with (
        Store.open(path) as s,
        pytest.raises(StoreFormatError, match="gc stopped before changing anything"),
    ):
        collect_garbage(s, grace=600)
    assert {p.name for p in packs(path)} == before
    code, _out, err = ags(path, "gc")
    assert code == 1
    assert f"gc stopped before changing anything: ref sessions/{a} is unreadable" in err


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_gc_refuses_to_sweep_past_a_node_it_cannot_read(tmp_path: Path, damage: str) -> None:
    """A node in the middle of a history that cannot be read hides its parent: were it
    only kept, everything before it would look unreachable and be swept (it was: a
    session lost its intact older messages to one flipped byte). gc stops instead,
    and the history before the damage stays readable."""
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session(title="damaged")
        ids = [s.append(sid, {"role": "user", "content": f"message {i}"}) for i in range(6)]
    broken = ids[3]
    loose_but(path, broken)  # then aged, older than any grace
    if damage == "corrupt":
        loose = path / "objects" / broken[:2] / broken[2:]
        loose.parent.mkdir(exist_ok=True)
        loose.write_bytes(b"not a zstd frame")
    hours_ago = time.time() - 3 * 3600
    loose_files = sorted(p for p in (path / "objects").glob("??/*"))
    for file in loose_files:
        os.utime(file, (hours_ago, hours_ago))
    for run in ({"dry_run": True}, {}):
        with (
            Store.open(path) as s,
            pytest.raises(StoreFormatError, match="gc stopped before sweeping anything"),
        ):
            collect_garbage(s, grace=600, **run)
    code, _out, err = ags(path, "gc", "--grace", "10m")
    assert code == 1
    assert f"gc stopped before sweeping anything: object {broken} is {damage}" in err
    assert sorted(p for p in (path / "objects").glob("??/*")) == loose_files
    with Store.open(path) as s:
        assert s.node(ids[2]).parent == ids[1]  # the history before the damage
        assert s.blob(s.node(ids[0]).content) == {"role": "user", "content": "message 0"}


def test_a_folder_of_refs_that_cannot_be_read_is_named_not_skipped(tmp_path: Path) -> None:
    """fsck passed a store whose refs/sessions it could not list (it saw no sessions),
    log said no session matched, and gc would have swept what they reach."""
    path = tmp_path / "store"
    a, _b, _c = three_sessions(path)
    folder = path / "refs" / "sessions"
    before = sorted(p.name for p in packs(path))
    os.chmod(folder, 0)
    try:
        for command in (["fsck"], ["log", a[:8]], ["gc", "--grace", "10m"]):
            done = as_user_without_overrides(
                [sys.executable, "-m", "cli.main", "--store", str(path), *command]
            )
            assert done.returncode == 1, (command, done.stdout, done.stderr)
            assert f"{folder} cannot be read (Permission denied)" in done.stderr, done.stderr
            assert "Traceback" not in done.stderr
    finally:
        os.chmod(folder, 0o700)
    assert sorted(p.name for p in packs(path)) == before
    assert fsck_problems(path) == []


def test_a_stray_file_among_refs_does_not_stop_gc(tmp_path: Path) -> None:
    path = tmp_path / "store"
    three_sessions(path)
    (path / "refs" / "sessions" / "notes.txt").write_text("mine")
    with Store.open(path) as s:
        collect_garbage(s, grace=600)
    assert os.path.exists(path / "refs" / "sessions" / "notes.txt")


# -- loose objects, and reports over the whole store -------------------------------------


def test_stray_files_among_loose_objects_do_not_stop_fsck(tmp_path: Path) -> None:
    path = tmp_path / "store"
    three_sessions(path)
    (path / "objects" / "ab").mkdir()
    (path / "objects" / "ab" / ("Z" * 62)).write_text("not an object")
    (path / "objects" / "zz").mkdir()
    (path / "objects" / "zz" / ("0" * 62)).write_text("not an object either")
    assert fsck_problems(path) == []
    code, _out, _err = ags(path, "gc")
    assert code == 0


def test_a_loose_object_that_is_not_a_file_is_named_by_fsck(tmp_path: Path) -> None:
    path = tmp_path / "store"
    three_sessions(path)
    oid = "ab" + "0" * 62
    (path / "objects" / "ab" / oid[2:]).mkdir(parents=True)
    assert f"{oid}: is corrupt: its loose file is a directory" in fsck_problems(path)


def test_a_pack_cut_short_is_named_and_every_command_goes_on(tmp_path: Path) -> None:
    """A pack shorter than its index says (a disk that lost its tail): its blocks past
    the end read as corrupt, the commands that sum sizes or sweep go on, and fsck names
    it. Before, the index's offsets past the end raised struct.error out of du, info
    and gc."""
    path = tmp_path / "store"
    sids = three_sessions(path)
    (pack,) = packs(path)
    with open(pack, "r+b") as f:
        f.truncate(pack.stat().st_size // 3)
    for command in (["du"], ["info", sids[0]], ["gc"], ["log", sids[2]], ["ls"]):
        code, _out, err = ags(path, *command)
        assert code in (0, 1), (command, err)
    code, out, _err = ags(path, "fsck")
    assert code == 1 and "index covers" in out


def test_du_reports_the_store_and_names_a_session_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "store"
    a, _b, _c = three_sessions(path)
    with Store.open(path) as s:
        damaged = s.new_session(title="damaged")
        node_id = s.append(damaged, {"role": "user", "content": "will be lost"})
        s.append(damaged, {"role": "user", "content": "after"})
    loose_but(path, node_id)  # the first node of "damaged"
    code, out, err = ags(path, "du")
    assert code == 0 and "sessions: 4" in out
    assert f"ags: warning: session {damaged}: object {node_id} is missing" in err
    code, out, _err = ags(path, "log", a)
    assert code == 0 and "alpha message 0" in out


def test_a_removed_tmp_directory_is_made_again(tmp_path: Path) -> None:
    path = tmp_path / "store"
    a, _b, _c = three_sessions(path)
    os.rmdir(path / "tmp")
    code, _out, err = ags(path, "title", a, "renamed")
    assert (code, err) == (0, "")
    with Store.open(path) as s:
        s.append(a, {"role": "user", "content": "after"})
    assert (path / "tmp").is_dir()
    assert fsck_problems(path) == []


def test_a_tag_file_that_is_no_tag_name_is_left_out_of_tags(tmp_path: Path) -> None:
    path = tmp_path / "store"
    a, _b, _c = three_sessions(path)
    with Store.open(path) as s:
        s.tag("good", a)
    (path / "refs" / "tags" / ".hidden").write_text("{}")
    code, out, err = ags(path, "tags")
    assert code == 0 and "good" in out
    assert "bad tag name '.hidden'" in err
