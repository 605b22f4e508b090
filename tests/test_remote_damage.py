"""A remote that was damaged or tampered with: nothing outside a directory remote
is read or written through a link planted in it, nothing is waited on forever,
a ref that breaks the format is named and left out while every other one
arrives, and fsck finds the same damage in a store's own refs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import tree_snapshot
from sync_setup import age_remote, directory_remote, new_store, session_with, sessions_with

from cli.main import cli
from objstore import Store
from objstore.fsck import check_store
from objstore.remote import open_storage, push, record_push

SID = "0123456789abcdef0123456789abcdef"


def ags(store: Path | None, *args: str) -> tuple[int, str, str]:
    pre = ["--store", str(store)] if store is not None else []
    result = CliRunner().invoke(cli, [*pre, *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def remote_with_two_sessions(tmp_path: Path) -> tuple[Path, list[str]]:
    """A directory remote holding two pushed sessions; their ids."""
    return remote_with(tmp_path, lambda a: [session_with(a, 3, "one"), session_with(a, 2, "two")])


def remote_with_many(tmp_path: Path, count: int) -> Path:
    """A directory remote holding ``count`` sessions of 5 messages (a clone or a pull
    of it takes a moment)."""
    return remote_with(tmp_path, lambda a: sessions_with(a, count, 5))[0]


def remote_with(tmp_path: Path, make: Callable[[Store], list[str]]) -> tuple[Path, list[str]]:
    """A directory remote holding the sessions ``make`` writes in store ``a``, pushed."""
    remote, location = directory_remote(tmp_path)
    with new_store(tmp_path / "a", location) as a:
        sids = make(a)
        with open_storage(location) as storage:
            result = push(a, storage, [f"sessions/{s}" for s in sids], force=False, seen={})
            record_push(a, "origin", result)
    return remote, sids


def edit_cell(remote: Path, sid: str, change: dict[str, Any]) -> None:
    """Change a session's ref cell in place, as a hand or another program would."""
    path = remote / "refs" / "sessions" / sid
    cell = json.loads(path.read_bytes())
    cell["value"]["meta"].update(change)
    path.write_text(json.dumps(cell))


BAD_META: list[dict[str, Any]] = [
    {"root": ["a"]},
    {"root": "relative/path"},
    {"messages": -5},
    {"archived_at": "yesterday"},
    {"created": "not a time"},
    {"updated": None},
    {"forked_from": {"session": "../../etc", "node": None}},
    {"forked_from": {"session": SID}},
    {"model": "m" * 5000},
    {"title": "t" * 1001},
    {"title": "a\0b"},
    {"imported": [1]},
]


@pytest.mark.parametrize("change", BAD_META, ids=lambda c: next(iter(c)))
def test_a_ref_cell_with_damaged_metadata_is_left_out_and_the_rest_is_pulled(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    remote, (bad, good) = remote_with_two_sessions(tmp_path)
    edit_cell(remote, bad, change)
    code, out, err = ags(None, "clone", str(remote), str(tmp_path / "b"))
    field = next(iter(change))
    assert code == 1, (out, err)
    assert err.count("\n") == 1 and f"sessions/{bad}" in err and f"meta.{field}" in err, err
    assert f"damaged      sessions/{bad}  left out" in out
    with Store.open(tmp_path / "b") as b:
        assert [s.id for s in b.sessions()] == [good]
        assert check_store(b).problems == []
    # A pull after says the same again, and still takes nothing of it.
    code, out, err = ags(tmp_path / "b", "pull")
    assert code == 1 and f"meta.{field}" in err and f"damaged      {bad}  left out" in out
    # Mended on the remote, it arrives.
    edit_cell(remote, bad, {"title": "one", **{k: None for k in change if k != "title"}})
    if field in ("created", "updated"):
        edit_cell(remote, bad, {field: "2026-01-31T12:00:00.000Z"})
    if field == "messages":
        edit_cell(remote, bad, {"messages": 3})
    code, out, err = ags(tmp_path / "b", "pull")
    assert code == 0, err
    assert f"created      {bad}" in out


def test_a_tracking_ref_an_older_ags_took_damaged_is_read_again_and_not_pulled(
    tmp_path: Path,
) -> None:
    """A tracking ref fetched before the checks (its metadata damaged) does not get a
    session made from it: the cell is read again, and fsck names the tracking ref."""
    remote, (bad, good) = remote_with_two_sessions(tmp_path)
    code, _out, err = ags(None, "clone", str(remote), str(tmp_path / "b"))
    assert code == 0, err
    assert ags(tmp_path / "b", "delete", bad, "--yes")[0] == 0
    tracking = tmp_path / "b" / "refs" / "remotes" / "origin" / bad
    rec = json.loads(tracking.read_bytes())
    rec["meta"]["title"] = "t" * 2000
    tracking.write_text(json.dumps(rec))
    assert any(f"remotes/origin/{bad}" in p for p in problems(tmp_path / "b"))
    edit_cell(remote, bad, {"title": "t" * 2000})  # (the remote agrees: still damaged)
    code, out, err = ags(tmp_path / "b", "pull")
    assert code == 1 and "meta.title" in err, err
    with Store.open(tmp_path / "b") as b:
        assert [s.id for s in b.sessions()] == [good]


def problems(store: Path) -> list[str]:
    with Store.open(store) as s:
        return [str(p) for p in check_store(s).problems]


@pytest.mark.parametrize("change", BAD_META, ids=lambda c: next(iter(c)))
def test_fsck_names_a_session_ref_whose_metadata_breaks_the_format(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    with Store.open(tmp_path / "s") as s:
        sid = session_with(s, 2)
    path = tmp_path / "s" / "refs" / "sessions" / sid
    rec = json.loads(path.read_bytes())
    rec["meta"].update(change)
    path.write_text(json.dumps(rec))
    found = problems(tmp_path / "s")
    assert len(found) == 1 and sid in found[0], found
    assert f"meta.{next(iter(change))}" in found[0] or "meta is" in found[0], found


def test_a_stray_key_in_place_of_a_ref_is_named_and_stops_remote_gc(tmp_path: Path) -> None:
    """A ref replaced by a folder of files (or a name no store can hold) is named by a
    pull, which takes the other sessions, and remote gc sweeps nothing."""
    remote, (bad, good) = remote_with_two_sessions(tmp_path)
    cell = remote / "refs" / "sessions" / bad
    body = cell.read_bytes()
    cell.unlink()
    cell.mkdir()
    (cell / "cell").write_bytes(body)
    code, out, err = ags(None, "clone", str(remote), str(tmp_path / "b"))
    assert code == 1 and f"refs/sessions/{bad}/cell is not the key of a ref cell" in err, err
    with Store.open(tmp_path / "b") as b:
        assert [s.id for s in b.sessions()] == [good]
    age_remote(remote, 2 * 3600)  # old enough to be swept, were gc to sweep
    before = keys(remote)
    code, _out, err = ags(tmp_path / "b", "gc", "--remote", "origin")
    assert code == 1 and "is not the key of a ref cell" in err and err.count("\n") == 1, err
    assert keys(remote) == before


def keys(remote: Path) -> dict[str, bytes]:
    """A directory remote's keys and their bytes (not its locks and temporary files)."""
    return {k: v for k, v in tree_snapshot(remote).items() if not k.startswith(".")}


# -- what a directory remote will not follow or wait on ------------------------------


def test_a_remote_folder_that_is_a_link_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """``packs`` made a link to a folder outside: a clone reads nothing through it, a
    push writes nothing through it (before, it wrote its pack there)."""
    remote, _sids = remote_with_two_sessions(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (remote / "packs").rename(elsewhere)
    (remote / "packs").symlink_to(elsewhere)
    outside = tree_snapshot(elsewhere)
    code, _out, err = ags(None, "clone", str(remote), str(tmp_path / "b"))
    assert code == 1 and err.count("\n") == 1, err
    assert "packs is a symbolic link, never followed" in err
    assert not (tmp_path / "b").exists()
    with Store.open(tmp_path / "a") as a:
        session_with(a, 4, "three")
    code, _out, err = ags(tmp_path / "a", "push", "--all")
    assert code == 1 and "packs is a symbolic link, never followed" in err, err
    assert tree_snapshot(elsewhere) == outside


@pytest.mark.parametrize("link", ["refs", "refs/tags", ".ags-tmp", ".ags-locks"])
def test_no_folder_of_a_remote_is_followed_when_it_is_a_link(tmp_path: Path, link: str) -> None:
    remote, sids = remote_with_two_sessions(tmp_path)
    with Store.open(tmp_path / "a") as a:
        a.tag("v1", sids[0])
    assert ags(tmp_path / "a", "push", "v1")[0] == 0
    elsewhere = tmp_path / "elsewhere"
    (remote / link).rename(elsewhere)
    (remote / link).symlink_to(elsewhere)
    outside = tree_snapshot(elsewhere)
    with Store.open(tmp_path / "a") as a:
        session_with(a, 4, "three")
    code, _out, err = ags(tmp_path / "a", "push", "--all")
    assert code == 1 and err.count("\n") == 1, err
    assert link in err and ("symbolic link" in err or "not a folder" in err), err
    assert tree_snapshot(elsewhere) == outside
    if not link.startswith("."):  # (a read needs neither)
        code, _out, err = ags(None, "clone", str(remote), str(tmp_path / "b"))
        assert code == 1 and f"{link} is a symbolic link, never followed" in err, err


def test_a_remote_whose_refs_is_a_file_is_not_taken_for_an_empty_one(tmp_path: Path) -> None:
    remote, _sids = remote_with_two_sessions(tmp_path)
    os.rename(remote / "refs", tmp_path / "old-refs")
    (remote / "refs").write_text("not a folder")
    code, _out, err = ags(None, "clone", str(remote), str(tmp_path / "b"))
    assert code == 1 and "refs is a file where a folder should be" in err, err
    assert not (tmp_path / "b").exists()


def test_a_fifo_in_place_of_a_pack_index_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Run as a process of its own: a clone that opened the FIFO would wait forever."""
    remote, _sids = remote_with_two_sessions(tmp_path)
    (idx,) = (remote / "packs").glob("*.idx")
    idx.unlink()
    os.mkfifo(idx)
    run = subprocess.run(
        [sys.executable, "-m", "cli.main", "clone", str(remote), str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 1, run.stderr
    assert f"packs/{idx.name} is not a regular file" in run.stderr
    assert run.stderr.count("\n") == 1
    assert not (tmp_path / "b").exists()


def test_a_truncated_pack_index_is_named_as_the_index(tmp_path: Path) -> None:
    remote, _sids = remote_with_two_sessions(tmp_path)
    (idx,) = (remote / "packs").glob("*.idx")
    idx.write_bytes(idx.read_bytes()[:50])
    code, _out, err = ags(None, "clone", str(remote), str(tmp_path / "b"))
    assert code == 1 and err.count("\n") == 1, err
    assert f"pack {idx.stem.removeprefix('pack-')}: its index is truncated" in err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_clone_stopped_by_a_signal_removes_what_it_made(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """Stopped (SIGSTOP) as soon as its folder appears, so the signal surely comes
    while it works, then sent ``signum`` and let go on."""
    remote = remote_with_many(tmp_path, 300)
    target = tmp_path / "b"
    child = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "clone", str(remote), str(target)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not (target / "ags-store.json").exists():
        assert child.poll() is None and time.monotonic() < deadline, "the clone ended first"
        time.sleep(0.001)
    child.send_signal(signal.SIGSTOP)
    assert child.poll() is None, "the clone ended before it could be stopped"
    child.send_signal(signum)
    child.send_signal(signal.SIGCONT)
    _out, err = child.communicate(timeout=60)
    assert child.returncode == 128 + signum, err
    assert not target.exists()


def test_two_pulls_at_once_both_finish(tmp_path: Path) -> None:
    """One failed ("ref remotes/origin/... changed while a batch was writing it") in 7
    of 8 tries; one fetch or pull into a store at a time now, the second waits."""
    remote = remote_with_many(tmp_path, 200)
    assert ags(tmp_path / "b", "init")[0] == 0
    assert ags(tmp_path / "b", "remote", "add", "origin", str(remote))[0] == 0
    args = [sys.executable, "-m", "cli.main", "--store", str(tmp_path / "b"), "pull"]
    runs = [
        subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    for run in runs:
        _out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    with Store.open(tmp_path / "b") as b:
        assert len(b.sessions()) == 200
        assert check_store(b).problems == []


def test_a_clone_into_a_store_left_by_a_killed_clone_says_how_to_finish(
    tmp_path: Path,
) -> None:
    remote, _sids = remote_with_two_sessions(tmp_path)
    Store.open(tmp_path / "b").close()
    code, _out, err = ags(None, "clone", str(remote), str(tmp_path / "b"))
    assert code == 1 and err.count("\n") == 1, err
    assert f"`ags --store {tmp_path / 'b'} pull` finishes it" in err


def test_temporary_files_a_killed_push_left_are_removed_by_a_later_write(
    tmp_path: Path,
) -> None:
    """A push killed while it wrote a pack left the partial file in .ags-tmp for good."""
    remote, _sids = remote_with_two_sessions(tmp_path)
    old, young = remote / ".ags-tmp" / "1-aaaa", remote / ".ags-tmp" / "2-bbbb"
    old.write_bytes(b"x" * 1000)
    young.write_bytes(b"y")  # (a push under way in another process, perhaps)
    then = time.time() - 2 * 3600
    os.utime(old, (then, then))
    with Store.open(tmp_path / "a") as a:
        session_with(a, 2, "three")
    assert ags(tmp_path / "a", "push", "--all")[0] == 0
    assert not old.exists() and young.exists()
