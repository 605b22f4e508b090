"""An import, a fetch (clone, pull) or a push killed with SIGKILL midway leaves no
object whose links name objects that are not there: whatever it wrote is closed
under links, so ``ags fsck`` finds nothing (it does not mind objects no ref
reaches, only links that name nothing). Each child is killed at a set point of its
writes, not at a random moment: after some of its objects or packs were written.
"""

from __future__ import annotations

import importlib
import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sync_setup import directory_remote, new_store, session_with

from objstore import Store, check_store, export_session, import_document
from objstore.reach import node_links
from objstore.remote import open_storage, push, record_push

ROOT = Path(__file__).parent.parent


def big_session(store: Store, n: int, title: str) -> str:
    """A session of ``n`` messages of 20 KB that do not compress: the writes pass a
    pack (2 MiB, or a remote pack of the tests' size) soon."""
    sid = store.new_session(title=title)
    with store.batch():
        for i in range(n):
            store.append(sid, {"role": "user", "content": f"{i} {secrets.token_hex(10_000)}"})
    return sid


def run_killed(script: str, *args: str) -> None:
    """Run ``python -c script args``, which must die of its own SIGKILL."""
    child = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True
    )
    assert child.returncode == -signal.SIGKILL, child.stderr


def fsck_problems(path: Path) -> list[str]:
    with Store.open(path) as store:
        report = check_store(store, workers=1)
        return [str(p) for p in report.problems]


def object_count(path: Path) -> int:
    with Store.open(path) as store:
        return len(store.object_ids())


def test_import_writes_each_object_after_what_it_links_to(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a") as a:
        sid = session_with(a, 200, "long")
        doc = export_session(a, sid)
    with Store.open(tmp_path / "b") as b:
        written: list[str] = []
        put_raw = b.put_raw

        def recording(kind: str, body: bytes) -> str:
            oid = put_raw(kind, body)
            written.append(oid)
            return oid

        b.put_raw = recording  # type: ignore[method-assign]
        import_document(b, doc)
        before: set[str] = set()
        for oid in written:
            kind, _body = b.raw_object(oid)
            if kind == "node":
                missing = {link.target for link in node_links(b.node(oid))} - before
                assert not missing, f"node {oid} written before {missing}"
            before.add(oid)
    assert len(written) == len(doc["objects"])


IMPORT_KILLED = """
import json, os, signal, sys
from objstore import Store, import_document
doc = json.load(open(sys.argv[2]))
with Store.open(sys.argv[1]) as store:
    put_raw, count = store.put_raw, [0]
    def put_then_die(kind, body):
        count[0] += 1
        if count[0] > int(sys.argv[3]):
            os.kill(os.getpid(), signal.SIGKILL)
        return put_raw(kind, body)
    store.put_raw = put_then_die
    import_document(store, doc)
"""


def test_an_import_killed_midway_leaves_nothing_fsck_finds(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a") as a:
        sid = big_session(a, 300, "long")
        doc = export_session(a, sid)
    (tmp_path / "s.json").write_text(json.dumps(doc))
    Store.open(tmp_path / "b").close()
    run_killed(IMPORT_KILLED, str(tmp_path / "b"), str(tmp_path / "s.json"), "400")
    assert object_count(tmp_path / "b") > 0  # the kill came after some packs were written
    assert fsck_problems(tmp_path / "b") == []


def remote_of_many_packs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory remote holding three sessions in a dozen packs or so."""
    remote, location = directory_remote(tmp_path)
    monkeypatch.setattr(
        importlib.import_module("objstore.remote.push"), "PACK_CONTENT_BYTES", 1 << 18
    )
    with new_store(tmp_path / "a", location) as a:
        for n in range(3):
            big_session(a, 150, f"s{n}")
        with open_storage(location) as storage:
            result = push(a, storage, [f"sessions/{s.id}" for s in a.sessions()])
        record_push(a, "origin", result)
    assert result.packs >= 10
    return remote


FETCH_KILLED = """
import os, signal, sys
from objstore import Store
from objstore.remote import add_remote, open_storage, parse_location, pull
import importlib
fetch = importlib.import_module("objstore.remote.fetch")
fetch_pack_part, count = fetch.fetch_pack_part, [0]
def fetch_then_die(*args):
    count[0] += 1
    if count[0] > int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)
    return fetch_pack_part(*args)
fetch.fetch_pack_part = fetch_then_die
with Store.open(sys.argv[1]) as store:
    location = parse_location(sys.argv[2], None, None)
    add_remote(store, "origin", location)
    with open_storage(location) as storage:
        pull(store, storage, "origin")
"""


def test_a_fetch_killed_midway_adds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = remote_of_many_packs(tmp_path, monkeypatch)
    # Killed once half the remote's packs were read: before, those were in the store,
    # naming parents and messages in the packs not read yet.
    run_killed(FETCH_KILLED, str(tmp_path / "b"), str(remote), "6")
    assert fsck_problems(tmp_path / "b") == []
    assert object_count(tmp_path / "b") == 0
    assert [p.name for p in (tmp_path / "b" / "objects" / "pack").iterdir()] == []
    # The next pull does it all.
    ags = [sys.executable, "-m", "cli.main", "--store", str(tmp_path / "b"), "pull"]
    assert subprocess.run(ags, cwd=ROOT, capture_output=True).returncode == 0
    assert fsck_problems(tmp_path / "b") == []
    with Store.open(tmp_path / "a") as a, Store.open(tmp_path / "b") as b:
        assert {s.id: s.head for s in a.sessions()} == {s.id: s.head for s in b.sessions()}


PUSH_KILLED = """
import os, signal, sys
import importlib
from objstore import Store
from objstore.remote import open_storage, parse_location, push
push_module = importlib.import_module("objstore.remote.push")
push_module.PACK_CONTENT_BYTES = 256 * 1024
raise_marker, count = push_module.raise_marker, [0]
def raise_then_die(*args):  # once before each pack is written
    count[0] += 1
    if count[0] > int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)
    return raise_marker(*args)
push_module.raise_marker = raise_then_die
with Store.open(sys.argv[1]) as store, open_storage(parse_location(sys.argv[2], None, None)) as s:
    push(store, s, [f"sessions/{info.id}" for info in store.sessions()])
"""


def test_a_push_killed_between_packs_leaves_the_remote_closed_under_links(
    tmp_path: Path,
) -> None:
    """What a killed push leaves on the remote (packs no cell names yet) is taken in by
    a clone: each of its links must name an object the remote holds."""
    remote, location = directory_remote(tmp_path)
    with Store.open(tmp_path / "a") as a:
        for n in range(3):
            big_session(a, 150, f"s{n}")
        # one session there before, which the push then moves forward
        first = a.sessions()[0].id
    with Store.open(tmp_path / "a") as a, open_storage(location) as storage:
        push(a, storage, [f"sessions/{first}"])
        with a.batch():
            for i in range(150):
                a.append(first, {"role": "user", "content": f"{i} {secrets.token_hex(10_000)}"})
    run_killed(PUSH_KILLED, str(tmp_path / "a"), str(remote), "6")
    assert len(os.listdir(remote / "packs")) >= 2 * 6  # six packs, each with its index
    ags = [sys.executable, "-m", "cli.main", "clone", str(remote), str(tmp_path / "c")]
    assert subprocess.run(ags, cwd=ROOT, capture_output=True).returncode == 0
    assert object_count(tmp_path / "c") > 0
    assert fsck_problems(tmp_path / "c") == []
