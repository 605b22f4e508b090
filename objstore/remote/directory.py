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
Files are created 0600 and directories 0700: a remote holds the same
conversations as the store.

Nothing inside the directory is followed out of it. A key's folders are
opened one part at a time from the root, each relative to the one above it
and never through a symbolic link (``_Folders``), and the key itself is
opened the same way, so a link planted for ``packs``, ``refs/tags`` or a
pack is refused with its name, before anything is read or written, and no
check can be raced by swapping a folder for a link after it. Only regular
files are read: a FIFO in a key's place is refused, never waited on.
"""

from __future__ import annotations

import errno
import os
import random
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

import blake3

from ..files import DIR_MODE, FileLock, make_dir, read_all, write_new
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

    def _prepare(self) -> None:
        """Make ``.ags-locks`` and ``.ags-tmp`` before the first write, one level deep
        only: a remote whose disk is not mounted must not be made on the disk below."""
        with self._prepare_lock:
            if self._prepared:
                return
            self._check_reachable()
            for name in (LOCKS, TMP):
                self._guard(partial(_make_dir_once, self.root / name))
                if not stat.S_ISDIR(self._guard(partial(os.lstat, self.root / name)).st_mode):
                    raise RemoteError(f"{self.url}: {name} is not a folder (a link?): remove it")
            self._guard(partial(_remove_stale, self.root / TMP, time.time() - STALE_TMP_S))
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
            missing = self._root_missing()
            if missing is not None:
                raise missing from None
            what = e.strerror or type(e).__name__
            where = f" ({e.filename})" if e.filename else ""
            raise RemoteError(f"{self.url}: {what}{where}") from None

    def _folders(self, key: str, *, make: bool = False) -> _Folders:
        return _Folders(self.url, self.root, key.split("/")[:-1], make)

    def _write(self, key: str, data: bytes) -> str:
        name = key.rpartition("/")[2]

        def write() -> None:
            tmp = write_new(self.root / TMP, data)
            try:
                # A delete of a neighbouring key prunes a "directory" it left empty
                # (_Folders.prune), perhaps between this making it again and renaming
                # into it: try again, as S3 knows no directories at all, after a pause
                # of random length, since threads that take turns for the interpreter
                # lock at each system call can otherwise lose that race in step, try
                # after try (CI once saw all sixteen lost).
                for attempt in range(PRUNE_RACE_TRIES):
                    try:
                        with self._folders(key, make=True) as folders:
                            os.rename(tmp, name, dst_dir_fd=folders.fd)
                            folders.sync()
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

    def _read_key(self, key: str, read: Callable[[int], T]) -> tuple[T, os.stat_result] | None:
        """``read`` of the key's file and what fstat says of it, or None if there is no
        such key (nothing there, or a "directory" of other keys, as S3 has none)."""

        def run() -> tuple[T, os.stat_result] | None:
            with self._folders(key) as folders:
                if folders.fd is None:
                    return None
                fd = folders.open_file(key)
                if fd is None:
                    return None
            try:
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    return None
                if not stat.S_ISREG(st.st_mode):
                    raise RemoteError(f"{self.url}: {key} is not a regular file")
                return read(fd), st
            finally:
                os.close(fd)

        found = self._guard(run)
        if found is None:
            self._require_root()  # a missing key, or a missing remote?
        return found

    # -- RemoteStorage -----------------------------------------------------------

    def _root_missing(self, hint: str = "") -> BucketMissing | None:
        """Why the remote's directory is not there (a file in its place, or nothing)."""
        if self.root.is_dir():
            return None
        if self.root.exists():
            return BucketMissing(f"{self.url}: not a directory")
        return BucketMissing(f"{self.url}: no such directory{hint}")

    def _require_root(self) -> None:
        missing = self._root_missing(" (create it first)")
        if missing is not None:
            raise missing

    def _check_reachable(self) -> None:
        self._require_root()
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise RemoteError(f"{self.url}: the directory is not writable by you")

    def _read(self, key: str) -> tuple[bytes, str] | None:
        found = self._read_key(key, read_all)
        self.stats.add(requests=1, received=len(found[0]) if found else 0)
        return (found[0], content_etag(found[0])) if found else None

    def _read_range(self, key: str, start: int, end: int) -> bytes | None:
        found = self._read_key(key, lambda fd: os.pread(fd, end - start, start))
        self.stats.add(requests=1, received=len(found[0]) if found else 0)
        return found[0] if found else None

    def _put_if_absent(self, key: str, data: bytes) -> str | None:
        with self._locked(key):
            if self._guard(partial(self._exists, key)):
                return None
            return self._write(key, data)

    def _exists(self, key: str) -> bool:
        with self._folders(key) as folders:
            if folders.fd is None:
                return False
            try:
                os.stat(key.rpartition("/")[2], dir_fd=folders.fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            return True

    def _put_if_match(self, key: str, data: bytes, etag: str) -> str:
        with self._locked(key):
            found = self._read(key)
            if found is None or found[1] != etag:
                raise SwapFailed(self.url, key)
            return self._write(key, data)

    def _head(self, key: str) -> ObjectInfo | None:
        found = self._read_key(key, read_all)
        self.stats.add(requests=1, received=len(found[0]) if found else 0)
        if found is None:
            return None
        data, st = found
        return ObjectInfo(key, len(data), _mtime(st), content_etag(data))

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        # In byte order, as AWS lists ("a-b" before "a/b"): walk, then sort.
        base = prefix.rpartition("/")[0]
        found: list[tuple[str, os.stat_result]] = []

        def walk(rel: str, fd: int) -> None:
            with os.scandir(fd) as scan:
                entries = list(scan)
            for entry in entries:
                if entry.name.startswith("."):
                    continue  # not a key: our locks and temporary files
                key = f"{rel}/{entry.name}" if rel else entry.name
                inside = key.startswith(prefix) or prefix.startswith(key + "/")
                if inside and entry.is_symlink():
                    raise RemoteError(f"{self.url}: {key} is a symbolic link, never followed")
                if entry.is_dir(follow_symlinks=False):
                    if inside:
                        try:
                            sub = os.open(entry.name, _FOLDER, dir_fd=fd)
                        except FileNotFoundError:
                            continue  # deleted since the scan
                        except NotADirectoryError:  # (a link put there since the scan)
                            raise RemoteError(f"{self.url}: {key} is not a folder now") from None
                        try:
                            walk(key, sub)
                        finally:
                            os.close(sub)
                elif key.startswith(prefix):
                    try:
                        found.append((key, entry.stat(follow_symlinks=False)))
                    except FileNotFoundError:
                        continue  # deleted since the scan: S3 leaves such a key out too

        def run() -> None:
            with _Folders(self.url, self.root, base.split("/") if base else [], False) as top:
                if top.blocked is not None:  # no key ags writes is a file there
                    raise RemoteError(
                        f"{self.url}: {top.blocked} is a file where a folder should be"
                    )
                if top.fd is not None:
                    walk(base, top.fd)

        self._require_root()
        self._guard(run)
        self.stats.add(requests=1)
        for key, st in sorted(found):
            yield ObjectInfo(key, st.st_size, _mtime(st), None)

    def hidden_names(self) -> list[str]:
        self._require_root()
        names = self._guard(lambda: [entry.name for entry in os.scandir(self.root)])
        return sorted(n for n in names if n.startswith(".") and n not in NOT_OTHER_THINGS)

    def _delete(self, keys: list[str]) -> None:
        for key in keys:
            with self._locked(key):
                self._guard(partial(self._remove, key))
            self.stats.add(requests=1)
            self._guard(partial(self._prune, key))

    def _remove(self, key: str) -> None:
        with self._folders(key) as folders:
            if folders.fd is not None:
                with suppress(FileNotFoundError):
                    os.unlink(key.rpartition("/")[2], dir_fd=folders.fd)

    def _prune(self, key: str) -> None:
        """Remove the "directories" above a deleted key that are empty now, as S3 has
        no empty ones (a writer that meets its directory gone makes it again)."""
        with self._folders(key) as folders:
            if folders.fd is not None:
                folders.prune()


PRUNE_RACE_TRIES: Final = 16
PRUNE_RACE_PAUSE: Final = 0.0005  # seconds, times the tries so far: the most of a pause


STALE_TMP_S: Final = 3600.0
"""A file in ``.ags-tmp`` this old was left by a writer that was killed (a write
renames its file within moments): the first write of a later command removes it.
Before, each killed push left its partial pack there for good."""


def _remove_stale(folder: Path, before: float) -> None:
    with os.scandir(folder) as entries:
        for entry in entries:
            with suppress(FileNotFoundError):  # (another writer removed it first)
                if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < before:
                    os.unlink(entry.path)


def _make_dir_once(path: Path) -> None:
    with suppress(FileExistsError):
        make_dir(path)


def _unlink_if_present(path: Path) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)


class _Folders:
    """The folders from a remote's root down to ``parts``, each opened relative to
    the one above it, never through a symbolic link: a link, or a file where a
    folder should be, is refused by name (a RemoteError). A missing folder is made
    (``make``, mode 0700) or leaves ``fd`` None: the key is not there."""

    def __init__(self, url: str, root: Path, parts: list[str], make: bool) -> None:
        self.url = url
        self.parts = parts
        self.fd: int | None = None  # the last folder's, once every part is open
        self.fds: list[int] = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
        self.made: list[int] = []  # the descriptors of folders something was made in
        self.blocked: str | None = None  # a file found where a folder should be
        try:
            for part in parts:
                fd = self._open(part, make)
                if fd is None:
                    return
                self.fds.append(fd)
        except BaseException:
            self.close()
            raise
        self.fd = self.fds[-1]

    def _open(self, part: str, make: bool) -> int | None:
        above = self.fds[-1]
        while True:
            try:
                return os.open(part, _FOLDER, dir_fd=above)
            except FileNotFoundError:
                if not make:
                    return None
            except NotADirectoryError:
                where = "/".join(self.parts[: len(self.fds)])
                st = os.stat(part, dir_fd=above, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise RemoteError(
                        f"{self.url}: {where} is a symbolic link, never followed"
                    ) from None
                if make:  # a write: S3 could, a directory cannot
                    raise RemoteError(
                        f"{self.url}: {where} is a file where a folder should be"
                    ) from None
                self.blocked = where
                return None  # a read: no key below a file, as S3 has it
            with suppress(FileExistsError):
                os.mkdir(part, DIR_MODE, dir_fd=above)
                fd = os.open(part, _FOLDER, dir_fd=above)
                os.fchmod(fd, DIR_MODE)  # the umask may have taken the owner's bits
                self.made.append(above)
                return fd

    def open_file(self, key: str) -> int | None:
        """The key's file opened for reading (a FIFO is not waited on), or None."""
        assert self.fd is not None
        try:
            return os.open(key.rpartition("/")[2], _FILE, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise RemoteError(f"{self.url}: {key} is a symbolic link, never followed") from None
            raise

    def sync(self) -> None:
        """Make a rename into the last folder durable, with every folder made for it."""
        assert self.fd is not None
        os.fsync(self.fd)
        for fd in reversed(self.made):
            os.fsync(fd)

    def prune(self) -> None:
        """Remove the folders from the last upward while they are empty."""
        for at in range(len(self.parts), 0, -1):
            try:
                os.rmdir(self.parts[at - 1], dir_fd=self.fds[at - 1])
            except OSError:
                return  # not empty (or already gone): stop there

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def __enter__(self) -> _Folders:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_FOLDER: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _mtime(st: os.stat_result) -> datetime:
    return datetime.fromtimestamp(st.st_mtime, UTC)


__all__ = ["DirectoryStorage", "content_etag"]
