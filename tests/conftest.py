"""Helpers shared by the test files."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import blake3
import pytest
import zstandard
from docker_fixture import require_docker
from model_server import FakeModelServer

from objstore import Store, check_store
from objstore.pack_format import (
    BLOCK_IDX_ENTRY,
    ENTRIES_AT,
    PACK_MAGIC,
    RECORD_HEAD,
    TYPE_BLOCK,
    encode_record,
    parse_index,
    scan_buffer,
)
from objstore.packs import rebuild_index

# Ctrl-C as a terminal sends it. A script's `pytest &` starts pytest with SIGINT
# ignored, and an ignored signal stays ignored in every process it starts: the
# tests that press Ctrl-C on fsck would see nothing happen. A handler here is
# reset to the default in each child, as a process started from a terminal has it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def store_with_damaged_message(path: Path, text: str) -> tuple[str, str, Path]:
    """A store with one session of one message whose content has one bit flipped.

    The sealed pack compresses objects together in blocks (FORMAT.md 5.5); the bit
    is flipped in the message's content and its block compressed again, so the
    block reads and only the message fails its id (a flipped bit on the disk
    fails the whole block: tests/test_damaged_store.py). Returns (session id,
    message blob id, the pack holding it).
    """
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": text})
        blob = s.node(s.node_id(sid)).content
    return sid, blob, flip_a_bit_of_object(path, blob)


def flip_a_bit_of_object(path: Path, oid: str) -> Path:
    """Flip one bit in the middle of object ``oid``'s content inside the (only) sealed
    block pack of the store at ``path``, its block compressed again so that only the
    object fails its id; return the pack."""
    blob = oid
    pack = next((path / "objects" / "pack").glob("*.pack"))
    index = pack.with_suffix(".idx")
    data = index.read_bytes()
    head = parse_index(data)
    at = next(
        ENTRIES_AT + i * BLOCK_IDX_ENTRY.size
        for i in range(head.entries)
        if data[ENTRIES_AT + i * BLOCK_IDX_ENTRY.size :].startswith(bytes.fromhex(blob))
    )
    _, off, inner, length = BLOCK_IDX_ENTRY.unpack_from(data, at)
    packed = pack.read_bytes()
    size = int.from_bytes(packed[off - 4 : off], "little")
    content = bytearray(zstandard.ZstdDecompressor().decompress(packed[off : off + size]))
    content[inner + length // 2] ^= 0x01  # one bit, in the middle of the message
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(bytes(content))
    record = encode_record(TYPE_BLOCK, blake3.blake3(frame).digest(), frame)
    pack.write_bytes(packed[: off - RECORD_HEAD.size] + record + packed[off + size :])
    index.unlink()
    rebuild_index(pack, path / "tmp")
    return pack


def copy_fixture_store(source: Path, path: Path) -> Path:
    """A copy at ``path`` of a store kept under tests/fixtures, with the modes ags gives
    its files (git keeps none)."""
    shutil.copytree(source, path)
    for dirpath, _dirs, files in os.walk(path):
        os.chmod(dirpath, 0o700)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o600)
    return path


def assert_reads_as_expected(path: Path, want: dict[str, Any]) -> None:
    """The store at ``path`` holds what a fixture's expected JSON says (each session's
    title, head, count, context and log, and the tags, under ``_tags``), and fsck
    finds nothing wrong."""
    want = dict(want)
    tags = want.pop("_tags")
    with Store.open(path) as s:
        assert {info.id for info in s.sessions(include_archived=True)} == set(want)
        for sid, session in want.items():
            info = s.session(sid)
            assert (info.title, info.head, info.messages) == (
                session["title"], session["head"], session["messages"]
            )  # fmt: skip
            assert s.context(sid) == session["context"]
            assert [e.message for e in s.log(sid)] == session["log"]
        assert s.tags() == tags
        assert check_store(s).problems == []


@contextmanager
def read_only_mount(source: Path, mounted: Path) -> Iterator[Path]:
    """``source`` seen read-only at ``mounted`` (made here): a read-only bind mount, a
    real read-only file system that root cannot write either. Skips the test where no
    mount can be made (not root)."""
    mounted.mkdir()
    mount = subprocess.run(["mount", "--bind", source, mounted], capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here: {mount.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", mounted], check=True)
        yield mounted
    finally:
        subprocess.run(["umount", mounted], check=True)


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes. Lock files are left out (they hold
    pids), and so is ``cache/``: derived data that any read may make or refresh
    (FORMAT.md 13, 16), never part of what a store holds."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            p = Path(dirpath, fn)
            rel = str(p.relative_to(root))
            if rel.startswith(("locks/", "cache/")):
                continue
            out[rel] = p.read_bytes()
    return out


@pytest.fixture
def image() -> str:
    """The sandbox image once a Docker engine answers (else a skip; a failure under CI)."""
    return require_docker()


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    """A scripted model server on 127.0.0.1 (tests/model_server.py)."""
    with FakeModelServer() as s:
        yield s


def count_preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of every ``os.pread`` from now on (what a reader reads of a pack)."""
    calls: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, off: int) -> bytes:
        calls.append(n)
        return real(fd, n, off)

    monkeypatch.setattr(os, "pread", pread)
    return calls


def live_pack(path: Path) -> Path:
    """The one pack of the store at ``path`` being written (no index yet)."""
    (pack,) = [p for p in (path / "objects" / "pack").glob("*.pack")
               if not p.with_suffix(".idx").exists()]  # fmt: skip
    return pack


def records_end(pack: bytes) -> int:
    """Where the records of a pack being written end: its size less the zeros its
    writer keeps ahead of them (FORMAT.md 5.1)."""
    return scan_buffer(pack, 0, len(PACK_MAGIC)).end


def as_user_without_overrides(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``args`` without the capabilities that let root read any folder (as root),
    or as it is (as anyone else): so a folder of mode 000 is unreadable to it."""
    if os.geteuid() == 0:
        drop = "-dac_override,-dac_read_search,-fowner"
        args = ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", *args]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)
