"""A block pack seen before its index exists (its writer is still sealing, or
merging packs) is read by scanning its blocks: every object in it must read
back as itself, however many blocks one look takes in."""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path

from objstore import Store
from objstore.pack_format import BLOCK_PACK_MAGIC, TYPE_BLOCK, iter_records


def test_every_object_of_a_block_pack_without_its_index_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
        # Incompressible messages: several 128 KiB blocks when the pack is sealed.
        nodes = [
            store.append(sid, {"role": "user", "content": secrets.token_hex(600)})
            for _ in range(400)
        ]
    (block_pack,) = [
        p for p in (path / "objects" / "pack").glob("*.pack")
        if p.read_bytes()[:8] == BLOCK_PACK_MAGIC
    ]  # fmt: skip
    records = iter_records(block_pack.read_bytes()[8:], 8, (TYPE_BLOCK,))
    assert sum(1 for _ in records) >= 3
    # As a reader finds it while its writer has written the blocks, not yet the index:
    # the writer's flock keeps this open from recovering (writing the index) itself.
    block_pack.with_suffix(".idx").unlink()
    fd = os.open(block_pack, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with Store.open(path) as reader:
            assert not block_pack.with_suffix(".idx").exists(), "read as an unsealed pack"
            for i, node_id in enumerate(nodes):
                node = reader.node(node_id)  # CorruptObject if found in the wrong block
                assert node.messages == i + 1
                assert len(reader.blob(node.content)["content"]) == 1200
    finally:
        os.close(fd)
