"""fsck's read of every object: each one's hash, the JSON a read of it needs, and
what each node links to, in compact form for fsck.py to check the links of the
whole store at once.

A sealed pack is read in parts (``Part``: a run of its records, or a run of its
index entries), each by ``read_part``, which a pool of worker processes runs
side by side when the store is big enough to pay for them (``read_parts``).
A block is decompressed once and its objects checked in one loop: the hash,
then for a blob one parse of its JSON and one walk of the value (its nesting,
and the numbers a block's WITHIN_LIMITS claim speaks of). A node as ags writes
it is matched whole by one regular expression (``_EVERYDAY_NODE``), whose
groups are its links; a node of a near shape is parsed once and taken apart
inline; any other goes through ``nodes.parse_node`` and ``reach.node_links``,
which decide exactly as every reader does.

Ids are remembered as the int of their first 60 bits (``key``): a false match
needs two ids sharing them, and it only hides a report. What a part sends back
(``Found``) is arrays of such keys and the problems it saw.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import re
import signal
import struct
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Final

import blake3
import orjson

from . import objects
from .errors import NestingTooDeep, ObjectError
from .limits import MAX_DEPTH, TOO_DEEP, check_json_text, read_exactly, unusual
from .nodes import Node, parse_node
from .pack_format import (
    BLOCK_ENTRY_HEAD,
    RECORD_HEAD,
    TYPE_BLOCK,
    TYPE_OBJECT,
    WITHIN_LIMITS,
    ArrayTable,
    array_separators,
    array_table,
    block_claim,
    block_pieces,
    body_of_value,
    decode_packed,
    is_array_block,
    iter_block,
    iter_records,
)
from .packs import Checked, SealedPack, decompress_block
from .reach import node_links

RECORDS: Final = 0  # a Part of a pack's records
INDEX: Final = 1  # a Part of a pack's index entries
PART_BYTES: Final = 2 << 20  # bytes of pack records in one part
INDEX_PART: Final = 1 << 16  # index entries in one part
MAX_WORKERS: Final = 4
POOL_BYTES: Final = 16 << 20  # less pack than this is read in the calling process

# (pack number in the list given to read_parts, RECORDS or INDEX, first, stop): record
# head offsets for RECORDS, entry numbers for INDEX.
Part = tuple[int, int, int, int]

_NESTED_TOO_DEEP: Final = f"is not a blob ags can read: {NestingTooDeep(MAX_DEPTH)}"
_KIND_CODES: Final = {"node": 0, "blob": 1, "file": 2}  # what a link may name (Link.kind)

_ID: Final = rb'"([0-9a-f]{64})"'
_ID_OR_NULL: Final = rb'(?:null|"([0-9a-f]{64})")'
_EVERYDAY_BODY: Final = (
    rb'\{"message":' + _ID + rb',"messages":(0|[1-9][0-9]{0,17}),'
    rb'"meta":\{"time":"[0-9A-Za-z:.+-]*"\},"parent":' + _ID_OR_NULL + rb","
    rb'(?:"span":\{"after":' + _ID_OR_NULL + rb',"messages":\[((?:"[0-9a-f]{64}",)*'
    rb'"[0-9a-f]{64}"|)\]\},)?"state":' + _ID_OR_NULL + rb',"type":"message"\}'
)
_EVERYDAY_NODE: Final = re.compile(rb"node\x00" + _EVERYDAY_BODY)
"""The content of a message node as ags writes it (canonical JSON, FORMAT.md 4.1),
matched in one C call: a match is JSON that ``parse_node`` reads (three levels deep,
one integer below 10**18, every id 64 lowercase hex digits), and its groups are the
message id, the message count, the parent id, the span's ``after`` and listed
message ids (``"id","id"``), and the state id. A node of any other shape, or
written any other way, is parsed (``Reader.node``)."""
_EVERYDAY_NODE_BODY: Final = re.compile(_EVERYDAY_BODY)  # the same, of a body alone


def key(oid: object) -> int:
    """What fsck remembers of an id: its first 60 bits (-1 for what is not an id)."""
    if type(oid) is not str or len(oid) != 64:
        return -1
    try:
        return int(oid[:15], 16)
    except ValueError:
        return -1


@dataclass(slots=True)
class Found:
    """What a part of the store holds, as keys (``key``), and what is wrong in it.

    ``targets`` holds, for each kind a link may name (node, blob, file), the keys
    the part's nodes link to, but for the links of nodes of the everyday shape
    that the columns below hold already (parent, message, span start and span
    messages; -1 for none): a node of any other shape puts every link there, so
    that an id that is not one (its key -1) is looked up and found missing.
    ``messages``: the message count of each node whose key was asked for."""

    count: int = 0  # objects read, an object stored twice counted twice
    content_bytes: int = 0  # of the objects ``Reader.checked`` read
    nodes: array[int] = field(default_factory=lambda: array("q"))
    bad_nodes: array[int] = field(default_factory=lambda: array("q"))  # not parsed
    blobs: array[int] = field(default_factory=lambda: array("q"))
    files: array[int] = field(default_factory=lambda: array("q"))
    unreadable: array[int] = field(default_factory=lambda: array("q"))
    targets: tuple[array[int], array[int], array[int]] = field(
        default_factory=lambda: (array("q"), array("q"), array("q"))
    )
    # Per node of ``nodes``: its parent's key (-1: none), its content's, whether it
    # is a compaction; what a span is checked against (fsck.py).
    parents: array[int] = field(default_factory=lambda: array("q"))
    contents: array[int] = field(default_factory=lambda: array("q"))
    compactions: bytearray = field(default_factory=bytearray)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (object id, what)
    # Per span, in four flat columns (a store has one every 16 messages): its node's
    # 32-byte id, the key of its ``after`` (-1: none), how many messages it lists,
    # and (all spans' in a row) the keys of those messages.
    span_nodes: bytearray = field(default_factory=bytearray)
    span_after: array[int] = field(default_factory=lambda: array("q"))
    span_sizes: array[int] = field(default_factory=lambda: array("q"))
    span_messages: array[int] = field(default_factory=lambda: array("q"))
    messages: dict[int, int] = field(default_factory=dict)
    pack_problems: list[str] = field(default_factory=list)  # of the records themselves
    placed: int = 0  # objects whose place an index must say (SealedPack.settle)
    placements: int = 0
    index_sum: int = 0
    index_problem: str | None = None

    def add_span(self, node: bytes, after: int, messages: array[int]) -> None:
        self.span_nodes += node
        self.span_after.append(after)
        self.span_sizes.append(len(messages))
        self.span_messages += messages


class Reader:
    """Checks objects into a ``Found``. ``wanted``: keys of nodes whose message count
    is asked for (the targets of refs)."""

    def __init__(self, wanted: frozenset[int] | set[int]) -> None:
        self.found = Found()
        self.wanted = wanted

    def records(self, pack: SealedPack, first: int, stop: int) -> None:
        """Check the records of ``pack`` whose heads are from ``first`` to ``stop``."""
        data = pack.payload(first, stop - first)
        found = self.found
        place = pack.placement()
        for record in iter_records(data, first, pack.record_types()):
            off, length = record.location
            payload = data[off - first : off - first + length]
            if record.type == TYPE_BLOCK:
                self.block(pack, record.raw_id, payload, off)
            elif record.type == TYPE_OBJECT:
                where = (off, length) if pack.version == 1 else (off, 0xFFFFFFFF, length)
                found.placed += 1
                found.placements += hash(place(record.raw_id, *where))
                oid = record.raw_id.hex()
                try:
                    self.checked([(oid, objects.decode(oid, payload))])  # a format-1 pack
                except ObjectError as e:
                    self.error(oid, e)
            else:
                found.pack_problems += pack.ref_record_problems(record.raw_id, off, length)
        pack.release(first, stop)

    def _unreadable(self, pack: SealedPack, off: int, where: str, e: ValueError) -> None:
        """A block whose content cannot be read: named, and each object it should hold
        reported as the pack's index places it there."""
        self.found.pack_problems.append(f"block {where} cannot be read ({e})")
        for oid, error in pack.unreadable_block(off, str(e), set()):
            self.error(oid, error)

    def block(self, pack: SealedPack, checksum: bytes, payload: bytes, off: int) -> None:
        where = f"at offset {off - RECORD_HEAD.size}"
        found = self.found
        if blake3.blake3(payload).digest() != checksum:
            found.pack_problems.append(f"block {where} does not match its checksum")
        try:
            content = decompress_block(payload)
        except ValueError as e:
            self._unreadable(pack, off, where, e)
            return
        # What a context read believes without a walk (FORMAT.md 5.5) is checked here.
        claimed = bool(block_claim(payload) & WITHIN_LIMITS)
        unclaimed: list[str] = []
        if is_array_block(content):
            try:
                table = array_table(content)
            except ValueError as e:
                self._unreadable(pack, off, where, e)
                return
            if not array_separators(content, table):
                found.pack_problems.append(
                    f"block {where} holds its bodies in no array where its table says; "
                    "a context read parses that array"
                )
            check = self.packed if table.packed else self.array
            check(content, table, pack.placement(), off, unclaimed if claimed else None)
            pos = len(content)
        else:
            pos = self.entries(content, pack.placement(), off, unclaimed if claimed else None)
        if unclaimed:
            found.pack_problems.append(
                f"block {where} claims that each of its objects reads exactly without a "
                f"walk, but {len(unclaimed)} do not (first {unclaimed[0]}); a context read "
                "believes the claim"
            )
        if pos < len(content):
            why = f"a block entry is cut at {pos}"
            found.pack_problems.append(f"block {where} cannot be read ({why})")
            read = {oid for oid, _, _ in iter_block(content[:pos])}
            for oid, error in pack.unreadable_block(off, why, read):
                self.error(oid, error)

    def checked(self, items: Iterable[Checked]) -> None:
        """Objects read one by one elsewhere (verified already; hashed again here)."""
        for oid, result in items:
            if isinstance(result, ObjectError):
                self.error(oid, result)
            else:
                kind, body = result
                content = kind.encode("ascii") + b"\0" + body
                self.found.content_bytes += len(content)
                self.entries(BLOCK_ENTRY_HEAD.pack(bytes.fromhex(oid), len(content)) + content)

    def error(self, oid: str, error: ObjectError) -> None:
        self.found.count += 1
        self.found.unreadable.append(key(oid))
        self.found.problems.append((oid, str(error).removeprefix(f"object {oid} ")))

    def entries(
        self,
        content: bytes,
        place: Callable[..., bytes] | None = None,
        off: int = 0,
        unclaimed: list[str] | None = None,
    ) -> int:
        """Check each ``id | length | kind NUL body`` entry of a block's content; return
        where the entries stop (``len(content)`` if whole). With ``place``, each object
        that verifies adds its placement (block record at ``off``) to the sums. With
        ``unclaimed`` (the block claims WITHIN_LIMITS), the ids of the objects that
        orjson does not read exactly are added to it.

        Every object of the store goes through this loop: keep it tight."""
        found = self.found
        unpack, head, size = BLOCK_ENTRY_HEAD.unpack_from, BLOCK_ENTRY_HEAD.size, len(content)
        view = memoryview(content)
        hashed, from_bytes = blake3.blake3, int.from_bytes
        starts, everyday = content.startswith, _EVERYDAY_NODE.fullmatch
        blobs, files = found.blobs, found.files
        placed = placements = objects = 0
        pos = 0
        while pos + head <= size:
            raw, n = unpack(content, pos)
            if pos + head + n > size:
                break
            pos += head
            end = pos + n
            objects += 1
            if hashed(view[pos:end]).digest() != raw:
                self.corrupt(raw, "its content does not hash to its id")
                pos = end
                continue
            if starts(b"blob\0", pos):
                blobs.append(from_bytes(raw[:8]) >> 4)
                self.blob(raw, view[pos + 5 : end], unclaimed)
            elif (match := everyday(content, pos, end)) is not None:
                self.everyday_node(raw, match)  # within the claim: no big number
            elif starts(b"node\0", pos):
                self.node(raw, content, pos + 5, end)
                if unclaimed is not None and not read_exactly(content[pos + 5 : end]):
                    unclaimed.append(raw.hex())
            elif starts(b"file\0", pos):
                files.append(from_bytes(raw[:8]) >> 4)
                if unclaimed is not None:
                    unclaimed.append(raw.hex())
            else:
                kind = bytes(view[pos:end]).partition(b"\0")[0].decode("ascii", "replace")
                self.corrupt(raw, f"unknown kind {kind!r}")
                pos = end
                continue
            if place is not None:
                placed += 1
                placements += hash(place(raw, off, pos, n))
            pos = end
        found.count += objects
        found.placed += placed
        found.placements += placements
        return pos

    def array(
        self,
        content: bytes,
        table: ArrayTable,
        place: Callable[..., bytes],
        off: int,
        unclaimed: list[str] | None,
    ) -> None:
        """``entries`` for a block in the array layout (FORMAT.md 5.5), whose table fits
        it: each object hashed as ``kind + NUL + body``, then checked as ``entries``
        checks it. Every object of such a block goes through this loop: keep it tight."""
        found = self.found
        view = memoryview(content)
        kind, ids, lengths = table.kind, table.ids, table.lengths
        hasher = blake3.blake3(kind)
        from_bytes, everyday = int.from_bytes, _EVERYDAY_NODE_BODY.fullmatch
        is_blob = kind == b"blob\0"
        blobs = found.blobs
        placed = placements = 0
        for i, start in enumerate(table.starts()):
            raw = ids[32 * i : 32 * i + 32]
            end = start + lengths[i]
            if hasher.copy().update(view[start:end]).digest() != raw:
                self.corrupt(raw, "its content does not hash to its id")
                continue
            if is_blob:
                blobs.append(from_bytes(raw[:8]) >> 4)
                self.blob(raw, view[start:end], unclaimed)
            elif (match := everyday(content, start, end)) is not None:
                self.everyday_node(raw, match)
            else:
                self.node(raw, content, start, end)
                if unclaimed is not None and not read_exactly(content[start:end]):
                    unclaimed.append(raw.hex())
            placed += 1
            placements += hash(place(raw, off, start, lengths[i] + 5))
        found.count += len(lengths)
        found.placed += placed
        found.placements += placements

    def packed(
        self,
        content: bytes,
        table: ArrayTable,
        place: Callable[..., bytes],
        off: int,
        unclaimed: list[str] | None,
    ) -> None:
        """``array`` for a block in the MessagePack layout (FORMAT.md 5.5): each value
        decoded alone where the table puts it, its body written from it and hashed, then
        checked as a blob from the value. The body is written by orjson first, and again
        by the canonical encoder only where that does not hash to the id (a float that
        orjson spells its own way): the hash decides, so a quick body is never taken
        for a wrong one, and the walk the canonical encoder needs is saved for the rest
        (fsck of a store of 80,000 messages: 1.0 s with it for each, 0.77-0.79 s so,
        against 0.76-0.77 s for the same store in the array layout). Every object of
        such a block goes through this loop."""
        found = self.found
        view = memoryview(content)
        ids, lengths, sizes = table.ids, table.lengths, table.value_lengths
        hasher, from_bytes, blobs = blake3.blake3(b"blob\0"), int.from_bytes, found.blobs
        placed = placements = 0
        for i, at in enumerate(table.starts()):
            raw = ids[32 * i : 32 * i + 32]
            digest = None
            try:
                value = decode_packed(view[at : at + sizes[i]])
                body = _quick_body(value)
                digest = None if body is None else hasher.copy().update(body).digest()
                if digest != raw:
                    body = body_of_value(value)
                    digest = hasher.copy().update(body).digest()
            except ValueError:
                body = None
            if body is None or len(body) != lengths[i]:
                self.corrupt(raw, "its MessagePack value is not the body its block's table gives")
                continue
            if digest != raw:
                self.corrupt(raw, "its content does not hash to its id")
                continue
            blobs.append(from_bytes(raw[:8]) >> 4)
            self.blob_value(raw, value, unclaimed)
            placed += 1
            placements += hash(place(raw, off, at, lengths[i] + 5))
        found.count += len(lengths)
        found.placed += placed
        found.placements += placements

    def blob(self, raw: bytes, body: memoryview | bytes, unclaimed: list[str] | None) -> None:
        """Check a blob's body: JSON, nested within the limit, and (for a block's claim,
        ``unclaimed`` given) no number orjson may have read inexactly; one walk
        answers both."""
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            self.blob_problem(raw, body)
            return
        self.blob_value(raw, value, unclaimed)

    def blob_value(self, raw: bytes, value: object, unclaimed: list[str] | None) -> None:
        """``blob`` of a body's value."""
        found_in_it = unusual(value)
        if found_in_it == TOO_DEEP:
            self.problem(raw, _NESTED_TOO_DEEP)
        if found_in_it and unclaimed is not None:
            unclaimed.append(raw.hex())

    def everyday_node(self, raw: bytes, match: re.Match[bytes]) -> None:
        """Take apart a node ``_EVERYDAY_NODE`` matched. Its parent, message, span
        start and span messages are links the columns hold already: only its state
        goes to ``targets``."""
        message, messages, parent, after, listed, state = match.groups()
        found = self.found
        own = int.from_bytes(raw[:8]) >> 4
        content = int(message[:15], 16)
        found.nodes.append(own)
        found.contents.append(content)
        found.compactions.append(0)
        found.parents.append(-1 if parent is None else int(parent[:15], 16))
        if state is not None:
            found.targets[1].append(int(state[:15], 16))
        if own in self.wanted:
            found.messages[own] = int(messages)
        if listed is not None:
            start_key = -1 if after is None else int(after[:15], 16)
            # Each listed id is '"' + 64 hex digits + '"', one comma between.
            keys = array("q", [int(listed[at : at + 15], 16) for at in range(1, len(listed), 67)])
            found.add_span(raw, start_key, keys)

    def corrupt(self, raw: bytes, why: str) -> None:
        self.found.unreadable.append(int.from_bytes(raw[:8]) >> 4)
        self.problem(raw, f"is corrupt: {why}")

    def problem(self, raw: bytes, what: str) -> None:
        self.found.problems.append((raw.hex(), what))

    def blob_problem(self, raw: bytes, body: memoryview | bytes) -> None:
        try:
            check_json_text(bytes(body))  # the standard parser decides, and says why
        except ValueError as e:
            self.problem(raw, f"is not a blob ags can read: {e}")

    def node(self, raw: bytes, content: bytes, start: int, end: int) -> None:
        """Check the node whose body is ``content[start:end]``: the everyday shape (a
        message node with a parent, a state and perhaps a span, its ids all 64 hex
        digits, nothing deeper than the limit) inline; anything else as
        ``parse_node`` decides."""
        try:
            d = orjson.loads(memoryview(content)[start:end])
        except orjson.JSONDecodeError:
            d = None
        if (
            type(d) is dict
            and d.get("type") == "message"
            and "files" not in d
            and "meta" in d
            and type(d.get("messages")) is int
            and content.count(b"[", start, end) + content.count(b"{", start, end) <= MAX_DEPTH
        ):
            try:
                parent, state, span = d["parent"], d["state"], d.get("span")
                ids = [d["message"]]
                if parent is not None:
                    ids.append(parent)
                if state is not None:
                    ids.append(state)
                if span is not None:
                    if type(span) is not dict or type(span["messages"]) is not list:
                        raise ValueError
                    after = span["after"]
                    if after is not None:
                        ids.append(after)
                    ids += span["messages"]
                elif "span" in d:
                    raise ValueError
                keys = _keys(ids)
            except (KeyError, ValueError, TypeError):
                pass  # what parse_node makes of it decides
            else:
                found = self.found
                own = int.from_bytes(raw[:8]) >> 4
                found.nodes.append(own)
                found.contents.append(keys[0])
                found.compactions.append(0)
                node_targets, blob_targets, _ = found.targets
                blob_targets.append(keys[0])
                at = 1
                if parent is not None:
                    found.parents.append(keys[1])
                    node_targets.append(keys[1])
                    at = 2
                else:
                    found.parents.append(-1)
                if state is not None:
                    blob_targets.append(keys[at])
                    at += 1
                if own in self.wanted:
                    found.messages[own] = d["messages"]
                if span is not None:
                    start_key = -1
                    if span["after"] is not None:
                        start_key = keys[at]
                        node_targets.append(start_key)
                        at += 1
                    listed = keys[at:]
                    blob_targets += listed
                    found.add_span(raw, start_key, listed)
                return
        self._parsed(raw, bytes(content[start:end]))

    def _parsed(self, raw: bytes, body: bytes) -> None:
        """A node of any other shape, read as every reader reads it."""
        found = self.found
        oid = raw.hex()
        own = int.from_bytes(raw[:8]) >> 4
        try:
            node = parse_node(oid, body)
        except ObjectError as e:
            found.bad_nodes.append(own)  # a node, though not one ags can read
            found.problems.append((oid, str(e).removeprefix(f"object {oid} ")))
            return
        found.nodes.append(own)
        found.parents.append(key(node.parent))
        found.contents.append(key(node.content))
        found.compactions.append(node.is_compaction)
        targets = found.targets
        for link in node_links(node):
            targets[_KIND_CODES[link.kind]].append(key(link.target))
        if own in self.wanted:
            found.messages[own] = node.messages
        if node.span is not None:
            span = array("q", map(key, node.span.messages))
            found.add_span(raw, key(node.span.after), span)


def _keys(ids: list[str]) -> array[int]:
    """``key`` of each id, all in C: ValueError (or TypeError) unless each is a string
    of 64 hex digits."""
    raw = bytes.fromhex("".join(ids))
    if len(raw) != 32 * len(ids) or set(map(len, ids)) != {64}:
        raise ValueError("not all ids")
    unpack = _FIRST_8.get(len(ids))
    if unpack is None:
        unpack = _FIRST_8[len(ids)] = struct.Struct(">" + "Q24x" * len(ids)).unpack
    return array("q", map(_TO_60_BITS, unpack(raw)))


_FIRST_8: dict[int, Callable[[bytes], tuple[int, ...]]] = {}  # by number of ids
_TO_60_BITS: Final = (4).__rrshift__  # v -> v >> 4


def read_part(part: Part) -> Found:
    """Check one part of a pack (``_PACKS``, ``_WANTED``: set before the pool forks)."""
    number, what, first, stop = part
    pack = _PACKS[number]
    if what == INDEX:
        found = Found()
        found.index_sum, found.index_problem = pack.index_part(first, stop)
        return found
    reader = Reader(_WANTED)
    reader.records(pack, first, stop)
    return reader.found


_PACKS: list[SealedPack] = []
_WANTED: frozenset[int] = frozenset()


def plan(packs: list[SealedPack], problems: list[list[str]]) -> list[Part]:
    """The parts of each pack, index parts first; where a pack's records stop being
    readable goes to ``problems[its number]``."""
    parts: list[Part] = []
    records: list[Part] = []
    for number, pack in enumerate(packs):
        parts += [
            (number, INDEX, first, min(first + INDEX_PART, pack.count))
            for first in range(0, pack.count, INDEX_PART)
        ]
        start = end = -1
        for _type, _raw, off, length in pack.records(problems[number]):
            if start < 0:
                start = off - RECORD_HEAD.size
            end = off + length
            if end - start >= PART_BYTES:
                records.append((number, RECORDS, start, end))
                start = -1
        if start >= 0:
            records.append((number, RECORDS, start, end))
    return parts + records


def read_parts(
    packs: list[SealedPack], parts: list[Part], wanted: frozenset[int], workers: int | None
) -> Iterator[Found]:
    """``read_part`` of each part, in order: in a pool of ``workers`` processes (by
    default one per core, at most MAX_WORKERS) when the parts hold POOL_BYTES or
    more and this process runs no other thread (a fork copies only the thread that
    forks), else here. Ctrl-C stops the workers with the rest."""
    global _PACKS, _WANTED
    _PACKS, _WANTED = packs, wanted
    size = sum(stop - first for _n, what, first, stop in parts if what == RECORDS)
    if workers is None:
        workers = min(len(os.sched_getaffinity(0)), MAX_WORKERS) if size >= POOL_BYTES else 1
    try:
        if workers <= 1 or threading.active_count() > 1:
            yield from map(read_part, parts)
            return
        with _pool(workers) as pool:
            yield from pool.imap(read_part, parts)
    finally:
        _PACKS, _WANTED = [], frozenset()


def _pool(workers: int) -> multiprocessing.pool.Pool:
    """A pool of forked workers, built with Ctrl-C held back. A KeyboardInterrupt
    inside ``Pool()``, after its threads start but before it can be terminated,
    leaves a thread that forks new workers while the interpreter exits and waits
    for them: the process can hang. Held back, the Ctrl-C lands once the pool exists,
    in the ``with`` that stops it. The pool's threads, and the workers they fork,
    start with it held back too (a thread inherits the mask of its creator)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return multiprocessing.get_context("fork").Pool(workers, _ignore_interrupts)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _ignore_interrupts() -> None:
    """A worker leaves Ctrl-C to the process that started it, which stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def nodes_of_part(pack: SealedPack, first: int, stop: int) -> Iterator[Node]:
    """The nodes of a part that verify and parse: read again for the exact messages
    of links that failed."""
    data = pack.payload(first, stop - first)
    for record in iter_records(data, first, pack.record_types()):
        off, length = record.location
        payload = data[off - first : off - first + length]
        contents: list[tuple[str, bytes]] = []
        if record.type == TYPE_BLOCK:
            try:
                content = decompress_block(payload)
                contents = [(o, piece) for o, _, _, piece in block_pieces(content)]
            except ValueError:
                contents = []
        elif record.type == TYPE_OBJECT:
            oid = record.raw_id.hex()
            try:
                kind, body = objects.decode(oid, payload)
                contents = [(oid, kind.encode("ascii") + b"\0" + body)]
            except ObjectError:
                contents = []
        for oid, piece in contents:
            if piece.startswith(b"node\0") and blake3.blake3(piece).hexdigest() == oid:
                with suppress(ObjectError):
                    yield parse_node(oid, piece[5:])
    pack.release(first, stop)


def _quick_body(value: object) -> bytes | None:
    """orjson's sorted JSON of a value, which is its canonical JSON unless it holds a
    float that orjson spells its own way (canonical.py); None if orjson refuses it."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return None
