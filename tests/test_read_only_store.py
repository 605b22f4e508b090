"""A store on a read-only file system (a backup disk, a snapshot, a mount shared
read-only) can be read: listing, transcripts, export, search, fsck, the web pages'
reads. Every command failed before it read anything: opening a store takes
``locks/recovery`` and seals what a crashed writer left, and the search index is a
file it writes. Now opening such a store takes no lock and recovers nothing: a
crashed writer's pack is read as a pack being written, search indexes into memory,
and a command that writes says in one line that it cannot.

A read-only bind mount: a real read-only file system, which root cannot write either.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from conftest import read_only_mount, tree_snapshot

from cli.main import cli
from objstore import Store
from tests.web_server import ags_serve

CRASHED_WRITER = """
import os, signal, sys
from pathlib import Path
from objstore import Store
s = Store.open(Path(sys.argv[1]))
sid = s.new_session(title="crashed writer")
for i in range(40):
    s.append(sid, {"role": "user", "content": f"unsealed kumquat {i}"})
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the store as written, the same store through a read-only mount)."""
    source, mounted = tmp_path / "disk", tmp_path / "ro"
    store = source / "store"
    with Store.open(store) as s:
        old = s.new_session(title="indexed before")
        s.append(old, {"role": "user", "content": "an indexed persimmon"})
    assert ags(store, "search", "persimmon")[0] == 0  # the index file, made here
    with Store.open(store) as s:
        new = s.new_session(title="added after the index")
        s.append(new, {"role": "user", "content": "a later quince"})
    crash = subprocess.run([sys.executable, "-c", CRASHED_WRITER, str(store)], check=False)
    assert crash.returncode == -9
    packs = store / "objects" / "pack"
    assert any(not p.with_suffix(".idx").exists() for p in packs.glob("*.pack"))  # unsealed
    with read_only_mount(source, mounted):
        yield store, mounted / "store"


def ags(store: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", str(store), *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_a_store_on_a_read_only_file_system_can_be_read(read_only: tuple[Path, Path]) -> None:
    source, store = read_only
    before = tree_snapshot(source)
    cache = {p.name: p.read_bytes() for p in (source / "cache").iterdir()}
    code, out, err = ags(store, "ls", "--json")
    assert code == 0, err
    sessions = {s["title"]: s for s in json.loads(out)}
    assert sessions.keys() == {"indexed before", "added after the index", "crashed writer"}
    crashed = sessions["crashed writer"]["id"]
    assert sessions["crashed writer"]["messages"] == 40  # from the unsealed pack
    code, out, err = ags(store, "log", crashed, "--oneline", "-n", "1")
    assert (code, err) == (0, "") and "unsealed kumquat 39" in out
    code, out, err = ags(store, "export", crashed)
    assert code == 0 and json.loads(out)["session"]["messages"] == 40, err
    # The index file knew the first session only: the copy in memory is brought up
    # to date with the rest, unsealed pack included.
    for word, title in [
        ("persimmon", "indexed before"),
        ("quince", "added after the index"),
        ("kumquat", "crashed writer"),
    ]:
        code, out, err = ags(store, "search", word)
        assert code == 0 and out.startswith(sessions[title]["id"][:12]), (word, out, err)
    code, out, err = ags(store, "fsck")
    assert code == 0 and "ok" in out, out + err
    code, out, err = ags(store, "title", crashed, "renamed")
    assert code == 1 and out == ""
    assert err.startswith(f"ags: cannot write {store}/") and err.count("\n") == 1, err
    assert err.endswith(": read-only file system\n")
    assert tree_snapshot(source) == before
    assert {p.name: p.read_bytes() for p in (source / "cache").iterdir()} == cache


def test_its_web_pages_are_served_read_only(read_only: tuple[Path, Path]) -> None:
    """Without --read-only too: every button would fail (a 500 where it wrote)."""
    _, store = read_only
    with ags_serve(store) as server:
        assert "(read-only)" in server.stderr[0]
        listing = httpx.get(server.url, timeout=30)
        assert listing.status_code == 200 and "crashed writer" in listing.text
        found = httpx.get(f"{server.base}/search", params={"q": "kumquat"}, timeout=30)
        assert found.status_code == 200 and "unsealed" in found.text
        sid = re.findall(r'href="/s/([0-9a-f]{32})"', listing.text)[0]
        page = httpx.get(f"{server.base}/s/{sid}", timeout=30)
        assert page.status_code == 200 and 'method="post"' not in page.text


def test_a_read_only_mount_is_told_from_a_writable_one(read_only: tuple[Path, Path]) -> None:
    from objstore.files import read_only_file_system

    source, store = read_only
    assert read_only_file_system(store) and not read_only_file_system(source)
    with Store.open(store) as s, Store.open(source) as t:
        assert s.read_only and not t.read_only
    assert not read_only_file_system(source / "no such folder")
    assert os.access(source, os.W_OK)
