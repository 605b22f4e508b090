"""Packs: many objects in one append-only file, the index that finds them, and
the journal of ref updates that lets one fsync make an append durable.

The byte layouts are in docs/FORMAT.md (5.1 the pack and its records, 5.3
the index) and encoded by pack_format.py; this module does the I/O.

A pack is only ever appended to, by the one process that holds an ``flock``
on it. An append writes its objects and its ref update, then one ``fsync``
makes both durable, and writes no ref file: until the pack is sealed, the
ref-update record is the ref's newest value, which readers find in their
scan of the packs being written (``OpenPack.journaled``; refs.py).

A pack is *sealed* when its writer closes it (or it passes MAX_PACK_BYTES):
the writer brings the ref files up to its journal (``RefStore.replay``),
then writes the index. An index means "sealed: nothing in this pack is
needed to read or recover a ref", and is derived data: a damaged one is
rebuilt from the pack. A pack without an index is being written (its flock
is held) or was left by a crash; whoever finds it unlocked when opening the
store recovers it (FORMAT.md 5.2): replays its ref updates (which writes the
ref files the dead writer had not) and writes the index, leaving any torn
tail unindexed.
"""

from __future__ import annotations

import bisect
import fcntl
import mmap
import operator
import os
import secrets
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from operator import itemgetter
from pathlib import Path
from typing import Any, Final, Literal

import blake3
import zstandard

from . import canonical, forks, live_index, objects
from .errors import CorruptObject, DamagedIndex, DamagedPack, ObjectError
from .files import atomic_write, fsync_dir, make_dirs, open_fd, write_all
from .id_set import IdSet
from .limits import read_exactly
from .live_index import ENTRY_RECORDS, LIVE_MAGIC
from .live_index import encode_entry as encode_live_entry
from .pack_format import (
    BLOCK_ENTRY_HEAD,
    BLOCK_IDX_ENTRY,
    BLOCK_PACK_MAGIC,
    CHECKSUM_BYTES,
    ENTRIES_AT,
    IDX_ENTRY,
    NOT_IN_A_BLOCK,
    PACK_MAGIC,
    PACKED_MARK,
    RECORD_HEAD,
    TYPE_BLOCK,
    TYPE_OBJECT,
    TYPE_REF,
    WITHIN_LIMITS,
    ArrayTable,
    Location,
    Scan,
    array_separators,
    array_size,
    array_table,
    block_claim,
    block_entries,
    block_piece,
    block_pieces,
    encode_array_block,
    encode_block,
    encode_claim,
    encode_index,
    encode_packed_block,
    encode_record,
    is_array_block,
    iter_block,
    iter_records,
    packed_size,
    packed_values,
    parse_index,
    payload_location,
    scan_buffer,
    sorted_index_chunks,
)
from .shared_fsync import SharedFsync

MAX_PACK_BYTES: Final = 2 * 1024 * 1024
"""A handle seals its pack (compressing it into a block pack) once it passes this:
every process that opens the store reads the packs being written (their live
index, and the records past its last entry: live_index.py), so a long running
writer keeps them small (about 1,200 messages). A seal also has work of its own
that does not grow with the pack (the ref files of the sessions it journals, the
block pack's index, fsyncs, a new pack to start), and the more packs, the more
merges: eight threads appending 8,000 messages through one handle went from
6,871 to 7,597/s (bench row) when this went from 1 to 2 MiB, and a reader beside
the writer was no slower (the live-reader row)."""

ZEROS_AHEAD: Final = 256 * 1024
"""Zero bytes a pack being written keeps written (and synced) past its records, up to
MAX_PACK_BYTES (FORMAT.md 5.1): an fsync that need not record a new file size takes
about half the time (ext4, XFS), and most appends then sync only data."""

READ_WINDOW: Final = 64 * 1024
"""What a reader reads of a pack at once where its live index saved the scan."""

MAX_KEPT_CONTENT: Final = 4 * MAX_PACK_BYTES
"""Bytes of content a handle keeps of the objects in its pack, to seal it without
reading them back: about a whole pack of messages (they compress about 3x)."""

SMALL_WRITE: Final = 50_000
"""Objects up to which a block pack writer keeps the ids it wrote in a Python ``set``
(``BlockPackWriter``): about 250 bytes an object at its peak, 13 MB at most. A merge
of 23 packs of 1 MiB (12,000 appends, 24,000 objects) took 182 ms of CPU with it
against 230 with the ``IdSet``; a bigger merge (gc's sweep of a whole store) keeps the
``IdSet``, 6 bytes an object."""

Replay = Callable[[list[dict[str, Any]]], None]
Recovery = Literal["busy", "sealed", "removed"]


def new_pack_name() -> str:
    return f"pack-{secrets.token_hex(16)}"


REF_KIND: Final = frozenset({"ref"})


def scan_records(fd: int, start: int, end: int) -> Scan:
    """The records in ``[start, end)`` of a pack file (pack_format.scan_buffer)."""
    return scan_buffer(os.pread(fd, end - start, start) if end > start else b"", start)


def decode_ref_update(checksum: bytes, stored: bytes) -> dict[str, Any]:
    """The update a ref-update record holds, checked; CorruptObject says what is wrong."""
    oid = checksum.hex()
    _, body = objects.decode(oid, stored, REF_KIND)
    try:
        update = canonical.loads(body)
    except ValueError:
        raise CorruptObject(oid, "ref update is not JSON") from None
    if not (
        isinstance(update, dict)
        and isinstance(update.get("ref"), str)
        and isinstance(update.get("body"), dict | None)
        and (
            (isinstance(update.get("log"), dict) and type(update["log"].get("gen")) is int)
            or (
                update.get("log", 0) is None
                and isinstance(update["body"], dict)
                and type(update["body"].get("generation")) is int
            )
        )
    ):
        raise CorruptObject(oid, "ref update lacks ref, log.gen (or body.generation) or body")
    return update


def _named_ref(stored: bytes) -> str | None:
    """The ref a ref-update record names, read without checking it (its canonical JSON
    ends with the ``ref`` key: 5.1), or None if it does not even decompress. A full
    decode costs ten times as much, and a live pack holds a record per append."""
    try:
        content = objects.unverified_content(stored)
    except CorruptObject:
        return None
    at = content.rfind(b',"ref":"')
    if at < 0 or not content.endswith(b'"}'):
        return None
    return content[at + len(b',"ref":"') : -2].decode("utf-8", "replace")


class PackWriter:
    """The one open, growing pack of a store handle. Holds the pack's flock (not in
    a child of a fork: forks.py)."""

    def __init__(
        self, pack_dir: Path, tmp_dir: Path, magic: bytes = PACK_MAGIC, *, hidden: bool = False
    ) -> None:
        self.name = new_pack_name()
        self.path = pack_dir / f"{self.name}.pack"
        self._tmp_dir = tmp_dir
        # Locked before it is visible, so no reader ever mistakes it for an abandoned
        # pack; its header durable before it is visible, so a power loss never leaves
        # a visible pack without one. ``hidden``: it stays in tmp/ (``path``) until its
        # seal renames it to ``final`` (BlockPackWriter), so a writer killed before
        # leaves nothing any reader takes in, only a file of tmp/ for repack to remove.
        tmp = tmp_dir / f"{self.name}.pack"
        self.final = self.path
        if hidden:
            self.path = tmp
        try:
            fd = open_fd(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        except FileNotFoundError:  # tmp/ was removed by hand: make it again
            make_dirs(tmp_dir)
            fd = open_fd(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        zeros = ZEROS_AHEAD if magic == PACK_MAGIC else 0  # a block pack is written whole
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            write_all(fd, magic + bytes(zeros), 0)
            os.fsync(fd)
            if not hidden:
                os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            with suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._fd = fd
        forks.track(self)
        self.size = len(magic)  # with the held records
        self._in_file = self.size  # in the file
        # Where the zeros written ahead of the records end (ZEROS_AHEAD); 0 for none.
        self._zeroed = self.size + zeros if zeros else 0
        self._held: list[bytes] = []  # encoded records waiting for the next write
        self._held_ids: list[str] = []
        self.index: dict[str, Location] = {}
        # The content (``kind + NUL + body``) of the objects ``add_object`` wrote, for the
        # seal to compress into blocks without reading and checking them back; up to
        # MAX_KEPT_CONTENT bytes (content that compresses well can be far more than
        # the pack), the rest is read back.
        self.contents: dict[str, bytes] = {}
        self.exact: set[str] = set()  # of those, JSON orjson wrote (``block_payload``)
        self._kept = 0
        self._dir_synced = False
        self._fsyncs = SharedFsync()  # each covering what came before it, two at a time
        # Set while a seal beside the writer copies the pack (``sealing``): where its
        # fsync failed, an append relying on it waits for the copy instead.
        self._copy: threading.Event | None = None
        self._copied = False
        self._holders = 0  # threads waiting for a sync outside their turn
        self._idle = threading.Condition()
        # The newest journaled update of each ref: the truth for that ref (when newer
        # than its file) until the pack is sealed, which writes the files (FORMAT.md 9).
        self.journaled: dict[str, dict[str, Any]] = {}
        self._journal_undo: list[tuple[str, dict[str, Any] | None]] = []  # of held updates
        # The live index (live_index.py): records written since its last entry.
        self._live_objects: list[tuple[bytes, int]] = []
        self._live_refs: list[int] = []
        self._live_fd = -1 if magic == PACK_MAGIC else -2  # -2: none (a block pack)
        self._live_written = (0, 0)  # how many of those lists are in the pack

    def _write(self, records: Iterable[tuple[int, bytes, bytes]]) -> None:
        """Append records, and the held ones before them, in one write; all of them,
        or (on an error such as a full disk) none: the pack is cut back and the
        index forgets the held objects."""
        self._hold(records)
        self.flush()

    def _hold(self, records: Iterable[tuple[int, bytes, bytes]]) -> None:
        """Place records after the others, to be written with the next ``flush``: found
        in the index at once (``read`` writes them first)."""
        offset = self.size
        live = self._live_fd != -2
        for rtype, raw_id, payload in records:
            self._held.append(encode_record(rtype, raw_id, payload))
            if rtype == TYPE_OBJECT:
                oid = raw_id.hex()
                self.index[oid] = (offset + RECORD_HEAD.size, len(payload))
                self._held_ids.append(oid)
                if live:
                    self._live_objects.append((raw_id, offset))
            elif live:
                self._live_refs.append(offset)
            offset += RECORD_HEAD.size + len(payload)
        self.size = offset

    def flush(self) -> None:
        """Write the held records in one write (called in the handle's turn: an append
        holds its objects and writes them with its ref update, turns.py)."""
        if not self._held:
            return
        held, start = self._held, self._in_file
        try:
            if self._fsyncs.failed is not None:  # written past it, nothing is durable
                raise OSError(self._fsyncs.failed.errno, "an fsync of this pack failed")
            if not self._zeroed:
                write_all(self._fd, b"".join(held), start)
            else:
                # Readers of a pack with zeros ahead cannot tell a record from its size,
                # so the first type byte is written last: until then the new records
                # read as zeros, the end of the pack (FORMAT.md 5.1).
                ahead = b""
                if self.size > self._zeroed and self.size < MAX_PACK_BYTES:
                    ahead = bytes(min(ZEROS_AHEAD, MAX_PACK_BYTES - self.size))
                write_all(self._fd, b"".join([b"\0", held[0][1:], *held[1:], ahead]), start)
                self._zeroed = max(self._zeroed, self.size + len(ahead))
                write_all(self._fd, held[0][:1], start)
        except BaseException:
            os.ftruncate(self._fd, start)
            self._zeroed = min(self._zeroed, start)
            self.drop_held()
            raise
        self._held, self._held_ids = [], []
        self._journal_undo = []
        self._in_file = self.size
        if len(self._live_objects) + len(self._live_refs) >= ENTRY_RECORDS:
            self._note_live()
        self._live_written = (len(self._live_objects), len(self._live_refs))

    def drop_held(self) -> None:
        """Forget the held records, as if never added: their write failed, or what they
        rely on could not be made durable first (ObjectStore.flush)."""
        for oid in self._held_ids:
            self.index.pop(oid, None)
            self._kept -= len(self.contents.pop(oid, b""))
            self.exact.discard(oid)
        self.size = self._in_file
        self._held, self._held_ids = [], []
        objects_noted, refs_noted = self._live_written
        del self._live_objects[objects_noted:], self._live_refs[refs_noted:]
        for ref, before in reversed(self._journal_undo):  # the held updates never were
            if before is None:
                self.journaled.pop(ref, None)
            else:
                self.journaled[ref] = before
        self._journal_undo = []

    def _note_live(self) -> None:
        """Append an entry listing the records written since the last one to the live
        index (FORMAT.md 5.6), after they are in the pack. Never synced: a hint for
        readers, which a failure here only makes slower."""
        entry = encode_live_entry(self.size, self._live_objects, self._live_refs)
        self._live_objects, self._live_refs = [], []
        try:
            if self._live_fd == -1:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
                self._live_fd = open_fd(self.path.with_suffix(".live"), flags)
                os.write(self._live_fd, LIVE_MAGIC)
            os.write(self._live_fd, entry)
        except OSError:
            self.drop_live_index()  # a full disk: readers scan instead

    def drop_live_index(self) -> None:
        """Delete the live index (5.6): when the pack is deleted, or cannot keep one."""
        if self._live_fd >= 0:
            os.close(self._live_fd)
        self._live_fd = -2  # none for this pack any more
        with suppress(FileNotFoundError):
            os.unlink(self.path.with_suffix(".live"))

    def add(self, records: Iterable[tuple[str, bytes]]) -> None:
        """Hold ``(id, stored form)`` object records: written with the next ref update,
        ``flush`` or ``read``; durable after ``flush`` and ``sync``."""
        self._hold((TYPE_OBJECT, bytes.fromhex(oid), stored) for oid, stored in records)

    def add_object(self, oid: str, stored: bytes, content: bytes, exact: bool = False) -> None:
        """``add`` one object whose content (which hashes to ``oid``) the caller has;
        ``exact``: a JSON body that orjson wrote (canonical.encode)."""
        self._hold([(TYPE_OBJECT, bytes.fromhex(oid), stored)])
        if self._kept + len(content) <= MAX_KEPT_CONTENT:
            self.contents[oid] = content
            self._kept += len(content)
            if exact:
                self.exact.add(oid)

    def add_ref_update(self, update: dict[str, Any]) -> None:
        """Journal a ref update (``{"body", "log", "ref"}``, FORMAT.md 5.1), held to be
        written with the next ``flush`` in one write with the objects held before it,
        the handle's own reads taking it at once. Durable after ``sync``; its ref file
        is written when the pack is sealed."""
        body = canonical.dumps(update, fast=canonical.check_json(update))
        content = objects.content_of("ref", body)
        checksum, stored = objects.content_id(content), objects.stored_raw("ref", content)
        name = update["ref"]
        self._journal_undo.append((name, self.journaled.get(name)))
        self.journaled[name] = update
        self._hold([(TYPE_REF, bytes.fromhex(checksum), stored)])

    def read(self, loc: Location) -> bytes:
        if loc[0] >= self._in_file:
            self.flush()
        return os.pread(self._fd, loc[1], loc[0])

    def sync(self) -> None:
        """Make every record written so far durable. Threads that wait here together
        share fsyncs (shared_fsync.py): each fsync covers every record written before
        it began."""
        wanted = self._in_file  # held records are the caller's to flush first
        if self._fsyncs.synced < wanted:
            self._fsyncs.cover(wanted, wanted, self._fsync_now)

    @property
    def holding(self) -> bool:
        """Whether records wait to be written with the next ``flush``."""
        return bool(self._held)

    def sealing(self) -> None:
        """This pack is being sealed beside its writer (sealing.py)."""
        self._copy = threading.Event()

    def sealed(self, ok: bool) -> None:
        """Its seal has copied it (``ok``: its objects are durable in the block pack the
        seal wrote, whatever its own fsyncs did), or failed to; said once."""
        if self._copy is not None and not self._copy.is_set():
            self._copied = ok
            self._copy.set()

    def sync_or_sealed(self) -> None:
        """``sync`` for a pack being sealed: if an fsync of it failed, its seal writes what
        the handle holds of it into a block pack (ObjectStore._sealed_pack), and its
        objects are durable once that block pack is."""
        try:
            self.sync()
        except OSError:
            if self._copy is None or self.failed is None:
                raise
            self._copy.wait()
            if not self._copied:
                raise

    @property
    def failed(self) -> OSError | None:
        """The error of a failed fsync of this pack: from then, nothing is written to
        it (shared_fsync.py), and its handle retires it (``cut_back``)."""
        return self._fsyncs.failed

    def cut_back(self) -> None:
        """After a failed fsync, cut the pack back to what the last fsync that returned
        made durable, durably: what was written after it is of unknown durability,
        and a later append chained on it could lose its parent in a power loss.
        Cut, no reader takes it for a value (FORMAT.md 5.1: the end of a pack)."""
        keep = max(self._fsyncs.synced, len(PACK_MAGIC))
        os.ftruncate(self._fd, keep)
        os.fsync(self._fd)
        self.size = self._in_file = keep

    def _fsync_now(self) -> None:
        """One fsync (and of the directory, the first time)."""
        os.fsync(self._fd)
        if not self._dir_synced:
            fsync_dir(self.path.parent)
            self._dir_synced = True

    def hold(self) -> None:
        """Keep the pack open while this thread syncs it outside its turn."""
        with self._idle:
            self._holders += 1

    def let_go(self) -> None:
        with self._idle:
            self._holders -= 1
            self._idle.notify_all()

    def release(self) -> None:
        """Let go of the pack (and its flock), once no thread is syncing it."""
        with self._idle:
            self._idle.wait_for(lambda: self._holders == 0)
        self.drop_live_index()
        forks.untrack(self)
        os.close(self._fd)
        self._fd = -1

    def abandon(self) -> None:
        """Remove a pack that will never be sealed (an error while writing it)."""
        self.drop_live_index()
        with suppress(FileNotFoundError):
            os.unlink(self.path)
        forks.untrack(self)
        with suppress(OSError):
            os.close(self._fd)
        self._fd = -1

    def forget_in_child(self) -> None:
        """In a child of a fork: close this copy of the pack and of its live index,
        unlocking, writing and removing nothing: the parent goes on writing them."""
        fds = (self._fd, self._live_fd)
        self._fd, self._live_fd = -1, -2
        for fd in fds:
            if fd >= 0:
                with suppress(OSError):
                    os.close(fd)


class BlockPackWriter(PackWriter):
    """Writes a sealed pack of version 2 (FORMAT.md 5.5): objects compressed together in
    blocks of about BLOCK_BYTES, so that what repeats across messages (a file read
    again, a standing prompt) is stored about once. Used when a handle seals its
    pack and when packs are merged; nothing in it is durable before ``seal``.

    A merge writes every object of a store, so what the writer remembers of each is
    kept small (about 60 bytes, where a dict of tuples took about 250): its index
    entry as packed bytes, in one bytearray per first byte of the id (the fanout's
    buckets, each sorted alone at ``seal``), and the first 4 bytes of its id in an
    ``IdSet``, which tells at once that an id was not written; only when it says
    "perhaps" (for an id not written, about one time in 2,500 in a pack of a million
    objects) is the id looked for in its bucket. The ``IdSet`` is made by the first
    such question: a seal, which knows its objects are new, never asks one. A writer
    told to expect at most SMALL_WRITE objects (a merge beside appends, or of a
    handle's packs at close) keeps their whole raw ids in a Python ``set`` instead:
    about 250 bytes an object at its peak, 13 MB at most, where an answer costs a
    third of the ``IdSet``'s Python, and a merge asks one for every object it copies."""

    def __init__(
        self, pack_dir: Path, tmp_dir: Path, expected: int = 0, *, hidden: bool = False
    ) -> None:
        super().__init__(pack_dir, tmp_dir, BLOCK_PACK_MAGIC, hidden=hidden)
        self._buckets = [bytearray() for _ in range(256)]
        self._expected = expected
        self._prefixes: IdSet | set[bytes] | None = None  # made when first needed (``_written``)
        # One block being filled per group (``block_group``), each written when full.
        self._pending: list[dict[str, bytes]] = [{} for _ in range(BLOCK_GROUPS)]
        self._pending_bytes = [0] * BLOCK_GROUPS
        self._exact: set[str] = set()  # pending ids known exact (``add_content``)

    def __contains__(self, oid: str) -> bool:
        """Whether ``oid`` was added (written, or waiting for its block)."""
        return any(oid in pending for pending in self._pending) or self._written(bytes.fromhex(oid))

    def holds_any(self, oids: list[str]) -> bool:
        """Whether any of ``oids`` was added (``in``, for many ids at once)."""
        if any(not pending.keys().isdisjoint(oids) for pending in self._pending):
            return True
        prefixes = self._prefixes
        if type(prefixes) is set:
            return not prefixes.isdisjoint(map(bytes.fromhex, oids))
        return any(self._written(bytes.fromhex(oid)) for oid in oids)

    def _written(self, raw: bytes) -> bool:
        prefixes = self._prefixes
        if prefixes is None:
            prefixes = self._prefixes = self._prefixes_of_written()
        if raw not in prefixes:
            return False
        if type(prefixes) is set:
            return True  # whole ids
        bucket, step = self._buckets[raw[0]], BLOCK_IDX_ENTRY.size
        at = bucket.find(raw)
        while at >= 0 and at % step:  # a match across two entries
            at = bucket.find(raw, at + 1)
        return at >= 0

    def _prefixes_of_written(self) -> IdSet | set[bytes]:
        """The ``IdSet`` of the ids of the index entries made so far (their set, for a
        small writer)."""
        step = BLOCK_IDX_ENTRY.size
        if 0 < self._expected <= SMALL_WRITE:
            return {bytes(b[at : at + 32]) for b in self._buckets for at in range(0, len(b), step)}
        prefixes = IdSet(max(self._expected, sum(map(len, self._buckets)) // step), key_bytes=4)
        for bucket in self._buckets:
            for at in range(0, len(bucket), step):
                prefixes.add(bytes(bucket[at : at + 4]))
        return prefixes

    def _entry(self, raw: bytes, at: int, inner: int, length: int) -> None:
        self._buckets[raw[0]] += BLOCK_IDX_ENTRY.pack(raw, at, inner, length)
        if self._prefixes is not None:
            self._prefixes.add(raw)

    def add_content(
        self, oid: str, content: bytes, *, new: bool = False, exact: bool = False
    ) -> None:
        """Add an object by its ``kind + NUL + body`` (verified by the caller); ``new``:
        the caller knows it was not added yet (one pack's objects, at its seal);
        ``exact``: a JSON body orjson wrote (``block_payload``)."""
        if not new and oid in self:
            return
        self.add_new(((oid, content, exact),))

    def add_new(self, contents: Iterable[tuple[str, bytes, bool]]) -> None:
        """``add_content(oid, content, new=True, exact=exact)`` of each ``(oid, content,
        exact)``, in one loop: a seal's objects."""
        pending, pending_bytes, known_exact = self._pending, self._pending_bytes, self._exact
        for oid, content, exact in contents:
            if exact:
                known_exact.add(oid)
            _put_in_block(pending, pending_bytes, oid, content, self._flush_group)

    def write_sealed(self, contents: Iterable[tuple[str, bytes, bool]]) -> Path:
        """``add_new(contents)``, then ``seal``; the pack's path. On any error the pack is
        abandoned (a seal's block pack, in the handle or its helper)."""
        try:
            self.add_new(contents)
            self.seal()
        except BaseException:
            self.abandon()
            raise
        return self.path

    def add(self, records: Iterable[tuple[str, bytes]]) -> None:
        """Add objects by their stored form as plain records (a damaged copy kept as it is)."""
        for oid, stored in records:
            if oid not in self:
                at = self.size + RECORD_HEAD.size
                raw = bytes.fromhex(oid)
                self._write([(TYPE_OBJECT, raw, stored)])
                self._entry(raw, at, NOT_IN_A_BLOCK, len(stored))

    def add_block_record(self, record: bytes, members: list[tuple[str, int, int]]) -> None:
        """Copy a block record as it is (one that cannot be read: kept for fsck), with
        the (id, offset, length) its old index gave its objects."""
        self._flush()
        at = self._write_as_is(record)
        for oid, inner, size in members:
            if oid not in self:
                self._entry(bytes.fromhex(oid), at, inner, size)

    def copy_block(self, record: bytes, members: list[tuple[str, int, int]], group: int) -> None:
        """Copy a verified block record as it is, claim included, with its objects'
        (id, offset, length), none of which this pack holds (a merge, FORMAT.md 5.4).
        The objects of its ``group`` (``block_group``) waiting for a block are written
        first, in a block of their own: blocks keep their objects' order (a context
        read takes a block that holds its next messages whole)."""
        self._flush_group(group)
        at = self._write_as_is(record)
        for oid, inner, size in members:
            self._entry(bytes.fromhex(oid), at, inner, size)

    def _write_as_is(self, record: bytes) -> int:
        """Write a block record (header and payload) as it is; where its payload starts."""
        _type, checksum, _length = RECORD_HEAD.unpack_from(record)
        at = self.size + RECORD_HEAD.size
        self._write([(TYPE_BLOCK, checksum, record[RECORD_HEAD.size :])])
        return at

    def _flush(self) -> None:
        for group in range(BLOCK_GROUPS):
            self._flush_group(group)

    def _flush_group(self, group: int) -> None:
        pending = self._pending[group]
        if not pending:
            return
        content, payload = block_payload(pending, self._exact)
        self._exact.difference_update(pending)
        at = self.size + RECORD_HEAD.size
        self._write([(TYPE_BLOCK, blake3.blake3(payload).digest(), payload)])
        self._pending[group], self._pending_bytes[group] = {}, 0
        self._index_block(at, content)

    def _index_block(self, at: int, content: bytes) -> None:
        """The index entries of the objects of the block whose payload is at ``at``, made
        from its content's raw ids in one loop (the seal's index is made here)."""
        entries: Iterable[tuple[bytes, int, int]]
        if is_array_block(content):
            table = array_table(content)
            ids, kind_bytes = table.ids, len(table.kind)
            raws = (ids[i : i + 32] for i in range(0, len(ids), 32))
            lengths = [kind_bytes + n for n in table.lengths]
            entries = zip(raws, table.starts(), lengths, strict=True)
        else:
            entries = ((bytes.fromhex(oid), inner, n) for oid, inner, n in iter_block(content))
        buckets, pack, prefixes = self._buckets, BLOCK_IDX_ENTRY.pack, self._prefixes
        for raw, inner, length in entries:
            buckets[raw[0]] += pack(raw, at, inner, length)
            if prefixes is not None:
                prefixes.add(raw)

    def seal(self) -> None:
        self._flush()
        self.sync()
        if self.path != self.final:  # hidden: whole and durable, now it appears
            os.rename(self.path, self.final)
            self.path = self.final  # the index's rename below syncs the directory
        chunks = sorted_index_chunks(self._buckets, self.size, version=2)
        atomic_write(self._tmp_dir, self.path.with_suffix(".idx"), _joined(chunks))
        self.release()


def _joined(chunks: Iterable[bytes | bytearray]) -> Iterator[bytes]:
    """``chunks`` joined into pieces of about INDEX_PIECE bytes: an index's 258 chunks
    (its head, a bucket per first byte, its checksum) were 258 writes, each letting go
    of the interpreter lock and waiting to take it back from the appending threads."""
    piece: list[bytes | bytearray] = []
    held = 0
    for chunk in chunks:
        piece.append(chunk)
        held += len(chunk)
        if held >= INDEX_PIECE:
            yield b"".join(piece)
            piece, held = [], 0
    if piece:
        yield b"".join(piece)


INDEX_PIECE: Final = 1 << 20  # bytes of an index written at once (memory: a merge's is big)


BLOCK_BYTES: Final = 128 * 1024
"""Uncompressed bytes of objects per block: big enough to hold what repeats across
nearby messages (on generated agent transcripts about 3x smaller than compressing
each message alone), small enough that reading one object costs a fraction of a
millisecond. 256 and 512 KiB made the bench's session 6% and 10% smaller and its
3,000-message resume 10% and 15% faster, but its compacted contexts 10-30% slower
to read: they repeat messages first written long before, each a whole old block
to decode (README, "Where ags misses")."""
BLOCK_GROUPS: Final = 4
_CHAIN_NODE: Final = 0
_OTHER_NODE: Final = 1
_BLOB: Final = 2
_FILE: Final = 3


def block_group(content: bytes) -> int:
    """Which blocks an object (``kind + NUL + body``) is put in (FORMAT.md 5.5): nodes
    that carry a span and compactions, what a context read walks, apart from other
    nodes, and both apart from blobs (messages, states) and files, so that reading a
    context decodes few bytes it does not use, and the blocks of JSON objects can
    claim to need no walk. A placement only: readers find an object by the index
    wherever it is, so a meta text that fools the test below (canonical keys are
    sorted: ``span`` comes after ``meta``) costs nothing but speed."""
    if not content.startswith(b"node\0"):
        return _FILE if content.startswith(b"file\0") else _BLOB
    if content.startswith(b'node\0{"kept":') or content.rfind(b',"span":{"after":') > 0:
        return _CHAIN_NODE
    return _OTHER_NODE


def _put_in_block(
    pending: list[dict[str, bytes]],
    pending_bytes: list[int],
    oid: str,
    content: bytes,
    flush: Callable[[int], None],
) -> None:
    """Put an object in its group's block being filled (FORMAT.md 5.5), writing that
    block (``flush``, which empties its entry of both lists) once it passes
    BLOCK_BYTES, and before an object within reach of the size limit, which gets a
    block of its own (ALONE_ABOVE), as is one over LARGE_CONTENT (``block_payload``
    writes that block plainly). The one fill rule of seals, merges and pushes."""
    group = block_group(content)
    if len(content) > min(ALONE_ABOVE, LARGE_CONTENT) and pending[group]:
        flush(group)
    pending[group][oid] = content  # a new dict after each flush of the group
    pending_bytes[group] += len(content)
    if pending_bytes[group] >= BLOCK_BYTES:
        flush(group)


_JSON_KINDS: Final = frozenset({b"blob\0", b"node\0"})
LARGE_CONTENT: Final = 1 << 20
"""An object whose content is bigger (a tool's output of megabytes) is written in a
block of its own, in the entry layout and with no claim (FORMAT.md 5.5): a claim is
checked by parsing the body, and the MessagePack layout writes it again and encodes
its value, about five copies of it in memory at once (a 75 MB message took the seal
past 450 MB), for a block its reader then parses in either layout."""


def block_payload(
    objects_in: dict[str, bytes], known_exact: Iterable[str] = ()
) -> tuple[bytes, bytes]:
    """The content of a block of ``objects_in`` (id -> ``kind + NUL + body``, verified
    by the caller) and its record's payload: the zstd frame, then its claim (5.5),
    WITHIN_LIMITS if every object is a blob or a node that orjson reads exactly
    (``known_exact``: ids of blobs and nodes whose JSON orjson wrote, and nested no
    deeper than the limit, so not parsed again). Such a block of blobs is written in
    the MessagePack layout if each body is the canonical JSON of its value (those
    known exact are: orjson wrote them), else, as such a block of nodes, in the array
    layout; any other in the entry layout."""
    if any(len(piece) > LARGE_CONTENT for piece in objects_in.values()):
        content = encode_block(objects_in.items())
        return content, encode_claim(_block_compressor().compress(content), 0)
    kinds = {piece[:5] for piece in objects_in.values()}
    # Set operations, not a test per object: a seal's objects are nearly all known exact.
    unknown = objects_in.keys() - known_exact
    exact = kinds <= _JSON_KINDS and all(read_exactly(objects_in[oid][5:]) for oid in unknown)
    if exact and len(kinds) == 1:
        oids, bodies = list(objects_in), [piece[5:] for piece in objects_in.values()]
        kind = kinds.pop()[:4]
        values = None
        if kind == b"blob":
            values = packed_values(bodies, [oid not in unknown for oid in oids])
        # No bigger than the array layout (floats grow: 0.5 takes 9 bytes), so within
        # the bound a reader holds a block's content to.
        if values is not None and packed_size(values) <= array_size(bodies):
            content = encode_packed_block(oids, bodies, values)
        else:
            content = encode_array_block(kind, zip(oids, bodies, strict=True))
    else:
        content = encode_block(objects_in.items())
    return content, encode_claim(_block_compressor().compress(content), WITHIN_LIMITS * exact)


BLOCK_CACHE: Final = 16  # decompressed blocks a pack reader keeps
RELEASE_EVERY: Final = 16 << 20  # bytes of a pack or index fsck reads between letting go of them
_SUM: Final = 1 << 64
_ENTRY_BYTES: Final = {e.size: struct.Struct(f"{e.size}s") for e in (IDX_ENTRY, BLOCK_IDX_ENTRY)}
_ENTRIES_BETWEEN_RELEASES: Final = 1 << 16
_BLOCKS_BETWEEN_RELEASES: Final = 512
WRITTEN_BLOCK_CONTENT: Final = BLOCK_BYTES + objects.MAX_CONTENT_BYTES + 64
"""The most content ags writes in a block (FORMAT.md 5.5): objects up to BLOCK_BYTES,
then the one that passes it, and their heads: the bound older readers of store
version 5 hold a block to, so what ags writes reads there too."""
_SMALLEST_CONTENT: Final = len("blob") + 1  # kind + NUL, and an empty body (a file)
_MOST_HEADS: Final = BLOCK_ENTRY_HEAD.size * (BLOCK_BYTES // _SMALLEST_CONTENT + 1) + 64
"""The heads of a block of the smallest objects up to BLOCK_BYTES and one more, in the
larger of the two layouts (36 bytes an object in the entry layout; 32, and 42 in all,
in the array layout), with room to spare: under 1 MiB."""
ALONE_ABOVE: Final = WRITTEN_BLOCK_CONTENT - BLOCK_BYTES - _MOST_HEADS
"""An object whose content is bigger (within 1 MiB of the size limit) is written in a
block of its own: after the objects before it and their heads, it could take the
block past WRITTEN_BLOCK_CONTENT."""
MAX_BLOCK_CONTENT: Final = WRITTEN_BLOCK_CONTENT + _MOST_HEADS
"""The most content a reader decompresses in a block, never more: WRITTEN_BLOCK_CONTENT,
and the heads that older writers left out of that bound when they put a near-limit
object after a block's worth of others (such a block then read nowhere, and its
objects as corrupt), so those blocks read too."""


def encode_block_pack(contents: Iterable[tuple[str, bytes]]) -> tuple[bytes, bytes]:
    """A whole block pack (5.5) and its index (5.3, version 2), in memory, of the
    objects ``contents`` gives by ``(id, kind + NUL + body)`` (verified by the caller):
    what a push sends. The bytes are those a ``BlockPackWriter`` would write."""
    parts: list[bytes] = [BLOCK_PACK_MAGIC]
    size = len(BLOCK_PACK_MAGIC)
    entries: dict[str, tuple[int, int, int]] = {}
    pending: list[dict[str, bytes]] = [{} for _ in range(BLOCK_GROUPS)]
    pending_bytes = [0] * BLOCK_GROUPS

    def flush(group: int) -> None:
        nonlocal size
        content, payload = block_payload(pending[group])
        at = size + RECORD_HEAD.size
        parts.append(encode_record(TYPE_BLOCK, blake3.blake3(payload).digest(), payload))
        size += RECORD_HEAD.size + len(payload)
        for oid, inner, length in iter_block(content):
            entries[oid] = (at, inner, length)
        pending[group], pending_bytes[group] = {}, 0

    for oid, content in contents:
        if oid in entries or any(oid in waiting for waiting in pending):
            continue
        _put_in_block(pending, pending_bytes, oid, content, flush)
    for group in range(BLOCK_GROUPS):
        if pending[group]:
            flush(group)
    return b"".join(parts), encode_index(entries.items(), size, version=2)


def verified_block(frame: bytes | memoryview) -> list[tuple[str, int, int]]:
    """``(id, offset, length)`` of each object of a block payload from elsewhere (a pack
    received whole, or blocks read by range), every object checked against its id,
    and against the block's claim if it makes one (5.5: the records are kept as they
    are, so a context read here will believe it); ValueError or CorruptObject for a
    payload that is not what it claims."""
    content = decompress_block(frame)
    pieces = block_pieces(content)
    if is_array_block(content) and not array_separators(content, array_table(content)):
        raise ValueError("its array is not where its table says")
    exact = block_claim(frame) & WITHIN_LIMITS
    members = [(oid, inner, n) for oid, inner, n, _ in pieces]
    for oid, _, _, piece in pieces:
        kind, body = objects.verified(oid, piece)
        if exact and (kind not in ("blob", "node") or not read_exactly(body)):
            raise ValueError(
                f"it claims that each of its objects reads exactly, but {oid} does not"
            )
    return members


def verified_block_pack(
    pack: bytes, index: bytes, name: str
) -> list[tuple[bytes, list[tuple[str, int, int]]]]:
    """Check a block pack that arrived whole with its index, as a fetch receives it:
    every record whole and verified (a block by its checksum, each object in it by its
    id), nothing after the last record, and the index exactly the one its records
    give. Returns each block's record and its objects' (id, offset, length);
    DamagedPack naming ``name`` otherwise. Plain object records are refused: ags
    writes none into a pack it sends."""
    if pack[: len(BLOCK_PACK_MAGIC)] != BLOCK_PACK_MAGIC:
        raise DamagedPack(f"{name} is not a block pack")
    start = len(BLOCK_PACK_MAGIC)
    blocks: list[tuple[bytes, list[tuple[str, int, int]]]] = []
    entries: dict[str, tuple[int, int, int]] = {}
    end = start
    for record in iter_records(memoryview(pack)[start:], start, (TYPE_OBJECT, TYPE_BLOCK)):
        off, length = record.location
        frame = pack[off : off + length]
        if record.type != TYPE_BLOCK or blake3.blake3(frame).digest() != record.raw_id:
            raise DamagedPack(f"{name} has a damaged record at byte {off - RECORD_HEAD.size}")
        try:
            members = verified_block(frame)
        except (ValueError, CorruptObject) as e:
            raise DamagedPack(f"{name} has a damaged block at byte {off}: {e}") from None
        for oid, inner, n in members:
            entries.setdefault(oid, (off, inner, n))
        blocks.append((pack[off - RECORD_HEAD.size : off + length], members))
        end = off + length
    if end != len(pack):
        raise DamagedPack(f"{name} is cut short or has bytes after its last record")
    if encode_index(entries.items(), end, version=2) != index:
        raise DamagedPack(f"{name}: its index does not match its records")
    return blocks


def _block_compressor() -> zstandard.ZstdCompressor:
    """No content checksum (FORMAT.md 5.5): the record's id, a BLAKE3 of the whole
    payload, covers the frame, and every object read alone is hashed against its id;
    a decoder that checks a content checksum spends a sixth of its time on it (1.29
    ms for the bench's 3,000-message context, 1.52 with it)."""
    return objects.thread_compressor(
        "block", level=objects.ZSTD_LEVEL, write_checksum=False, write_content_size=True
    )


def decompress_block(frame: bytes | memoryview) -> bytes:
    """A block's content; ValueError if the frame is damaged (its zstd checksum, or a
    size beyond what a block may hold)."""
    try:
        size = zstandard.frame_content_size(frame)
        if not 0 <= size <= MAX_BLOCK_CONTENT:
            raise ValueError(f"a block frame claims {size} bytes")
        return objects.thread_decompressor().decompress(frame)
    except zstandard.ZstdError as e:
        raise ValueError(f"zstd: {e}") from None


# An object as fsck reads it: its id and (kind, body), or what is wrong with it.
Checked = tuple[str, "tuple[str, bytes] | ObjectError"]


def _check_header(path: Path, head: bytes) -> None:
    """Refuse a pack whose header is not version 1's or 2's (a shorter one is a pack
    that lost its header: recovery decides about it)."""
    if head not in (PACK_MAGIC, BLOCK_PACK_MAGIC) and len(head) == len(PACK_MAGIC):
        raise DamagedPack(f"pack {path.name} has an unknown format or version")


def _open_pack(path: Path) -> int:
    """Open a pack for reading, refusing a version this code does not know."""
    fd = open_fd(path, os.O_RDONLY)
    try:
        _check_header(path, os.pread(fd, len(PACK_MAGIC), 0))
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_index(pack_path: Path, tmp_dir: Path, index: dict[str, Location], size: int) -> None:
    atomic_write(tmp_dir, pack_path.with_suffix(".idx"), encode_index(index.items(), size))


class SealedPack:
    """A pack with an index, both mapped into memory. A lookup reads the fanout
    to find the few entries that share the id's first byte and searches them
    with one ``find``. The mappings stay valid after a repack deletes the
    files, so a reader never loses an object it has found."""

    def __init__(self, pack_path: Path) -> None:
        self.path = pack_path
        self._blocks: OrderedDict[int, bytes] = OrderedDict()  # payload offset -> content
        # payload offset -> the table of a block in the MessagePack layout, and where its
        # values start, for the blocks in _blocks (a value is found through them)
        self._tables: dict[int, tuple[ArrayTable, list[int]]] = {}
        idx_path = pack_path.with_suffix(".idx")
        fd = _open_pack(pack_path)  # first: a pack whose index exists may have been repacked
        try:
            st = os.fstat(fd)
            if st.st_size < len(PACK_MAGIC):
                raise DamagedPack(f"pack {pack_path.name} is truncated")
            self._data = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            self.size = len(self._data)
            pack_mtime = st.st_mtime
        finally:
            os.close(fd)
        try:
            fd = open_fd(idx_path, os.O_RDONLY)
        except BaseException:
            self._data.close()
            raise
        try:
            st = os.fstat(fd)
            # When its objects last became reachable from new writes: a pack is never
            # changed after sealing, and a recovered pack is sealed when recovered.
            self.sealed_at = max(pack_mtime, st.st_mtime)
            if st.st_size < ENTRIES_AT + CHECKSUM_BYTES:
                self._data.close()
                raise DamagedIndex(f"pack index {idx_path.name} is truncated")
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            head = parse_index(self._map, f"pack index {idx_path.name}")
        except DamagedIndex:
            self.close()
            raise
        self.pack_size, self.count, self._fanout, self.version = head
        self._entry = IDX_ENTRY if self.version == 1 else BLOCK_IDX_ENTRY

    def _entry_range(self, first_byte: int) -> tuple[int, int]:
        """Byte offsets in the index of the entries whose id starts with ``first_byte``."""
        lo, hi = self._fanout[first_byte], self._fanout[first_byte + 1]
        return ENTRIES_AT + lo * self._entry.size, ENTRIES_AT + hi * self._entry.size

    def _entries(self) -> Iterator[tuple[Any, ...]]:
        """Every index entry, unpacked: (raw id, payload offset, length) in version 1,
        (raw id, record payload offset, offset in the block, length) in version 2."""
        step = self._entry.size
        for at in range(ENTRIES_AT, ENTRIES_AT + self.count * step, step):
            yield self._entry.unpack_from(self._map, at)

    def find(self, oid: str) -> tuple[int, ...] | None:
        """Where the object is: the rest of its index entry (see ``_entries``)."""
        raw = bytes.fromhex(oid)
        start, end = self._entry_range(raw[0])
        mapped, step = self._map, self._entry.size
        at = mapped.find(raw, start, end)
        while at >= 0 and (at - ENTRIES_AT) % step:  # a match across two entries
            at = mapped.find(raw, at + 1, end)
        if at < 0:
            return None
        return tuple(self._entry.unpack_from(mapped, at)[1:])

    def get(self, oid: str) -> tuple[str, bytes] | None:
        """``(kind, body)`` of an object, verified; None if the pack lacks it."""
        loc = self.find(oid)
        if loc is None:
            return None
        if self.version == 1:
            return objects.decode(oid, self._data[loc[0] : loc[0] + loc[1]])
        off, inner, length = loc
        if inner == NOT_IN_A_BLOCK:
            return objects.decode(oid, self._data[off : off + length])
        try:
            piece = self._piece(off, inner, length)
        except ValueError as e:
            raise CorruptObject(oid, f"its block at offset {off} cannot be read ({e})") from None
        return objects.verified(oid, piece)

    def in_block(self, oid: str) -> tuple[int, int, int] | None:
        """Where the object sits in a block: (payload offset of the block's record, offset
        of its ``kind + NUL + body`` in the block's content, length); None if this pack
        holds it in no block."""
        loc = self.find(oid)
        if loc is None or self.version == 1 or loc[1] == NOT_IN_A_BLOCK:
            return None
        return loc[0], loc[1], loc[2]

    def checked_block(self, off: int) -> tuple[bytes, int] | None:
        """The content of the block whose record payload starts at ``off`` and the flags
        it claims (5.5), if its payload matches the record's checksum (the BLAKE3 of
        the payload, 5.1) and decompresses; None otherwise (then ``get`` reads and
        verifies each object alone).

        Every writer of a block verified each object in it against its id (5.5), so
        an object of a block that matches its checksum needs no hash of its own."""
        try:
            _type, checksum, _length = RECORD_HEAD.unpack_from(self._data, off - RECORD_HEAD.size)
            with self._frame(off) as frame:
                if blake3.blake3(frame).digest() != checksum:
                    return None
                return decompress_block(frame), block_claim(frame)
        except (ValueError, struct.error):
            return None

    def content_length(self, oid: str) -> int | None:
        """The length of ``kind + NUL + body`` if the index says it (version 2)."""
        loc = self.find(oid)
        if loc is None or self.version == 1 or loc[1] == NOT_IN_A_BLOCK:
            return None
        return int(loc[2])

    def _frame(self, off: int) -> memoryview:
        """The payload of the record whose payload starts at ``off``; ValueError if the
        record is not all in the pack (a damaged index, or a pack cut short)."""
        if not RECORD_HEAD.size <= off <= self.size:
            raise ValueError(f"a record at offset {off}, outside the pack of {self.size} bytes")
        (length,) = struct.unpack_from("<I", self._data, off - 4)
        if off + length > self.size:
            raise ValueError("the block runs past the end of the pack")
        return memoryview(self._data)[off : off + length]

    def _piece(self, off: int, inner: int, length: int) -> bytes:
        """``block_piece`` of the block at ``off``, its table kept with the block if it is
        in the MessagePack layout (a table is read for each of its objects otherwise:
        a search indexing a store's messages one by one took 14% longer)."""
        content = self._block(off)
        if content[:32] != PACKED_MARK:
            return block_piece(content, inner, length)
        places = self._tables.get(off)
        if places is None:
            table = array_table(content)
            places = self._tables[off] = (table, table.starts())
        return block_piece(content, inner, length, places)

    def _block(self, off: int) -> bytes:
        """The content of the block whose record payload starts at ``off`` (cached)."""
        content = self._blocks.get(off)
        if content is None:
            with self._frame(off) as frame:
                content = decompress_block(frame)
            self._blocks[off] = content
            if len(self._blocks) > BLOCK_CACHE:
                self._tables.pop(self._blocks.popitem(last=False)[0], None)
        else:
            self._blocks.move_to_end(off)
        return content

    def with_prefix(self, prefix: str) -> Iterator[str]:
        start, end = self._entry_range(int(prefix[:2], 16))
        for at in range(start, end, self._entry.size):
            hexid = self._map[at : at + 32].hex()
            if hexid.startswith(prefix):
                yield hexid

    def ids(self) -> Iterator[str]:
        for entry in self._entries():
            yield entry[0].hex()

    def sizes(self) -> Iterator[tuple[str, int, int | None]]:
        """Every object, the bytes it takes in the pack (its stored form, or its share
        of its block's compressed frame), and the length of its ``kind + NUL + body``
        where the index says it (in a block), else None. Two passes over the index
        (the first sums each block's content): memory grows with the blocks, not
        the objects."""
        if self.version == 1:
            for raw, _off, length in self._entries():
                yield raw.hex(), length, None
            return
        # Each page fault maps the pages around it too (fault-around): the pages are
        # let go of often, or this walk would map the whole pack.
        content: dict[int, int] = {}
        for n, (_raw, off, inner, length) in enumerate(self._entries(), 1):
            if inner != NOT_IN_A_BLOCK:
                content[off] = content.get(off, 0) + length
            if n % _ENTRIES_BETWEEN_RELEASES == 0:
                self.release_pages()
        frames = {}
        for n, off in enumerate(content, 1):
            try:
                frames[off] = len(self._frame(off))
            except ValueError:  # not in the pack (fsck names it): nothing stored there
                frames[off] = 0
            if n % _BLOCKS_BETWEEN_RELEASES == 0:
                self.release_pages()
        for n, (raw, off, inner, length) in enumerate(self._entries(), 1):
            if inner == NOT_IN_A_BLOCK:
                yield raw.hex(), length, None
            else:
                yield raw.hex(), max(1, frames[off] * length // (content[off] or 1)), length
            if n % _ENTRIES_BETWEEN_RELEASES == 0:
                self.release_pages()
        self.release_pages()

    def release_pages(self) -> None:
        """Let go of every page of the pack and index this process has touched (they
        stay in the page cache): what walks a whole store calls now and then, so its
        memory does not grow to the size of the store."""
        self._release_pages(self.size)

    def plain_records(self) -> Iterator[tuple[str, bytes]]:
        """``(id, stored form)`` of every object kept as a record of its own."""
        for n, entry in enumerate(self._entries(), 1):
            if n % _ENTRIES_BETWEEN_RELEASES == 0:
                self.release_pages()
            if self.version == 1:
                raw, off, length = entry
            else:
                raw, off, inner, length = entry
                if inner != NOT_IN_A_BLOCK:
                    continue
            yield raw.hex(), self._data[off : off + length]

    def blocks(self) -> Iterator[tuple[bytes, bytes | None, list[tuple[str, int, int]]]]:
        """For each block (version 2): its record (header and frame, to copy as it is),
        its content (None if it cannot be read), and its objects' (id, offset, length):
        those the content lists, or for a block that cannot be read or whose entries
        are cut short, those the index puts in it.

        The blocks are read in pack order, found by walking the records, not grouped
        from the index (a merge reads every object of a store: grouping took about
        250 bytes an object). A block the walk cannot reach (records after damage)
        is found through the index afterwards."""
        if self.version == 1:
            return
        start, end = len(PACK_MAGIC), min(self.pack_size, self.size)
        found: set[int] = set()
        released = start
        view = memoryview(self._data)
        try:
            for rec in iter_records(view[start:end], start, (TYPE_OBJECT, TYPE_BLOCK)):
                if rec.type != TYPE_BLOCK:
                    continue
                off, length = rec.location
                found.add(off)
                block = bytes(view[off - RECORD_HEAD.size : off + length])
                content: bytes | None
                try:
                    content = decompress_block(block[RECORD_HEAD.size :])
                except ValueError:
                    content, members = None, self._members(off)
                else:
                    try:
                        members = block_entries(content)
                    except ValueError:  # entries cut short: each object is tried alone
                        members = self._members(off)
                if off + length - released > RELEASE_EVERY // 4:  # a merge holds much else
                    released = self._release_pages(off - RECORD_HEAD.size)
                yield block, content, members
        finally:
            view.release()
        missed: dict[int, list[tuple[str, int, int]]] = {}
        for n, (raw, off, inner, length) in enumerate(self._entries(), 1):
            if inner != NOT_IN_A_BLOCK and off not in found:
                missed.setdefault(off, []).append((raw.hex(), inner, length))
            if n % _ENTRIES_BETWEEN_RELEASES == 0:
                self.release_pages()  # the index of a big pack is tens of megabytes
        for off in sorted(missed):
            try:
                frame = self._frame(off)
                record = bytes(self._data[off - RECORD_HEAD.size : off + len(frame)])
                content = decompress_block(frame)
            except ValueError:
                content, record = None, b""
            yield record, content, missed[off]
        self.release_pages()

    def _members(self, off: int) -> list[tuple[str, int, int]]:
        """(id, offset, length) of the objects the index puts in the block at ``off``."""
        return [
            (raw.hex(), inner, length)
            for raw, at, inner, length in self._entries()
            if at == off and inner != NOT_IN_A_BLOCK
        ]

    def index_problems(self) -> list[str]:
        """What is wrong with the index as a whole (its checksum, the pack size it
        covers); [] when it is sound. Each entry is checked by ``index_part``."""
        problems = []
        end = ENTRIES_AT + self.count * self._entry.size
        hashed = blake3.blake3()
        with memoryview(self._map) as view:
            for at in range(0, end, RELEASE_EVERY):  # a big index is let go of as it goes
                hashed.update(view[at : min(at + RELEASE_EVERY, end)])
                self._map.madvise(mmap.MADV_DONTNEED)
        if hashed.digest() != self._map[end : end + 32]:
            problems.append("index checksum does not match")
        if self.pack_size > self.size:  # less is a torn tail left by a crash (5.2)
            problems.append(f"index covers {self.pack_size} bytes, pack has {self.size}")
        return problems

    def index_part(self, first: int, stop: int) -> tuple[int, str | None]:
        """Index entries ``first`` to ``stop`` (their numbers): the sum of their
        placements (``placement``), and the first of them out of order (after the
        entry before it) or pointing past the end of the pack, if any. fsck splits a
        big index into parts that run side by side; each is checked in C, and walked
        entry by entry only to name what is wrong."""
        step, size = self._entry.size, self.size
        at, end = ENTRIES_AT + first * step, ENTRIES_AT + stop * step
        previous = self._map[at - step : at - step + 32] if first else b""
        with memoryview(self._map) as view:
            chunk = view[at:end]
            total = sum(map(hash, map(itemgetter(0), _ENTRY_BYTES[step].iter_unpack(chunk))))
            entries = list(self._entry.iter_unpack(chunk))
            chunk.release()
        ids = list(map(itemgetter(0), entries))
        offsets = list(map(itemgetter(1), entries))
        lengths = list(map(itemgetter(-1), entries))
        plain = self.version == 1 or NOT_IN_A_BLOCK in map(itemgetter(2), entries)
        if (
            (not ids or previous < ids[0])
            and all(map(operator.lt, ids, ids[1:]))
            and (not offsets or max(offsets) <= size)
            and (not plain or not offsets or max(map(operator.add, offsets, lengths)) <= size)
        ):
            self._map.madvise(mmap.MADV_DONTNEED)
            return total % _SUM, None
        problem = None
        for entry in entries:
            raw, off, length = entry[0], entry[1], entry[-1]
            if raw <= previous:
                problem = f"index entries out of order at {raw.hex()}"
                break
            in_block = self.version == 2 and entry[2] != NOT_IN_A_BLOCK
            if off > size or (not in_block and off + length > size):
                problem = f"index entry {raw.hex()} points past the end of the pack"
                break
            previous = raw
        self._map.madvise(mmap.MADV_DONTNEED)
        return total % _SUM, problem

    def placement(self) -> Callable[..., bytes]:
        """What a record's object adds to the placement sum (``index_part``, ``settle``):
        ``hash(placement()(raw id, *where))``, ``where`` being the rest of its index
        entry. The exact bytes of the entry, hashed (SipHash, keyed per process, so
        the sums must be made in one process or its forks): a sum of tuple hashes
        is nearly linear in small ints, and two entries that swapped places kept it."""
        return self._entry.pack

    def records(self, problems: list[str]) -> Iterator[tuple[int, bytes, int, int]]:
        """``(type, raw id, payload offset, length)`` of every readable record, in pack
        order; where the readable records end before the pack does goes to
        ``problems``. The pages read are let go of as it goes."""
        end = min(self.pack_size, self.size)
        start = len(PACK_MAGIC)
        readable_end = released = start
        with memoryview(self._data) as view:
            for record in iter_records(view[start:end], start, self.record_types()):
                off, length = record.location
                if off + length - released > RELEASE_EVERY:
                    released = self._release_pages(off - RECORD_HEAD.size)
                readable_end = off + length
                yield record.type, record.raw_id, off, length
        self._release_pages(end)
        if readable_end < end:
            problems.append(f"records cannot be read from offset {readable_end} on (of {end})")

    @property
    def index_size(self) -> int:
        return len(self._map)

    def record_types(self) -> tuple[int, int]:
        return (TYPE_OBJECT, TYPE_REF) if self.version == 1 else (TYPE_OBJECT, TYPE_BLOCK)

    def payload(self, off: int, length: int) -> bytes:
        return self._data[off : off + length]

    def release(self, start: int, end: int) -> None:
        """Let go of the pages of the pack between ``start`` and ``end`` that this
        process read (they stay in the page cache)."""
        start -= start % mmap.PAGESIZE
        if end > start:
            self._data.madvise(mmap.MADV_DONTNEED, start, min(end, self.size) - start)

    def settle(self, found: int, placements: int, index_sum: int) -> Iterator[Checked | str]:
        """After every record was read (``found`` objects, whose placements summed to
        ``placements``) and every index entry summed (``index_sum``): nothing if the
        index says where each object is; else how many objects it lacks (a str),
        and every object read through the index, the way other readers read it."""
        if found == self.count and placements % _SUM == index_sum % _SUM:
            return
        start, end = len(PACK_MAGIC), min(self.pack_size, self.size)
        unindexed = sum(
            self.find(oid) is None for oid in self._record_ids(start, end, self.record_types())
        )
        if unindexed:
            yield f"the index lacks {unindexed} object(s) of the pack"
        yield from self._misplaced()

    def _record_ids(self, start: int, end: int, types: tuple[int, ...]) -> Iterator[str]:
        """The id of every object in the records (a block that cannot be read: none)."""
        with memoryview(self._data) as view:
            for record in iter_records(view[start:end], start, types):
                off, length = record.location
                if record.type == TYPE_OBJECT:
                    yield record.raw_id.hex()
                elif record.type == TYPE_BLOCK:
                    with suppress(ValueError):
                        content = decompress_block(self._data[off : off + length])
                        yield from (oid for oid, _, _ in iter_block(content))

    def _release_pages(self, upto: int) -> int:
        """Let go of the pages of the pack before ``upto`` and of the whole index that a
        scan has touched: they stay in the page cache, but a scan of a pack of any
        size no longer holds them in this process's memory. Returns where it got to."""
        upto -= upto % mmap.PAGESIZE
        if upto > 0:
            self._data.madvise(mmap.MADV_DONTNEED, 0, upto)
        self._map.madvise(mmap.MADV_DONTNEED)
        return upto

    def ref_record_problems(self, checksum: bytes, off: int, length: int) -> list[str]:
        try:
            decode_ref_update(checksum, self._data[off : off + length])
        except CorruptObject as e:
            why = str(e).removeprefix(f"object {checksum.hex()} is corrupt: ")
            return [
                f"ref-update record at offset {off - RECORD_HEAD.size} is damaged "
                f"({why}); the pack is sealed, so no ref depends on it"
            ]
        return []

    def unreadable_block(
        self, off: int, why: str, read: set[str]
    ) -> Iterator[tuple[str, ObjectError]]:
        """A CorruptObject for each object the index puts in the block at ``off`` but
        not in ``read`` (those read from it before it broke)."""
        for entry in self._entries():
            oid = entry[0].hex()
            if entry[1] == off and entry[2] != NOT_IN_A_BLOCK and oid not in read:
                yield oid, CorruptObject(oid, f"its block at offset {off} cannot be read ({why})")

    def _misplaced(self) -> Iterator[Checked]:
        """Every object read through the index, the way other readers read it: for a
        pack whose records did not confirm every index entry (fsck reports an
        object twice rather than miss one)."""
        for entry in self._entries():
            oid = entry[0].hex()
            if entry[1] > self.size:  # named by index_part; no read may go there
                yield oid, CorruptObject(oid, "its index entry points past the end of the pack")
                continue
            try:
                found = self.get(oid)
            except ObjectError as e:
                yield oid, e
                continue
            if found is not None:
                yield oid, found

    def close(self) -> None:
        self._blocks.clear()
        self._tables.clear()
        self._data.close()
        self._map.close()


class OpenPack:
    """A pack without an index, seen by a reader: scanned, and rescanned as it grows.

    A scan notes where each record starts, nothing more (pack_format.Scan), and
    its bytes are kept: a reader beside a live writer reads most of the newest
    objects, each then a slice, not a pread. (At most about MAX_PACK_BYTES: a
    writer seals its pack past that.)"""

    def __init__(self, pack_path: Path) -> None:
        self.path = pack_path
        self._fd = open_fd(pack_path, os.O_RDONLY)  # its header is checked by refresh
        self._raw: dict[bytes, int] = {}  # binary id -> pack offset of its record
        self._hex: dict[str, Location] | None = None  # ``index``, made when first asked
        self._in_blocks: dict[str, tuple[int, int, int, int]] = {}
        self._scanned = len(PACK_MAGIC)
        self._low = len(PACK_MAGIC)  # what is below this and listed is not read yet
        # What each scan read: pack offsets ascending; no record spans two, as a scan
        # stops at a record's end.
        self._bases: list[int] = []
        self._chunks: list[bytes] = []
        # Ref updates in pack order (the offsets of their records), looked at only when
        # a ref is read (most opens read one or two), newest first: which ref each
        # names, once; a full decode only for the record a read takes.
        self._refs: list[int] = []
        self._names: dict[int, str | None] = {}  # record number -> the ref it names
        self._newest: dict[str, tuple[int, dict[str, Any]]] = {}  # verified, per ref
        self.refresh()

    def refresh(self) -> None:
        end = os.fstat(self._fd).st_size
        if end > self._scanned:
            head = os.pread(self._fd, len(PACK_MAGIC), 0)
            if head == BLOCK_PACK_MAGIC:
                self._scan_blocks(end)
                return
            if head != PACK_MAGIC:
                return  # no header: left by a crash (recovery decides), never a writer's
            if self._scanned > len(PACK_MAGIC) and os.pread(self._fd, 1, self._scanned) == b"\0":
                return  # the zeros its writer keeps ahead of its records (FORMAT.md 5.1)
            listed = self._scanned
            if listed == len(PACK_MAGIC):
                listed = self._low = self._take_live_index(end)
            # A first scan of the whole pack reads from its start, so the offsets it
            # notes are the pack's own: no record-by-record translation.
            base = 0 if listed == len(PACK_MAGIC) else listed
            # Not the zeros its writer keeps ahead (FORMAT.md 5.1), where that tells: up
            # to ZEROS_AHEAD before the end first, the rest only if records go on.
            stop = min(end, max(listed + READ_WINDOW, end - ZEROS_AHEAD))
            while True:
                data = os.pread(self._fd, stop - base, base)
                scan = scan_buffer(data, base, listed - base)
                after = data[scan.end - base : scan.end - base + 1]
                if stop == end or (after and after[0] not in (TYPE_OBJECT, TYPE_REF)):
                    break
                stop = end
            if scan.end == self._scanned:
                return
            if scan.end > base:
                self._bases.append(base)
                self._chunks.append(data if scan.end == end else data[: scan.end - base])
            if base == 0:
                self._raw.update(scan.raw_objects)
                self._refs += scan.ref_starts
            else:
                self._raw.update({raw: base + at for raw, at in scan.raw_objects.items()})
                self._refs += [base + at for at in scan.ref_starts]
            self._hex = None
            self._scanned = scan.end

    def _take_live_index(self, end: int) -> int:
        """Note the records the writer's live index lists (FORMAT.md 5.6) as a scan
        would, and return where they end: the scan goes on from there. Each entry is
        taken only if the pack bears it out (its last record has the type, id and
        length to end where the entry says); the first that does not ends what is
        taken. Reads no more of the pack than those records' heads."""
        try:
            fd = open_fd(self.path.with_suffix(".live"), os.O_RDONLY)
        except OSError:  # none (yet), or unreadable: a scan finds the same records
            return len(PACK_MAGIC)
        try:
            listed = os.pread(fd, os.fstat(fd).st_size, 0)
        except OSError:
            return len(PACK_MAGIC)
        finally:
            os.close(fd)
        taken = len(PACK_MAGIC)
        for stretch in live_index.parse(listed, taken, end):
            ids, starts, refs = stretch.object_ids, stretch.object_starts, stretch.ref_starts
            last_ref = refs[-1] if refs else -1
            last = max(starts[-1] if starts else -1, last_ref)
            head = os.pread(self._fd, RECORD_HEAD.size, last)
            if len(head) != RECORD_HEAD.size:
                break
            rtype, raw, length = RECORD_HEAD.unpack(head)
            if last + RECORD_HEAD.size + length != stretch.end or rtype != (
                TYPE_REF if last == last_ref else TYPE_OBJECT
            ):
                break
            if rtype == TYPE_OBJECT and raw != ids[-1]:
                break
            self._raw.update(zip(ids, starts, strict=True))
            self._refs += refs
            taken = stretch.end
        return taken

    def _chunk(self, off: int, length: int) -> tuple[bytes, int] | None:
        """The kept bytes holding ``[off, off + length)`` and where ``off`` is in them;
        the part of the pack the live index listed is read when first needed."""
        i = bisect.bisect_right(self._bases, off) - 1
        if i < 0 or off - self._bases[i] + length > len(self._chunks[i]):
            if not len(PACK_MAGIC) <= off < self._low:
                return None
            self._read_below(off)
            i = bisect.bisect_right(self._bases, off) - 1
        at = off - self._bases[i]
        chunk = self._chunks[i]
        return (chunk, at) if at + length <= len(chunk) else None

    def _read_below(self, off: int) -> None:
        """Read the pack from the window holding ``off`` up to what is read already.
        A context reads the newest objects, at the end of the pack: only they are read,
        a few windows in all, not one read per object."""
        low = max(len(PACK_MAGIC), off - off % READ_WINDOW)
        data = os.pread(self._fd, self._low - low, low)
        self._bases.insert(0, low)
        self._chunks.insert(0, data)
        self._low = low

    def _location(self, start: int) -> Location:
        """Where the payload is of the record starting at pack offset ``start``."""
        found = self._chunk(start, RECORD_HEAD.size)
        if found is None:
            return start + RECORD_HEAD.size, RECORD_HEAD.unpack(
                self.read((start, RECORD_HEAD.size))
            )[2]
        chunk, at = found
        return payload_location(chunk, at, start - at)

    def journaled(self, name: str) -> dict[str, Any] | None:
        """The newest update of ref ``name`` this pack journals (FORMAT.md 9), as far as
        it is scanned, or None. A record that does not verify is passed over: a torn
        tail (a writer that died mid-write), never something a writer acknowledged."""
        known = self._newest.get(name)
        for i in range(len(self._refs) - 1, -1 if known is None else known[0], -1):
            if self.journaled_name(i) != name:
                continue
            start = self._refs[i]
            checksum = RECORD_HEAD.unpack(self.read((start, RECORD_HEAD.size)))[1]
            with suppress(CorruptObject):
                update = decode_ref_update(checksum, self.read(self._location(start)))
                if update["ref"] == name:
                    self._newest[name] = (i, update)
                    return update
        return None if known is None else known[1]

    def journaled_names(self) -> set[str]:
        """The name of every ref this pack journals, as far as it is scanned."""
        return {n for n in map(self.journaled_name, range(len(self._refs))) if n is not None}

    def journaled_name(self, i: int) -> str | None:
        if i not in self._names:
            self._names[i] = _named_ref(self.read(self._location(self._refs[i])))
        return self._names[i]

    def _scan_blocks(self, end: int) -> None:
        """A block pack whose index cannot be used (or not yet written): each object
        is found by reading its block, until the next open writes the index."""
        base = self._scanned  # where ``data`` starts; ``_scanned`` moves on below
        data = os.pread(self._fd, end - base, base)
        types = (TYPE_OBJECT, TYPE_BLOCK)
        for record in iter_records(data, base, types):
            off, length = record.location
            self._scanned = off + length
            if record.type == TYPE_OBJECT:
                self._raw[record.raw_id] = off - RECORD_HEAD.size
                self._hex = None
                continue
            with suppress(ValueError):
                content = decompress_block(data[off - base : off - base + length])
                for oid, inner, n in iter_block(content):
                    self._in_blocks[oid] = (off, length, inner, n)

    @property
    def index(self) -> dict[str, Location]:
        """Every object record scanned so far, by hex id."""
        if self._hex is None:
            self._hex = {raw.hex(): self._location(at) for raw, at in self._raw.items()}
        return self._hex

    def stored(self, oid: str) -> bytes | None:
        """The stored form of ``oid`` if the pack holds it (as far as it is scanned):
        ``read_object(oid, find(oid))`` in one lookup, for the newest objects a reader
        beside a live writer reads."""
        try:
            start = self._raw.get(bytes.fromhex(oid)) if len(oid) == 64 else None
        except ValueError:  # not hex: no object's id
            return None
        if start is None:
            loc = self.find(oid)  # in a block, or not here
            return None if loc is None else self.read_object(oid, loc)
        found = self._chunk(start, RECORD_HEAD.size)
        if found is None:
            return self.read(self._location(start))
        chunk, at = found
        payload, length = payload_location(chunk, at)
        if payload + length > len(chunk):  # never, as a scan keeps whole records
            return self.read(self._location(start))
        return chunk[payload : payload + length]

    def verified_among(self, oids: Iterable[str]) -> dict[str, tuple[str, bytes]]:
        """``(kind, body)`` of each of ``oids`` the pack holds in an object record (as far
        as it is scanned) and that verifies against its id: the newest objects of a
        context beside a live writer, in one pass. One that does not verify is left
        out, for ``ObjectStore.get`` to name what is wrong with it."""
        return objects.decode_many(self._payloads(oids))

    def _payloads(self, oids: Iterable[str]) -> Iterator[tuple[str, bytes]]:
        raw_start = self._raw.get
        for oid in oids:
            try:
                start = raw_start(bytes.fromhex(oid))
            except ValueError:  # not hex: no object's id
                continue
            found = None if start is None else self._chunk(start, RECORD_HEAD.size)
            if found is None:
                continue
            chunk, at = found
            payload, length = payload_location(chunk, at)
            if payload + length <= len(chunk):
                yield oid, chunk[payload : payload + length]

    def holds(self, oid: str) -> bool:
        """Whether the pack holds ``oid`` as far as it is scanned (``find`` without
        working out where)."""
        try:
            return bytes.fromhex(oid) in self._raw or oid in self._in_blocks
        except ValueError:  # not hex: no object's id
            return False

    def find(self, oid: str) -> Location | None:
        try:
            start = self._raw.get(bytes.fromhex(oid)) if len(oid) == 64 else None
        except ValueError:  # not hex: no object's id
            return None
        found = None if start is None else self._location(start)
        if found is None and oid in self._in_blocks:
            return self._in_blocks[oid][:2]
        return found

    def read(self, loc: Location) -> bytes:
        off, length = loc
        found = self._chunk(off, length)
        if found is None:
            return os.pread(self._fd, length, off)
        chunk, at = found
        return chunk[at : at + length]

    def read_object(self, oid: str, loc: Location) -> bytes:
        """The stored form of an object found by ``find``: from a block, its content
        compressed again (this path is for a damaged index only, until reopened)."""
        where = self._in_blocks.get(oid)
        if where is None or where[:2] != loc:
            return self.read(loc)
        try:
            content = decompress_block(self.read(loc))
            return objects.stored_as_is(block_piece(content, where[2], where[3]))
        except ValueError as e:
            raise CorruptObject(oid, f"its block cannot give it ({e})") from None

    def sync(self) -> None:
        """Make what its writer wrote so far durable (a reader relies on an object in it)."""
        os.fsync(self._fd)

    def try_recover(self, tmp_dir: Path, replay: Replay) -> Recovery:
        """Seal the pack if no writer holds it: ``"busy"`` if one does, ``"sealed"``
        once it has an index, ``"removed"`` if it held nothing.

        Verifies every record, replays its ref updates and writes the index,
        whose pack length marks where the good records end. Bytes after that
        (a torn tail) are left alone, not cut: should they come from a damaged
        header in the middle instead, nothing readable is destroyed.

        A pack without its header (a writer of an older ags lost power before
        its first sync: zero bytes, or zeros) in which no record verifies holds
        nothing anyone was told is durable: it is deleted. One in which a
        record verifies is damage, not a crash: DamagedPack, and it stays.
        """
        try:
            fd = open_fd(self.path, os.O_RDWR)
        except FileNotFoundError:
            return "removed"  # sealed into a block pack (or merged) just now
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return "busy"
            if not _still_named(fd, self.path):
                return "removed"  # its writer sealed it and let go as we looked
            if os.path.lexists(self.path.with_suffix(".idx")):
                return "sealed"
            if os.pread(fd, len(BLOCK_PACK_MAGIC), 0) == BLOCK_PACK_MAGIC:
                # A block pack whose writer died before its index: it holds copies
                # of objects the writer still had elsewhere, and no ref updates.
                _index_block_pack(fd, self.path, tmp_dir)
                return "sealed"
            size = os.fstat(fd).st_size
            head = os.pread(fd, len(PACK_MAGIC), 0)
            scan = scan_records(fd, len(PACK_MAGIC), size)
            good_objects, updates, good_end = _verified(fd, scan)
            if head != PACK_MAGIC:
                another_version = len(head) == len(PACK_MAGIC) and head[:-1] == PACK_MAGIC[:-1]
                if another_version or good_end > len(PACK_MAGIC) or _holds_a_block(fd, size):
                    raise DamagedPack(f"pack {self.path.name} has a damaged header")
                os.unlink(self.path)
                fsync_dir(self.path.parent)
                return "removed"
            replay(updates)
            if size > good_end and not os.pread(fd, size - good_end, good_end).strip(b"\0"):
                os.ftruncate(fd, good_end)  # zeros written ahead (5.1): no torn record
            os.fsync(fd)
            write_index(self.path, tmp_dir, good_objects, good_end)
            with suppress(FileNotFoundError):  # its dead writer's live index (5.6)
                os.unlink(self.path.with_suffix(".live"))
            self._raw = {
                bytes.fromhex(oid): loc[0] - RECORD_HEAD.size for oid, loc in good_objects.items()
            }
            self._hex = None
            return "sealed"
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self._fd)
        self._bases, self._chunks = [], []


def rebuild_index(pack_path: Path, tmp_dir: Path) -> int:
    """Write the index of a sealed pack again from the pack itself (after the old one
    was found damaged); return how many objects it indexes. Ref updates are not
    replayed: a sealed pack's refs were made durable before it was sealed."""
    fd = _open_pack(pack_path)
    try:
        if os.pread(fd, len(BLOCK_PACK_MAGIC), 0) == BLOCK_PACK_MAGIC:
            return _index_block_pack(fd, pack_path, tmp_dir)
        scan = scan_records(fd, len(PACK_MAGIC), os.fstat(fd).st_size)
        good_objects, _updates, good_end = _verified(fd, scan)
        write_index(pack_path, tmp_dir, good_objects, good_end)
        return len(good_objects)
    finally:
        os.close(fd)


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open at ``fd`` (not unlinked meanwhile)."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _holds_a_block(fd: int, size: int) -> bool:
    """Whether a pack that lost its header holds a block record that verifies (then
    it is damage, not a crash before the first sync, and must not be deleted)."""
    data = os.pread(fd, size, 0)
    start = len(BLOCK_PACK_MAGIC)
    for record in iter_records(memoryview(data)[start:], start, (TYPE_OBJECT, TYPE_BLOCK)):
        off, length = record.location
        if record.type == TYPE_BLOCK and blake3.blake3(data[off : off + length]).digest() == (
            record.raw_id
        ):
            return True
    return False


def _index_block_pack(fd: int, pack_path: Path, tmp_dir: Path) -> int:
    """Write the index of a block pack (5.5) from its records; return how many objects
    it indexes. Its good part ends after the last record that verifies."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0)
    entries: dict[str, tuple[int, int, int]] = {}
    good_end = len(BLOCK_PACK_MAGIC)
    types = (TYPE_OBJECT, TYPE_BLOCK)
    for record in iter_records(memoryview(data)[good_end:], good_end, types):
        off, length = record.location
        payload = data[off : off + length]
        try:
            if record.type == TYPE_OBJECT:
                objects.decode(record.raw_id.hex(), payload)
                entries[record.raw_id.hex()] = (off, NOT_IN_A_BLOCK, length)
            else:
                if blake3.blake3(payload).digest() != record.raw_id:
                    continue
                for oid, inner, n in iter_block(decompress_block(payload)):
                    entries.setdefault(oid, (off, inner, n))
        except (CorruptObject, ValueError):
            continue
        good_end = off + length
    os.fsync(fd)
    atomic_write(
        tmp_dir, pack_path.with_suffix(".idx"), encode_index(entries.items(), good_end, version=2)
    )
    return len(entries)


def _verified(fd: int, scan: Scan) -> tuple[dict[str, Location], list[dict[str, Any]], int]:
    """Check every record of a scan: (objects to index, ref updates in order, good end).

    The pack's good part ends after its last record that verifies: what
    follows is a torn tail (power loss can leave zeros there). A bad object
    before a good record is not a tail; it stays indexed so that fsck reports it.
    """
    good_end = len(PACK_MAGIC)
    for oid, loc in scan.objects.items():
        try:
            objects.decode(oid, os.pread(fd, loc[1], loc[0]))
        except CorruptObject:
            continue
        good_end = max(good_end, loc[0] + loc[1])
    updates: list[tuple[int, dict[str, Any]]] = []
    for checksum, loc in scan.refs:
        try:
            update = decode_ref_update(checksum, os.pread(fd, loc[1], loc[0]))
        except CorruptObject:
            continue
        updates.append((loc[0], update))
        good_end = max(good_end, loc[0] + loc[1])
    kept = {oid: loc for oid, loc in scan.objects.items() if loc[0] + loc[1] <= good_end}
    return kept, [u for _, u in sorted(updates, key=lambda item: item[0])], good_end
