"""What a remote's storage must do, and the parts every backend shares.

A remote is a flat space of *keys* holding bytes, as an S3 bucket (under a
prefix) or a directory holds them. A Git-like sync needs only these
operations, all of them on ``RemoteStorage``:

* ``put_new(key, data)``: write a key only if it is absent (S3
  ``If-None-Match: *``). Packs and indexes are named by their content and
  written once, so "already there" is success, not an error.
* ``get(key)``, ``get_range(key, start, end)`` (a part of a pack: S3 ``Range``),
  ``head(key)`` (size, etag, LastModified: the object's age, which remote gc's
  grace rule reads), ``list(prefix)`` (paged), ``delete(*keys)``.
* ``read_cell(key)`` / ``swap(cell, value)``: a small key changed only by
  compare-and-swap, for refs. The swap is conditional on the version read
  (S3 ``If-Match: <etag>``, or ``If-None-Match: *`` for a key not yet
  written), and every body carries a generation that goes up by one on
  every swap: S3 etags are content hashes, so a ref that went A -> B -> A
  would otherwise get its old etag back and a writer holding the first
  read would win a swap it should lose.
* ``check()``: the endpoint answers, the bucket exists, the credentials work,
  and the server really enforces conditional writes (some S3 servers accept
  the headers and ignore them): a second ``If-None-Match: *`` write of one
  scratch key must be refused, and so must an ``If-Match`` on a stale etag
  and on a missing key. Run when a remote is added and before a push.

A cell's body is canonical JSON and a newline:
``{"generation": N, "value": <JSON value>}``; docs/REMOTES.md has the layout
that phase 2 of the sync builds on these keys.

Keys are ``/``-separated parts of ``[A-Za-z0-9_][A-Za-z0-9._-]*`` (no part
empty or starting with a dot), at most 512 characters: the same set maps to
an S3 key and to a path under a directory without escaping, and a directory
backend can keep its own files under names starting with a dot. A key is
never also the "directory" of another (``refs/a`` beside ``refs/a/b``): S3
allows it, a directory cannot hold it.

A listing's order is the server's: AWS lists in UTF-8 byte order, SeaweedFS
puts ``a/b`` before ``a-b`` (it lists its directories' entries), a directory
remote lists in byte order. So nothing may rely on the order, and there is
no "list after this key".

Backends implement the underscore primitives; the cell protocol, the key
rules and the connect-time check are written once, here.
"""

from __future__ import annotations

import re
import secrets
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from .. import canonical
from .errors import (
    BadRemote,
    ConditionalWritesIgnored,
    DamagedRemoteKey,
    KeyMissing,
    RemoteError,
    SwapFailed,
)

KEY_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(?:/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
# A listing prefix is a key, a key and a slash, or a key cut anywhere in its last part.
PREFIX_RE: Final = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._-]*/)*(?:[A-Za-z0-9_][A-Za-z0-9._-]*)?")
MAX_KEY: Final = 512
PROBE_PREFIX: Final = "probe/"  # scratch keys of the connect-time check


def check_key(key: str) -> str:
    if type(key) is not str or len(key) > MAX_KEY or not KEY_RE.fullmatch(key):
        raise BadRemote(f"bad remote key {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    if type(prefix) is not str or len(prefix) > MAX_KEY or not PREFIX_RE.fullmatch(prefix):
        raise BadRemote(f"bad remote key prefix {prefix!r}")
    return prefix


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One key as ``head`` or ``list`` see it."""

    key: str
    size: int
    modified: datetime  # LastModified, timezone-aware UTC: remote gc reads ages from it
    etag: str | None  # the server's version token; None where a listing does not give one


@dataclass(frozen=True, slots=True)
class Cell:
    """A compare-and-swap key as read: ``swap`` succeeds only if it is unchanged since."""

    key: str
    generation: int  # 0: never written
    value: Any  # the JSON value; None if never written
    etag: str | None  # the version read; None if the key is absent

    @property
    def exists(self) -> bool:
        return self.etag is not None


@dataclass(slots=True)
class TransferStats:
    """What one storage handle sent and received, counted where it leaves the process:
    S3 requests as sent on the wire (a retry is a second request), a directory's
    file operations. Tests count requests with it; the bench reports it."""

    requests: int = 0
    bytes_sent: int = 0  # request bodies (what is written)
    bytes_received: int = 0  # bodies of what is read
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, requests: int = 0, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes_sent += sent
            self.bytes_received += received


def encode_cell(generation: int, value: Any) -> bytes:
    canonical.check_json(value, "cell value")
    return canonical.dumps({"generation": generation, "value": value}) + b"\n"


def decode_cell(where: str, key: str, data: bytes, etag: str) -> Cell:
    try:
        body = canonical.loads(data)
        generation = body["generation"]
        value = body["value"]
    except (ValueError, KeyError, TypeError):
        raise DamagedRemoteKey(f"{where}: {key} is not a cell ags wrote") from None
    if type(generation) is not int or generation < 1 or set(body) != {"generation", "value"}:
        raise DamagedRemoteKey(f"{where}: {key} is not a cell ags wrote")
    return Cell(key, generation, value, etag)


class RemoteStorage(ABC):
    """A remote's keys. Thread-safe: a push may send packs from several threads."""

    url: str  # what messages call this remote: s3://bucket/prefix, or a path
    stats: TransferStats  # what this handle sent and received

    # -- what a backend implements --------------------------------------------

    @abstractmethod
    def _check_reachable(self) -> None:
        """Raise RemoteUnreachable, NoCredentials, AccessDenied or BucketMissing."""

    @abstractmethod
    def _read(self, key: str) -> tuple[bytes, str] | None:
        """(content, etag), or None if the key is absent."""

    @abstractmethod
    def _read_range(self, key: str, start: int, end: int) -> bytes | None:
        """Bytes ``start`` to ``end`` (exclusive) of ``key``, fewer where it is shorter,
        or None if the key is absent (S3: a GET with ``Range``)."""

    @abstractmethod
    def _put_if_absent(self, key: str, data: bytes) -> str | None:
        """Write ``key`` unless it exists: its new etag, or None if it existed."""

    @abstractmethod
    def _put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace ``key`` if its etag is still ``etag``: its new etag. Raise SwapFailed
        if it changed or is gone (S3 answers 412, or AWS 404 for a missing key)."""

    @abstractmethod
    def _head(self, key: str) -> ObjectInfo | None:
        """Size, etag and LastModified of ``key``, or None if it is absent."""

    @abstractmethod
    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every key starting with ``prefix``, once each, in the server's order."""

    @abstractmethod
    def _delete(self, keys: list[str]) -> None:
        """Delete the keys that exist; absent ones are no error."""

    def close(self) -> None:
        """Let go of connections and files (a no-op where there are none)."""
        return None

    def hidden_names(self) -> list[str]:
        """Names at the top of the remote that are neither keys nor the backend's own
        (a directory's hidden files: ``.git``, ``.bashrc``), which a listing leaves
        out; none on S3, where every name is a key."""
        return []

    # -- shared ----------------------------------------------------------------

    def __enter__(self) -> RemoteStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put_new(self, key: str, data: bytes) -> bool:
        """Write ``key`` if it is absent. True if this call wrote it, False if it was
        there (for a content-named key, that is the same content: success)."""
        return self._put_if_absent(check_key(key), data) is not None

    def head(self, key: str) -> ObjectInfo | None:
        """Size, etag and LastModified (the age remote gc reads) of ``key``, or None."""
        return self._head(check_key(key))

    def get(self, key: str) -> bytes:
        found = self._read(check_key(key))
        if found is None:
            raise KeyMissing(self.url, key)
        return found[0]

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """``key``'s content and etag (its version, for ``replace``), or KeyMissing."""
        found = self._read(check_key(key))
        if found is None:
            raise KeyMissing(self.url, key)
        return found

    def replace(self, key: str, data: bytes, etag: str) -> str:
        """Write ``key`` if it is still at ``etag`` (S3 ``If-Match``): its new etag, or
        SwapFailed. For a key whose bodies never repeat (the marker only goes up), so
        an etag read once is never met again; cells, whose values may, have ``swap``."""
        return self._put_if_match(check_key(key), data, etag)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of ``key``: one request, whatever the
        key's size. The caller checks it got ``end - start`` bytes."""
        if type(start) is not int or type(end) is not int or not 0 <= start < end:
            raise BadRemote(f"bad byte range {start}-{end} of {key}")
        found = self._read_range(check_key(key), start, end)
        if found is None:
            raise KeyMissing(self.url, key)
        return found

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """The keys starting with ``prefix``, each once, fetched a page at a time, in
        the server's order (see above: no order to rely on)."""
        return self._list(check_prefix(prefix))

    def delete(self, *keys: str) -> None:
        self._delete([check_key(k) for k in keys])

    def read_cell(self, key: str) -> Cell:
        found = self._read(check_key(key))
        if found is None:
            return Cell(key, 0, None, None)
        return decode_cell(self.url, key, *found)

    def swap(self, cell: Cell, value: Any) -> Cell:
        """Set ``cell.key`` to ``value`` if it is still as ``cell`` was read; return it
        as written. Raise SwapFailed (with ``current``, the key as it is now) if
        another writer changed it first.

        A request whose answer was lost may have been applied: the client's retry
        then meets its own write and is refused. So a refusal is checked by
        reading the key again: holding exactly the body this call wrote, the
        swap succeeded (whoever wrote it, the outcome is the one asked for).
        """
        check_key(cell.key)
        body = encode_cell(cell.generation + 1, value)
        try:
            if cell.etag is None:
                etag = self._put_if_absent(cell.key, body)
                if etag is None:
                    raise SwapFailed(self.url, cell.key)
            else:
                etag = self._put_if_match(cell.key, body, cell.etag)
        except SwapFailed:
            found = self._read(cell.key)
            if found is not None and found[0] == body:
                return decode_cell(self.url, cell.key, *found)
            current = (
                Cell(cell.key, 0, None, None)
                if found is None
                else decode_cell(self.url, cell.key, *found)
            )
            raise SwapFailed(self.url, cell.key, current) from None
        return Cell(cell.key, cell.generation + 1, value, etag)

    def check(self) -> None:
        """Raise unless the remote answers, exists, accepts the credentials and
        enforces conditional writes (``verify_conditional_writes``)."""
        self.check_reachable()
        self.verify_conditional_writes()

    def check_reachable(self) -> None:
        """``check`` without the conditional writes: it writes nothing."""
        self._check_reachable()

    def _conditional_write_ignored(self, key: str, missing: str) -> str | None:
        """The first write the server let through that it must have refused, if any."""
        self._put_if_absent(key, b"first\n")
        if self._put_if_absent(key, b"second\n") is not None:
            return "a second If-None-Match: * write of one key was accepted"
        for target, what in ((key, "with a stale etag"), (missing, "of a missing key")):
            try:
                self._put_if_match(target, b"third\n", '"0"')
            except SwapFailed:
                continue
            return f"an If-Match write {what} was accepted"
        found = self._read(key)
        if found is None or found[0] != b"first\n":
            return "a conditional write that was refused changed the key"
        return None

    def verify_conditional_writes(self) -> None:
        """Write a scratch key the ways a sync relies on and raise ConditionalWritesIgnored
        if the server lets a write through that it must refuse. Six requests."""
        key = f"{PROBE_PREFIX}{secrets.token_hex(16)}"
        missing = f"{key}-missing"
        try:
            ignored = self._conditional_write_ignored(key, missing)
        except BaseException:
            with suppress(RemoteError):  # the first error is the one to report
                self._delete([key, missing])
            raise
        self._delete([key, missing])
        if ignored is not None:
            raise ConditionalWritesIgnored(
                f"{self.url} does not enforce conditional writes ({ignored}); "
                "two pushes could both win, so ags will not push there"
            )


__all__ = [
    "Cell",
    "ObjectInfo",
    "TransferStats",
    "RemoteError",
    "RemoteStorage",
    "check_key",
    "check_prefix",
    "decode_cell",
    "encode_cell",
]
