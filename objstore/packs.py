"""Packs: many objects in one append-only file, the index that finds them, and
the journal of ref updates that lets one fsync make an append durable.

The byte layouts are in docs/FORMAT.md (5.1 the pack and its records, 5.3
the index) and encoded by pack_format.py; this module does the I/O.

A pack is only ever appended to, by the one process that holds an ``flock``
on it. An append writes its objects and its ref update, then one ``fsync``
makes both durable; the ref file is then renamed into place without further
syncs (refs.py). Should the machine lose power before the ref file reaches
the disk, the ref-update record in the pack is what restores it.

A pack is *sealed* when its writer closes it: the writer syncs every ref file
it updated, then writes the index with the atomic-replace protocol. An index
means "sealed: nothing in this pack is needed to recover a ref", and is
derived data: a damaged one is rebuilt from the pack. A pack without an index
is being written (its flock is held) or was left by a crash; whoever finds it
unlocked when opening the store recovers it (FORMAT.md 5.2): replays its ref
updates (a no-op unless power was lost) and writes the index, leaving any
torn tail unindexed.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any, Final, Literal

import blake3

from . import canonical, objects
from .errors import CorruptObject, DamagedIndex, DamagedPack
from .files import atomic_write, fsync_dir, make_dirs, open_fd, sync_paths
from .pack_format import (
    CHECKSUM_BYTES,
    ENTRIES_AT,
    IDX_ENTRY,
    PACK_MAGIC,
    RECORD_HEAD,
    TYPE_OBJECT,
    TYPE_REF,
    Location,
    Scan,
    encode_index,
    encode_record,
    parse_index,
    scan_buffer,
)

MAX_PACK_BYTES: Final = 256 * 1024 * 1024

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
        and isinstance(update.get("log"), dict)
        and type(update["log"].get("gen")) is int
        and isinstance(update.get("body"), dict | None)
    ):
        raise CorruptObject(oid, "ref update lacks ref, log.gen or body")
    return update


class PackWriter:
    """The one open, growing pack of a store handle. Holds the pack's flock."""

    def __init__(self, pack_dir: Path, tmp_dir: Path) -> None:
        self.name = new_pack_name()
        self.path = pack_dir / f"{self.name}.pack"
        self._tmp_dir = tmp_dir
        # Locked before it is visible, so no reader ever mistakes it for an abandoned
        # pack; its header durable before it is visible, so a power loss never leaves
        # a visible pack without one.
        tmp = tmp_dir / f"{self.name}.pack"
        try:
            fd = open_fd(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        except FileNotFoundError:  # tmp/ was removed by hand: make it again
            make_dirs(tmp_dir)
            fd = open_fd(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, PACK_MAGIC)
            os.fsync(fd)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            with suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._fd = fd
        self.size = len(PACK_MAGIC)
        self.index: dict[str, Location] = {}
        self.dirty = True
        self._dir_synced = False
        self._unsynced_refs: set[str] = set()  # files to sync before sealing

    def _write(self, records: Iterable[tuple[int, bytes, bytes]]) -> None:
        """Append records in one write; all of them, or (on an error such as a full
        disk) none: the pack is cut back and the index learns nothing."""
        parts: list[bytes] = []
        added: dict[str, Location] = {}
        offset = self.size
        for rtype, raw_id, payload in records:
            parts.append(encode_record(rtype, raw_id, payload))
            if rtype == TYPE_OBJECT:
                added[raw_id.hex()] = (offset + RECORD_HEAD.size, len(payload))
            offset += RECORD_HEAD.size + len(payload)
        view = memoryview(b"".join(parts))
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except BaseException:
            os.ftruncate(self._fd, self.size)
            os.lseek(self._fd, self.size, os.SEEK_SET)
            raise
        self.index.update(added)
        self.size = offset
        self.dirty = True

    def add(self, records: Iterable[tuple[str, bytes]]) -> None:
        """Append ``(id, stored form)`` object records in one write. Durable after ``sync``."""
        self._write((TYPE_OBJECT, bytes.fromhex(oid), stored) for oid, stored in records)

    def add_ref_update(self, update: bytes, files_to_sync: Iterable[str]) -> None:
        """Journal a ref update (canonical JSON); ``files_to_sync`` are made durable before
        the pack is sealed."""
        checksum, stored = objects.encode("ref", update)
        self._write([(TYPE_REF, bytes.fromhex(checksum), stored)])
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


def _check_header(path: Path, head: bytes) -> None:
    """Refuse a pack whose header is not version 1's (a shorter one is a pack that
    lost its header: recovery decides about it)."""
    if head != PACK_MAGIC and len(head) == len(PACK_MAGIC):
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
        self.pack_size, self.count, self._fanout = head

    def _entry_range(self, first_byte: int) -> tuple[int, int]:
        """Byte offsets in the index of the entries whose id starts with ``first_byte``."""
        lo, hi = self._fanout[first_byte], self._fanout[first_byte + 1]
        return ENTRIES_AT + lo * IDX_ENTRY.size, ENTRIES_AT + hi * IDX_ENTRY.size

    def find(self, oid: str) -> Location | None:
        raw = bytes.fromhex(oid)
        start, end = self._entry_range(raw[0])
        mapped, step = self._map, IDX_ENTRY.size
        at = mapped.find(raw, start, end)
        while at >= 0 and (at - ENTRIES_AT) % step:  # a match across two entries
            at = mapped.find(raw, at + 1, end)
        if at < 0:
            return None
        _, off, length = IDX_ENTRY.unpack_from(mapped, at)
        return off, length

    def with_prefix(self, prefix: str) -> Iterator[str]:
        start, end = self._entry_range(int(prefix[:2], 16))
        for at in range(start, end, IDX_ENTRY.size):
            hexid = self._map[at : at + 32].hex()
            if hexid.startswith(prefix):
                yield hexid

    def ids(self) -> Iterator[str]:
        for at in range(ENTRIES_AT, ENTRIES_AT + self.count * IDX_ENTRY.size, IDX_ENTRY.size):
            yield self._map[at : at + 32].hex()

    def read(self, loc: Location) -> bytes:
        return self._data[loc[0] : loc[0] + loc[1]]

    def locations(self) -> Iterator[tuple[str, Location]]:
        """Every indexed object and where its stored form is."""
        for at in range(ENTRIES_AT, ENTRIES_AT + self.count * IDX_ENTRY.size, IDX_ENTRY.size):
            raw, off, length = IDX_ENTRY.unpack_from(self._map, at)
            yield raw.hex(), (off, length)

    def index_problems(self) -> list[str]:
        """What is wrong with the index (checksum, order, bounds); [] when it is sound."""
        problems = []
        end = ENTRIES_AT + self.count * IDX_ENTRY.size
        if blake3.blake3(self._map[:end]).digest() != self._map[end : end + 32]:
            problems.append("index checksum does not match")
        if self.pack_size > self.size:  # less is a torn tail left by a crash (5.2)
            problems.append(f"index covers {self.pack_size} bytes, pack has {self.size}")
        previous = b""
        for at in range(ENTRIES_AT, end, IDX_ENTRY.size):
            raw, off, length = IDX_ENTRY.unpack_from(self._map, at)
            if raw <= previous:
                problems.append(f"index entries out of order at {raw.hex()}")
                break
            if off + length > self.size:
                problems.append(f"index entry {raw.hex()} points past the end of the pack")
                break
            previous = raw
        return problems

    def record_problems(self) -> list[str]:
        """What is wrong with the records the index covers: a record that cannot be
        read, a ref-update record that does not verify, an object the index lacks."""
        end = min(self.pack_size, self.size)
        start = len(PACK_MAGIC)
        with memoryview(self._data) as view:
            scan = scan_buffer(view[start:end], start)
        problems = []
        if scan.end < end:
            problems.append(f"records cannot be read from offset {scan.end} on (of {end})")
        for checksum, loc in scan.refs:
            try:
                decode_ref_update(checksum, self.read(loc))
            except CorruptObject as e:
                why = str(e).removeprefix(f"object {checksum.hex()} is corrupt: ")
                problems.append(
                    f"ref-update record at offset {loc[0] - RECORD_HEAD.size} is damaged "
                    f"({why}); the pack is sealed, so no ref depends on it"
                )
        missing = len(set(scan.objects) - set(self.ids()))
        if missing:
            problems.append(f"the index lacks {missing} object(s) of the pack")
        return problems

    def close(self) -> None:
        self._data.close()
        self._map.close()


class OpenPack:
    """A pack without an index, seen by a reader: scanned, and rescanned as it grows."""

    def __init__(self, pack_path: Path) -> None:
        self.path = pack_path
        self._fd = open_fd(pack_path, os.O_RDONLY)  # its header is checked by refresh
        self.index: dict[str, Location] = {}
        self._scanned = len(PACK_MAGIC)
        self.refresh()

    def refresh(self) -> None:
        end = os.fstat(self._fd).st_size
        if end > self._scanned:
            if os.pread(self._fd, len(PACK_MAGIC), 0) != PACK_MAGIC:
                return  # no header: left by a crash (recovery decides), never a writer's
            scan = scan_records(self._fd, self._scanned, end)
            self.index.update(scan.objects)
            self._scanned = scan.end

    def find(self, oid: str) -> Location | None:
        return self.index.get(oid)

    def read(self, loc: Location) -> bytes:
        return os.pread(self._fd, loc[1], loc[0])

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
        fd = open_fd(self.path, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return "busy"
            if os.path.lexists(self.path.with_suffix(".idx")):
                return "sealed"
            size = os.fstat(fd).st_size
            head = os.pread(fd, len(PACK_MAGIC), 0)
            scan = scan_records(fd, len(PACK_MAGIC), size)
            good_objects, updates, good_end = _verified(fd, scan)
            if head != PACK_MAGIC:
                another_version = len(head) == len(PACK_MAGIC) and head[:-1] == PACK_MAGIC[:-1]
                if another_version or good_end > len(PACK_MAGIC):
                    raise DamagedPack(f"pack {self.path.name} has a damaged header")
                os.unlink(self.path)
                fsync_dir(self.path.parent)
                return "removed"
            replay(updates)
            os.fsync(fd)
            write_index(self.path, tmp_dir, good_objects, good_end)
            self.index = good_objects
            return "sealed"
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self._fd)


def rebuild_index(pack_path: Path, tmp_dir: Path) -> int:
    """Write the index of a sealed pack again from the pack itself (after the old one
    was found damaged); return how many objects it indexes. Ref updates are not
    replayed: a sealed pack's refs were made durable before it was sealed."""
    fd = _open_pack(pack_path)
    try:
        scan = scan_records(fd, len(PACK_MAGIC), os.fstat(fd).st_size)
        good_objects, _updates, good_end = _verified(fd, scan)
        write_index(pack_path, tmp_dir, good_objects, good_end)
        return len(good_objects)
    finally:
        os.close(fd)


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
