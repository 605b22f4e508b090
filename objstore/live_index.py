"""The live index: where the records of a pack being written start, kept beside
it by its writer, so that a reader opening the store need not scan the whole
pack record by record (FORMAT.md 5.6).

It is a hint, derived and never synced: entries appended as the pack grows,
each listing the records of one stretch of the pack and checked by its own
checksum. A reader takes the entries that check, then scans the pack from
where they end. It never takes content from here: every record a reader uses
is read from the pack and verified there as before, and an entry that does
not fit the pack (a torn one, a stale one, one of another pack) ends what is
taken, so a bad live index costs a scan, never a wrong value.

This module is the byte layout, as pure functions; packs.py does the I/O.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

import blake3

LIVE_MAGIC: Final = b"AGSLIVE\x01"
ENTRY_HEAD: Final = struct.Struct("<I32s")  # body length | BLAKE3-256 of the body
BODY_HEAD: Final = struct.Struct("<QII")  # end | objects | ref updates
ID_BYTES: Final = 32
ENTRY_RECORDS: Final = 256
"""Records per entry: a reader scans at most about this many (the tail past the
last entry), and the writer writes an entry every ~85 appends. Each entry costs
a reader a checksum and a few calls; each record it lists, next to nothing."""


class Stretch(NamedTuple):
    """What one entry lists: the records of the pack in ``[previous end, end)``."""

    end: int
    object_ids: tuple[bytes, ...]  # binary ids, in pack order
    object_starts: tuple[int, ...]  # where each object record starts
    ref_starts: tuple[int, ...]  # where each ref-update record starts, in pack order


def encode_entry(
    end: int, objects: Sequence[tuple[bytes, int]], ref_starts: Sequence[int]
) -> bytes:
    """One entry: ``length | checksum | end (u64) | n (u32) | m (u32) | n ids (32 bytes
    each) | n object record starts (u64 each) | m ref-update record starts (u64 each)``."""
    n, m = len(objects), len(ref_starts)
    body = b"".join(
        [
            BODY_HEAD.pack(end, n, m),
            *(raw for raw, _ in objects),
            struct.pack(f"<{n}Q", *(at for _, at in objects)),
            struct.pack(f"<{m}Q", *ref_starts),
        ]
    )
    return ENTRY_HEAD.pack(len(body), blake3.blake3(body).digest()) + body


def parse(data: bytes, first: int, limit: int) -> list[Stretch]:
    """The entries of a live index that check, in order, up to the first that does not:
    its checksum, an ``end`` past the one before it (``first`` for the first entry)
    and not past ``limit`` (the pack's size), the first record at the previous end
    and the last before ``end``. Whether the records are there is the pack's to say
    (``OpenPack`` checks the last one of each entry)."""
    if not data.startswith(LIVE_MAGIC):
        return []
    found: list[Stretch] = []
    pos, prev_end, size = len(LIVE_MAGIC), first, len(data)
    while pos + ENTRY_HEAD.size <= size:
        length, checksum = ENTRY_HEAD.unpack_from(data, pos)
        at = pos + ENTRY_HEAD.size
        body = data[at : at + length]
        if len(body) != length or length < BODY_HEAD.size:
            break
        end, n, m = BODY_HEAD.unpack_from(body)
        if length != BODY_HEAD.size + n * (ID_BYTES + 8) + m * 8 or n + m == 0:
            break
        if blake3.blake3(body).digest() != checksum or not prev_end < end <= limit:
            break
        ids_at = BODY_HEAD.size
        starts_at = ids_at + n * ID_BYTES
        object_starts = struct.unpack_from(f"<{n}Q", body, starts_at)
        ref_starts = struct.unpack_from(f"<{m}Q", body, starts_at + n * 8)
        firsts = object_starts[:1] + ref_starts[:1]
        lasts = object_starts[-1:] + ref_starts[-1:]
        if min(firsts) != prev_end or max(lasts) >= end:
            break
        found.append(Stretch(end, _ids(n).unpack_from(body, ids_at), object_starts, ref_starts))
        prev_end, pos = end, at + length
    return found


@functools.lru_cache(maxsize=512)
def _ids(n: int) -> struct.Struct:
    """A layout of ``n`` ids one after the other: unpacked in one call, since a reader
    takes thousands of them on every open."""
    return struct.Struct(f"<{n * f'{ID_BYTES}s'}")
