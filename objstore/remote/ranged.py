"""Ranged reads of a remote pack: only the blocks that hold objects a store lacks.

A remote pack's index (FORMAT.md 5.3, version 2) gives each object's block by
the offset of the block record's payload. Block records follow one another
from the header to the pack's length (which the index also gives), so the
record of a block runs from its payload offset less the record head to the
next block's record, or to the end: the index alone says which byte ranges
hold the blocks a fetch needs. Ranges that touch or nearly touch are read
as one GET (``MERGE_GAP``), and a pack most of which is needed anyway is
read whole (one GET, verified whole as before).

What a ranged read brings is verified exactly as a whole pack's records
are (packs.verified_block_pack): each record whole, of type 3, its id the
BLAKE3 of its payload, its frame decompressing within the bound to whole
entries, each object hashing to its id; and here also the index's own
checksum, and that every object the index places in a block read is there,
where it says. The blocks are then written as the same records into a
new local pack (``Store.staged_blocks``: one for a whole fetch).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Final

import blake3

from ..errors import CorruptObject, DamagedPack
from ..object_store import BlockStaging
from ..pack_format import (
    BLOCK_IDX_ENTRY,
    CHECKSUM_BYTES,
    ENTRIES_AT,
    RECORD_HEAD,
    TYPE_BLOCK,
    parse_index,
)
from ..packs import verified_block
from .layout import pack_key
from .storage import RemoteStorage

MERGE_GAP: Final = 64 * 1024  # bytes of unneeded blocks read rather than a request more
WHOLE_AT: Final = 0.5  # a pack at least this share of which is needed is read whole
MAX_RANGES: Final = 64  # more ranges than this: the pack is read whole

Block = tuple[bytes, list[tuple[str, int, int]]]  # a block record and its objects
Members = dict[int, set[tuple[str, int, int]]]  # block payload offset -> its index entries


def index_members(index: bytes, name: str) -> tuple[int, Members]:
    """The pack's length and what its index says each block holds, by the block's
    payload offset; DamagedPack if the index fails its checksum."""
    head = parse_index(index, f"{name}: its index")
    body = index[:-CHECKSUM_BYTES]
    if head.version != 2 or blake3.blake3(body).digest() != index[-CHECKSUM_BYTES:]:
        raise DamagedPack(f"{name}: its index is damaged")
    members: Members = defaultdict(set)
    for i in range(head.entries):
        raw, block, inner, length = BLOCK_IDX_ENTRY.unpack_from(
            index, ENTRIES_AT + i * BLOCK_IDX_ENTRY.size
        )
        members[block].add((raw.hex(), inner, length))
    return head.pack_length, members


def ranges_to_read(
    pack_length: int, members: Members, needed: set[int]
) -> list[tuple[int, int]] | None:
    """The byte ranges holding the blocks ``needed`` (payload offsets), adjacent ones
    merged; None if reading the whole pack is the better way."""
    starts = sorted(members)
    spans = []
    for i, at in enumerate(starts):
        if at in needed:
            end = starts[i + 1] - RECORD_HEAD.size if i + 1 < len(starts) else pack_length
            spans.append((at - RECORD_HEAD.size, end))
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start - merged[-1][1] <= MERGE_GAP:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    wanted = sum(end - start for start, end in merged)
    if len(merged) > MAX_RANGES or wanted >= pack_length * WHOLE_AT:
        return None
    return merged


def read_blocks(
    storage: RemoteStorage, pack: str, ranges: list[tuple[int, int]], members: Members, where: str
) -> list[Block]:
    """Read ``ranges`` of the remote pack ``pack`` and verify every block record in them
    against its id, its objects' ids and the index's ``members``."""
    blocks: list[Block] = []
    for start, end in ranges:
        data = storage.get_range(pack_key(pack), start, end)
        if len(data) != end - start:
            raise DamagedPack(f"{where} is shorter than its index says")
        pos = 0
        while pos < len(data):
            if pos + RECORD_HEAD.size > len(data):
                raise DamagedPack(f"{where} has a cut record at byte {start + pos}")
            rtype, raw, length = RECORD_HEAD.unpack_from(data, pos)
            payload = start + pos + RECORD_HEAD.size
            frame = data[pos + RECORD_HEAD.size : pos + RECORD_HEAD.size + length]
            if (
                rtype != TYPE_BLOCK
                or len(frame) != length
                or blake3.blake3(frame).digest() != raw
                or payload not in members
            ):
                raise DamagedPack(f"{where} has a damaged record at byte {start + pos}")
            try:
                found = verified_block(frame)
            except (ValueError, CorruptObject) as e:
                raise DamagedPack(f"{where} has a damaged block at byte {payload}: {e}") from None
            if not members[payload] <= set(found):
                raise DamagedPack(f"{where}: its index does not match its block at byte {payload}")
            blocks.append((data[pos : pos + RECORD_HEAD.size + length], found))
            pos += RECORD_HEAD.size + length
    return blocks


def fetch_pack_part(
    staging: BlockStaging, storage: RemoteStorage, pack: str, index: bytes, where: str
) -> tuple[int, int] | None:
    """Stage the blocks of the remote pack ``pack`` holding objects the store (and
    ``staging``) lacks, read by ranges: (objects new here, bytes read); None if the
    pack is better read whole (the caller does)."""
    pack_length, members = index_members(index, where)
    needed = {
        block
        for block, held in members.items()
        if any(not staging.has(oid) for oid, _inner, _n in held)
    }
    if not needed:
        return 0, 0
    ranges = ranges_to_read(pack_length, members, needed)
    if ranges is None:
        return None
    blocks = read_blocks(storage, pack, ranges, members, where)
    return staging.add(blocks), sum(end - start for start, end in ranges)
