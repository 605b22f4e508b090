"""Packs: many objects in one append-only file, the index that finds them, and
the journal of ref updates that lets one fsync make an append durable.

A pack (``objects/pack/pack-<32 hex>.pack``) is an 8-byte header
(``b"AGSPACK"`` and a version byte, 1) followed by records::

    type (1 byte) | id (32 bytes) | length (u32, little endian) | payload

* type 1, an object: ``id`` is the raw object id, the payload its stored form
  (exactly what a loose object file holds, see objects.py).
* type 2, a ref update: the payload is canonical JSON
  ``{"body": <new ref file body or null>, "log": <reflog line>, "ref": <name>}``
  and ``id`` is the BLAKE3-256 of ``b"ref\\0" + payload``, a checksum.

A pack is only ever appended to, by the one process that holds an ``flock``
on it. An append writes its objects and its ref update, then one ``fsync``
makes both durable; the ref file is then renamed into place without further
syncs (refs.py). Should the machine lose power before the ref file reaches
the disk, the ref update record in the pack is what restores it.

A pack is *sealed* when its writer closes it: the writer syncs every ref file
it updated, then writes an index (``pack-<32 hex>.idx``) with the
atomic-replace protocol. An index means "sealed: nothing in this pack is
needed to recover a ref". The index is derived data::

    b"AGSIDX" | version (1 byte, 1) | 0x00 | pack length (u64) | count (u32)
    count entries sorted by id: id (32 bytes) | offset (u64) | length (u32)
    BLAKE3-256 of everything above (32 bytes)

Only objects are indexed. A pack without an index is being written (its
flock is held) or was left by a crash. Readers scan such a pack; whoever
finds it unlocked recovers it: replays its ref updates (a no-op unless power
was lost), cuts a torn tail, and writes the index.
"""

from __future__ import annotations

import bisect
import fcntl
import mmap
import os
import secrets
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import blake3

from . import canonical, objects
from .errors import CorruptObject, StoreFormatError
from .files import atomic_write, fsync_dir, sync_paths

PACK_MAGIC: Final = b"AGSPACK\x01"
IDX_MAGIC: Final = b"AGSIDX\x01\x00"
RECORD_HEAD: Final = struct.Struct("<B32sI")
IDX_HEAD: Final = struct.Struct("<8sQI")
IDX_ENTRY: Final = struct.Struct("<32sQI")
TYPE_OBJECT: Final = 1
TYPE_REF: Final = 2
MAX_PACK_BYTES: Final = 256 * 1024 * 1024

Location = tuple[int, int]  # (offset of the payload, its length)
Replay = Callable[[list[dict[str, Any]]], None]


def new_pack_name() -> str:
    return f"pack-{secrets.token_hex(16)}"


def ref_record_id(payload: bytes) -> bytes:
    return blake3.blake3(b"ref\0" + payload).digest()


class Scan:
    """What a scan of pack records found."""

    def __init__(self) -> None:
        self.objects: dict[str, Location] = {}
        self.refs: list[tuple[bytes, Location]] = []  # (checksum, location), in pack order
        self.end = 0


def scan_records(fd: int, start: int, end: int) -> Scan:
    """Read record headers in ``[start, end)``.

    Stops at the first record that does not fit before ``end`` (one being
    written, or a torn one left by a crash) or whose type is unknown.
    """
    scan = Scan()
    data = os.pread(fd, end - start, start) if end > start else b""
    pos, size, head = 0, len(data), RECORD_HEAD.size
    while pos + head <= size:
        rtype, raw, length = RECORD_HEAD.unpack_from(data, pos)
        if pos + head + length > size or rtype not in (TYPE_OBJECT, TYPE_REF):
            break
        loc = (start + pos + head, length)
        if rtype == TYPE_OBJECT:
            scan.objects[raw.hex()] = loc
        else:
            scan.refs.append((raw, loc))
        pos += head + length
    scan.end = start + pos
    return scan


class PackWriter:
    """The one open, growing pack of a store handle. Holds the pack's flock."""

    def __init__(self, pack_dir: Path, tmp_dir: Path) -> None:
        self.name = new_pack_name()
        self.path = pack_dir / f"{self.name}.pack"
        self._tmp_dir = tmp_dir
        # Locked before it is visible, so no reader ever mistakes it for an abandoned pack.
        tmp = tmp_dir / f"{self.name}.pack"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, PACK_MAGIC)
        os.rename(tmp, self.path)
        self._fd = fd
        self.size = len(PACK_MAGIC)
        self.index: dict[str, Location] = {}
        self.dirty = True
        self._dir_synced = False
        self._unsynced_refs: set[str] = set()  # files to sync before sealing

    def _write(self, records: Iterable[tuple[int, bytes, bytes]]) -> None:
        parts: list[bytes] = []
        offset = self.size
        for rtype, raw_id, payload in records:
            parts.append(RECORD_HEAD.pack(rtype, raw_id, len(payload)))
            parts.append(payload)
            if rtype == TYPE_OBJECT:
                self.index[raw_id.hex()] = (offset + RECORD_HEAD.size, len(payload))
            offset += RECORD_HEAD.size + len(payload)
        view = memoryview(b"".join(parts))
        while view:
            view = view[os.write(self._fd, view) :]
        self.size = offset
        self.dirty = True

    def add(self, records: Iterable[tuple[str, bytes]]) -> None:
        """Append ``(id, stored form)`` object records in one write. Durable after ``sync``."""
        self._write((TYPE_OBJECT, bytes.fromhex(oid), stored) for oid, stored in records)

    def add_ref_update(self, payload: bytes, files_to_sync: Iterable[str]) -> None:
        """Journal a ref update; ``files_to_sync`` are made durable before the pack is sealed."""
        self._write([(TYPE_REF, ref_record_id(payload), payload)])
        self._unsynced_refs.update(files_to_sync)

    def read(self, loc: Location) -> bytes:
        return os.pread(self._fd, loc[1], loc[0])

    def sync(self) -> None:
        if self.dirty:
            os.fsync(self._fd)
            if not self._dir_synced:
                fsync_dir(self.path.parent)
                self._dir_synced = True
            self.dirty = False

    def seal(self) -> None:
        """Sync, make journaled refs durable on their own, write the index, let go."""
        self.sync()
        sync_paths(self._unsynced_refs)
        write_index(self.path, self._tmp_dir, self.index, self.size)
        os.close(self._fd)
        self._fd = -1


def _open_pack(path: Path) -> int:
    """Open a pack for reading, refusing a version this code does not know."""
    fd = os.open(path, os.O_RDONLY)
    head = os.pread(fd, len(PACK_MAGIC), 0)
    if head != PACK_MAGIC and len(head) == len(PACK_MAGIC):
        os.close(fd)
        raise StoreFormatError(f"pack {path.name} has an unknown format or version")
    return fd


def write_index(pack_path: Path, tmp_dir: Path, index: dict[str, Location], size: int) -> None:
    entries = sorted(index.items())
    body = IDX_HEAD.pack(IDX_MAGIC, size, len(entries)) + b"".join(
        IDX_ENTRY.pack(bytes.fromhex(oid), off, length) for oid, (off, length) in entries
    )
    atomic_write(tmp_dir, pack_path.with_suffix(".idx"), body + blake3.blake3(body).digest())


class SealedPack:
    """A pack with an index: lookups by binary search in the mapped index."""

    def __init__(self, pack_path: Path) -> None:
        self.path = pack_path
        idx_path = pack_path.with_suffix(".idx")
        with open(idx_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < IDX_HEAD.size + 32:
                raise StoreFormatError(f"pack index {idx_path} is truncated")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        magic, self.pack_size, self.count = IDX_HEAD.unpack_from(self._map, 0)
        if magic != IDX_MAGIC:
            raise StoreFormatError(f"pack index {idx_path} has an unknown format")
        if size != IDX_HEAD.size + self.count * IDX_ENTRY.size + 32:
            raise StoreFormatError(f"pack index {idx_path} has the wrong length")
        self._fd = _open_pack(pack_path)
        self._keys = _IndexKeys(self._map, self.count)

    def verify_index(self) -> bool:
        body = self._map[: len(self._map) - 32]
        return blake3.blake3(body).digest() == self._map[len(self._map) - 32 :]

    def find(self, oid: str) -> Location | None:
        raw = bytes.fromhex(oid)
        i = bisect.bisect_left(self._keys, raw)
        if i < self.count and self._keys[i] == raw:
            _, off, length = IDX_ENTRY.unpack_from(self._map, IDX_HEAD.size + i * IDX_ENTRY.size)
            return off, length
        return None

    def with_prefix(self, prefix: str) -> Iterator[str]:
        lo = bytes.fromhex(prefix.ljust(64, "0"))
        i = bisect.bisect_left(self._keys, lo)
        while i < self.count:
            hexid = self._keys[i].hex()
            if not hexid.startswith(prefix):
                break
            yield hexid
            i += 1

    def ids(self) -> Iterator[str]:
        for i in range(self.count):
            yield self._keys[i].hex()

    def read(self, loc: Location) -> bytes:
        return os.pread(self._fd, loc[1], loc[0])

    def close(self) -> None:
        os.close(self._fd)
        self._map.close()


class _IndexKeys:
    """The sorted ids of a mapped index, as a sequence ``bisect`` can search."""

    def __init__(self, mapped: mmap.mmap, count: int) -> None:
        self._map = mapped
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: int) -> bytes:
        start = IDX_HEAD.size + i * IDX_ENTRY.size
        return self._map[start : start + 32]


class OpenPack:
    """A pack without an index, seen by a reader: scanned, and rescanned as it grows."""

    def __init__(self, pack_path: Path) -> None:
        self.path = pack_path
        self._fd = _open_pack(pack_path)
        self.index: dict[str, Location] = {}
        self._scanned = len(PACK_MAGIC)
        self.refresh()

    def refresh(self) -> None:
        end = os.fstat(self._fd).st_size
        if end > self._scanned:
            scan = scan_records(self._fd, self._scanned, end)
            self.index.update(scan.objects)
            self._scanned = scan.end

    def find(self, oid: str) -> Location | None:
        return self.index.get(oid)

    def read(self, loc: Location) -> bytes:
        return os.pread(self._fd, loc[1], loc[0])

    def try_recover(self, tmp_dir: Path, replay: Replay) -> bool:
        """Seal the pack if no writer holds it; return whether it is sealed now.

        Verifies every record, replays its ref updates, cuts a torn tail and
        writes the index.
        """
        fd = os.open(self.path, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            if self.path.with_suffix(".idx").exists():
                return True
            if os.pread(fd, len(PACK_MAGIC), 0) != PACK_MAGIC:
                raise StoreFormatError(f"pack {self.path} has an unknown format")
            size = os.fstat(fd).st_size
            scan = scan_records(fd, len(PACK_MAGIC), size)
            good_objects, updates, good_end = _verified(fd, scan)
            replay(updates)
            if good_end < size:
                os.ftruncate(fd, good_end)
            os.fsync(fd)
            write_index(self.path, tmp_dir, good_objects, good_end)
            self.index = good_objects
            return True
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self._fd)


def _verified(fd: int, scan: Scan) -> tuple[dict[str, Location], list[dict[str, Any]], int]:
    """Check every record of a scan: (objects to index, ref updates in order, good end).

    The pack ends after its last record that verifies: what follows is a torn
    tail (power loss can leave zeros there). A bad object before a good record
    is not a tail; it stays indexed so that fsck reports it.
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
        payload = os.pread(fd, loc[1], loc[0])
        if ref_record_id(payload) != checksum:
            continue
        try:
            update = canonical.loads(payload)
        except ValueError:
            continue
        updates.append((loc[0], update))
        good_end = max(good_end, loc[0] + loc[1])
    kept = {oid: loc for oid, loc in scan.objects.items() if loc[0] + loc[1] <= good_end}
    return kept, [u for _, u in sorted(updates, key=lambda item: item[0])], good_end
