"""The byte layouts of a pack and of its index, as pure functions on bytes.

FORMAT.md 5.1 (records) and 5.3 (the index) are the contract; this module
encodes and decodes exactly that and touches no file: packs.py does the I/O
(appending, syncing, mapping, recovering), so every layout can be tested
byte for byte against the documentation.
"""

from __future__ import annotations

import mmap
import struct
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from itertools import accumulate
from types import ModuleType
from typing import Final, NamedTuple

import blake3
import orjson

from .canonical import check_json, encode
from .errors import DamagedIndex, InvalidInput, LimitExceeded

PACK_MAGIC: Final = b"AGSPACK\x01"  # written by a handle as it appends (5.1)
BLOCK_PACK_MAGIC: Final = b"AGSPACK\x02"  # sealed: objects compressed together (5.5)
IDX_MAGIC: Final = b"AGSIDX\x01\x00"
BLOCK_IDX_MAGIC: Final = b"AGSIDX\x02\x00"
RECORD_HEAD: Final = struct.Struct("<B32sI")  # type | id | payload length
IDX_HEAD: Final = struct.Struct("<8sQI")  # magic and version | pack length | count
IDX_FANOUT: Final = struct.Struct("<256I")
IDX_ENTRY: Final = struct.Struct("<32sQI")  # id | payload offset | payload length
# version 2: id | payload offset of its record | offset in the block | length there
BLOCK_IDX_ENTRY: Final = struct.Struct("<32sQII")
BLOCK_ENTRY_HEAD: Final = struct.Struct("<32sI")  # id | length of kind + NUL + body
NOT_IN_A_BLOCK: Final = 0xFFFFFFFF  # a v2 index entry of a plain object record
ENTRIES_AT: Final = IDX_HEAD.size + IDX_FANOUT.size
CHECKSUM_BYTES: Final = 32
TYPE_OBJECT: Final = 1
TYPE_REF: Final = 2
TYPE_BLOCK: Final = 3  # version 2 only

Location = tuple[int, int]  # (offset of the payload in the pack, its length)


class Record(NamedTuple):
    type: int
    raw_id: bytes  # the object id, or a ref update's checksum (32 bytes)
    location: Location


def encode_record(rtype: int, raw_id: bytes, payload: bytes) -> bytes:
    """One record: ``type | id | length (u32 LE) | payload`` (5.1)."""
    return RECORD_HEAD.pack(rtype, raw_id, len(payload)) + payload


def iter_records(
    data: bytes | memoryview, base: int = 0, types: tuple[int, ...] = (TYPE_OBJECT, TYPE_REF)
) -> Iterator[Record]:
    """The records in ``data``, which starts at pack offset ``base``, in order.

    Stops before the first record that does not fit in ``data`` (one being
    written, or a torn one left by a crash) or whose type is unknown: the
    offset after the last record yielded is where readable records end.
    """
    pos, head, size = 0, RECORD_HEAD.size, len(data)
    while pos + head <= size:
        rtype, raw, length = RECORD_HEAD.unpack_from(data, pos)
        if pos + head + length > size or rtype not in types:
            return
        yield Record(rtype, raw, (base + pos + head, length))
        pos += head + length


_ID_AT: Final = 1  # a record head's id, after its type byte
_LENGTH_AT: Final = 33  # a record head's payload length, after type and id
_LENGTH: Final = struct.Struct("<I")


def payload_location(data: bytes | memoryview, start: int, base: int = 0) -> Location:
    """Where the payload is of the record whose head starts at ``data[start]``
    (``data[0]`` being at pack offset ``base``)."""
    return base + start + RECORD_HEAD.size, _LENGTH.unpack_from(data, start + _LENGTH_AT)[0]


@dataclass(slots=True)
class Scan:
    """What a scan of pack records found: objects by id, ref updates in pack order,
    and the offset where readable records end.

    The scan itself keeps only where each record starts in ``data`` (a binary id
    for an object); locations and hex ids are made when asked. Every process that
    opens a store scans the packs being written, a record per object and per
    journaled update: making a hex id and a location for each was half that scan."""

    data: bytes | memoryview
    base: int  # the pack offset of data[0]
    raw_objects: dict[bytes, int]  # binary id -> where its record starts in data
    ref_starts: list[int]  # where each ref-update record starts in data
    end: int  # pack offset where readable records end

    def location(self, start: int) -> Location:
        """The pack location of the payload of the record starting at ``start``."""
        return payload_location(self.data, start, self.base)

    @property
    def objects(self) -> dict[str, Location]:
        return {raw.hex(): self.location(at) for raw, at in self.raw_objects.items()}

    def checksum(self, start: int) -> bytes:
        """The checksum (id field) of the record starting at ``start``."""
        return bytes(self.data[start + _ID_AT : start + _LENGTH_AT])

    @property
    def refs(self) -> list[tuple[bytes, Location]]:
        """(checksum, location) of each ref-update record, in pack order."""
        return [(self.checksum(at), self.location(at)) for at in self.ref_starts]


def scan_buffer(data: bytes | memoryview, base: int, start: int = 0) -> Scan:
    """Every object and ref-update record of ``data`` from ``data[start]`` on (as
    ``iter_records`` reads them), up to the first that is cut short or of another
    type. Every process that opens a store scans the packs being written: this loop
    is kept tight."""
    objects: dict[bytes, int] = {}
    others: list[int] = []
    add = others.append
    unpack, head, size, pos = RECORD_HEAD.unpack_from, RECORD_HEAD.size, len(data), start
    while pos + head <= size:
        rtype, raw, length = unpack(data, pos)
        end = pos + head + length
        if end > size:
            break
        if rtype == TYPE_OBJECT:
            objects[raw] = pos
        elif rtype == TYPE_REF:
            add(pos)
        else:
            break
        pos = end
    return Scan(data, base, objects, others, base + pos)


CLAIM_MAGIC: Final = 0x184D2A5A  # a zstd skippable frame (RFC 8878 3.1.2), 0x184D2A5?
CLAIM: Final = struct.Struct("<IIII")  # magic | size (8) | flags | length of the frame before
WITHIN_LIMITS: Final = 1
"""A block's claim (FORMAT.md 5.5): every object in it is a blob or a node whose body
nests at most MAX_DEPTH deep and holds no number that orjson reads inexactly."""


def block_claim(payload: bytes | memoryview) -> int:
    """The flags a block record's payload claims: those of the skippable frame that ends
    it, if it has one that names the length of the frame before it; else 0."""
    if len(payload) < CLAIM.size:
        return 0
    magic, size, flags, frame = CLAIM.unpack_from(payload, len(payload) - CLAIM.size)
    if magic != CLAIM_MAGIC or size != CLAIM.size - 8 or frame != len(payload) - CLAIM.size:
        return 0
    return int(flags)


def encode_claim(frame: bytes, flags: int) -> bytes:
    """A block record's payload: the zstd ``frame``, then the skippable frame of its claim."""
    return frame + CLAIM.pack(CLAIM_MAGIC, CLAIM.size - 8, flags, len(frame))


def encode_block(entries: Iterable[tuple[str, bytes]]) -> bytes:
    """The uncompressed content of a block in the entry layout (5.5): ``id | length (u32
    LE) | kind + NUL + body`` for each object."""
    return b"".join(BLOCK_ENTRY_HEAD.pack(bytes.fromhex(oid), len(c)) + c for oid, c in entries)


ARRAY_MARK: Final = bytes(32)
"""How an array-layout block's content starts (5.5): 32 zero bytes, which no object's id
can be, where an entry-layout block's starts with its first object's id."""
PACKED_MARK: Final = bytes(31) + b"\x01"
"""How a MessagePack-layout block's content starts (5.5): 31 zero bytes and 0x01."""
ARRAY_HEAD: Final = struct.Struct("<32s5sI")  # the mark | kind + NUL | n
ARRAY_KINDS: Final = (b"blob\0", b"node\0")  # the kinds whose bodies are JSON
PACKED_ARRAY: Final = struct.Struct(">BI")  # MessagePack's array 32 head: 0xdd | n (BE)
_PACKED_ARRAY_TYPE: Final = 0xDD
_KIND_BYTES: Final = len("blob\0")


def encode_array_block(kind: bytes, entries: Iterable[tuple[str, bytes]]) -> bytes:
    """The content of a block in the array layout (5.5) of objects of one JSON ``kind``
    (``b"blob"`` or ``b"node"``), given as ``(id, body)``: the mark, ``kind + NUL``,
    n (u32 LE), the n ids, the n body lengths (u32 LE), then ``[body,body,...]``, so
    that one JSON parse of its end gives every body's value."""
    oids, bodies = _split(entries)
    n = len(bodies)
    if not n or kind + b"\0" not in ARRAY_KINDS:
        raise ValueError("an array block holds one or more blobs or nodes")
    return b"".join(
        [
            ARRAY_HEAD.pack(ARRAY_MARK, kind + b"\0", n),
            _raw_ids(oids),
            struct.pack(f"<{n}I", *map(len, bodies)),
            b"[",
            b",".join(bodies),
            b"]",
        ]
    )


def encode_packed_block(oids: list[str], bodies: list[bytes], values: list[bytes]) -> bytes:
    """The content of a block in the MessagePack layout (5.5) of the blobs ``oids``, their
    ``bodies``, and ``values``, the MessagePack of each body's value (``packed_values``):
    the mark, ``blob + NUL``, n (u32 LE), the n ids, the n body lengths and the n value
    lengths (u32 LE each), then MessagePack's array 32 head and the values, so that one
    MessagePack decode of its end gives every body's value."""
    n = len(bodies)
    if not n or len(oids) != n or len(values) != n:
        raise ValueError("a MessagePack block holds one or more blobs")
    return b"".join(
        [
            ARRAY_HEAD.pack(PACKED_MARK, b"blob\0", n),
            _raw_ids(oids),
            struct.pack(f"<{2 * n}I", *map(len, bodies), *map(len, values)),
            PACKED_ARRAY.pack(_PACKED_ARRAY_TYPE, n),
            *values,
        ]
    )


def packed_values(bodies: Iterable[bytes], canonical: Iterable[bool]) -> list[bytes] | None:
    """The MessagePack of each body's value, for a block in the MessagePack layout, or
    None if a body is not the canonical JSON (section 3) of its value, which the layout
    stands for (a reader writes it again from the value). Each body must read exactly
    with orjson (5.5, WITHIN_LIMITS); ``canonical``, for each, whether it is known to be
    canonical (orjson wrote it from a value with no float), so not encoded again to
    check."""
    values: list[bytes] = []
    pack = _msgpack().encode
    for body, known in zip(bodies, canonical, strict=True):
        value = orjson.loads(body)
        if not known:
            try:
                if body_of_value(value) != body:
                    return None
            except ValueError:
                return None
        values.append(pack(value))
    return values


def array_size(bodies: list[bytes]) -> int:
    """The size of the content of an array-layout block of these bodies."""
    return ARRAY_HEAD.size + 37 * len(bodies) + sum(map(len, bodies)) + 1


def packed_size(values: list[bytes]) -> int:
    """The size of the content of a MessagePack-layout block of these values."""
    return ARRAY_HEAD.size + 40 * len(values) + PACKED_ARRAY.size + sum(map(len, values))


def body_of_value(value: object) -> bytes:
    """The canonical JSON (section 3) of a value read from a MessagePack-layout block: the
    body that value stands for. ValueError if it is no JSON value (a MessagePack type
    JSON has not, a key that is not a string, nesting past the limit)."""
    try:
        return encode(value, fast=check_json(value))[0]
    except LimitExceeded:
        raise ValueError("a MessagePack value nests deeper than JSON bodies may") from None
    except InvalidInput as e:
        raise ValueError(f"a MessagePack value is not JSON ({e})") from None


def decode_packed(data: bytes | memoryview) -> object:
    """One MessagePack value (``data`` holds it exactly); ValueError if it does not
    (msgspec's DecodeError is one)."""
    try:
        return _msgpack().decode(data)
    except RecursionError:  # nested past what msgspec decodes
        raise ValueError("a MessagePack value nests too deeply") from None


@cache
def _msgpack() -> ModuleType:
    """msgspec's MessagePack codec, imported when first needed: importing it added about
    50 ms to the start of every ``ags`` command (220 -> 275 ms), most of which read no
    block of messages."""
    import msgspec.msgpack

    return msgspec.msgpack


def _split(entries: Iterable[tuple[str, bytes]]) -> tuple[list[str], list[bytes]]:
    oids, bodies = [], []
    for oid, body in entries:
        oids.append(oid)
        bodies.append(body)
    return oids, bodies


def _raw_ids(oids: list[str]) -> bytes:
    ids = bytes.fromhex("".join(oids))  # one call, not one an id (a seal's time)
    if len(ids) != 32 * len(oids):
        raise ValueError("a block's ids are 32 bytes each")
    return ids


def is_array_block(content: bytes | memoryview) -> bool:
    """Whether a block's content is in the array layout or the MessagePack layout (both
    tabled, ``array_table``), else the entry layout."""
    mark = content[:32]
    return mark in (ARRAY_MARK, PACKED_MARK)


class ArrayTable(NamedTuple):
    """The table at the head of a block in the array or the MessagePack layout (5.5)."""

    kind: bytes  # kind + NUL: b"blob\0" or b"node\0"
    ids: bytes  # the n raw ids, 32 bytes each, in block order
    lengths: tuple[int, ...]  # of each body
    start: int  # where ``[`` is, the JSON array of the bodies (or MessagePack's of values)
    value_lengths: tuple[int, ...] = ()  # of each value, in the MessagePack layout only

    @property
    def packed(self) -> bool:
        """Whether the block is in the MessagePack layout."""
        return bool(self.value_lengths)

    def hex_ids(self) -> list[str]:
        """Each id as 64 hex digits, in block order."""
        return hex_ids(self.ids)

    def starts(self) -> list[int]:
        """Where each body starts in the content (each value, in the MessagePack layout),
        in block order."""
        if self.value_lengths:
            return list(accumulate(self.value_lengths[:-1], initial=self.start + PACKED_ARRAY.size))
        return list(accumulate(map((1).__add__, self.lengths[:-1]), initial=self.start + 1))

    def values(self, content: bytes | memoryview) -> list[object]:
        """Every body's value, in block order, by one parse of the block's array (JSON or
        MessagePack); ValueError if it does not read as n values."""
        tail = memoryview(content)[self.start :]
        values = decode_packed(tail) if self.value_lengths else orjson.loads(tail)
        if type(values) is not list or len(values) != len(self.lengths):
            raise ValueError("a block's array does not read as its objects")
        return values

    def value(self, content: bytes | memoryview, i: int, starts: list[int]) -> object:
        """Value ``i`` of a block in the MessagePack layout, given ``starts()``, decoded
        alone (ValueError if it does not decode over exactly its length)."""
        at = starts[i]
        return decode_packed(memoryview(content)[at : at + self.value_lengths[i]])

    def body(self, content: bytes | memoryview, i: int, starts: list[int]) -> bytes:
        """Body ``i``, given ``starts()``: sliced from the content, or in the MessagePack
        layout written again from its value (``body_of_value``), which must give the
        length the table does; ValueError for a value that is not such a body."""
        if not self.value_lengths:
            return bytes(content[starts[i] : starts[i] + self.lengths[i]])
        body = body_of_value(self.value(content, i, starts))
        if len(body) != self.lengths[i]:
            raise ValueError("a MessagePack value is not the body its table gives")
        return body

    def bodies(self, content: bytes | memoryview) -> list[bytes]:
        """Every body, in block order (``body``)."""
        starts = self.starts()
        return [self.body(content, i, starts) for i in range(len(starts))]


def hex_ids(raw: bytes) -> list[str]:
    """Raw ids, 32 bytes each, as 64 hex digits each, in order."""
    return list(map(bytes.hex, _ids_struct(len(raw) // 32).unpack(raw)))


@lru_cache(maxsize=64)
def _ids_struct(n: int) -> struct.Struct:
    """Unpacks n raw ids at once (splitting their hex took half again the time)."""
    return struct.Struct("32s" * n)


def array_table(content: bytes | memoryview) -> ArrayTable:
    """The table of a block's content in the array or the MessagePack layout, checked as
    far as finding the bodies (values) relies on it: a known kind (the MessagePack
    layout holds blobs only), at least one object, and lengths that add up, with the
    brackets and commas (the array's head), to the content's end exactly. ValueError
    otherwise. (Whether the separators are in place is ``array_separators``'.)"""
    size = len(content)
    if size < ARRAY_HEAD.size:
        raise ValueError("an array block is cut in its head")
    mark, kind, n = ARRAY_HEAD.unpack_from(content)
    packed = mark == PACKED_MARK
    if not (mark == ARRAY_MARK or packed) or kind not in ARRAY_KINDS:
        raise ValueError("an array block names no kind of JSON object")
    if packed and kind != b"blob\0":
        raise ValueError("a MessagePack block holds blobs only")
    ids_end = ARRAY_HEAD.size + 32 * n
    start = ids_end + (8 if packed else 4) * n
    if n == 0 or start + 2 > size:
        raise ValueError(f"an array block of {n} objects does not fit its {size} bytes")
    lengths = struct.unpack_from(f"<{n}I", content, ids_end)
    ids = bytes(content[ARRAY_HEAD.size : ids_end])
    if packed:
        values = struct.unpack_from(f"<{n}I", content, ids_end + 4 * n)
        if start + PACKED_ARRAY.size + sum(values) != size:
            raise ValueError("the values of a MessagePack block do not add up to its size")
        return ArrayTable(kind, ids, lengths, start, values)
    if start + sum(lengths) + n + 1 != size:
        raise ValueError("the bodies of an array block do not add up to its size")
    return ArrayTable(kind, ids, lengths, start)


def array_separators(content: bytes | memoryview, table: ArrayTable) -> bool:
    """Whether ``[``, the commas and ``]`` are where the table puts them (in the
    MessagePack layout: the array's head, 0xdd and n)."""
    view = bytes(content) if isinstance(content, memoryview) else content
    if table.packed:
        head = PACKED_ARRAY.unpack_from(view, table.start)
        return head == (_PACKED_ARRAY_TYPE, len(table.lengths))
    if view[table.start : table.start + 1] != b"[" or view[-1:] != b"]":
        return False
    return all(view[at - 1] == 0x2C for at in table.starts()[1:])


def iter_block(content: bytes | memoryview) -> Iterator[tuple[str, int, int]]:
    """(id, offset, length) of each object of a block's content, as its index entry
    gives them (5.3): in the entry layout where its ``kind + NUL + body`` is; in the
    array layout where its body is, and the length of ``kind + NUL + body`` (the body's
    plus 5). ValueError if the content does not divide into whole objects."""
    if is_array_block(content):
        table = array_table(content)
        yield from zip(
            table.hex_ids(), table.starts(), map(_KIND_BYTES.__add__, table.lengths), strict=True
        )
        return
    pos, head, size = 0, BLOCK_ENTRY_HEAD.size, len(content)
    while pos < size:
        if pos + head > size:
            raise ValueError(f"a block entry is cut at {pos}")
        raw, length = BLOCK_ENTRY_HEAD.unpack_from(content, pos)
        if pos + head + length > size:
            raise ValueError(f"a block entry is cut at {pos}")
        yield raw.hex(), pos + head, length
        pos += head + length


def block_piece(
    content: bytes, at: int, length: int, places: tuple[ArrayTable, list[int]] | None = None
) -> bytes:
    """The ``kind + NUL + body`` of the object an index entry (or ``iter_block``) puts at
    ``at``, ``length`` in a block's content, in any layout (in the MessagePack layout,
    the body written again from its value: ValueError where the table does not put a
    value at ``at`` whose body has that length; ``places``, its table and ``starts()``,
    if the caller keeps them)."""
    if content[:32] == PACKED_MARK:
        table, starts = places or _places(content)
        i = bisect_left(starts, at)
        if i == len(starts) or starts[i] != at or table.lengths[i] + _KIND_BYTES != length:
            raise ValueError("no object of a MessagePack block is where its index says")
        return table.kind + table.body(content, i, starts)
    if is_array_block(content):
        return content[32 : 32 + _KIND_BYTES] + content[at : at + length - _KIND_BYTES]
    return content[at : at + length]


def _places(content: bytes) -> tuple[ArrayTable, list[int]]:
    table = array_table(content)
    return table, table.starts()


def block_pieces(content: bytes) -> list[tuple[str, int, int, bytes]]:
    """``(id, offset, length, kind + NUL + body)`` of each object of a block's content,
    in block order, as ``iter_block`` and ``block_piece`` give them, the block's table
    read once: what a merge, fsck and a fetch read whole. ValueError as they raise."""
    if content[:32] == PACKED_MARK:
        table = array_table(content)
        pieces = [table.kind + body for body in table.bodies(content)]
        sizes = map(_KIND_BYTES.__add__, table.lengths)
        return list(zip(table.hex_ids(), table.starts(), sizes, pieces, strict=True))
    return [(oid, at, n, block_piece(content, at, n)) for oid, at, n in iter_block(content)]


def block_members(
    content: bytes, blobs: dict[str, bytes] | None = None
) -> dict[str, tuple[bytes, int, int]]:
    """Each object of an entry-layout block's content by id: ``(content, offset, length)``
    of its ``kind + NUL + body``, as ``iter_block`` finds them, with the same checks; in
    one loop kept tight for readers that take a whole block at once (block_reader.py).
    Given ``blobs``, each blob goes there instead, as its body: what a context takes."""
    unpack, head, size = BLOCK_ENTRY_HEAD.unpack_from, BLOCK_ENTRY_HEAD.size, len(content)
    members: dict[str, tuple[bytes, int, int]] = {}
    pos = 0
    try:
        if blobs is None:
            while pos < size:
                raw, length = unpack(content, pos)
                pos += head
                members[raw.hex()] = (content, pos, length)
                pos += length
        else:
            blob = b"blob\0"
            while pos < size:
                raw, length = unpack(content, pos)
                pos += head
                if content.startswith(blob, pos):
                    blobs[raw.hex()] = content[pos + 5 : pos + length]
                else:
                    members[raw.hex()] = (content, pos, length)
                pos += length
    except struct.error:
        raise ValueError(f"a block entry is cut at {pos}") from None
    if pos != size:
        raise ValueError("the last block entry runs past the end of the block")
    return members


def block_entries(content: bytes) -> list[tuple[str, int, int]]:
    """``(id, offset, length)`` of each object of a block's content, in block order, as
    ``iter_block`` finds them, with the same checks: what a merge copies in order."""
    if is_array_block(content):
        return list(iter_block(content))
    return [(oid, pos, length) for oid, (_c, pos, length) in block_members(content).items()]


def encode_index(
    entries: Iterable[tuple[str, tuple[int, ...]]], pack_length: int, version: int = 1
) -> bytes:
    """The index (5.3) of the objects ``entries`` of a pack whose good part is
    ``pack_length`` bytes long: version 1 (id -> payload offset and length) or, for a
    block pack, version 2 (id -> record payload offset, offset and length in it)."""
    magic, entry = (IDX_MAGIC, IDX_ENTRY) if version == 1 else (BLOCK_IDX_MAGIC, BLOCK_IDX_ENTRY)
    ordered = sorted(entries)
    fanout = [0] * 256
    for oid, _ in ordered:
        fanout[int(oid[:2], 16)] += 1
    for i in range(1, 256):
        fanout[i] += fanout[i - 1]
    body = b"".join(
        [
            IDX_HEAD.pack(magic, pack_length, len(ordered)),
            IDX_FANOUT.pack(*fanout),
            *(entry.pack(bytes.fromhex(oid), *where) for oid, where in ordered),
        ]
    )
    return body + blake3.blake3(body).digest()


def sorted_index_chunks(
    buckets: list[bytearray], pack_length: int, version: int = 2
) -> Iterator[bytes | bytearray]:
    """The bytes ``encode_index`` gives, in pieces, from its entries already packed
    (``IDX_ENTRY`` or ``BLOCK_IDX_ENTRY``) in 256 buckets by the id's first byte, no id
    twice: for a pack of millions of objects, whose entries as tuples would take
    about five times the memory. Each bucket is sorted in place, one at a time."""
    magic, entry = (IDX_MAGIC, IDX_ENTRY) if version == 1 else (BLOCK_IDX_MAGIC, BLOCK_IDX_ENTRY)
    step = entry.size
    fanout, total = [], 0
    for bucket in buckets:
        records = [bytes(bucket[at : at + step]) for at in range(0, len(bucket), step)]
        records.sort()  # by id: the id comes first in an entry
        bucket[:] = b"".join(records)
        total += len(records)
        fanout.append(total)
    head = IDX_HEAD.pack(magic, pack_length, total) + IDX_FANOUT.pack(*fanout)
    hasher = blake3.blake3(head)
    yield head
    for bucket in buckets:
        hasher.update(bucket)
        yield bucket
    yield hasher.digest()


class IndexHead(NamedTuple):
    pack_length: int
    entries: int
    fanout: tuple[int, ...]  # 257 numbers: entries before first byte i, then the count
    version: int


def parse_index(data: bytes | memoryview | mmap.mmap, name: str = "pack index") -> IndexHead:
    """The header of an index, checked as a lookup relies on it: magic and version,
    the length the count implies, a fanout that never decreases and ends at the
    count. DamagedIndex otherwise. (The checksum over the entries is fsck's.)"""
    if len(data) < ENTRIES_AT + CHECKSUM_BYTES:
        raise DamagedIndex(f"{name} is truncated")
    magic, pack_length, count = IDX_HEAD.unpack_from(data, 0)
    if magic not in (IDX_MAGIC, BLOCK_IDX_MAGIC):
        raise DamagedIndex(f"{name} has an unknown format")
    version = 1 if magic == IDX_MAGIC else 2
    entry = IDX_ENTRY if version == 1 else BLOCK_IDX_ENTRY
    if len(data) != ENTRIES_AT + count * entry.size + CHECKSUM_BYTES:
        raise DamagedIndex(f"{name} has the wrong length")
    fanout = IDX_FANOUT.unpack_from(data, IDX_HEAD.size)
    if fanout[-1] != count or list(fanout) != sorted(fanout):
        raise DamagedIndex(f"{name} has a damaged fanout table")
    return IndexHead(pack_length, count, (0, *fanout), version)
