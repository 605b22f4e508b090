"""fsck reads a store in storage order: each block of a block pack is decompressed
once (read in id order, nearly every object cost a whole block), and what the
index says is checked against the records without a lookup per object."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from objstore import Store, check_store
from objstore import packs as packs_module
from objstore.pack_format import encode_index


def test_fsck_decompresses_each_block_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s, s.batch():
        for n in range(40):
            sid = s.new_session(title=f"s{n}")
            for i in range(200):
                s.append(sid, {"role": "user", "content": f"message {i} of {n} " + "x" * 500})
    with Store.open(path) as s:  # every pack sealed now
        blocks = sum(1 for pack in s.objects.sealed_packs() for _ in pack.blocks())
    assert blocks > 16  # more than a pack reader caches
    calls = 0
    real = packs_module.decompress_block

    def counted(frame: bytes | memoryview) -> bytes:
        nonlocal calls
        calls += 1
        return real(frame)

    monkeypatch.setattr(packs_module, "decompress_block", counted)
    with Store.open(path) as s:
        report = check_store(s)
    assert report.problems == [] and report.objects >= 16000
    assert calls <= blocks, f"{calls} block reads for {blocks} blocks"


def _rewrite_index(path: Path, change: Callable[[list[tuple[str, tuple[int, ...]]]], None]) -> str:
    """Write the one pack's index again, changed but with a valid checksum (so only
    a comparison with the records can tell)."""
    with Store.open(path) as s:
        (pack,) = s.objects.sealed_packs()
        entries = [(e[0].hex(), tuple(e[1:])) for e in pack._entries()]
        size, version, name = pack.pack_size, pack.version, pack.path
    change(entries)
    name.with_suffix(".idx").write_bytes(encode_index(entries, size, version))
    return name.name


def _one_pack_store(path: Path) -> None:
    with Store.open(path) as s, s.batch():
        sid = s.new_session()
        for i in range(300):
            s.append(sid, {"role": "user", "content": f"message {i} " + "y" * 200})
    with Store.open(path) as s:
        assert len(s.objects.sealed_packs()) == 1


def test_fsck_finds_an_object_its_index_lacks(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _one_pack_store(path)
    name = _rewrite_index(path, lambda entries: entries.pop(len(entries) // 2))
    with Store.open(path) as s:
        problems = [str(p) for p in check_store(s).problems]
    assert f"{name}: the index lacks 1 object(s) of the pack" in problems


def test_fsck_finds_index_entries_that_point_at_the_wrong_object(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _one_pack_store(path)

    def swap(entries: list[tuple[str, tuple[int, ...]]]) -> None:
        (a, loc_a), (b, loc_b) = entries[3], entries[4]
        entries[3], entries[4] = (a, loc_b), (b, loc_a)

    _rewrite_index(path, swap)
    with Store.open(path) as s:
        problems = [str(p) for p in check_store(s).problems]
    assert sum("its content does not hash to its id" in p for p in problems) == 2, problems
