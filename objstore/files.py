"""Durable file primitives: how ags creates, replaces and appends to files.

(Packs, append-only files with one writer, sync themselves: packs.py.)

The atomic-replace protocol, used for loose objects, ref files and pack
indexes alike:

1. write the new content to a fresh file in the store's ``tmp/`` directory;
2. ``fsync`` it;
3. ``rename`` it over the destination (atomic: a reader sees the old file or
   the new one, never a mix);
4. ``fsync`` the destination's directory, so the rename itself survives a
   power loss.

``durable=False`` skips the two syncs; the caller then promises a later
``sync_paths`` (bulk work syncs once at the end).

Every file of a store is opened here, through ``open_fd``: never through a
symbolic link (``O_NOFOLLOW``; a planted link is refused, not followed), and
created with mode 0600 (directories 0700) whatever the umask, since sessions
hold conversations and tool output.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import Final

from . import forks
from .errors import InvalidInput, UnsafeStore

# Plain strings on the hot path (an append touches several files): pathlib's
# object churn costs more than the system calls it wraps.
StrPath = str | os.PathLike[str]
Data = bytes | Iterable[bytes | bytearray]  # a file's bytes, whole or in pieces

FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700
_NO_LINKS: Final = os.O_NOFOLLOW | os.O_CLOEXEC


def planted_link(path: StrPath) -> UnsafeStore:
    return UnsafeStore(
        f"{os.fspath(path)} is a symbolic link; ags never follows links inside a store "
        "(someone who can write to the store may have planted it): remove it"
    )


def open_fd(path: StrPath, flags: int) -> int:
    """Open a store file, never through a symbolic link. A file this call creates
    (``O_CREAT``) gets mode 0600 exactly: the umask can only take bits away, and
    here it must not take the owner's. A file that exists keeps its mode (in a
    store shared on purpose it may belong to another user)."""
    if flags & os.O_CREAT and not flags & os.O_EXCL:
        while True:
            try:
                return open_fd(path, flags & ~os.O_CREAT)
            except FileNotFoundError:
                pass
            try:
                return open_fd(path, flags | os.O_EXCL)
            except FileExistsError:
                continue  # another process created it meanwhile: open theirs
    try:
        fd = os.open(path, flags | _NO_LINKS, FILE_MODE)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise planted_link(path) from None
        raise
    if flags & os.O_CREAT:
        try:
            os.fchmod(fd, FILE_MODE)
        except BaseException:
            os.close(fd)
            raise
    return fd


def read_file(path: StrPath) -> bytes:
    """The whole content of a store file (FileNotFoundError if there is none)."""
    fd = open_fd(path, os.O_RDONLY)
    try:
        return read_all(fd)
    finally:
        os.close(fd)


def read_all(fd: int) -> bytes:
    """What is left to read of an open file."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def fsync_dir(path: StrPath) -> None:
    fd = open_fd(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir(path: StrPath) -> None:
    """Create one directory with mode 0700 exactly (FileExistsError if it exists)."""
    os.mkdir(path, DIR_MODE)
    fd = open_fd(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fchmod(fd, DIR_MODE)  # the umask may have taken the owner's bits
    finally:
        os.close(fd)


def make_dirs(path: StrPath, *, durable: bool = True) -> list[str]:
    """Create a directory and any missing parents; sync the entry of each one created.
    Returns the directories it created, outermost first."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return []
    made = make_dirs(os.path.dirname(path), durable=durable)
    try:
        make_dir(path)
    except FileExistsError:
        return made
    if durable:
        fsync_dir(os.path.dirname(path))
    return [*made, path]


def write_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of the file (``pwrite`` may write less)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def write_new(
    tmp_dir: StrPath, data: Data, *, durable: bool = True, around: tuple[str, str] = ("", "")
) -> str:
    """Write ``data`` (bytes, or pieces of them in order) to a new uniquely named file
    in ``tmp_dir``, ``<pid>-<16 hex digits>`` between the two parts of ``around``;
    return its path."""
    tmp = f"{os.fspath(tmp_dir)}/{around[0]}{os.getpid()}-{secrets.token_hex(8)}{around[1]}"
    try:
        fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileNotFoundError:  # someone took tmp/ for a place to clean: make it again
        make_dirs(tmp_dir)
        fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        written = 0
        for piece in [data] if isinstance(data, bytes | bytearray) else data:
            write_all(fd, piece, written)
            written += len(piece)
        if durable:
            os.fsync(fd)
        elif _START_WRITEBACK is not None:
            # Start writing it now: ext4 makes a rename over an existing file wait
            # for the new file's data (auto_da_alloc), and an append renames its ref
            # after its pack's fsync, which this write then overlaps.
            os.posix_fadvise(fd, 0, 0, _START_WRITEBACK)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


_START_WRITEBACK: Final = getattr(os, "POSIX_FADV_DONTNEED", None)


def replace(tmp: StrPath, dest: StrPath, *, durable: bool = True) -> None:
    """Rename ``tmp`` over ``dest`` and, if durable, sync ``dest``'s directory. Missing
    directories on the way are made first and synced after the rename, once ``dest``
    is in them: an empty directory is what another writer may remove (a directory
    remote's delete prunes those it empties), and an fsync before the rename kept
    it empty for that long."""
    parent = os.path.dirname(dest)
    made: list[str] = []
    try:
        os.rename(tmp, dest)
    except FileNotFoundError:
        made = make_dirs(parent, durable=False)
        os.rename(tmp, dest)
    if durable:
        fsync_dir(parent)
        for directory in reversed(made):  # the entry of each directory made
            fsync_dir(os.path.dirname(directory))


def atomic_write(
    tmp_dir: StrPath,
    dest: StrPath,
    data: Data,
    *,
    durable: bool = True,
    around: tuple[str, str] = ("", ""),
) -> None:
    """The whole protocol: ``dest`` holds ``data`` afterwards, or is unchanged (and no
    temporary file is left: a rename refused, by a directory others cannot write
    to or a directory where ``dest`` would be, is not left for gc to find)."""
    tmp = write_new(tmp_dir, data, durable=durable, around=around)
    try:
        replace(tmp, dest, durable=durable)
    except BaseException:
        with suppress(FileNotFoundError):  # (gone if the rename was done)
            os.unlink(tmp)
        raise


def remove_empty_dirs(path: StrPath, stop: StrPath) -> None:
    """Remove the directory ``path``, then each parent of it below ``stop``, while they
    are empty: what deleting the last file in them leaves (a tag ``a/b``)."""
    path, stop = os.path.abspath(path), os.path.abspath(stop)
    while path.startswith(stop + os.sep):
        try:
            os.rmdir(path)
        except OSError:  # not empty, or gone already
            return
        path = os.path.dirname(path)


def remove_empty_tree(path: StrPath) -> bool:
    """Remove the directory ``path`` if it holds only directories, bottom up; return
    whether it is gone."""
    for directory, _subdirs, _files in os.walk(path, topdown=False):
        with suppress(OSError):  # one holding a file stays, and so do its parents
            os.rmdir(directory)
    return not os.path.lexists(path)


def write_private_file(dest: StrPath, data: bytes) -> None:
    """Write ``data`` to ``dest``, outside any store (an export), as a new 0600 file
    renamed over the old one, so a reader never sees half of it.

    Only a regular file (or nothing) is replaced: a symbolic link, a FIFO or a
    device at ``dest`` is refused, as renaming over it would silently turn it
    into a plain file and writing into it would send the data elsewhere.

    The new file is written beside ``dest`` as ``.<name>.<pid>-<hex>.tmp``, a name
    that says whose it is: a writer killed before its rename leaves it there
    (nothing can remove it then), and the next write to ``dest`` removes each
    such file whose process has ended (``_remove_dead_writers``).
    """
    dest = os.path.abspath(dest)
    try:
        st = os.lstat(dest)
    except (FileNotFoundError, NotADirectoryError):  # the folder is checked next
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            what = _FILE_TYPES.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise InvalidInput(f"refusing to write to {dest}: it is {what} (give a regular file)")
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise InvalidInput(f"cannot write {dest}: {parent} is not a folder")
        raise InvalidInput(f"cannot write {dest}: no folder {parent}")
    folder, name = os.path.split(dest)
    _remove_dead_writers(folder, name)
    atomic_write(folder, dest, data, around=(f".{name}.", ".tmp"))


def _remove_dead_writers(folder: str, name: str) -> None:
    """Remove the temporary files of earlier writes to ``folder/name`` whose process
    has ended (``write_private_file``). One whose process runs, or may (a process
    of another user), is left alone: it may be a write under way."""
    pattern = re.compile(re.escape(f".{name}.") + r"([0-9]+)-[0-9a-f]{16}\.tmp")
    try:
        entries = os.listdir(folder)
    except OSError:
        return  # the write itself names what is wrong with the folder
    for entry in entries:
        match = pattern.fullmatch(entry)
        if match and not _process_runs(int(match[1])):
            with suppress(OSError):
                os.unlink(os.path.join(folder, entry))


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's, or not a pid this system can have: not ours to judge
    return True


_FILE_TYPES: Final = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def append_line(path: StrPath, line: bytes, *, durable: bool = True) -> None:
    """Append whole lines to a log file in a single write, creating it if needed.

    Lines are only ever written whole, so a file that does not end in a
    newline ends in a fragment torn by a crash (or zeros a power loss left).
    The fragment is cut off first; otherwise it would swallow this line.
    """
    created = False
    try:
        fd = open_fd(path, os.O_RDWR | os.O_APPEND)
    except FileNotFoundError:
        make_dirs(os.path.dirname(path), durable=durable)
        fd = open_fd(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        created = True
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.ftruncate(fd, _end_of_last_line(fd, size))
        os.write(fd, line)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if created and durable:
        fsync_dir(os.path.dirname(path))  # the new file's name must survive too


def _end_of_last_line(fd: int, size: int) -> int:
    """Offset just after the last newline in the first ``size`` bytes (0 if none)."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        cut = os.pread(fd, end - start, start).rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        end = start
    return 0


def sync_paths(files: Iterable[StrPath]) -> None:
    """fsync each file and each directory holding one: the end of a bulk write."""
    dirs: set[str] = set()
    for path in files:
        dirs.add(os.path.dirname(path))  # a deleted file's directory needs its sync too
        try:
            fd = open_fd(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in dirs:
        with suppress(FileNotFoundError):  # a log never written (a creation is not logged)
            fsync_dir(d)


def read_only_file_system(path: StrPath) -> bool:
    """Whether ``path`` is on a file system mounted read-only (a backup, a snapshot)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class FileLock:
    """An OS advisory lock (``flock``) on one file, released by a crash.

    ``flock`` locks belong to an open file, so two ``FileLock`` objects on one
    path exclude each other even inside one process; a child of a fork closes
    its copy of the file, and holds none of its parent's locks (forks.py).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._locked = False

    @property
    def held(self) -> bool:
        return self._locked

    def acquire(self, *, blocking: bool = True) -> bool:
        """Take the lock; with ``blocking=False`` return False if it is held elsewhere."""
        if self._locked:
            return True
        fd = self._fd
        if fd is None:
            try:
                fd = open_fd(self.path, os.O_RDWR | os.O_CREAT)
            except FileNotFoundError:
                make_dirs(self.path.parent)
                fd = open_fd(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            if self._fd is None:
                os.close(fd)
            return False
        except BaseException:
            if self._fd is None:
                os.close(fd)
            raise
        if self._fd is None:
            forks.track(self)
        self._fd = fd
        self._locked = True
        return True

    def unlock(self) -> None:
        """Drop the lock but keep the file open, so the next ``acquire`` is one system call."""
        if self._locked and self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._locked = False

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"lock {self.path} is not held")
        return self._fd

    def release(self) -> None:
        """Drop the lock and close the file."""
        forks.untrack(self)
        self._close()  # closing the only descriptor drops the flock

    def forget_in_child(self) -> None:
        """In a child of a fork: close this copy of the file; the parent's lock holds."""
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._locked = False
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
