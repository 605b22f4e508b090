"""The listing index: every session's metadata in one derived file (FORMAT.md 17).

Listing the sessions of a store means reading every session ref, one file
each (10,000 sessions: 10,000 opens). ``cache/sessions.idx`` keeps what those
files said, with the ``stat`` of each file and of ``refs/sessions/`` when they
were read, so that a listing costs one ``stat`` and one read of the index when
no session ref moved, and a ``stat`` per session plus a read of each ref that
did move otherwise.

It is never the source of truth: a missing, damaged or foreign-version index
is made again from the refs, silently, and nothing but a listing reads it. A
ref update replaces the ref file by a rename, which changes both the file
(new inode, new ctime) and the directory (new mtime and ctime), so a stale
entry is always seen as stale, with one exception that the "racy" rule below
closes: a change within the file system's timestamp granularity of the moment
the index was made. As Git does for its index, an entry (or the directory)
whose ctime is within RACY_NS of the start of the scan that recorded it is
never trusted: it is read again next time.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import blake3
import orjson

from . import files
from .errors import StoreFormatError

INDEX_NAME: Final = "sessions.idx"
INDEX_VERSION: Final = 1
# Coarse file-system clocks lag the wall clock by up to a tick (1-10 ms); a
# wide margin costs only a re-read of the refs changed in the last moment.
RACY_NS: Final = 100_000_000

UPDATED: Final = 3  # where a row holds SessionInfo.updated (store.SESSION_FIELDS)
StatKey = list[int]  # inode, size, mtime_ns, ctime_ns
Row = list[Any]  # one session as listed: the SessionInfo fields in order
ReadRow = Callable[[str], "Row | None"]  # a session id -> its row (None: no such ref)


def stat_key(st: os.stat_result) -> StatKey:
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


@dataclass(frozen=True, slots=True)
class Listing:
    """What the session refs say: ``rows`` in listing order (most recently updated
    first: ``updated``, then the id, both descending), and the refs that could not
    be read, ``(session id, why)``."""

    rows: list[Row]
    damaged: list[tuple[str, str]]


class ListingIndex:
    """Reads and refreshes ``cache/sessions.idx`` for one store.

    ``read_row`` turns a session id into its row by reading its ref; it raises
    StoreFormatError for a damaged ref, whose message is kept in the index so
    that every listing names it until it is mended.
    """

    def __init__(self, sessions_dir: Path, cache_dir: Path, tmp_dir: Path) -> None:
        self.sessions_dir = sessions_dir
        self.cache_dir = cache_dir
        self.path = cache_dir / INDEX_NAME
        self._tmp_dir = tmp_dir

    def listing(self, read_row: ReadRow, valid_id: Callable[[str], bool]) -> Listing:
        """Every session ref, from the index when ``refs/sessions/`` has not changed
        since it was made, else from a scan that reads only the refs that moved."""
        try:
            dir_st = os.lstat(self.sessions_dir)
        except FileNotFoundError:
            return Listing([], [])
        start = time.time_ns()
        lines = self._load()
        if lines is None:
            header: dict[str, Any] = {}
        else:
            header = orjson.loads(lines[0])
            if header.get("dir") == stat_key(dir_st):
                damaged = [(sid, why) for sid, _key, why in orjson.loads(lines[3])]
                return Listing(orjson.loads(lines[1]), damaged)
        known: dict[str, tuple[StatKey | None, Row | None, str]] = {}
        if lines is not None:
            rows, keys = orjson.loads(lines[1]), orjson.loads(lines[2])
            known = {row[0]: (key, row, "") for row, key in zip(rows, keys, strict=True)}
            known.update((sid, (key, None, why)) for sid, key, why in orjson.loads(lines[3]))
        entries: list[tuple[str, StatKey | None, Row | None, str]] = []
        changed = lines is None
        for dirent in os.scandir(self.sessions_dir):
            sid = dirent.name
            if not valid_id(sid):
                continue
            try:
                st = dirent.stat(follow_symlinks=False)
            except FileNotFoundError:
                changed = True
                continue  # deleted since the directory was read
            key = stat_key(st)
            was = known.pop(sid, None)
            if was is not None and was[0] == key:
                entries.append((sid, was[0], was[1], was[2]))
                continue
            changed = True
            # Stat first, read after: a ref replaced in between is recorded with the
            # older stat and the newer content, so it is only read again next time.
            try:
                row, why = read_row(sid), ""
            except StoreFormatError as e:
                row, why = None, str(e)
            if row is None and not why:
                continue  # gone (a directory, or removed after its stat)
            trusted = None if _racy(st.st_ctime_ns, start) else key
            entries.append((sid, trusted, row, why))
        dir_key = None if _racy(dir_st.st_ctime_ns, start) else stat_key(dir_st)
        good = sorted(
            (e for e in entries if e[2] is not None),
            key=lambda e: (e[2][UPDATED], e[0]),  # type: ignore[index]
            reverse=True,
        )
        bad = [[sid, key, why] for sid, key, row, why in entries if row is None]
        if changed or known or header.get("dir") != dir_key:
            self._save(
                [
                    {"dir": dir_key, "version": INDEX_VERSION},
                    [e[2] for e in good],
                    [e[1] for e in good],
                    bad,
                ]
            )
        return Listing([e[2] for e in good], [(b[0], b[2]) for b in bad])  # type: ignore[misc]

    # -- the file ------------------------------------------------------------------

    def _cache_is_a_directory(self) -> bool:
        try:
            return stat.S_ISDIR(os.lstat(self.cache_dir).st_mode)
        except FileNotFoundError:
            return False

    def _load(self) -> list[bytes] | None:
        """The index's four JSON lines, unparsed, or None if it is missing, damaged or
        of another version. The checksum stands for the shape: the lines are as ags
        wrote them, each row taken from a checked ref."""
        if not self._cache_is_a_directory():
            return None  # a link there would lead out of the store: never followed
        try:
            data = files.read_file(self.path)
        except OSError:
            return None
        body, sep, digest = data[:-1].rpartition(b"\n")
        if not sep or digest != blake3.blake3(body + sep).hexdigest().encode("ascii"):
            return None
        lines = body.split(b"\n")
        if len(lines) != 4:
            return None
        try:
            header = orjson.loads(lines[0])
        except orjson.JSONDecodeError:
            return None
        if type(header) is not dict or header.get("version") != INDEX_VERSION:
            return None
        return lines

    def _save(self, parts: list[Any]) -> None:
        """Write the index by the atomic-replace protocol without syncs (it is derived:
        a copy lost to a power cut is made again). A store this user cannot write
        (one shared read-only) just goes without it."""
        body = b"".join(orjson.dumps(part) + b"\n" for part in parts)
        data = body + blake3.blake3(body).hexdigest().encode("ascii") + b"\n"
        try:
            if not self._cache_is_a_directory():
                if os.path.lexists(self.cache_dir):
                    return  # not ours to replace: fsck names a link in the store
                files.make_dirs(self.cache_dir, durable=False)
            files.atomic_write(self._tmp_dir, self.path, data, durable=False)
        except OSError:
            pass


def _racy(ctime_ns: int, scan_start_ns: int) -> bool:
    return ctime_ns >= scan_start_ns - RACY_NS
