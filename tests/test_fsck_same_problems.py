"""fsck reads a store in parts, side by side in worker processes: it must list exactly
the problems a read of one object after another lists, whichever way it runs.

One multi-pack store gets one of each kind of damage: an object whose content does
not hash to its id, blobs a read refuses (bad JSON, nested too deep), an object of
an unknown kind, nodes that do not parse, links to missing objects and to objects
of the wrong kind, a span that does not match its chain, a block whose frame is
damaged, an index entry pointing past its pack, and a ref naming a missing node.
The problems expected here are those the fsck that read one object after another
listed for this store (it listed the same 360, one by one, but for the index
entry past the end, on which it stopped with a traceback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import blake3
import pytest
from hand_packs import blob_object, node_object, object_id, write_pack

from objstore import Store, canonical, check_store
from objstore.limits import check_json_text
from objstore.nodes import Span, node_body


def _damaged_store(path: Path, index_past_end: bool = True) -> dict[str, object]:
    """The store, and what the test needs to know of it."""
    with Store.open(path) as s, s.batch():
        a = s.new_session(title="a")
        for i in range(40):  # spans at 16 and 32
            s.append(a, {"role": "user", "content": f"a {i} " + "x" * 300})
    with Store.open(path) as s, s.batch():
        b = s.new_session(title="b")
        for i in range(300):
            s.append(b, {"role": "assistant", "content": f"b {i} " + os.urandom(200).hex()})
        s.tag("mark", b)
    with Store.open(path) as s:
        real = list(s.log(a))[3].node  # a message node deep in a's chain
        real_node, message_of_real = real.id, real.content
        sealed = sorted(s.objects.sealed_packs(), key=lambda p: p.path.stat().st_mtime)
        assert len(sealed) == 2
        first_pack, second_pack = sealed[0].path, sealed[1].path
    missing = "ab" * 32
    ok_blob, ok_blob_content = blob_object({"role": "user", "content": "fine"})
    tampered = blob_object({"role": "user", "content": "before"})[0], b'blob\0{"content":"after"}'
    bad_json = object_id("blob", b"{not json"), b"blob\0{not json"
    deep_body = b"[" * 101 + b"]" * 101
    too_deep = object_id("blob", deep_body), b"blob\0" + deep_body
    odd_kind = object_id("thing", b"x"), b"thing\0x"
    file_body = os.urandom(64)
    a_file = object_id("file", file_body), b"file\0" + file_body
    orphan = node_object(node_body("message", missing, ok_blob, None, 1, {}))
    wrong_kind = node_object(node_body("message", None, real_node, None, 1, {}))
    not_a_node = node_object(b'{"type":"message"}')
    files_node = node_object(
        canonical.dumps(
            {
                "type": "message",
                "parent": None,
                "state": None,
                "messages": 1,
                "meta": {},
                "message": ok_blob,
                "files": {"a.txt": {"after": a_file[0]}, "b.txt": {"before": missing}},
            }
        )
    )
    bad_span = node_object(
        node_body(
            "message", real_node, ok_blob, None, 5, {}, span=Span(None, (ok_blob, message_of_real))
        )
    )
    contents = [
        (ok_blob, ok_blob_content), tampered, bad_json, too_deep, odd_kind, a_file,
        orphan, wrong_kind, not_a_node, files_node, bad_span,
    ]  # fmt: skip
    third = write_pack(path, contents)
    # A damaged frame: one byte flipped in the middle of the second pack's first block.
    data = bytearray(second_pack.read_bytes())
    data[200] ^= 0x55
    second_pack.write_bytes(bytes(data))
    if index_past_end:  # the first pack's last index entry points past its end
        idx = first_pack.with_suffix(".idx")
        raw = bytearray(idx.read_bytes())
        last = len(raw) - 32 - 48
        raw[last + 32 : last + 40] = (1 << 40).to_bytes(8, "little")
        raw[-32:] = blake3.blake3(bytes(raw[:-32])).digest()
        idx.write_bytes(bytes(raw))
    (path / "refs" / "tags" / "mark").write_text(json.dumps({"generation": 1, "target": missing}))
    return {
        "missing": missing,
        "tampered": tampered[0],
        "bad_json": bad_json[0],
        "too_deep": too_deep[0],
        "odd_kind": odd_kind[0],
        "orphan": orphan[0],
        "wrong_kind": wrong_kind[0],
        "not_a_node": not_a_node[0],
        "files_node": files_node[0],
        "bad_span": bad_span[0],
        "first": first_pack.name,
        "second": second_pack.name,
        "third": third.name,
    }


def _expected(known: dict[str, object]) -> set[str]:
    k = known
    try:
        check_json_text(b"{not json")
    except ValueError as e:
        json_error = str(e)
    return {
        f"{k['tampered']}: is corrupt: its content does not hash to its id",
        f"{k['bad_json']}: is not a blob ags can read: {json_error}",
        f"{k['too_deep']}: is not a blob ags can read: nested deeper than 100 levels, the limit",
        f"{k['odd_kind']}: is corrupt: unknown kind 'thing'",
        f"{k['orphan']}: parent names missing {k['missing']}",
        f"{k['wrong_kind']}: message names a node, not a blob",
        f"{k['not_a_node']}: is corrupt: not a valid node ('message')",
        f'{k["files_node"]}: files["b.txt"].before names missing {k["missing"]}',
        f"{k['bad_span']}: span does not match the messages before it",
        f"tags/mark: names missing node {k['missing']}",
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_fsck_lists_the_same_problems_read_in_parts_or_whole(tmp_path: Path, workers: int) -> None:
    path = tmp_path / "store"
    known = _damaged_store(path)
    with Store.open(path) as s:
        report = check_store(s, workers=workers)
    listed = [str(p) for p in report.problems]
    assert len(listed) == len(set(listed))
    expected = _expected(known)
    assert expected <= set(listed), sorted(expected - set(listed))
    rest = sorted(set(listed) - expected)
    second, first = known["second"], known["first"]
    # The damaged frame: named, and the objects of its block the damage reached: all
    # of them if it cannot be decoded, else each whose content it changed (its frame
    # has no content checksum, FORMAT.md 5.5: the record's checksum is what covers it)
    assert f"{second}: block at offset 8 does not match its checksum" in rest
    lost = [
        p
        for p in rest
        if "is corrupt: its block at offset 45 cannot be read" in p
        or "is corrupt: its content does not hash to its id" in p
    ]
    assert lost
    # The index entry past the end: named, and the pack read again through its index.
    assert any(p.startswith(f"{first}: index entry ") and "points past the end" in p for p in rest)
    others = [p for p in rest if not p.startswith((f"{second}:", f"{first}:")) and p not in lost]
    # What the lost block held is missing for the nodes that link to it.
    assert all("names missing" in p or "is corrupt" in p or "span" in p for p in others), others


def test_fsck_in_parts_and_whole_list_exactly_the_same(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _damaged_store(path)
    with Store.open(path) as s:
        one = [str(p) for p in check_store(s, workers=1).problems]
        two = [str(p) for p in check_store(s, workers=2).problems]
        three = [str(p) for p in check_store(s, workers=3).problems]
    assert one == two == three
    assert len(one) > 12  # _expected's, the frame's and the index's, and what they lost


def test_ctrl_c_stops_fsck_and_its_workers(tmp_path: Path) -> None:
    path = _random_sessions(tmp_path / "store", 30, 400)
    code = (
        "import sys\n"
        "from objstore import Store, check_store\n"
        "from objstore import fsck_read\n"
        "fsck_read.PART_BYTES = 1 << 16\n"
        "with Store.open(sys.argv[1]) as s:\n"
        "    print('started', flush=True)\n"
        "    while True:\n"
        "        check_store(s, workers=2)\n"
    )
    proc = _start_alone(code, path)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"
        time.sleep(1.5)
        # Each fsck of this store starts a pool and ends it: wait for one that runs.
        deadline = time.monotonic() + 10
        while not (children := _children(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert children, "no worker processes"
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does: to the whole process group
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode != 0
        assert err.rstrip().endswith(b"KeyboardInterrupt"), err  # raised where fsck was called
        assert b"PoolWorker" not in err  # the workers print nothing of their own
        deadline = time.monotonic() + 10
        while (
            any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert not any(Path(f"/proc/{pid}").exists() for pid in children)
    finally:
        _stop_group(proc)  # a failed test leaves no fsck looping behind


def test_a_ctrl_c_while_the_pool_starts_stops_fsck(tmp_path: Path) -> None:
    """The Ctrl-C lands inside ``Pool()``, just before the pool can be stopped:
    without it held back there, the exiting interpreter can wait forever on workers
    that the pool's thread keeps forking (it hung once in CI). Whether it does is a
    race between that thread and the interpreter's exit: without the fix this test
    hung when it was written, and passed in a later try, so it catches the hang
    only some of the time; it always checks that fsck stops cleanly there."""
    path = _random_sessions(tmp_path / "store", 4, 200)
    code = (
        "import os, signal, sys\n"
        "import multiprocessing.pool as mp_pool\n"
        "from objstore import Store, check_store\n"
        "from objstore import fsck_read\n"
        "fsck_read.PART_BYTES = 1 << 16\n"
        "real = mp_pool.util.Finalize\n"
        "def finalize(obj, callback, *args, **kwargs):\n"
        "    if getattr(callback, '__name__', '') == '_terminate_pool':\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(obj, callback, *args, **kwargs)\n"
        "mp_pool.util.Finalize = finalize\n"
        "with Store.open(sys.argv[1]) as s:\n"
        "    check_store(s, workers=2)\n"
        "print('fsck ended', flush=True)\n"
    )
    proc = _start_alone(code, path)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        _stop_group(proc)
    assert out == b""
    assert err.rstrip().endswith(b"KeyboardInterrupt"), err
    assert b"PoolWorker" not in err


def _random_sessions(path: Path, sessions: int, messages: int) -> Path:
    """A store of ``sessions`` sessions of ``messages`` messages that do not compress."""
    with Store.open(path) as s, s.batch():
        for n in range(sessions):
            sid = s.new_session(title=f"s{n}")
            for i in range(messages):
                s.append(sid, {"role": "user", "content": f"{n} {i} " + os.urandom(300).hex()})
    return path


def _start_alone(code: str, path: Path) -> subprocess.Popen[bytes]:
    """Python running ``code`` on the store at ``path``, in a session (and process group)
    of its own, as a command started from a terminal is: Ctrl-C goes to its group."""
    return subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a test's fsck and its workers if the fsck still runs (it was started in a
    session of its own, so its group is those processes; once it has been waited
    for, its pid could name another group)."""
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found
