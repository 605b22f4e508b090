"""Merging sealed packs into one (FORMAT.md 5.4): what a repack, gc's sweep and a
merge beside the appends do, in a handle's process or in its seal helper's
(seal_helper.py)."""

from __future__ import annotations

from collections.abc import Callable, Container
from pathlib import Path
from typing import Final

import blake3

from . import objects
from .errors import CorruptObject
from .files import read_file
from .pack_format import RECORD_HEAD, block_piece, block_pieces
from .packs import BLOCK_BYTES, BlockPackWriter, SealedPack, block_group

COPIED_WHOLE_BYTES: Final = BLOCK_BYTES * 3 // 4
"""Content a block holds, at least, for a merge to copy it as it is (``_copied_whole``):
a full block. The part-filled blocks a seal ends with are taken apart, their objects
written with the next ones of their kind."""


def merged_pack(
    packs: list[SealedPack],
    pack_dir: Path,
    tmp_dir: Path,
    *,
    keep: Container[str] | None = None,
    extra: list[tuple[str, str]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> BlockPackWriter:
    """One new sealed block pack in ``pack_dir`` holding every object of ``packs`` (and
    the loose files ``extra``) once, a good copy if any; with ``keep``, only the
    objects in it. A damaged copy with no good one is kept as it is, for fsck to
    report: a plain record, or the whole block that cannot be read. Run by a
    handle, and by its seal helper (seal_helper.py) for a merge beside the appends."""
    expected = sum(pack.count for pack in packs) + len(extra or ())
    merged = BlockPackWriter(pack_dir, tmp_dir, expected)
    damaged: dict[str, bytes] = {}
    broken: list[tuple[bytes, list[tuple[str, int, int]]]] = []

    def wanted(oid: str) -> bool:
        return (keep is None or oid in keep) and oid not in merged

    def take_stored(oid: str, stored: bytes) -> None:
        if not wanted(oid):
            return
        try:
            kind, body = objects.decode(oid, stored)
        except CorruptObject:
            damaged.setdefault(oid, stored)  # unless a good copy turns up
            return
        merged.add_content(oid, kind.encode("ascii") + b"\0" + body, new=True)

    try:
        # Oldest first: what was written together stays together (a context's
        # messages in few blocks), whatever order the packs were chosen in.
        packs = sorted(packs, key=lambda pack: pack.sealed_at)
        for i, pack in enumerate(packs):
            for oid, stored in pack.plain_records():
                take_stored(oid, stored)
            for record, content, members in pack.blocks():
                if content is None:
                    broken.append((record, members))
                    continue
                if keep is None and _copied_whole(merged, record, content, members):
                    continue
                try:
                    pieces = block_pieces(content)
                except ValueError:  # a MessagePack value that is no body: copied as it is
                    broken.append((record, members))
                    continue
                for oid, _, _, piece in pieces:
                    if not wanted(oid):
                        continue
                    try:
                        objects.verified(oid, piece)
                    except CorruptObject:
                        damaged.setdefault(oid, objects.stored_as_is(piece))
                        continue
                    merged.add_content(oid, piece, new=True)  # wanted: not in it
            if progress:
                progress(i + 1, len(packs))
        for oid, path in extra or []:
            take_stored(oid, read_file(path))
        merged.add([(oid, stored) for oid, stored in damaged.items() if oid not in merged])
        for record, members in broken:
            left = [m for m in members if wanted(m[0])]
            if left and record:
                merged.add_block_record(record, left)
        merged.seal()
    except BaseException:
        merged.abandon()
        raise
    return merged


def _copied_whole(
    merged: BlockPackWriter, record: bytes, content: bytes, members: list[tuple[str, int, int]]
) -> bool:
    """Copy a full block into ``merged`` as it is, when ``merged`` holds none of its
    objects and its record verifies (its id is the BLAKE3 of its payload, claim
    included: the block is what the writer that verified its objects wrote, FORMAT.md
    5.4); whether it did. The merge then neither checks each object, nor builds and
    compresses that block again: most of the cost of merging the packs a writer
    seals, where each object is copied again about log2(packs) times."""
    if len(content) < COPIED_WHOLE_BYTES or not members:
        return False
    if merged.holds_any([oid for oid, _, _ in members]):
        return False
    _type, checksum, _length = RECORD_HEAD.unpack_from(record)
    if blake3.blake3(memoryview(record)[RECORD_HEAD.size :]).digest() != checksum:
        return False
    _oid, inner, length = members[0]
    try:
        group = block_group(block_piece(content, inner, length))
    except ValueError:  # a MessagePack value that is no body: the merge reads each
        return False
    merged.copy_block(record, members, group)
    return True
