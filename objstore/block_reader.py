"""Reading many objects at once: what a context, a walk or an export needs.

A ``BlockReader`` decodes each block it meets once and checks it whole by its
checksum (FORMAT.md 5.5). Read one at a time (``get``, ``node``: a walk, an
export), objects come from blocks the reader keeps for as long as it lives. In
a block of the entry layout, the first object it takes (LIST_AFTER) is found by
the pack index and checked against the entry head the block holds before it;
after that, and at once in the array layout, whose table says where each body
is, the reader lists the whole block by the ids the block itself holds, so
every further object of it costs one dictionary lookup: no index search, no
decompression, no hash of its own.

The messages of a context (``blob_values``) are taken a block at a time: the
block the index names for the first message still to read is decoded and
checked, gives every message of the context it holds, and is let go. The
reader keeps the blocks its walk decoded (nodes), not those of the messages.

A block in the array layout (FORMAT.md 5.5) gives all its messages at once: its
bodies already are one JSON array, so one ``orjson.loads`` over the end of its
content gives every value, with no per-message parse or loop (on the bench's
3,000-message context, 5.2 ms for its blocks where the entry layout took 6.9),
when the context holds a good part of it (_SAMPLES); a block read for one message
repeated from long ago gives that one, parsed alone. A block in the MessagePack
layout (store version 6) does the same with one msgspec decode of its MessagePack
array (``ArrayTable.values``): the bench's 3,000 messages, in blocks of about 110,
decoded in 1.8-2.1 ms where orjson parsed their JSON arrays in 3.4-3.8, and the
whole context read went from 0.45-0.53x the JSONL read to 0.37-0.42x (paired runs,
a new process each, the same machine). One object of such a block costs more than
one of the array layout: its body is written again from its value and hashed
(a search indexing 80,000 messages one at a time took 5-8% more CPU).

Most contexts are read from blocks that hold their messages in the context's
order, since a session's messages are written, and sealed, in order. While each
block holds exactly the next messages (one hex of its table compared with the
context's next ids joined), its parsed array is taken as it is; a repeated
message (held once) is spliced in as a copy at its later places, found by
comparing the context's ids with its distinct ones a window at a time.
The ids are taken to be distinct until a block is not the next; only then are they
counted (a dictionary of them, 0.15-0.25 ms for 3,000 fresh ids), so a context with no repeat
hashes none: on the bench's 3,000 messages made distinct, 0.08-0.15 ms less CPU of
6.2-6.8 (in-process, 4 x 200-300 interleaved pairs, load 0.5-0.8); the bench's own
context, whose first repeat is in its first block, counts them there, as it did at the
start (0.00-0.08 ms more, within the noise). The first block that is not next, and
everything after it, goes by id: one dictionary of
the ids' first places, and the values put in the context's order through it
(built only then: dictionaries of the 3,000 ids, their first places and a lookup
for each took 0.55 ms, a twelfth of the read). Beside a live writer the sealed
blocks are taken in order first, the writer's newest messages by id after. On
the bench's 3,000-message context the values took 6.4-7.4 ms in order against
7.1-8.7 ms by id (in-process A/B, interleaved, load 3). Keying by raw ids
instead cost more: 0.34 ms to turn 3,000 hex ids into bytes, checked. Tried and
left, each no faster in paired runs: filling the context's places by id a run at
a time where a block holds them in order (still a dictionary of every id);
parsing a node block's array whole once a walk takes several of its nodes;
holding the cycle collector off during the read (9 collections of 15-100 us
each, but the one after it does their work; again with the runs: 7.70-8.26 ms against
7.66-7.79); one dictionary of the ids' first places for the repeats, in place of the
set, ``dict.fromkeys`` and ``_repeated_places`` (0.35 ms against 0.32 for the bench's
3,000 ids, 87 of them repeats; again later, with the places spliced as ``_placed``
does: 0.49-0.55 ms against 0.53-0.59, no clear gain: each way touches every id about
three times through a hash table). Costed and not built: finding the repeats with no
hash of the ids at all (each block's hex ids against the context's next ids in C, a
mismatch taken for a repeat, its first place found through the index): 5-6 us of hex
ids for each of the ~25 blocks that hold a repeat, about 1.5 us for each of the 87
mismatches and 2.3 us of index search for each of the 38 distinct repeated ids, about
0.4 ms, what hashing costs. Comparing raw ids (``bytes.fromhex`` of the context's
joined ids once, 53 us, then a slice per block, against 2.9 us for each block's
``hex``): 28 us net, left because ``fromhex`` takes upper case and white space, so an
id the hex compare refuses could match.

A context read walks its nodes a run at a time (``message_run``): a session's nodes
sit in their blocks in the order they were written, its span nodes in blocks of their
own, so from the node the walk is at, the nodes before it in its block are parsed
together (a range of 8, then 16, ... while the run goes on) and followed, each linking
to the one before it, with no Node made for each and no dictionary of the block's
ids; any node that is not such a link (a compaction, files, another session's node, a
node ``node_from_value`` might refuse or read otherwise) ends the run and is read by
``node``. On the bench's 3,000-message context the walk (117 nodes in 5 blocks) took
0.53 ms of CPU against 0.77 ms node by node (medians of 400 interleaved pairs, load
2.9), and the whole read about 3% less (in-process, 6 x 100 reads, each after a
JSONL read, the two orders taken in turn: the one measured second gained 1-4%).

The messages and nodes of a block that claims WITHIN_LIMITS (FORMAT.md 5.5: its
writer read each of them exactly with orjson alone, and the claim is covered by
the block's checksum) are parsed by orjson with no walk; those of any other block
are walked for their nesting and for integers orjson cannot read exactly
(``limits.parse_json_many``), as every single read walks them.

An object that is in no such block (in a pack being written, a loose file, a
plain record, a block that fails its checksum) is read by
``ObjectStore.get``, verified against its id as always.

No second thread decodes blocks ahead while this one parses, though zstd and
BLAKE3 let go of the GIL: orjson holds it, so the decoding thread waits for it
after each call and the two run in turn. Measured on a 3,000-message context
(2 cores, load 3-5): 12.1-16.1 ms with a thread decoding the next block, 9.1-9.8
ms without; zstandard's multi_decompress_to_buffer took 4.2 ms for the blocks one
decompressor takes 2.3 ms for, with one thread or two. Again on a quiet machine,
the decoding and parsing alone (27 blocks of 128 KiB, no store): 3.5-5.6 ms with a
decoding thread, 3.5-4.2 without. Also measured and left: msgspec's JSON decoder
(2.5 ms for these blocks against orjson's 2.0), and a lower zstd level (decompression
2.1 -> 1.9 ms at level -1, the blocks 27% bigger).

A reader keeps at most MAX_BLOCKS decoded blocks (about 128 KiB each), the
oldest decoded let go first; make one per task and drop it, rather than keep
it for the life of a store handle.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections import OrderedDict
from itertools import compress, count, filterfalse
from operator import is_not, ne
from typing import TYPE_CHECKING, Any, Final

import orjson

from .errors import CorruptObject
from .limits import parse_json_many
from .nodes import Node, node_from_value, parse_node
from .objects import ID_RE
from .pack_format import (
    BLOCK_ENTRY_HEAD,
    WITHIN_LIMITS,
    ArrayTable,
    array_table,
    block_members,
    hex_ids,
    is_array_block,
    iter_block,
)

if TYPE_CHECKING:
    from .object_store import ObjectStore
    from .packs import SealedPack

_KINDS: Final = {b"blob": "blob", b"node": "node", b"file": "file"}
_HEAD: Final = BLOCK_ENTRY_HEAD.size
LIST_AFTER: Final = 1
"""Objects a reader takes from a block through the index (``get``, ``node``) before it
lists the block whole. A lookup through the index searches every pack's (about
10 us), so a long walk, which takes all of most blocks, lists a block at its second
object; a short one after a compaction takes a few objects from each of a few old
blocks. (A context's messages are taken a block at a time: ``blob_values``.)"""
_LISTED: Final = -1
MAX_BLOCKS: Final = 256
"""Decoded blocks one reader keeps (about 32 MiB) for ``get`` and ``node``: a walk, or
an export, of about 20,000 objects is read with each block decoded once; a longer
one decodes some twice rather than hold them all."""


class BlockReader:
    """Objects of one store, read through the blocks they sit in (see the module)."""

    def __init__(self, objects: ObjectStore) -> None:
        self._objects = objects
        # id -> (content of its block, offset of its kind + NUL + body there, length),
        # for each node or file of a listed block in the entry layout; those of blocks
        # that claim WITHIN_LIMITS (FORMAT.md 5.5) apart
        self._located: dict[str, tuple[bytes, int, int]] = {}
        self._exact_located: dict[str, tuple[bytes, int, int]] = {}
        # id -> body, for each blob of a listed block in the entry layout: what a
        # context takes, ready; those of blocks that claim to need no walk apart
        self._exact_blobs: dict[str, bytes] = {}
        self._blobs: dict[str, bytes] = {}
        # id -> its listed block in the array layout; whether one of them holds blobs
        # (a walk lists blocks of nodes only, whose ids a context need not look up)
        self._arrays: dict[str, _ArrayBlock] = {}
        self._blob_arrays = False
        # blocks of nodes in the array layout that message runs read, not listed (a
        # block listed later for ``node`` or ``get`` is listed as any other), and the
        # ids a message run found in no block (beside a live writer: its newest nodes)
        self._runs: dict[tuple[str, int], _ArrayBlock] = {}
        self._unblocked: set[str] = set()
        # (pack name, record payload offset) -> the block's content, the flags it
        # claims, and how many objects it gave through the index, or _LISTED once its
        # objects are in the dicts above; oldest decoded first
        self._blocks: OrderedDict[tuple[str, int], tuple[bytes, int, int]] = OrderedDict()
        # blocks that fail their checksum or do not divide into entries: read object by
        # object, each verified, without hashing the block again for each
        self._failed: set[tuple[str, int]] = set()

    def get(self, oid: str) -> tuple[str, bytes]:
        """``(kind, body)`` of an object; ObjectMissing or CorruptObject as ``get`` raises."""
        hit = self._listed(oid) or self._take(oid)[0]
        if hit is None:
            return self._objects.get(oid)
        if isinstance(hit, bytes):
            return "blob", hit
        if isinstance(hit, _ArrayBlock):
            return hit.kind, hit.body(oid)
        content, at, length = hit
        kind = _KINDS.get(content[at : at + 4])
        if kind is None or content[at + 4] != 0:
            raise CorruptObject(oid, "its block holds no kind for it")
        return kind, content[at + 5 : at + length]

    def node(self, oid: str) -> Node:
        """The node ``oid`` as ``parse_node`` reads it; parsed by orjson alone, with no
        walk, if its block claims WITHIN_LIMITS (as a context's messages are). What a
        context read walks: a span node or compaction every 32 messages."""
        block = self._arrays.get(oid)
        if block is None and oid not in self._exact_located and oid not in self._located:
            hit = self._take(oid)[0]  # the first of its block: listed now if an array
            block = hit if isinstance(hit, _ArrayBlock) else None
        if block is not None and block.claimed and block.kind == "node":
            return self._exact_node(oid, block.body(oid))
        hit = self._exact_located.get(oid)
        if hit is not None:
            content, at, length = hit
            if content.startswith(b"node\0", at):
                return self._exact_node(oid, content[at + 5 : at + length])
        kind, body = self.get(oid)
        if kind != "node":
            raise CorruptObject(oid, f"expected a node, found a {kind}")
        return parse_node(oid, body)

    def message_run(self, oid: str) -> tuple[list[str], str | None] | None:
        """For a context read (``walk.context_blobs``): the message blobs, newest first,
        of the message node ``oid`` and of the nodes before it in its block that a walk
        by spans goes to next, each from the one before it, and the id the walk goes to
        after the last of them. None if ``oid`` is not in a checked block of nodes in
        the array layout that claims WITHIN_LIMITS, or is not a node this takes (a
        compaction, a node with files, one ``node_from_value`` might refuse or read
        otherwise): ``node`` reads it.

        A session's nodes sit in their blocks in the order they were written, its span
        nodes apart from the others (FORMAT.md 5.5), so a context read takes them a run
        at a time, parsed together, with no Node made for each and no dictionary of the
        block's ids: on the bench's 3,000-message context, 117 nodes in 5 blocks."""
        if type(oid) is not str:
            return None  # a link no id can be: ``node`` says so
        block = self._arrays.get(oid)
        if block is not None:
            i = block.index[oid]
        else:
            if oid in self._exact_located or oid in self._located or not ID_RE.fullmatch(oid):
                return None
            found = self._objects.in_block(oid)
            if found is None:
                self._unblocked.add(oid)  # ``node`` reads it by ``get``, with no look again
                return None
            pack, off, at, _length = found
            key = (pack.path.name, off)
            block = self._runs.get(key)
            if block is None:
                decoded = self._decoded(key, pack, off)
                if decoded is None or decoded[2] == _LISTED or not decoded[1] & WITHIN_LIMITS:
                    return None  # a listed block holds no object the listing lacks
                content = decoded[0]
                if not is_array_block(content):
                    return None  # ``node`` takes it, as it takes any of the entry layout
                try:
                    block = _ArrayBlock(content, array_table(content), True)
                except ValueError:
                    return None
                self._runs[key] = block
            found_at = block.place(oid, at)
            if found_at is None:
                return None  # the index's word, not the block's: ``node`` decides
            i = found_at
        if not block.claimed or block.kind != "node":
            return None
        return block.message_run(oid, i)

    @staticmethod
    def _exact_node(oid: str, body: bytes) -> Node:
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise CorruptObject(oid, f"not a valid node ({e})") from None
        return node_from_value(oid, value)

    def get_many(self, oids: list[str]) -> list[tuple[str, bytes]]:
        """``(kind, body)`` of each object, in order."""
        return [self.get(oid) for oid in oids]

    def blob_values(self, oids: list[str]) -> list[Any]:
        """The value of each blob, in order, a new value for each (as
        ``limits.parse_json_many`` reads them): a blob of a block that claims
        WITHIN_LIMITS is read by orjson alone, every other one is walked as usual.
        CorruptObject for an object of another kind; ValueError (NestingTooDeep,
        orjson's JSONDecodeError) for a body that cannot be read, without naming it:
        ``blob_bodies`` then gives the bodies, to read one at a time.

        Each block is decoded for the first blob it holds that is still to read, and
        gives every blob of ``oids`` it holds at once; it is then let go, not kept
        with the reader: a long context would otherwise hold its blocks and a copy of
        every body until the end, about twice its JSON, in memory the allocator takes
        fresh from the system (a new process reading 3,000 messages took 2,900 page
        faults so, 900-1,100 now)."""
        fill = _Fill(oids)
        live = self._live_blobs(oids)  # verified, claimed by no block: the newest, mostly
        if self._exact_blobs or self._blobs or self._blob_arrays:  # blocks the walk listed
            wanted = fill.wanted
            for oid in self._exact_blobs.keys() & wanted:
                fill.put(oid, self._exact_blobs[oid], claimed=True)
            for oid in self._blobs.keys() & wanted:
                fill.put(oid, self._blobs[oid], claimed=False)
            for oid in self._arrays.keys() & wanted:
                block = self._arrays[oid]
                if block.kind == "blob":
                    fill.put(oid, block.body(oid), claimed=block.claimed)
        # A context read from its blocks in order: each block holds the next messages,
        # and its parsed array is taken as it is, with no lookup by id.
        while (first := fill.next_in_order) is not None:
            self._fill_from_block(first, fill)
            if fill.next_in_order == first:  # its block is not next, or does not read
                break
        if fill.complete:
            return fill.values()
        for oid, body in live.items():
            fill.put(oid, body, claimed=False)
        fill.out_of_order()
        found = fill.found
        # Each id not found yet, as the blocks taken so far leave them (a C loop over
        # the found ones: a context in order finds the rest of a block's at once).
        for oid in filterfalse(found.__contains__, oids):
            self._fill_from_block(oid, fill)
            if oid not in found:  # in no block that reads, or not as a blob there
                fill.put(oid, self._blob_body(oid), claimed=False)
        return fill.values()

    def _fill_from_block(self, oid: str, fill: _Fill) -> None:
        """Every blob still to read that the block the index names for ``oid`` holds,
        if that block is whole (its checksum); the block is not kept."""
        if not ID_RE.fullmatch(oid):
            return  # a link no id can be: ``ObjectStore.get`` says so (InvalidName)
        found = self._objects.in_block(oid)
        if found is None:
            return
        pack, off = found[0], found[1]
        key = (pack.path.name, off)
        block = self._blocks.get(key)
        if block is not None:
            content, flags = block[0], block[1]
        elif key in self._failed:
            return
        else:
            checked = pack.checked_block(off)
            if checked is None:
                self._failed.add(key)
                return
            content, flags = checked
        claimed = bool(flags & WITHIN_LIMITS)
        if fill.next_in_order == oid and claimed and is_array_block(content):
            try:
                table = array_table(content)
            except ValueError:
                table = None  # take_array finds it so, and the block is read object by object
            if table is not None and fill.take_in_order(content, table):
                return
        taken = (
            fill.take_array(content, claimed=claimed)
            if is_array_block(content)
            else fill.take(content, claimed=claimed)
        )
        if not taken:
            self._failed.add(key)

    def blob_bodies(self, oids: list[str]) -> list[bytes]:
        """The body of each blob, in order (CorruptObject for an object of another kind)."""
        live = self._live_blobs(oids)
        return [live.get(oid) or self._blob_body(oid) for oid in oids]

    def _live_blobs(self, oids: list[str]) -> dict[str, bytes]:
        """The bodies of those of ``oids`` that are blobs in other writers' packs being
        written, verified, read in one pass (beside a live writer: its newest messages)."""
        live = self._objects.live_objects(oids)
        return {oid: body for oid, (kind, body) in live.items() if kind == "blob"}

    def _listed(self, oid: str) -> _ArrayBlock | tuple[bytes, int, int] | bytes | None:
        """Where ``oid`` is in a block listed already: its body if it is a blob of a block
        in the entry layout."""
        return (
            self._exact_blobs.get(oid)
            or self._blobs.get(oid)
            or self._arrays.get(oid)
            or self._exact_located.get(oid)
            or self._located.get(oid)
        )

    def _blob_body(self, oid: str) -> bytes:
        """The body of a blob: listed, or the first taken from its block, or one in no
        checked block."""
        hit = self._listed(oid) or self._take(oid)[0]
        if isinstance(hit, bytes):
            return hit
        # Not a blob in a checked block of the entry layout (``_take`` has looked): read
        # as ``get`` reads it, which names the kind, or what is wrong.
        kind, body = self.get(oid) if hit is not None else self._objects.get(oid)
        if kind != "blob":
            raise CorruptObject(oid, f"expected a blob, found a {kind}")
        return body

    def _decoded(
        self, key: tuple[str, int], pack: SealedPack, off: int
    ) -> tuple[bytes, int, int] | None:
        """The block ``key`` as kept: its content, the flags it claims, and how many
        objects it gave (or _LISTED), decoding and checking it if it is new; None if it
        fails its checksum (then each of its objects is read alone)."""
        block = self._blocks.get(key)
        if block is not None:
            return block
        checked = None if key in self._failed else pack.checked_block(off)
        if checked is None:
            self._failed.add(key)
            return None
        content, flags = checked
        block = self._blocks[key] = (content, flags, 0)
        if len(self._blocks) > MAX_BLOCKS:
            dropped_key, (dropped, _, taken) = self._blocks.popitem(last=False)
            self._runs.pop(dropped_key, None)
            if taken == _LISTED:  # it was listed whole, so it divides into entries
                for member, _, _ in iter_block(dropped):
                    self._located.pop(member, None)
                    self._exact_located.pop(member, None)
                    self._exact_blobs.pop(member, None)
                    self._blobs.pop(member, None)
                    self._arrays.pop(member, None)
        return block

    def _take(self, oid: str) -> tuple[_ArrayBlock | tuple[bytes, int, int] | bytes | None, int]:
        """Where ``oid`` is in a checked block (its body, if it is a blob of the entry
        layout), decoding that block if it is new, and the flags the block claims; None
        if it is in none (or in none its index names)."""
        if oid in self._unblocked or not ID_RE.fullmatch(oid):
            return None, 0  # in no block (a message run looked), or a link no id can be
        found = self._objects.in_block(oid)
        if found is None:
            return None, 0
        pack, off, at, length = found
        key = (pack.path.name, off)
        block = self._decoded(key, pack, off)
        if block is None:
            return None, 0
        content, flags, taken = block
        if taken == _LISTED:
            return None, 0  # the block does not hold it, whatever the index says
        if is_array_block(content):
            # Its own table says at once where each object is: listed whole now.
            try:
                array = _ArrayBlock(content, array_table(content), bool(flags & WITHIN_LIMITS))
            except ValueError:
                return None, 0  # listed as _LISTED never: each of it is read through ``get``
            self._blocks[key] = (content, flags, _LISTED)
            self._runs.pop(key, None)
            self._arrays.update(dict.fromkeys(array.ids, array))
            self._blob_arrays = self._blob_arrays or array.kind == "blob"
            return (array if self._arrays.get(oid) is array else None), flags
        # The index's word, checked against the entry head the block holds; where they
        # disagree, or once a block has given LIST_AFTER objects, the block's own list
        # of its objects decides.
        if (
            taken < LIST_AFTER
            and _HEAD <= at <= len(content) - length
            and BLOCK_ENTRY_HEAD.unpack_from(content, at - _HEAD) == (bytes.fromhex(oid), length)
        ):
            self._blocks[key] = (content, flags, taken + 1)
            if content.startswith(b"blob\0", at):
                return content[at + 5 : at + length], flags
            return (content, at, length), flags
        blobs: dict[str, bytes] = {}
        try:
            members = block_members(content, blobs)
        except ValueError:
            return None, 0  # listed as _LISTED never: each of it is read through ``get``
        self._blocks[key] = (content, flags, _LISTED)
        if flags & WITHIN_LIMITS:
            self._exact_located.update(members)
            self._exact_blobs.update(blobs)
        else:
            self._located.update(members)
            self._blobs.update(blobs)
        return blobs.get(oid) or members.get(oid), flags


class _ArrayBlock:
    """A block in the array layout (FORMAT.md 5.5): each object's body found by its id
    through the block's own table. Its hex ids, the dictionary of them and where each
    body starts are made when first needed (a message run needs none but the last)."""

    __slots__ = (
        "_ids",
        "_index",
        "_starts",
        "_table",
        "claimed",
        "content",
        "kind",
        "lengths",
        "raw_ids",
    )

    def __init__(self, content: bytes, table: ArrayTable, claimed: bool) -> None:
        self.content = content
        self.kind = _KINDS[table.kind[:4]]
        self.claimed = claimed
        self.raw_ids = table.ids
        self.lengths = table.lengths
        self._table = table
        self._ids: list[str] | None = None
        self._index: dict[str, int] | None = None
        self._starts: list[int] | None = None

    @property
    def index(self) -> dict[str, int]:
        """id -> its place in the block."""
        if self._index is None:
            ids = self.ids
            self._index = dict(zip(ids, range(len(ids)), strict=True))
        return self._index

    @property
    def starts(self) -> list[int]:
        """Where each body (value, in the MessagePack layout) starts in the content, in
        block order."""
        if self._starts is None:
            self._starts = self._table.starts()
        return self._starts

    @property
    def ids(self) -> list[str]:
        """Each id in hex, in block order."""
        if self._ids is None:
            self._ids = hex_ids(self.raw_ids)
        return self._ids

    def body(self, oid: str) -> bytes:
        """The body of ``oid``; CorruptObject for a MessagePack value that is not one."""
        try:
            return self._table.body(self.content, self.index[oid], self.starts)
        except ValueError as e:
            raise CorruptObject(oid, f"its block cannot give it ({e})") from None

    def place(self, oid: str, at: int) -> int | None:
        """The place of ``oid`` whose body the index says starts at ``at``, if the
        block's table says so too; else None."""
        starts = self.starts
        i = bisect_left(starts, at)
        if i == len(starts) or starts[i] != at or self.hex_id(i) != oid:
            return None
        return i

    def hex_id(self, i: int) -> str:
        return self.raw_ids[32 * i : 32 * i + 32].hex()

    def message_run(self, oid: str, place: int) -> tuple[list[str], str | None] | None:
        """``BlockReader.message_run`` in this block (of nodes that claim WITHIN_LIMITS)
        from ``oid`` at ``place``. The nodes are parsed a range at a time, back from it,
        the range doubling from _RUN while the run goes on: what is parsed and not
        taken (another session's nodes before the run) is at most about what is
        taken."""
        starts, lengths, raw = self.starts, self.lengths, self.raw_ids
        if self.content.startswith(b'{"kept":', starts[place]):
            return None  # a compaction (FORMAT.md 5.5 tells it so): no run, ``node`` reads it
        newest_first: list[str] = []
        at: str | None = oid
        hi = place
        size = _RUN
        while hi >= 0 and at == self.hex_id(hi):
            lo = max(0, hi - size + 1)
            try:
                values = orjson.loads(
                    b"[" + self.content[starts[lo] : starts[hi] + lengths[hi]] + b"]"
                )
            except orjson.JSONDecodeError:
                break  # ``node`` reads each alone, and names the one that does not read
            if type(values) is not list or len(values) != hi - lo + 1:
                break
            ids = raw[32 * lo : 32 * hi + 32].hex()
            while hi >= lo and at == ids[64 * (hi - lo) : 64 * (hi - lo) + 64]:
                taken, link = _message_link(values[hi - lo], newest_first)
                if not taken:
                    break
                at, hi = link, hi - 1
            if hi >= lo:
                break
            size *= 2
        return None if hi == place else (newest_first, at)


_RUN: Final = 8
"""Nodes ``_ArrayBlock.message_run`` parses first; then twice as many each time."""
_NODE_FIELDS: Final = ("parent", "state", "meta", "message")


def _message_link(value: Any, newest_first: list[str]) -> tuple[bool, Any]:
    """For the parsed body of a message node that ``node_from_value`` reads as it is,
    with no files: True, with its message blobs put on ``newest_first`` (a span's,
    newest first, or its own message), and the id a walk by spans goes to next (the
    span's ``after``, or ``parent``). False, with nothing put, for any other value:
    a compaction, a node with files, one ``node_from_value`` might refuse or read
    otherwise."""
    if (
        type(value) is not dict
        or value.get("type") != "message"
        or "files" in value
        or type(value.get("messages")) is not int
        or not all(map(value.__contains__, _NODE_FIELDS))
    ):
        return False, None
    if "span" not in value:
        newest_first.append(value["message"])
        return True, value["parent"]
    span = value["span"]
    if type(span) is not dict or "after" not in span or type(span.get("messages")) is not list:
        return False, None
    newest_first += reversed(span["messages"])
    return True, span["after"]


class _Fill:
    """The values of a context's blobs as ``blob_values`` finds them, in any order, by
    id: each parsed once, and a blob that is in the context twice copied for each
    further place."""

    __slots__ = (
        "_counted",
        "_firsts",
        "_in_order",
        "_oids",
        "_ordered",
        "_to_walk",
        "_wanted",
        "found",
    )

    def __init__(self, oids: list[str]) -> None:
        self._oids = oids
        self._wanted: dict[str, int] | None = None
        # id -> its value, or (until ``values`` walks it) its body, those ids in _to_walk
        self.found: dict[str, Any] = {}
        self._to_walk: list[str] = []
        # While blocks come in the context's order: the distinct ids by first place, and
        # the values of the first of them, parsed whole from their blocks (``found`` is
        # empty until ``out_of_order``). The ids are taken to be distinct until a block
        # is not the next (``_count_repeats``): hashing them all to find out costs 0.15
        # ms of the bench's 3,000, which a context with no repeat never needs.
        self._firsts = oids
        self._counted = False
        self._in_order: list[Any] = []
        self._ordered = True

    @property
    def wanted(self) -> dict[str, int]:
        """id -> its first place: the ids of the context, made when first asked for (a
        context read in order does without: 0.2 ms of the bench's 3,000 ids)."""
        if self._wanted is None:
            oids = self._oids
            self._wanted = dict(zip(reversed(oids), range(len(oids) - 1, -1, -1), strict=True))
        return self._wanted

    @property
    def next_in_order(self) -> str | None:
        """The next id to take in order, or None once all are, or ``out_of_order``."""
        done = len(self._in_order)
        return self._firsts[done] if self._ordered and done < len(self._firsts) else None

    @property
    def complete(self) -> bool:
        """Whether every value was taken in order."""
        return self._ordered and len(self._in_order) == len(self._firsts)

    def take_in_order(self, content: bytes, table: ArrayTable) -> bool:
        """Take the values of a block in the array layout that claims WITHIN_LIMITS if
        its ids are the next ids of the context, in order: its parsed array as it is
        (one hex of its table and one compare, no dictionary by id). False, with
        nothing taken, if they are not, or its array does not read as that."""
        done, n = len(self._in_order), len(table.lengths)
        if table.kind != b"blob\0":
            return False
        ids = table.ids.hex()
        if ids != self._next_ids(done, n) and (
            # They may be the next once the context's repeats are counted (``_firsts``
            # then holds its distinct ids).
            not self._count_repeats(done) or ids != self._next_ids(done, n)
        ):
            return False
        try:
            values = table.values(content)
        except ValueError:
            return False  # read by take_array, and named if it cannot be
        self._in_order += values
        return True

    def _next_ids(self, done: int, n: int) -> str:
        """The next ``n`` distinct ids to take, joined, as a block's table's hex is."""
        return "".join(self._firsts[done : done + n])

    def _count_repeats(self, done: int) -> bool:
        """Once, at the first block that is not next while the ids are taken to be
        distinct: whether some id repeats, the distinct ids now in ``_firsts`` (the
        values taken so far, of the first ``done`` places, are theirs). False if none
        repeats (the block is not next), or one repeats among the places taken (a
        blob held by two blocks: each place has a value of its own, and
        ``out_of_order`` puts them by id)."""
        if self._counted:
            return False
        self._counted = True
        oids = self._oids
        firsts = list(dict.fromkeys(oids))  # the same str objects, at their first places
        if len(firsts) == len(oids):
            return False
        if next(compress(count(), map(is_not, firsts[:done], oids[:done])), None) is not None:
            return False
        self._firsts = firsts
        return True

    def out_of_order(self) -> None:
        """Go on by id: what was taken in order goes to ``found``."""
        if self._ordered:
            self._ordered = False
            self.found.update(zip(self._firsts, self._in_order, strict=False))  # a prefix
            self._in_order = []

    def put(self, oid: str, body: bytes, *, claimed: bool) -> None:
        """Take the value of ``oid`` (if still to read) from its body."""
        self.out_of_order()
        if oid in self.found:
            return
        if claimed:
            self.found[oid] = orjson.loads(body)
        else:
            self.found[oid] = body
            self._to_walk.append(oid)

    def take(self, content: bytes, *, claimed: bool) -> bool:
        """Take the value of each blob still to read that an entry-layout block's content
        holds (an object of another kind is left to be read alone). False, with nothing
        of it taken, if the content does not divide into whole entries (FORMAT.md 5.5).

        One pass over the entries, kept tight: it is most of what a long context
        costs in this layout beside orjson and zstd."""
        self.out_of_order()
        wanted, found, loads = self.wanted, self.found, orjson.loads
        unpack, head, size = BLOCK_ENTRY_HEAD.unpack_from, _HEAD, len(content)
        taken: list[str] = []
        pos = 0
        try:
            while pos < size:
                raw, length = unpack(content, pos)
                pos += head
                oid = raw.hex()
                if oid in wanted and oid not in found and content.startswith(b"blob\0", pos):
                    taken.append(oid)
                    if claimed:
                        found[oid] = loads(content[pos + 5 : pos + length])
                    else:
                        self.put(oid, content[pos + 5 : pos + length], claimed=False)
                pos += length
        except struct.error:
            pos = -1
        if pos != size:  # cut short, or the last entry runs past the end: read each
            for oid in taken:  # alone, verified, as of a block that fails its checksum
                del found[oid]
            undone = set(taken)
            self._to_walk = [oid for oid in self._to_walk if oid not in undone]
            return False
        return True

    def take_array(self, content: bytes, *, claimed: bool) -> bool:
        """Take the value of every blob an array-layout block's content holds, by one
        parse of its JSON array if it claims WITHIN_LIMITS and the context seems to
        hold a good part of it (``_SAMPLES``), else of each blob still to read alone.
        False, with nothing of it taken, if its table does not fit it (FORMAT.md 5.5)."""
        self.out_of_order()
        try:
            table = array_table(content)
        except ValueError:
            return False
        if table.kind != b"blob\0":
            return True  # no blob: each is read alone, and named
        ids = table.hex_ids()
        found, wanted, last = self.found, self.wanted, len(ids) - 1
        if claimed and sum(ids[last * i // _SAMPLES] in wanted for i in range(_SAMPLES + 1)) > 1:
            try:
                # Those found already (a copy beside a live writer) are found again.
                found.update(zip(ids, table.values(content), strict=True))
                return True
            except ValueError:
                pass  # each is read alone below, and named if it cannot be
        starts = table.starts()
        places = [i for i, oid in enumerate(ids) if oid in wanted and oid not in found]
        # A MessagePack value of a block that claims WITHIN_LIMITS is believed as the
        # block's whole array is: taken as decoded, with no body written again to parse.
        direct = claimed and table.packed
        try:
            read: list[Any] = [(table.value if direct else table.body)(content, i, starts)
                               for i in places]  # fmt: skip
        except ValueError:
            return False  # a MessagePack value that is no body: each is read alone
        for i, item in zip(places, read, strict=True):
            if direct:
                found[ids[i]] = item
            else:
                self.put(ids[i], item, claimed=claimed)
        return True

    def values(self) -> list[Any]:
        """Every place's value, once every blob is found."""
        if self._ordered:
            return self._placed(self._in_order)
        found, oids = self.found, self._oids
        walk = [oid for oid in self._to_walk if type(found[oid]) is bytes]
        if walk:
            found.update(zip(walk, parse_json_many([found[oid] for oid in walk]), strict=True))
        out = list(map(found.__getitem__, oids))
        if len(self.wanted) < len(out):  # a blob twice: a value of its own for each place
            firsts = map(self.wanted.__getitem__, oids)
            for i in compress(count(), map(ne, firsts, count())):  # in C, to the places
                out[i] = _copied(out[i])
        return out

    def _placed(self, values: list[Any]) -> list[Any]:
        """Every place's value from ``values``, those of the distinct ids by first place:
        ``values`` itself if no id repeats, else spliced, a copy at each further place
        (found in C, as ``values`` finds them)."""
        oids = self._oids
        if len(values) == len(oids):
            return values
        again = _repeated_places(oids, self._firsts)
        repeated = {oids[i] for i in again}
        first: dict[str, int] = {}
        for i in compress(count(), map(repeated.__contains__, oids)):  # in C, to the few
            first.setdefault(oids[i], i)
        out: list[Any] = []
        done = 0
        for k, i in enumerate(again):
            out += values[done : i - k]  # the distinct ones before place i
            done = i - k
            out.append(_copied(out[first[oids[i]]]))
        out += values[done:]
        return out


def _repeated_places(oids: list[str], firsts: list[str]) -> list[int]:
    """The places of ``oids`` that hold an id met at an earlier place, in order, given
    ``firsts``, its distinct ids by first place (the same str objects, as
    ``dict.fromkeys`` keeps them): the two lists are compared _WINDOW places at a
    time by identity, in C, so the cost is a step for each window and each repeat,
    not a lookup for each place. (Two list iterators set back after each repeat
    with ``__setstate__`` took 71-78 us for the bench's 3,000 ids with 87 repeats
    against 100-107 for these windows: 0.4% of the read, left for plain code.)"""
    places: list[int] = []
    i = f = 0
    n = len(oids)
    while i < n:
        here, there = oids[i : i + _WINDOW], firsts[f : f + _WINDOW]
        j = next(compress(count(i), map(is_not, here, there)), None)
        if j is None:
            if len(there) == len(here):
                i, f = i + len(here), f + len(here)
                continue
            j = i + len(there)  # firsts has ended: every place left is a repeat
        places.append(j)
        f += j - i
        i = j + 1
    return places


_WINDOW: Final = 64


def _copied(value: Any) -> Any:
    """A JSON value anew: each dict and list copied, the rest (str, numbers, True,
    False, None: immutable) shared."""
    kind = type(value)
    if kind is dict:
        return {key: _copied(item) for key, item in value.items()}
    if kind is list:
        return [_copied(item) for item in value]
    return value


_SAMPLES: Final = 4
"""An array block is parsed whole when at least two of the five ids at its start, end
and quarters are in the context (a context of messages in order takes all of a
block); else its few blobs the context holds alone (a message repeated from long
ago, the kept messages of a compaction)."""
