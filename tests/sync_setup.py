"""The setup the sync tests share: remotes in a directory or on SeaweedFS, stores
that know one as origin, sessions of N messages, and the check that a remote is
consistent (every ref cell reaches only objects its indexed packs hold)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from s3_server import S3Server

from objstore import Store
from objstore.reach import reachable
from objstore.remote import RemoteLocation, add_remote, open_storage
from objstore.remote.fetch import index_ids
from objstore.remote.layout import PACK_KEY_RE, ref_of_cell


def directory_remote(tmp_path: Path, name: str = "remote") -> tuple[Path, RemoteLocation]:
    """An empty directory remote under ``tmp_path``: its path and its location."""
    remote = tmp_path / name
    remote.mkdir()
    return remote, RemoteLocation(str(remote))


def s3_remote(server: S3Server) -> RemoteLocation:
    """A remote in a new bucket of ``server``, under the prefix ``ags``."""
    return RemoteLocation(f"s3://{server.new_bucket()}/ags", endpoint=server.endpoint)


@pytest.fixture(name="location", params=["directory", "s3"])
def location_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> RemoteLocation:
    """A new, empty remote: a directory, then a bucket on SeaweedFS (the s3_env
    fixture of s3_server, which a test module imports)."""
    if request.param == "directory":
        return directory_remote(tmp_path)[1]
    return s3_remote(request.getfixturevalue("s3_env"))


def new_store(path: Path, location: RemoteLocation, remote: str = "origin") -> Store:
    store = Store.open(path)
    add_remote(store, remote, location)
    return store


def session_with(store: Store, n: int, title: str = "t", pad: str = "") -> str:
    """A new session of ``n`` user messages, written in one batch."""
    sid = store.new_session(title=title)
    with store.batch():
        for i in range(n):
            store.append(sid, {"role": "user", "content": f"message {i} of {title}{pad}"})
    return sid


def sessions_with(store: Store, count: int, n: int, pad: str = "") -> list[str]:
    """``count`` sessions of ``n`` messages each, all in one batch."""
    with store.batch():
        return [session_with(store, n, f"s{s}", pad) for s in range(count)]


def age_remote(remote: Path, seconds: float) -> None:
    """Make every key of a directory remote look ``seconds`` old (its LastModified)."""
    for path in remote.rglob("*"):
        if path.is_file() and not any(p.startswith(".") for p in path.relative_to(remote).parts):
            then = time.time() - seconds
            os.utime(path, (then, then))


def remote_is_consistent(location: RemoteLocation, scratch: Path) -> dict[str, str]:
    """Every ref cell's target reaches only objects some remote pack indexes (read
    with a throwaway store that fetches every pack). Returns ref -> target."""
    targets: dict[str, str] = {}
    with open_storage(location) as storage:
        on_remote: set[str] = set()
        for info in storage.list("packs/"):
            m = PACK_KEY_RE.fullmatch(info.key)
            if m and m.group(2) == "idx":
                on_remote.update(index_ids(storage.get(info.key), info.key))
                # a pack without its index is an orphan: nothing may rely on it
        for info in storage.list("refs/"):
            ref = ref_of_cell(info.key)
            value = storage.read_cell(info.key).value
            if ref and isinstance(value, dict) and value.get("target"):
                targets[ref] = value["target"]
        with Store.open(scratch) as reader:
            for info in storage.list("packs/"):
                m = PACK_KEY_RE.fullmatch(info.key)
                if m and m.group(2) == "idx":
                    name = m.group(1)
                    reader.add_pack(
                        storage.get(f"packs/pack-{name}.pack"), storage.get(info.key), name
                    )
            for ref, target in targets.items():
                reached = reachable([target], reader.node, skip_missing=False)
                assert reached <= on_remote, f"{ref} reaches objects the remote lacks"
    return targets
