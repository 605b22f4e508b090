"""fsck reads a store in storage order: each block of a block pack is decompressed
once (read in id order, nearly every object cost a whole block)."""

from __future__ import annotations

from pathlib import Path

import pytest

from objstore import Store, check_store
from objstore import packs as packs_module


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
