"""A writer killed with SIGKILL in the middle of its writes leaves every key whole or
absent, on a real SeaweedFS and in a directory: what a killed push relies on; and a
killed remote gc does not keep the next one waiting for its lease to run out."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from s3_server import S3Server, aws_env_fixture, s3_env_fixture, seaweedfs_fixture  # noqa: F401
from sync_setup import directory_remote, new_store, session_with

from cli.main import cli
from objstore.remote import RemoteLocation, open_storage, push, record_push
from objstore.remote.layout import GC_LEASE
from objstore.remote.remote_gc import _take_lease

BODY = 4 << 20  # big enough that a kill lands inside a request, not between two


def body(key: str) -> bytes:
    seed = hashlib.blake2b(key.encode()).digest()
    return (seed * (BODY // len(seed) + 1))[:BODY]


def writer(location: RemoteLocation, round_: int, started: Any) -> None:
    with open_storage(location) as storage:
        cell = storage.read_cell(f"refs/{round_}")
        started.set()
        for i in range(1000):
            key = f"packs/{round_}-{i}"
            storage.put_new(key, body(key))
            cell = storage.swap(cell, key)  # the "ref" names only packs already written


def kill_writers(location: RemoteLocation, rounds: int) -> None:
    ctx = multiprocessing.get_context("spawn")
    for round_ in range(rounds):
        started = ctx.Event()
        proc = ctx.Process(target=writer, args=(location, round_, started))
        proc.start()
        assert started.wait(60)
        time.sleep(random.uniform(0.05, 1.0))
        proc.kill()
        proc.join()
    with open_storage(location) as storage:
        keys = [info.key for info in storage.list("packs/")]
        assert keys  # the writers got somewhere before they died
        for key in keys:
            assert storage.get(key) == body(key), f"{key} is torn"
        for round_ in range(rounds):
            named = storage.read_cell(f"refs/{round_}").value
            if named is not None:
                assert storage.get(named) == body(named)  # a ref never names what is not there
        listed = {info.key for info in storage.list()}
    leftovers = [k for k in listed if not k.startswith(("packs/", "refs/"))]
    assert leftovers == []


def test_killed_writers_leave_whole_keys_on_seaweedfs(s3_env: S3Server) -> None:
    bucket = s3_env.new_bucket()
    kill_writers(RemoteLocation(f"s3://{bucket}", s3_env.endpoint), rounds=6)


def test_killed_writers_leave_whole_keys_in_a_directory(tmp_path: Path) -> None:
    (tmp_path / "remote").mkdir()
    kill_writers(RemoteLocation(os.fspath(tmp_path / "remote")), rounds=6)
    # What a killed write leaves is in .ags-tmp, never under a key's name; and some
    # kill did land inside a write (a 4 MiB write takes most of a writer's time).
    assert sorted(os.listdir(tmp_path / "remote")) == [".ags-locks", ".ags-tmp", "packs", "refs"]
    assert os.listdir(tmp_path / "remote" / ".ags-tmp")


def hold_the_gc_lease(location: RemoteLocation, started: Any) -> None:
    """Take remote gc's lease, as a gc does first, and stay (to be killed)."""
    with open_storage(location) as storage:
        _take_lease(storage, "0123456789abcdef")
        started.set()
        time.sleep(600)


def test_a_remote_gc_killed_holding_the_lease_does_not_hold_it_for_the_hour(
    tmp_path: Path,
) -> None:
    """The lease names the gc's host and process (as git gc's gc.pid does): while that
    process runs, another gc is told who holds the remote; once it is killed, a gc on
    the same machine takes the lease over at once instead of waiting out the hour."""
    remote, location = directory_remote(tmp_path)
    with new_store(tmp_path / "a", location) as a:
        with open_storage(location) as storage:
            result = push(a, storage, [f"sessions/{session_with(a, 3)}"], force=False, seen={})
        record_push(a, "origin", result)
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    holder = ctx.Process(target=hold_the_gc_lease, args=(location, started))
    holder.start()
    try:
        assert started.wait(60)
        gc = ["--store", str(tmp_path / "a"), "gc", "--remote", "origin"]
        refused = CliRunner().invoke(cli, gc)
        assert refused.exit_code == 1
        assert f"another remote gc holds {remote}" in refused.stderr
        assert f"process {holder.pid} on {socket.gethostname()}" in refused.stderr
    finally:
        holder.kill()
        holder.join()
    done = CliRunner().invoke(cli, gc)
    assert done.exit_code == 0, done.stderr
    with open_storage(location) as storage:
        assert storage.read_cell(GC_LEASE).value is None  # let go at the end, as ever


def test_a_lease_from_another_machine_is_waited_out_whatever_its_pid(tmp_path: Path) -> None:
    """No process of that number here proves nothing about another machine's (or
    container's, or boot's): its lease is waited out, not taken over."""
    _remote, location = directory_remote(tmp_path)
    with new_store(tmp_path / "a", location) as a, open_storage(location) as storage:
        push(a, storage, [f"sessions/{session_with(a, 3)}"], force=False, seen={})
        lease = {"holder": "fedcba9876543210", "host": socket.gethostname(), "pid": 4_000_000,
                 "pids": "another-boot/pid:[1]", "until": time.time() + 3600}  # fmt: skip
        storage.swap(storage.read_cell(GC_LEASE), lease)
    refused = CliRunner().invoke(cli, ["--store", str(tmp_path / "a"), "gc", "--remote", "origin"])
    assert refused.exit_code == 1 and "another remote gc holds" in refused.stderr
    with open_storage(location) as storage:
        assert storage.read_cell(GC_LEASE).value == lease
