"""The remote marker's version (FORMAT.md 16.2), on a directory and on a real SeaweedFS:
a remote of version 1 (every block in the entry layout) or 2 (blocks in the array
layout too) still fetches and clones; a push raises it to 3 before its first pack,
whose blocks may be in the MessagePack layout; a marker is never lowered, whoever
raced to raise it; one this ags does not know is refused with a one-line error and
nothing changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import tree_snapshot
from s3_server import (  # noqa: F401
    S3Server,
    aws_env_fixture,
    s3_env_fixture,
    seaweedfs_fixture,
)
from sync_setup import (  # noqa: F401
    directory_remote,
    location_fixture,
    new_store,
    s3_remote,
    session_with,
)
from test_array_blocks import entry_layout_payload

import objstore.packs
from cli.main import cli
from objstore import Store
from objstore.pack_format import ARRAY_MARK, PACKED_MARK, RECORD_HEAD
from objstore.packs import decompress_block
from objstore.remote import (
    RemoteLocation,
    collect_remote_garbage,
    fetch,
    open_storage,
    push,
    record_push,
)
from objstore.remote.errors import BadRemote
from objstore.remote.layout import (
    MARKER_KEY,
    PACK_KEY_RE,
    Marker,
    raise_marker,
    read_marker,
)
from objstore.remote.storage import RemoteStorage


def marker_bytes(version: int) -> bytes:
    return b'{"format":"ags-remote","version":%d}\n' % version


def set_marker(storage: RemoteStorage, version: int) -> None:
    """Write the marker by hand, whatever it holds (as another ags would have)."""
    _, etag = storage.get_versioned(MARKER_KEY)
    storage.replace(MARKER_KEY, marker_bytes(version), etag)


def remote_layouts(storage: RemoteStorage) -> list[bytes]:
    """The first 32 bytes of each block of each remote pack: its layout (FORMAT.md 5.5)."""
    layouts = []
    for info in storage.list("packs/"):
        m = PACK_KEY_RE.fullmatch(info.key)
        if m and m.group(2) == "pack":
            data, at = storage.get(info.key), 8
            while at < len(data):
                _type, _raw, length = RECORD_HEAD.unpack_from(data, at)
                payload = data[at + RECORD_HEAD.size : at + RECORD_HEAD.size + length]
                layouts.append(decompress_block(payload)[:32])
                at += RECORD_HEAD.size + length
    return layouts


def push_all(store: Store, location: RemoteLocation) -> None:
    with open_storage(location) as storage:
        refs = [f"sessions/{s.id}" for s in store.sessions()]
        result = push(store, storage, refs)
        assert not result.rejected
        record_push(store, "origin", result)


def older_remote(
    tmp_path: Path, location: RemoteLocation, monkeypatch: pytest.MonkeyPatch, version: int = 1
) -> tuple[Store, str]:
    """A remote as an ags of remote format 1 left it (marker version 1, every block in
    the entry layout), or of format 2 (blocks of messages in the array layout).
    Returns the store that pushed it, and its session."""
    old = new_store(tmp_path / "old", location)
    sid = session_with(old, 30, "old")
    with monkeypatch.context() as m:
        if version == 1:
            m.setattr(objstore.packs, "block_payload", entry_layout_payload)
        else:
            m.setattr(objstore.packs, "packed_values", lambda *a: None)
        push_all(old, location)
    with open_storage(location) as storage:
        set_marker(storage, version)
        assert storage.get(MARKER_KEY) == marker_bytes(version)
        layouts = set(remote_layouts(storage))
        assert layouts and PACKED_MARK not in layouts
        assert (ARRAY_MARK in layouts) == (version == 2)
    return old, sid


def ags(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_a_first_push_writes_version_3(tmp_path: Path, location: RemoteLocation) -> None:
    a = new_store(tmp_path / "a", location)
    session_with(a, 5)
    push_all(a, location)
    with open_storage(location) as storage:
        assert storage.get(MARKER_KEY) == marker_bytes(3)
        assert PACKED_MARK in remote_layouts(storage)
    a.close()


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_remote_fetches_and_clones_and_a_push_raises_it(
    tmp_path: Path, location: RemoteLocation, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    old, sid = older_remote(tmp_path, location, monkeypatch, version)
    b = new_store(tmp_path / "b", location)
    with open_storage(location) as storage:
        before = set(remote_layouts(storage))
        fetched = fetch(b, storage, "origin")
        assert fetched.packs == 1
        assert storage.get(MARKER_KEY) == marker_bytes(version)  # a fetch never raises it
    tracked = b.tracking_refs("origin")[sid].body["target"]
    assert b.context(tracked) == old.context(sid)
    b.close()

    extra = ["--endpoint", location.endpoint] if location.endpoint else []
    code, _, err = ags("clone", location.url, str(tmp_path / "c"), *extra)
    assert code == 0, err
    with Store.open(tmp_path / "c", create=False) as c:
        assert c.context(sid) == old.context(sid)
    code, out, err = ags("--store", str(tmp_path / "c"), "fsck")
    assert code == 0 and "ok" in out, err

    # A push from a store of today raises the marker before its pack goes.
    for i in range(3):
        old.append(sid, {"role": "user", "content": f"more {i}"})
    push_all(old, location)
    with open_storage(location) as storage:
        assert storage.get(MARKER_KEY) == marker_bytes(3)
        layouts = set(remote_layouts(storage))
        assert PACKED_MARK in layouts and before < layouts  # the old packs stay as they are
    with open_storage(location) as storage:
        d = new_store(tmp_path / "d", location)
        fetch(d, storage, "origin")
        assert d.context(d.tracking_refs("origin")[sid].body["target"]) == old.context(sid)
        d.close()
    old.close()


def test_remote_gc_raises_a_version_1_remote_before_it_sends_again(
    tmp_path: Path, location: RemoteLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    if location.is_s3:
        pytest.skip("ages keys by hand: directory remotes only")
    from sync_setup import age_remote

    old, sid = older_remote(tmp_path, location, monkeypatch)
    kept, other = session_with(old, 4, "kept"), session_with(old, 4, "gone")
    with monkeypatch.context() as m:  # one pack holding both sessions, entry layout
        m.setattr(objstore.packs, "block_payload", entry_layout_payload)
        with open_storage(location) as storage:
            push(old, storage, [f"sessions/{kept}", f"sessions/{other}"])
            set_marker(storage, 1)
            push(old, storage, [f"sessions/{other}"])  # nothing new: no pack, no raise
            assert storage.get(MARKER_KEY) == marker_bytes(1)
    code, _, err = ags("--store", str(tmp_path / "old"), "push", "--delete", f"sessions/{other}")
    assert code == 0, err
    age_remote(Path(location.url), 7200)
    with open_storage(location) as storage:
        report = collect_remote_garbage(old, storage, "origin", grace=3600)
        assert report.packs_rewritten >= 1
        assert storage.get(MARKER_KEY) == marker_bytes(3)
    old.close()


def test_a_marker_is_never_lowered_by_a_raise_that_lost_a_race(location: RemoteLocation) -> None:
    with open_storage(location) as storage:
        storage.put_new(MARKER_KEY, marker_bytes(1))
        stale = read_marker(storage)
        assert stale is not None and stale.version == 1
        # Another push raised it meanwhile: this raise finds it done.
        set_marker(storage, 2)
        raised = raise_marker(storage, stale, 2)
        assert raised.version == 2
        assert raise_marker(storage, stale, 2).version == 2
        assert storage.get(MARKER_KEY) == marker_bytes(2)
        # A newer ags raised it past what this one knows: refused, and left as it is.
        set_marker(storage, 4)
        with pytest.raises(BadRemote, match="has remote format 4; this ags reads up to 3"):
            raise_marker(storage, stale, 3)
        assert storage.get(MARKER_KEY) == marker_bytes(4)


def test_an_ags_of_remote_format_1_refuses_a_raised_remote(
    location: RemoteLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_storage(location) as storage:
        storage.put_new(MARKER_KEY, marker_bytes(2))
        assert read_marker(storage) == Marker(2, storage.get_versioned(MARKER_KEY)[1])
        monkeypatch.setattr("objstore.remote.layout.MARKER_VERSION", 1)
        with pytest.raises(BadRemote) as refused:
            read_marker(storage)
        assert str(refused.value) == (f"{location.url} has remote format 2; this ags reads up to 1")


@pytest.mark.parametrize("command", ["fetch", "push", "pull", "clone"])
def test_a_marker_of_version_4_is_refused_in_one_line(
    tmp_path: Path, location: RemoteLocation, command: str
) -> None:
    a = new_store(tmp_path / "a", location)
    sid = session_with(a, 3)
    push_all(a, location)
    a.close()
    with open_storage(location) as storage:
        set_marker(storage, 4)
    before = tree_snapshot(tmp_path / "a")
    extra = ["--endpoint", location.endpoint] if location.endpoint else []
    if command == "clone":
        args = ["clone", location.url, str(tmp_path / "c"), *extra]
    elif command == "push":
        args = ["--store", str(tmp_path / "a"), "push", f"sessions/{sid}"]
    else:
        args = ["--store", str(tmp_path / "a"), command]
    code, out, err = ags(*args)
    assert code != 0
    assert err.strip().splitlines() == [
        f"ags: {location.url} has remote format 4; this ags reads up to 3"
    ], err
    assert tree_snapshot(tmp_path / "a") == before
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    with open_storage(location) as storage:
        assert json.loads(storage.get(MARKER_KEY))["version"] == 4
