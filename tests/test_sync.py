"""push, fetch, pull and clone against a real SeaweedFS started by the tests and a
real directory: only what is missing moves, refs move by compare-and-swap, a remote
that diverged is never overwritten without --force, what arrives is verified."""

from __future__ import annotations

import json
import os
import random
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import tree_snapshot
from s3_server import (  # noqa: F401
    S3Server,
    aws_env_fixture,
    s3_env_fixture,
    s3rver_fixture,
    seaweedfs_fixture,
)
from sync_setup import (  # noqa: F401
    age_remote,
    directory_remote,
    location_fixture,
    new_store,
    remote_is_consistent,
    s3_remote,
    session_with,
)

from cli.main import cli
from objstore import Store
from objstore.remote import (
    RemoteLocation,
    add_remote,
    collect_remote_garbage,
    fetch,
    open_storage,
    pull,
    push,
    record_push,
)


def do_push(store: Store, location: RemoteLocation, *refs: str, force: bool = False):  # type: ignore[no-untyped-def]
    with open_storage(location) as storage:
        seen = store.tracking_refs("origin")  # as `ags push` passes them
        result = push(store, storage, list(refs), force=force, seen=seen)
        record_push(store, "origin", result)
        return result, storage.stats.requests


def one_session_in_two_stores(
    tmp_path: Path, location: RemoteLocation, title: str = "t"
) -> tuple[Store, Store, str]:
    """Stores ``a`` and ``b`` with ``location`` as origin, and a session of 3 messages
    made in ``a``, pushed, and pulled into ``b``."""
    a, b = new_store(tmp_path / "a", location), new_store(tmp_path / "b", location)
    sid = session_with(a, 3, title)
    do_push(a, location, f"sessions/{sid}")
    with open_storage(location) as storage:
        pull(b, storage, "origin")
    return a, b, sid


def ags(store: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", str(store), *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def stores(tmp_path: Path, location: RemoteLocation) -> Iterator[tuple[Store, Store]]:
    a, b = new_store(tmp_path / "a", location), new_store(tmp_path / "b", location)
    yield a, b
    a.close()
    b.close()


def test_push_then_clone_gives_the_same_sessions(tmp_path: Path, location: RemoteLocation) -> None:
    a = new_store(tmp_path / "a", location)
    sids = [session_with(a, n, f"s{n}") for n in (1, 40, 3)]
    forked = a.fork(f"{sids[1]}~5", title="fork")
    a.tag("v1", sids[0])
    a.close()
    args = ["push", "--all", "--json"]
    code, out, err = ags(tmp_path / "a", *args)
    assert code == 0, err
    report = json.loads(out)
    assert {r["outcome"] for r in report["refs"]} == {"created"}
    assert report["packs"] == 1  # many small objects go as one pack, not a request each

    url = location.url
    extra = ["--endpoint", location.endpoint] if location.endpoint else []
    code, out, err = (
        CliRunner()
        .invoke(cli, ["clone", url, str(tmp_path / "c"), *extra], catch_exceptions=False)
        .exit_code,
        "",
        "",
    )
    assert code == 0
    with Store.open(tmp_path / "a") as a, Store.open(tmp_path / "c", create=False) as c:
        for sid in [*sids, forked]:
            assert c.context(sid) == a.context(sid)
            assert c.session(sid).title == a.session(sid).title
        assert c.tags() == a.tags()
        assert set(c.object_ids()) == set(a.object_ids())
    code, out, _ = ags(tmp_path / "c", "fsck")
    assert code == 0 and "ok" in out
    # Remote-tracking refs resolve like any spec.
    code, out, err = ags(tmp_path / "c", "log", f"remotes/origin/{sids[1][:6]}")
    assert code == 0, err
    assert "message 39 of s40" in out


@pytest.mark.parametrize("length", [20, 400])
def test_one_new_message_costs_the_same_requests_whatever_the_length(
    stores: tuple[Store, Store], location: RemoteLocation, length: int
) -> None:
    a, _ = stores
    sid = session_with(a, length)
    first, _ = do_push(a, location, f"sessions/{sid}")
    assert first.objects >= length
    a.append(sid, {"role": "user", "content": "one more"})
    result, requests = do_push(a, location, f"sessions/{sid}")
    assert [r.outcome for r in result.refs] == ["fast-forward"]
    assert result.objects <= 3  # the node, its message, perhaps its state
    assert result.packs == 1
    # the check (7) + marker + cell + pack + index + swap
    assert requests == 12


@pytest.mark.parametrize("length", [20, 400])
def test_a_fork_with_one_new_message_sends_only_that_whatever_the_parent_length(
    stores: tuple[Store, Store], location: RemoteLocation, length: int
) -> None:
    a, b = stores
    parent = session_with(a, length)
    do_push(a, location, f"sessions/{parent}")
    fork = a.fork(f"{parent}~3", title="fork")
    a.append(fork, {"role": "user", "content": "a new way"})
    result, requests = do_push(a, location, f"sessions/{fork}")
    assert [r.outcome for r in result.refs] == ["created"]
    assert result.objects <= 3  # the node, its message, perhaps its state
    # the check (7) + marker + cell + pin + the parent's cell + pack + index + swap;
    # a directory counts its check as 6 operations and its first swap as 1, as S3
    assert requests == (14 if location.endpoint else 13)
    with open_storage(location) as storage:
        pull(b, storage, "origin")
    assert b.context(fork) == a.context(fork)
    remote_is_consistent(location, b.path.parent / "check")


def test_a_big_push_goes_in_rounds_and_each_cell_moves_only_after_its_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A push larger than a pack is sent a pack at a time, and sessions whose objects
    are all stored are swapped before the next pack is built (so what a push holds
    does not grow with the store); the remote is consistent after every pack."""
    import importlib

    from objstore.remote.directory import DirectoryStorage

    monkeypatch.setattr(importlib.import_module("objstore.remote.push"), "PACK_CONTENT_BYTES", 4096)
    remote, location = directory_remote(tmp_path)
    a = new_store(tmp_path / "a", location)
    sids = [session_with(a, 12, f"s{i}", pad="x" * 100) for i in range(6)]
    fork = a.fork(f"{sids[0]}~2", title="fork")  # shares history with an earlier round
    seen: list[set[str]] = []

    class Checked(DirectoryStorage):
        def put_new(self, key: str, data: bytes) -> None:
            super().put_new(key, data)
            if key.endswith(".idx"):
                targets = remote_is_consistent(location, tmp_path / f"check{len(seen)}")
                seen.append(set(targets))

    with Checked(remote) as storage:
        result = push(a, storage, [f"sessions/{s}" for s in [*sids, fork]])
    assert {r.outcome for r in result.refs} == {"created"}
    assert result.packs > 3 and len(seen) == result.packs
    assert seen[0] == set() and 0 < len(seen[-2]) < 7  # cells moved between packs
    assert remote_is_consistent(location, tmp_path / "final").keys() == {
        f"sessions/{s}" for s in [*sids, fork]
    }
    from objstore.reach import reachable

    every = reachable([a.node_id(s) for s in [*sids, fork]], a.node)
    assert result.objects == len(set(every))  # shared history sent once
    a.close()


def test_a_push_the_remote_moved_past_is_refused_unless_forced(
    stores: tuple[Store, Store], location: RemoteLocation, tmp_path: Path
) -> None:
    a, b = stores
    sid = session_with(a, 5)
    do_push(a, location, f"sessions/{sid}")
    with open_storage(location) as storage:
        pull(b, storage, "origin")
    b.append(sid, {"role": "user", "content": "from b"})
    do_push(b, location, f"sessions/{sid}")
    a.append(sid, {"role": "user", "content": "from a"})
    a.close()
    code, out, err = ags(tmp_path / "a", "push", "origin", sid)
    assert code == 1
    assert "rejected" in out and "ags pull first" in err
    b_head = b.node_id(sid)
    with open_storage(location) as storage:
        assert storage.read_cell(f"refs/sessions/{sid}").value["target"] == b_head
    code, out, err = ags(tmp_path / "a", "push", "origin", sid, "--force")
    assert code == 0, err
    with Store.open(tmp_path / "a") as a2, open_storage(location) as storage:
        assert storage.read_cell(f"refs/sessions/{sid}").value["target"] == a2.node_id(sid)


def test_two_hosts_pushing_one_session_at_once_one_wins(
    stores: tuple[Store, Store], location: RemoteLocation
) -> None:
    a, b = stores
    sid = session_with(a, 5)
    do_push(a, location, f"sessions/{sid}")
    with open_storage(location) as storage:
        pull(b, storage, "origin")
    for store, who in ((a, "a"), (b, "b")):
        store.append(sid, {"role": "user", "content": f"from {who}"})
    results = {}
    start = threading.Barrier(2)

    def go(store: Store, who: str) -> None:
        start.wait()
        results[who] = do_push(store, location, f"sessions/{sid}")[0]

    threads = [threading.Thread(target=go, args=(s, w)) for s, w in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outcomes = sorted(results[w].refs[0].outcome for w in "ab")
    assert outcomes == ["fast-forward", "rejected"]
    loser = "a" if results["a"].refs[0].outcome == "rejected" else "b"
    assert "pull" in (results[loser].refs[0].why or "")
    winner_store = b if loser == "a" else a
    with open_storage(location) as storage:
        target = storage.read_cell(f"refs/sessions/{sid}").value["target"]
    assert target == winner_store.node_id(sid)
    # The loser's work is still there, locally.
    loser_store = a if loser == "a" else b
    assert loser_store.context(sid)[-1]["content"] == f"from {loser}"


def test_pull_fast_forwards_and_names_a_diverged_session(
    stores: tuple[Store, Store], location: RemoteLocation
) -> None:
    a, b = stores
    s1, s2 = session_with(a, 3, "one"), session_with(a, 3, "two")
    do_push(a, location, f"sessions/{s1}", f"sessions/{s2}")
    with open_storage(location) as storage:
        _, pulled = pull(b, storage, "origin")
    assert {p.outcome for p in pulled} == {"created"}
    a.append(s1, {"role": "user", "content": "a1"})
    a.append(s2, {"role": "user", "content": "a2"})
    do_push(a, location, f"sessions/{s1}", f"sessions/{s2}")
    b.append(s2, {"role": "user", "content": "b2"})
    with open_storage(location) as storage:
        _, pulled = pull(b, storage, "origin")
    by = {p.session: p.outcome for p in pulled}
    assert by == {s1: "fast-forward", s2: "diverged"}
    assert b.context(s1) == a.context(s1)
    assert b.context(s2)[-1]["content"] == "b2"  # never rewritten


def test_a_fetch_where_nothing_moved_reads_no_cell(
    stores: tuple[Store, Store], location: RemoteLocation
) -> None:
    a, b = stores
    sids = [session_with(a, 2, str(i)) for i in range(5)]
    do_push(a, location, *(f"sessions/{s}" for s in sids))
    with open_storage(location) as storage:
        first = fetch(b, storage, "origin")
    assert len(first.refs) == 5 and first.packs == 1
    with open_storage(location) as storage:  # the pusher's tracking refs know the etags too
        assert fetch(a, storage, "origin").refs == []
        assert storage.stats.requests == (2 if location.is_s3 else 2 + len(sids))
    with open_storage(location) as storage:
        again = fetch(b, storage, "origin")
        assert again.refs == [] and again.packs == 0
        # S3: the marker and one LIST of refs/, whose etags say nothing moved. A
        # directory's listing has no etags (they would cost a read each): it reads.
        assert storage.stats.requests == (2 if location.is_s3 else 2 + len(sids))


def _big_and_small(tmp_path: Path, location: RemoteLocation) -> tuple[Store, Store, str, str]:
    """Store ``a`` pushes a big session and a small one to ``location`` in one pack;
    store ``b`` already holds the big one (from another remote, ``usb``)."""
    _, usb = directory_remote(tmp_path, "usb")
    a, b = new_store(tmp_path / "a", location), new_store(tmp_path / "b", location)
    add_remote(a, "usb", usb)
    add_remote(b, "usb", usb)
    rng = random.Random(3)
    big = a.new_session(title="big")
    with a.batch():
        for i in range(1700):
            a.append(big, {"role": "user", "content": f"{i} {rng.randbytes(400).hex()}"})
    small = session_with(a, 3, "small")
    with open_storage(usb) as storage:
        record_push(a, "usb", push(a, storage, [f"sessions/{big}"]))
        pull(b, storage, "usb")
    result, _ = do_push(a, location, f"sessions/{big}", f"sessions/{small}")
    assert result.packs == 1
    return a, b, big, small


def test_a_fetch_of_a_few_objects_reads_only_their_blocks_of_a_big_pack(
    tmp_path: Path, location: RemoteLocation
) -> None:
    a, b, big, small = _big_and_small(tmp_path, location)
    with open_storage(location) as storage:
        sizes = {i.key.rpartition(".")[2]: i.size for i in storage.list("packs/")}
        stats = storage.stats
        start = stats.bytes_received
        fetched = fetch(b, storage, "origin")
        received = stats.bytes_received - start
    assert fetched.packs == 1 and fetched.objects == 3 * 2  # the small session's nodes, messages
    # The index (read whole, as before), the cells, and the last block or two of the
    # pack (a block is 128 KiB of objects before compression), not the whole pack.
    assert sizes["pack"] > 1_000_000, sizes
    assert received - sizes["idx"] < 200_000, (sizes, received)
    with open_storage(location) as storage:
        pull(b, storage, "origin")
    assert b.context(small) == a.context(small) and b.context(big) == a.context(big)
    code, out, _ = ags(b.path, "fsck")
    assert code == 0 and "ok" in out
    a.close()
    b.close()


def test_ranges_of_needed_blocks_merge_when_near_and_a_mostly_needed_pack_is_read_whole() -> None:
    from objstore.remote.ranged import ranges_to_read

    h = 37  # a record's head: type, id, length; a block's offset is its payload's
    records = [8, 1000, 2000, 100_000, 101_000]  # where each block record starts
    members = {at + h: {("0" * 64, 0, 1)} for at in records}
    length = 1_000_000
    block = [at + h for at in records]
    assert ranges_to_read(length, members, {block[0], block[1]}) == [(8, 2000)]  # adjacent
    assert ranges_to_read(length, members, {block[0], block[2]}) == [(8, 100_000)]  # 1 KB gap
    assert ranges_to_read(length, members, {block[0], block[3]}) == [(8, 1000), (100_000, 101_000)]
    assert ranges_to_read(190_000, members, {block[4]}) == [(101_000, 190_000)]  # to the end
    assert ranges_to_read(length, members, {block[4]}) is None  # most of it: read whole


def test_a_damaged_block_read_by_range_is_refused_and_moves_nothing(tmp_path: Path) -> None:
    remote, location = directory_remote(tmp_path)
    a, b, _big, _small = _big_and_small(tmp_path, location)
    a.close()
    b.close()
    pack = next((remote / "packs").glob("*.pack"))
    data = bytearray(pack.read_bytes())
    data[-20] ^= 0xFF  # in the last block: the small session's
    pack.chmod(0o600)
    pack.write_bytes(bytes(data))
    before = tree_snapshot(tmp_path / "b")
    code, out, err = ags(tmp_path / "b", "fetch", "origin")
    assert code == 1 and "damaged" in err and err.count("\n") == 1, err
    assert tree_snapshot(tmp_path / "b") == before


def test_a_damaged_pack_on_the_remote_is_refused_and_moves_nothing(tmp_path: Path) -> None:
    remote, location = directory_remote(tmp_path)
    with new_store(tmp_path / "a", location) as a:
        sid = session_with(a, 30)
        do_push(a, location, f"sessions/{sid}")
    pack = next((remote / "packs").glob("*.pack"))
    data = bytearray(pack.read_bytes())
    data[40] ^= 0xFF
    pack.chmod(0o600)
    pack.write_bytes(bytes(data))
    Store.open(tmp_path / "b").close()
    ags(tmp_path / "b", "remote", "add", "origin", str(remote))
    before = tree_snapshot(tmp_path / "b")
    code, out, err = ags(tmp_path / "b", "fetch")
    assert code == 1 and "damaged" in err and err.count("\n") == 1, err
    after = tree_snapshot(tmp_path / "b")
    assert {k for k in after if "refs/" in k} == {k for k in before if "refs/" in k}


def _push_to_directory_holding(
    tmp_path: Path, name: str, files: dict[str, bytes]
) -> tuple[Path, int, str]:
    """The directory remote ``name``, made holding ``files`` (relative path -> bytes),
    the exit code and stderr of a push of a new session of two messages to it."""
    remote = tmp_path / name
    for rel, data in files.items():
        (remote / rel).parent.mkdir(parents=True, exist_ok=True)
        (remote / rel).write_bytes(data)
    with new_store(tmp_path / "a", RemoteLocation(str(remote))) as a:
        sid = session_with(a, 2)
    code, _out, err = ags(tmp_path / "a", "push", sid)
    return remote, code, err


def test_a_directory_holding_other_things_is_not_pushed_to(tmp_path: Path) -> None:
    """Refused before anything is written there: not even the scratch keys of the
    check of conditional writes, nor the hidden directories it writes them through."""
    remote, code, err = _push_to_directory_holding(tmp_path, "photos", {"cat.jpg": b"meow"})
    assert code == 1 and "is not an ags remote" in err
    assert sorted(p.name for p in remote.iterdir()) == ["cat.jpg"]


def test_a_directory_holding_only_hidden_files_is_not_a_remote(tmp_path: Path) -> None:
    """A home directory, or a project of only ``.git``: a listing leaves hidden names
    out (they are no keys), so it looked empty, and a clone and a push took it."""
    home, code, err = _push_to_directory_holding(
        tmp_path, "home", {".git/HEAD": b"ref: refs/heads/main\n", ".bashrc": b"alias ll=ls\n"}
    )
    assert code == 1 and "holds other things (.bashrc)" in err and err.count("\n") == 1, err
    result = CliRunner().invoke(cli, ["clone", str(home), str(tmp_path / "copy")])
    assert result.exit_code == 1 and "is not an ags remote" in result.stderr
    assert not (tmp_path / "copy").exists()
    left = {p.name for p in home.iterdir()}
    assert left - {".ags-locks", ".ags-tmp"} == {".git", ".bashrc"}


def test_a_directory_holding_only_a_finders_litter_is_an_empty_remote(tmp_path: Path) -> None:
    """The ``.DS_Store`` macOS's Finder leaves in a folder it shows is no other thing."""
    usb, code, err = _push_to_directory_holding(tmp_path, "usb", {".DS_Store": b"\0\0\0\1Bud1"})
    assert code == 0, err
    assert (usb / "ags-remote.json").is_file()


def test_clone_into_a_directory_that_is_not_empty_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "remote").mkdir()
    (tmp_path / "there").mkdir()
    (tmp_path / "there" / "notes.txt").write_text("mine")
    result = CliRunner().invoke(cli, ["clone", str(tmp_path / "remote"), str(tmp_path / "there")])
    assert result.exit_code == 1 and "not an empty directory" in result.stderr
    assert [p.name for p in (tmp_path / "there").iterdir()] == ["notes.txt"]


def test_remote_gc_drops_only_what_no_remote_ref_reaches(tmp_path: Path) -> None:
    remote, location = directory_remote(tmp_path)
    with new_store(tmp_path / "a", location) as a:
        keep, change = session_with(a, 10, "keep"), session_with(a, 10, "change")
        do_push(a, location, f"sessions/{keep}", f"sessions/{change}")  # one pack, both
        a.rewind(change, f"{change}~5")
        a.append(change, {"role": "user", "content": "another way"})
        do_push(a, location, f"sessions/{change}", force=True)
        with open_storage(location) as storage:  # a push killed before its index and swap
            storage.put_new("packs/pack-" + "ab" * 32 + ".pack", b"AGSPACK\x02")
        age_remote(remote, 2 * 3600)
        fresh = session_with(a, 3, "fresh")
        do_push(a, location, f"sessions/{fresh}")  # younger than the grace period
    before = {p.name for p in (remote / "packs").iterdir()}
    code, out, err = ags(tmp_path / "a", "gc", "--remote", "origin", "--json", "--dry-run")
    assert code == 0, err
    would = json.loads(out)  # what the run below does (it said 0 packs sent again)
    assert {p.name for p in (remote / "packs").iterdir()} == before
    code, out, err = ags(tmp_path / "a", "gc", "--remote", "origin", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report == would
    assert report["packs_deleted"] == 1 and report["packs_rewritten"] == 1
    assert report["objects_dropped"] == 5 * 2  # the 5 old nodes of "change" and their messages
    assert report["other_keys_deleted"] == 1
    after = {p.name for p in (remote / "packs").iterdir()}
    # the stray pack gone; the old pack and index replaced by a new pair
    assert "pack-" + "ab" * 32 + ".pack" not in after and len(after) == len(before) - 1
    code, _out, err = ags(tmp_path / "a", "gc", "--remote", "origin")  # nothing left to do
    assert code == 0 and "packs deleted: 0" in _out
    result = CliRunner().invoke(cli, ["clone", str(remote), str(tmp_path / "c")])
    assert result.exit_code == 0, result.stderr
    with Store.open(tmp_path / "a") as a, Store.open(tmp_path / "c", create=False) as c:
        for sid in (keep, change, fresh):
            assert c.context(sid) == a.context(sid)
    code, out, _ = ags(tmp_path / "c", "fsck")
    assert code == 0 and "ok" in out


def test_the_tracking_ref_names_what_was_pushed_not_what_came_after(
    stores: tuple[Store, Store], location: RemoteLocation
) -> None:
    a, _ = stores
    sid = session_with(a, 3)
    with open_storage(location) as storage:
        result = push(a, storage, [f"sessions/{sid}"])
    pushed = a.node_id(sid)
    a.append(sid, {"role": "user", "content": "written while the push ran"})
    record_push(a, "origin", result)
    assert a.node_id(f"remotes/origin/{sid}") == pushed != a.node_id(sid)


def test_pull_leaves_a_busy_session_another_process_writes_and_says_so(
    stores: tuple[Store, Store], location: RemoteLocation
) -> None:
    a, b = stores
    sid = session_with(a, 3)
    do_push(a, location, f"sessions/{sid}")
    with open_storage(location) as storage:
        pull(b, storage, "origin")
    a.append(sid, {"role": "user", "content": "more"})
    do_push(a, location, f"sessions/{sid}")
    with Store.open(b.path) as writer:
        writer.lock(sid)
        with open_storage(location) as storage:
            _, pulled = pull(b, storage, "origin")
    assert [p.outcome for p in pulled] == ["busy"]


def test_a_server_that_ignores_conditional_writes_gets_no_push(
    tmp_path: Path, s3rver: S3Server, aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3rver.env().items():
        monkeypatch.setenv(name, value)
    bucket = s3rver.new_bucket()
    location = RemoteLocation(f"s3://{bucket}/ags", endpoint=s3rver.endpoint)
    with new_store(tmp_path / "a", location) as a:
        sid = session_with(a, 3)
    code, _out, err = ags(tmp_path / "a", "push", sid)
    assert code == 1 and "does not enforce conditional writes" in err
    listed = s3rver.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    assert listed == []


def test_a_clone_of_a_missing_remote_leaves_nothing_behind(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["clone", str(tmp_path / "nowhere"), str(tmp_path / "c")])
    assert result.exit_code == 1 and result.stderr.startswith("ags: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "c").exists()
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    os.chmod(empty, 0o755)  # whatever the umask
    result = CliRunner().invoke(cli, ["clone", str(tmp_path / "nowhere"), str(empty)])
    assert result.exit_code == 1
    assert os.listdir(empty) == [] and stat.S_IMODE(empty.stat().st_mode) == 0o755


def test_remote_gc_beside_pushes_never_leaves_a_ref_naming_a_swept_object(
    tmp_path: Path,
) -> None:
    remote, location = directory_remote(tmp_path)
    a, g = new_store(tmp_path / "a", location), new_store(tmp_path / "g", location)
    sids = [session_with(a, 20, str(i)) for i in range(4)]
    do_push(a, location, *(f"sessions/{s}" for s in sids))
    rng = random.Random(7)
    swept = 0
    for round_ in range(4):
        age_remote(remote, 2 * 3600)  # everything so far is old enough to be chosen
        stop = threading.Event()

        def pushes(round_: int = round_, stop: threading.Event = stop) -> None:
            for i in range(12):
                sid = rng.choice(sids)
                if i % 4 == 3:  # leave history behind: gc may sweep it
                    a.rewind(sid, f"{sid}~3")
                a.append(sid, {"role": "user", "content": f"round {round_} push {i}"})
                do_push(a, location, f"sessions/{sid}", force=i % 4 == 3)
            stop.set()

        pusher = threading.Thread(target=pushes)
        pusher.start()
        while not stop.is_set():
            with open_storage(location) as storage:
                swept += collect_remote_garbage(g, storage, "origin", grace=600).objects_dropped
        pusher.join()
        remote_is_consistent(location, tmp_path / f"check{round_}")
    assert swept > 0  # gc did sweep while the pushes ran
    with open_storage(location) as storage:
        for sid in sids:
            assert storage.read_cell(f"refs/sessions/{sid}").value["target"] == a.node_id(sid)
    a.close()
    g.close()


def test_remote_gc_between_a_fork_push_reading_its_parent_and_swapping_keeps_the_fork_point(
    tmp_path: Path,
) -> None:
    """The race a fork's push has with remote gc, made certain: right after the push
    reads the parent's cell (which still reaches the fork point), another host
    force-pushes the parent to a history without it and remote gc runs, with every
    pack old enough to be chosen. Without the pin, gc would sweep the fork point and
    the fork's cell would then name nodes the remote lacks."""
    from objstore.remote.directory import DirectoryStorage

    remote, location = directory_remote(tmp_path)
    a, b, g = (new_store(tmp_path / n, location) for n in "abg")
    parent = session_with(a, 30, "parent")
    do_push(a, location, f"sessions/{parent}")
    with open_storage(location) as storage:
        pull(b, storage, "origin")
    b.rewind(parent, f"{parent}~10")  # before the fork point
    b.append(parent, {"role": "user", "content": "the parent goes another way"})
    fork = a.fork(f"{parent}~3", title="fork")
    a.append(fork, {"role": "user", "content": "the fork's own message"})
    age_remote(remote, 2 * 3600)
    report = []

    class Interleaved(DirectoryStorage):
        def read_cell(self, key: str):  # type: ignore[no-untyped-def]
            cell = super().read_cell(key)
            if key == f"refs/sessions/{parent}" and not report:
                do_push(b, location, f"sessions/{parent}", force=True)
                with open_storage(location) as storage:
                    report.append(collect_remote_garbage(g, storage, "origin", grace=600))
            return cell

    with Interleaved(remote) as storage:
        result = push(a, storage, [f"sessions/{fork}"])
    assert [r.outcome for r in result.refs] == ["created"] and result.objects <= 3
    assert report and report[0].objects_dropped > 0  # gc swept what the parent dropped
    targets = remote_is_consistent(location, tmp_path / "check")
    assert targets[f"sessions/{fork}"] == a.node_id(fork)
    for store in (a, b, g):
        store.close()


def test_push_delete_removes_a_remote_session_fetch_forgets_it_and_gc_frees_it(
    tmp_path: Path, location: RemoteLocation
) -> None:
    a, b = new_store(tmp_path / "a", location), new_store(tmp_path / "b", location)
    gone, kept = session_with(a, 5, "gone"), session_with(a, 5, "kept")
    do_push(a, location, f"sessions/{gone}", f"sessions/{kept}")
    with open_storage(location) as storage:
        pull(b, storage, "origin")
    a.close()
    code, out, err = ags(tmp_path / "a", "push", "--delete", "origin", gone[:8])
    assert code == 0, err
    assert out.startswith("deleted") and gone in out
    with open_storage(location) as storage:
        cell = storage.read_cell(f"refs/sessions/{gone}")
        assert cell.value is None and cell.generation == 2  # a tombstone, by swap
    with Store.open(tmp_path / "a") as a:
        assert set(a.tracking_refs("origin")) == {kept}
        assert a.session(gone).messages == 5  # the local session stays, as git's branch
    with open_storage(location) as storage:
        fetched = fetch(b, storage, "origin")
        assert [(r.ref, r.outcome) for r in fetched.refs] == [(f"sessions/{gone}", "deleted")]
        _, pulled = pull(b, storage, "origin")
    assert [p.session for p in pulled] == [kept]  # the deleted one is not brought back
    assert set(b.tracking_refs("origin")) == {kept}
    b.close()
    # Deleting what the remote does not have is refused, and changes nothing.
    code, _out, err = ags(tmp_path / "a", "push", "--delete", "origin", gone)
    assert code == 1 and "no such ref" in err and err.count("\n") == 1, err
    with open_storage(location) as storage:
        assert storage.read_cell(f"refs/sessions/{gone}").generation == 2


def test_push_delete_of_work_this_store_has_not_seen_is_refused_unless_forced(
    tmp_path: Path,
) -> None:
    remote, location = directory_remote(tmp_path)
    a, b, sid = one_session_in_two_stores(tmp_path, location)
    b.append(sid, {"role": "user", "content": "b's work"})
    do_push(b, location, f"sessions/{sid}")
    a.close()
    b.close()
    code, _out, err = ags(tmp_path / "a", "push", "--delete", "origin", sid)
    assert code == 1 and "changes you have not seen" in err, err
    with open_storage(location) as storage:
        assert storage.read_cell(f"refs/sessions/{sid}").value is not None
    code, _out, err = ags(tmp_path / "a", "push", "--delete", "--force", "origin", sid)
    assert code == 0, err
    age_remote(remote, 2 * 3600)
    code, out, err = ags(tmp_path / "a", "gc", "--remote", "origin", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["packs_deleted"] == 2 and report["objects_dropped"] == 4 * 2
    assert not (remote / "packs").exists()  # every pack gone (and so its "directory")


def test_pull_brings_a_title_and_an_archive_set_on_the_remote_with_no_new_message(
    tmp_path: Path, location: RemoteLocation
) -> None:
    a, b, sid = one_session_in_two_stores(tmp_path, location, "first title")
    a.set_title(sid, "renamed")
    a.archive(sid)
    result, _ = do_push(a, location, f"sessions/{sid}")
    assert [r.outcome for r in result.refs] == ["updated"]
    with open_storage(location) as storage:
        fetch(b, storage, "origin")  # a fetch first, then the pull: the same outcome
        _, pulled = pull(b, storage, "origin")
    assert [(p.outcome, p.meta) for p in pulled] == [("updated", ("title", "archived_at"))]
    assert b.session(sid).title == "renamed"
    assert b.session(sid).archived_at == a.session(sid).archived_at
    with open_storage(location) as storage:
        _, pulled = pull(b, storage, "origin")
    assert [(p.outcome, p.meta) for p in pulled] == [("up to date", ())]
    a.close()
    b.close()


def test_metadata_changed_on_both_sides_keeps_yours_names_it_and_a_push_settles_it(
    tmp_path: Path,
) -> None:
    remote, location = directory_remote(tmp_path)
    a, b, sid = one_session_in_two_stores(tmp_path, location, "first title")
    b.set_title(sid, "b's title")  # only here: a pull keeps it, silently
    with open_storage(location) as storage:
        _, pulled = pull(b, storage, "origin")
    assert [(p.outcome, p.meta, p.kept) for p in pulled] == [("up to date", (), ())]
    a.set_title(sid, "a's title")  # and now there too
    do_push(a, location, f"sessions/{sid}")
    b.close()
    code, out, err = ags(tmp_path / "b", "pull")
    assert code == 1 and "yours kept" in err and f"{sid} (title)" in err, err
    assert "kept yours: title changed on both sides" in out
    with Store.open(tmp_path / "b") as b:
        assert b.session(sid).title == "b's title"
    code, _out, err = ags(tmp_path / "b", "push", sid)  # b settles it: its title wins
    assert code == 0, err
    with open_storage(location) as storage:
        _, pulled = pull(a, storage, "origin")
    assert [(p.outcome, p.meta) for p in pulled] == [("updated", ("title",))]
    assert a.session(sid).title == "b's title"
    a.close()


def test_a_push_of_metadata_over_metadata_changed_on_the_remote_is_rejected_until_a_pull(
    tmp_path: Path, location: RemoteLocation
) -> None:
    a, b, sid = one_session_in_two_stores(tmp_path, location, "first title")
    a.set_title(sid, "a's title")
    do_push(a, location, f"sessions/{sid}")
    b.set_title(sid, "b's title")  # b has not seen a's title
    result, _ = do_push(b, location, f"sessions/{sid}")
    assert [(r.outcome, r.why) for r in result.refs] == [
        ("rejected", "the remote has changes you do not have; ags pull first (or --force)")
    ]
    with open_storage(location) as storage:
        assert storage.read_cell(f"refs/sessions/{sid}").value["meta"]["title"] == "a's title"
        pull(b, storage, "origin")  # names the title as changed on both sides, keeps b's
    result, _ = do_push(b, location, f"sessions/{sid}")
    assert [r.outcome for r in result.refs] == ["updated"]
    with open_storage(location) as storage:
        assert storage.read_cell(f"refs/sessions/{sid}").value["meta"]["title"] == "b's title"
    a.close()
    b.close()


def test_a_title_pushed_elsewhere_while_a_push_of_metadata_runs_is_not_overwritten(
    tmp_path: Path,
) -> None:
    """The same rejection when the remote's title changes after the push read the
    cell and before it swaps it: the compare-and-swap fails, and the retry must not
    go on over the new title."""
    from objstore.remote.directory import DirectoryStorage

    remote, location = directory_remote(tmp_path)
    a, b, sid = one_session_in_two_stores(tmp_path, location, "first title")
    a.set_title(sid, "a's title")
    b.set_title(sid, "b's title")

    class Interleaved(DirectoryStorage):
        def read_cell(self, key: str):  # type: ignore[no-untyped-def]
            cell = super().read_cell(key)
            if key == f"refs/sessions/{sid}" and a.session(sid).title != "done":
                do_push(a, location, f"sessions/{sid}")
                a.set_title(sid, "done")  # once
            return cell

    with Interleaved(remote) as storage:
        result = push(b, storage, [f"sessions/{sid}"], seen=b.tracking_refs("origin"))
    assert [r.outcome for r in result.refs] == ["rejected"]
    with open_storage(location) as storage:
        assert storage.read_cell(f"refs/sessions/{sid}").value["meta"]["title"] == "a's title"
    a.close()
    b.close()


def test_what_an_importer_remembers_of_local_files_is_not_pushed(
    stores: tuple[Store, Store], location: RemoteLocation
) -> None:
    a, b = stores
    sid = session_with(a, 2)
    a.set_meta(sid, imported={"version": 1, "tool": "codex", "path": "/home/me/secret.jsonl"})
    result, _ = do_push(a, location, f"sessions/{sid}")
    with open_storage(location) as storage:
        assert "imported" not in storage.read_cell(f"refs/sessions/{sid}").value["meta"]
        _, pulled = pull(b, storage, "origin")
    assert b.session(sid).imported is None
    again, _ = do_push(a, location, f"sessions/{sid}")
    assert [r.outcome for r in again.refs] == ["up to date"]


def test_removing_a_remote_forgets_its_tracking_refs(tmp_path: Path) -> None:
    _, location = directory_remote(tmp_path)
    with new_store(tmp_path / "a", location) as a:
        sid = session_with(a, 2)
        do_push(a, location, f"sessions/{sid}")
        with open_storage(location) as storage:
            fetch(a, storage, "origin")
        assert a.tracking_refs("origin")
    code, _out, err = ags(tmp_path / "a", "remote", "remove", "origin")
    assert code == 0, err
    with Store.open(tmp_path / "a") as a:
        assert a.tracking_refs("origin") == {}
        assert not [n for n in a.ref_names() if n.startswith("remotes/")]
        assert not [n for n in a.reflog_names() if n.startswith("remotes/")]
    assert not (tmp_path / "a" / "cache" / "remotes" / "origin").exists()


def test_push_without_names_pushes_the_session_checked_out_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "project").mkdir()
    _, location = directory_remote(tmp_path)
    with new_store(tmp_path / "a", location) as a:
        here, other = session_with(a, 2, "here"), session_with(a, 2, "other")
    monkeypatch.chdir(tmp_path / "project")
    code, out, err = ags(tmp_path / "a", "push")
    assert code == 1 and "name the sessions or tags to push, or use --all" in err
    assert ags(tmp_path / "a", "checkout", here)[0] == 0
    code, out, err = ags(tmp_path / "a", "push", "--json")
    assert code == 0, err
    assert [r["ref"] for r in json.loads(out)["refs"]] == [f"sessions/{here}"]
    with open_storage(location) as storage:
        assert not storage.read_cell(f"refs/sessions/{other}").exists


def test_an_empty_session_does_not_empty_the_remote_one_unless_forced(
    stores: tuple[Store, Store], location: RemoteLocation
) -> None:
    a, b = stores
    sid = session_with(a, 3)
    do_push(a, location, f"sessions/{sid}")
    meta = {**a.read_ref(f"sessions/{sid}").body["meta"], "messages": 0}  # type: ignore[union-attr]
    b.fast_forward(sid, None, meta, "test")  # the same id, no history
    assert b.session(sid).head is None
    result, _ = do_push(b, location, f"sessions/{sid}")
    assert [r.outcome for r in result.refs] == ["rejected"]
    with open_storage(location) as storage:
        assert storage.read_cell(f"refs/sessions/{sid}").value["target"] == a.node_id(sid)
    result, _ = do_push(b, location, f"sessions/{sid}", force=True)
    assert [r.outcome for r in result.refs] == ["forced"]


def test_push_names_tags_and_sessions_and_refuses_what_names_neither(tmp_path: Path) -> None:
    _, location = directory_remote(tmp_path)
    with new_store(tmp_path / "a", location) as a:
        sid = session_with(a, 3)
        a.tag("v1", f"{sid}~1")
    code, out, err = ags(tmp_path / "a", "push", "--json", "v1", sid[:6])
    assert code == 0, err
    assert [r["ref"] for r in json.loads(out)["refs"]] == ["tags/v1", f"sessions/{sid}"]
    for bad in (f"{sid[:6]}~1", "nothing-here"):
        code, _out, err = ags(tmp_path / "a", "push", bad)
        assert code == 1 and err.startswith("ags: ") and err.count("\n") == 1, err
    with open_storage(location) as storage:
        assert storage.read_cell("refs/tags/v1").value == {"target": a.node_id(f"{sid}~1")}


@pytest.mark.parametrize(
    "value",
    [[1, 2], {"target": "not a node id", "meta": {}}, {"target": None}, {"meta": {}}],
)
def test_a_ref_cell_ags_did_not_write_is_refused_by_fetch_push_and_gc(
    tmp_path: Path, value: object
) -> None:
    _, location = directory_remote(tmp_path)
    with new_store(tmp_path / "a", location) as a:
        sid = session_with(a, 2)
        do_push(a, location, f"sessions/{sid}")
    with open_storage(location) as storage:
        cell = storage.read_cell(f"refs/sessions/{sid}")
        storage.swap(cell, value)
    Store.open(tmp_path / "b").close()
    ags(tmp_path / "b", "remote", "add", "origin", str(tmp_path / "remote"))
    before = tree_snapshot(tmp_path / "b")
    code, _out, err = ags(tmp_path / "b", "pull")
    assert code == 1 and "is not a ref cell ags wrote" in err and err.count("\n") == 1, err
    assert tree_snapshot(tmp_path / "b") == before
    remote_before = tree_snapshot(tmp_path / "remote")
    for args in (["push", sid], ["gc", "--remote", "origin"]):  # nor overwritten, nor collected
        code, _out, err = ags(tmp_path / "a", *args)
        assert code == 1 and "is not a ref cell ags wrote" in err and err.count("\n") == 1, err
    after = tree_snapshot(tmp_path / "remote")
    assert {k: v for k, v in after.items() if "/." not in k and not k.startswith(".")} == {
        k: v for k, v in remote_before.items() if "/." not in k and not k.startswith(".")
    }
    code, _out, err = ags(tmp_path / "a", "push", sid, "--force")
    assert code == 0, err


def test_a_store_that_receives_file_objects_is_marked_for_them(tmp_path: Path) -> None:
    """File objects that arrive in a pack raise the marker as a local write does
    (FORMAT.md 2): an ags of store version 2 would sweep them."""
    _, location = directory_remote(tmp_path)
    with new_store(tmp_path / "a", location) as a:
        sid = a.new_session()
        a.append(sid, {"role": "tool", "content": "wrote f"}, files={"f": (None, b"x")})
        do_push(a, location, f"sessions/{sid}")
    code, _out, err = ags(tmp_path / "b", "init")
    assert code == 0, err
    marker = tmp_path / "b" / "ags-store.json"
    assert json.loads(marker.read_bytes())["version"] == 2
    with Store.open(tmp_path / "b") as b:
        add_remote(b, "origin", location)
    code, _out, err = ags(tmp_path / "b", "pull")
    assert code == 0, err
    # 3 for the files, and 6 for the blocks, which may be in the MessagePack layout (5.5)
    assert json.loads(marker.read_bytes())["version"] == 6
    with Store.open(tmp_path / "b") as b:
        assert b.file_bytes(b.node(b.session(sid).head).files[0].after or "") == b"x"
