"""A remote in a plain directory: a USB disk, a network share, the tests.

Each key is the file at that relative path. The conditional writes an S3
server gives are made here by a lock and an atomic rename:

* every write of a key holds an ``flock`` on one of 256 lock files (by the
  key's hash, as the store's ref locks are striped), under ``.ags-locks/``;
* under it, ``put_new`` checks that the key is absent, and a swap checks
  that the content's etag is still the one read;
* the new content is written to ``.ags-tmp/``, fsynced, renamed over the
  key and the directory fsynced (the store's atomic-replace protocol,
  files.py), so a reader takes no lock and sees the old or the new file.

An etag here is the BLAKE3 of the content (32 hex digits), like S3's MD5
etags a content hash: a cell's generation is what tells two writes of one
body apart. LastModified is the file's mtime. A listing gives no etags
(it would have to read every file).

Names starting with a dot are not keys (storage.py), so ``.ags-locks`` and
``.ags-tmp`` never collide with one. The directory must exist: ags never
creates the place a remote points at, as it never creates a bucket.
Files are created 0600 and directories 0700, never through a symbolic link
at the last step (files.py): a remote holds the same conversations as the store.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

import blake3

from ..files import FileLock, make_dir, open_fd, read_file, replace, write_new
from .errors import BucketMissing, RemoteError, SwapFailed
from .storage import ObjectInfo, RemoteStorage, TransferStats

LOCKS: Final = ".ags-locks"
TMP: Final = ".ags-tmp"
NOT_OTHER_THINGS: Final = frozenset({LOCKS, TMP, ".DS_Store"})
"""Hidden names that do not make a directory other things than an empty remote: its
own, and what macOS's Finder leaves in any folder it shows (FORMAT.md 16.2)."""
T = TypeVar("T")


def content_etag(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()[:32]


class DirectoryStorage(RemoteStorage):
    """The keys of a remote as files under ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.url = str(self.root)
        self._prepared = False
        self._prepare_lock = threading.Lock()
        self.stats = TransferStats()  # "requests" here: reads, writes, listings, deletes

    # -- plumbing ----------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root / key

    def _prepare(self) -> None:
        """Make ``.ags-locks`` and ``.ags-tmp`` before the first write, one level deep
        only: a remote whose disk is not mounted must not be made on the disk below."""
        with self._prepare_lock:
            if self._prepared:
                return
            self._check_reachable()
            for name in (LOCKS, TMP):
                self._guard(partial(_make_dir_once, self.root / name))
            self._prepared = True

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        self._prepare()
        stripe = blake3.blake3(key.encode()).hexdigest()[:2]
        lock = FileLock(self.root / LOCKS / stripe)
        self._guard(lambda: lock.acquire())
        try:
            yield
        finally:
            lock.release()

    def _guard(self, op: Callable[[], T]) -> T:
        """Run ``op``; a missing root or a failing disk becomes a RemoteError."""
        try:
            return op()
        except OSError as e:
            if not self.root.is_dir():
                raise BucketMissing(f"{self.url}: no such directory") from None
            what = e.strerror or type(e).__name__
            where = f" ({e.filename})" if e.filename else ""
            raise RemoteError(f"{self.url}: {what}{where}") from None

    def _write(self, key: str, data: bytes) -> str:
        def write() -> None:
            tmp = write_new(self.root / TMP, data)
            try:
                # A delete of a neighbouring key prunes a "directory" it left empty
                # (_prune_empty_parents), perhaps between ``replace`` making it again
                # and renaming into it: try again, as S3 knows no directories at all,
                # after a pause of random length, since threads that take turns for
                # the interpreter lock at each system call can otherwise lose that
                # race in step, try after try (CI once saw all sixteen lost).
                for attempt in range(PRUNE_RACE_TRIES):
                    try:
                        replace(tmp, self._path(key))
                        return
                    except FileNotFoundError:
                        if attempt == PRUNE_RACE_TRIES - 1:
                            raise
                        time.sleep(random.uniform(0, PRUNE_RACE_PAUSE * attempt))
            except BaseException:
                _unlink_if_present(Path(tmp))
                raise

        self._guard(write)
        self.stats.add(requests=1, sent=len(data))
        return content_etag(data)

    # -- RemoteStorage -----------------------------------------------------------

    def _require_root(self) -> None:
        if not self.root.is_dir():
            if self.root.exists():
                raise BucketMissing(f"{self.url}: not a directory")
            raise BucketMissing(f"{self.url}: no such directory (create it first)")

    def _check_reachable(self) -> None:
        self._require_root()
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise RemoteError(f"{self.url}: the directory is not writable by you")

    def _read(self, key: str) -> tuple[bytes, str] | None:
        def read() -> bytes | None:
            try:
                return read_file(self._path(key))
            except (FileNotFoundError, NotADirectoryError):
                return None
            except IsADirectoryError:
                return None  # a "directory" of other keys, as S3 has none: no key here

        data = self._guard(read)
        self.stats.add(requests=1, received=len(data or b""))
        if data is None:
            self._require_root()  # a missing key, or a missing remote?
            return None
        return data, content_etag(data)

    def _read_range(self, key: str, start: int, end: int) -> bytes | None:
        def read() -> bytes | None:
            try:
                fd = open_fd(self._path(key), os.O_RDONLY)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None
            try:
                return os.pread(fd, end - start, start)
            finally:
                os.close(fd)

        data = self._guard(read)
        self.stats.add(requests=1, received=len(data or b""))
        if data is None:
            self._require_root()
        return data

    def _put_if_absent(self, key: str, data: bytes) -> str | None:
        with self._locked(key):
            if self._guard(lambda: os.path.lexists(self._path(key))):
                return None
            return self._write(key, data)

    def _put_if_match(self, key: str, data: bytes, etag: str) -> str:
        with self._locked(key):
            found = self._read(key)
            if found is None or found[1] != etag:
                raise SwapFailed(self.url, key)
            return self._write(key, data)

    def _head(self, key: str) -> ObjectInfo | None:
        found = self._read(key)
        if found is None:
            return None
        try:
            st = os.stat(self._path(key))
        except FileNotFoundError:
            return None  # deleted since it was read
        return ObjectInfo(key, len(found[0]), _mtime(st), found[1])

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        # In byte order, as AWS lists ("a-b" before "a/b"): walk, then sort.
        base = prefix.rpartition("/")[0]
        found: list[tuple[str, os.stat_result]] = []

        def walk(rel: str) -> None:
            try:
                entries = list(os.scandir(self.root / rel if rel else self.root))
            except (FileNotFoundError, NotADirectoryError):
                return
            for entry in entries:
                if entry.name.startswith("."):
                    continue  # not a key: our locks and temporary files
                key = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if key.startswith(prefix) or prefix.startswith(key + "/"):
                        walk(key)
                elif key.startswith(prefix):
                    try:
                        found.append((key, entry.stat(follow_symlinks=False)))
                    except FileNotFoundError:
                        continue  # deleted since the scan: S3 leaves such a key out too

        self._require_root()
        self._guard(lambda: walk(base))
        self.stats.add(requests=1)
        for key, st in sorted(found):
            yield ObjectInfo(key, st.st_size, _mtime(st), None)

    def hidden_names(self) -> list[str]:
        self._require_root()
        names = self._guard(lambda: [entry.name for entry in os.scandir(self.root)])
        return sorted(n for n in names if n.startswith(".") and n not in NOT_OTHER_THINGS)

    def _delete(self, keys: list[str]) -> None:
        for key in keys:
            path = self._path(key)
            with self._locked(key):
                self._guard(partial(_unlink_if_present, path))
            self.stats.add(requests=1)
            self._guard(partial(_prune_empty_parents, path.parent, self.root))


PRUNE_RACE_TRIES: Final = 16
PRUNE_RACE_PAUSE: Final = 0.0005  # seconds, times the tries so far: the most of a pause


def _make_dir_once(path: Path) -> None:
    with suppress(FileExistsError):
        make_dir(path)


def _unlink_if_present(path: Path) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)


def _prune_empty_parents(directory: Path, root: Path) -> None:
    """Remove the directories a delete left empty, as S3 has no empty "directories".
    A writer that meets its directory gone makes it again (files.replace)."""
    while directory != root and root in directory.parents:
        try:
            os.rmdir(directory)
        except OSError:
            return  # not empty (or already gone): stop there
        directory = directory.parent


def _mtime(st: os.stat_result) -> datetime:
    return datetime.fromtimestamp(st.st_mtime, UTC)


__all__ = ["DirectoryStorage", "content_etag"]
