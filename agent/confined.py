"""Files beneath one directory, reached so that nothing outside it can be.

:class:`ConfinedFS` is the only way the agent's file tools touch the project.
Its guarantee: **every file it reads, writes, lists or removes is beneath the
directory it was opened on, whatever another process does to the tree
meanwhile.** The sandbox shares the project read-write, so a command there can
swap any directory for a symlink at any moment; checking a path and then
opening it (the time-of-check / time-of-use race) would let it point the open
at a host file. So nothing is ever opened by a path string:

* The root directory is opened once; its fd is the anchor of every walk.
* A path is walked one component at a time, each opened relative to the fd of
  the directory before it (``openat``) with ``O_NOFOLLOW``, so the kernel never
  follows a symlink on our behalf. ``..`` steps back to the fd the walk came
  from, and stepping back past the root is refused.
* A symlink met on the way is read (``readlinkat``) and its target walked the
  same way, from the directory that holds it (a relative target) or from the
  root (an absolute target that names the root by one of its aliases: its own
  path, or ``/workspace`` as the sandbox sees it). Any other absolute target,
  or a ``..`` that climbs out, is :class:`OutsideRoot`. At most
  :data:`MAX_SYMLINKS` links per path, as the kernel allows.
* Reads open the last component with ``O_NOFOLLOW | O_NONBLOCK`` and accept
  only a regular file (checked with ``fstat`` on the open fd): a FIFO or a
  device never blocks or wakes, and a symlink swapped in at the last moment
  fails the open rather than being followed.
* Writes go to a temporary file created with ``O_CREAT | O_EXCL |
  O_NOFOLLOW`` in the target's directory (by fd), fsynced, then renamed over
  the target with both ends relative to that same directory fd. A reader sees
  the old or the new content, never a torn one; ``rename`` replaces a symlink
  swapped in at the target rather than following it. The new file keeps the
  replaced file's mode, and, when this process is root, its owner; a new file
  or directory made by a root process gets the root directory's owner, so the
  person who owns the project can still change what the tools made.
* Listings read directories from fds, never entering a symlink.

Races can still make a call fail (a directory vanishes under it); they can
never make it reach outside. Hard links are not symlinks: a file hard-linked
from outside is the same file inside, but nothing in the sandbox can make one
(the project is its own mount there, and links do not cross mounts).

Errors: :class:`OutsideRoot`, :class:`InvalidPath`, :class:`NotRegularFile` and
:class:`FileTooLarge` (all :class:`ConfinedError`, an ``AgsError``); everything else is the
``OSError`` the system gave (``FileNotFoundError``, ``IsADirectoryError``,
``PermissionError``...).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import secrets
import stat
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import BinaryIO

# The file tools' errors live with every other agent error; callers import them here too.
from agent.errors import ConfinedError as ConfinedError
from agent.errors import FileTooLarge as FileTooLarge
from agent.errors import InvalidPath as InvalidPath
from agent.errors import NotRegularFile as NotRegularFile
from agent.errors import OutsideRoot as OutsideRoot

MAX_SYMLINKS = 40
"""Symlinks followed in one path, as Linux's path walk allows."""

MAX_DEPTH = 256
"""Directories one walk may hold open at once (the depth of a path below the root)."""

MAX_PATH = 4096
"""Bytes of a path as given (PATH_MAX)."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# What open(..., O_NOFOLLOW) gives for a symlink: ELOOP, or ENOTDIR with
# O_DIRECTORY on Linux, EMLINK on FreeBSD.
_LINK_ERRNOS = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EMLINK})
# A component that turned into a symlink between the walk and the open: walk again.
_RETRIES = 8


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a listing: its path from the root, and whether it is a directory.

    A symlink is never a directory here, whatever it points at.
    """

    path: str
    is_dir: bool


@dataclass(frozen=True, slots=True)
class Written:
    """What :meth:`ConfinedFS.write_bytes` did: the file's path from the root
    (symlinks on the way resolved) and whether it was created or replaced."""

    path: str
    created: bool


class _Spot:
    """Where a walk ended: the open directories from the root down (fds), their
    names, and the last component (None when the path names a directory)."""

    __slots__ = ("fds", "names", "last")

    def __init__(self, fds: list[int], names: list[str], last: str | None) -> None:
        self.fds = fds
        self.names = names
        self.last = last

    @property
    def dir_fd(self) -> int:
        return self.fds[-1]

    def path(self) -> str:
        parts = self.names + ([self.last] if self.last is not None else [])
        return "/".join(parts) or "."

    def close(self) -> None:
        for fd in self.fds[1:]:  # fds[0] is the root's, which the ConfinedFS owns
            os.close(fd)
        self.fds[1:] = []


class ConfinedFS:
    """Reads, writes, lists and removes files beneath ``root`` and nowhere else.

    Paths are relative to the root, or absolute under one of its ``aliases``
    (the root's own absolute path always is one). Open it once and close it
    (or use it as a context manager); a dropped one closes its fd when
    collected.
    """

    def __init__(self, root: str | Path, *, aliases: Sequence[str] = ()) -> None:
        self.root = Path(os.path.realpath(root))
        self._fd = os.open(self.root, _DIR)  # the root itself: a symlink here is an error
        self._close = weakref.finalize(self, os.close, self._fd)
        self.aliases = tuple(PurePosixPath(a) for a in dict.fromkeys([str(self.root), *aliases]))
        root_stat = os.fstat(self._fd)
        # Who new files belong to when this process is root (see the module docstring).
        self._owner = (root_stat.st_uid, root_stat.st_gid) if os.geteuid() == 0 else None

    def close(self) -> None:
        self._close()

    def __enter__(self) -> ConfinedFS:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- reading

    def open_file(self, path: str) -> BinaryIO:
        """A regular file beneath the root, open for reading (binary, unbuffered).

        :class:`NotRegularFile` for a FIFO, device or socket (never opened in a
        way that blocks or wakes it); ``IsADirectoryError`` for a directory.
        """
        for _ in range(_RETRIES):
            spot = self._walk(path, follow_last=True)
            try:
                if spot.last is None:
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
                before = os.stat(spot.last, dir_fd=spot.dir_fd, follow_symlinks=False)
                if stat.S_ISLNK(before.st_mode):
                    continue  # made a symlink since the walk: walk it again
                _require_regular(path, before.st_mode)
                try:
                    fd = os.open(spot.last, _READ, dir_fd=spot.dir_fd)
                except OSError as exc:
                    if exc.errno in _LINK_ERRNOS:
                        continue
                    raise
                try:
                    _require_regular(path, os.fstat(fd).st_mode)
                    os.set_blocking(fd, True)
                except BaseException:
                    os.close(fd)
                    raise
                return open(fd, "rb", buffering=0, closefd=True)
            finally:
                spot.close()
        raise _changing(path)

    def read_bytes(self, path: str, limit: int) -> bytes:
        """The whole content of a regular file, or :class:`FileTooLarge` past ``limit`` bytes."""
        with self.open_file(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise FileTooLarge(path, size, limit)
            data = f.read(limit + 1)  # the size can grow after the fstat
            if len(data) > limit:
                raise FileTooLarge(path, max(size, len(data)), limit)
            return data

    def kind(self, path: str, *, follow_last: bool = True) -> str | None:
        """``"file"``, ``"dir"``, ``"other"`` for what ``path`` names (symlinks
        followed within the root), or None when nothing is there. With
        ``follow_last`` False a symlink as the last component is ``"link"``,
        wherever it points (symlinks before it are still followed)."""
        try:
            spot = self._walk(path, follow_last=follow_last)
        except FileNotFoundError:
            return None
        try:
            if spot.last is None:
                return "dir"
            try:
                mode = os.stat(spot.last, dir_fd=spot.dir_fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                return None
            if stat.S_ISLNK(mode):
                return "link"
            if stat.S_ISDIR(mode):
                return "dir"
            return "file" if stat.S_ISREG(mode) else "other"
        finally:
            spot.close()

    def resolve(self, path: str) -> str:
        """``path`` as a path from the root with every symlink resolved (``"."``
        for the root); the last component need not exist."""
        spot = self._walk(path, follow_last=True)
        try:
            return spot.path()
        finally:
            spot.close()

    # -- writing

    def write_bytes(self, path: str, data: bytes, *, make_parents: bool = True) -> Written:
        """Replace or create the file at ``path`` with ``data``, atomically.

        Missing directories on the way are made when ``make_parents``. A
        symlink at ``path`` is followed (within the root) and its target
        written; a directory or a special file there is an error.
        """
        for _ in range(_RETRIES):
            spot = self._walk(path, follow_last=True, make_parents=make_parents)
            try:
                if spot.last is None:
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
                try:
                    old: os.stat_result | None = os.stat(
                        spot.last, dir_fd=spot.dir_fd, follow_symlinks=False
                    )
                except FileNotFoundError:
                    old = None
                if old is not None:
                    if stat.S_ISLNK(old.st_mode):
                        continue  # made a symlink since the walk: walk it again
                    if stat.S_ISDIR(old.st_mode):
                        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
                    _require_regular(path, old.st_mode)
                self._replace(spot.dir_fd, spot.last, data, old)
                return Written(spot.path(), created=old is None)
            finally:
                spot.close()
        raise _changing(path)

    def remove(self, path: str) -> None:
        """Remove the file or symlink at ``path`` (a symlink itself, not its target)."""
        spot = self._walk(path, follow_last=False)
        try:
            if spot.last is None:
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            os.unlink(spot.last, dir_fd=spot.dir_fd)
        finally:
            spot.close()

    def _replace(self, dir_fd: int, name: str, data: bytes, old: os.stat_result | None) -> None:
        temp = f".{name[:200]}.{secrets.token_hex(6)}.ags-tmp"
        fd = os.open(temp, _CREATE, 0o666, dir_fd=dir_fd)
        try:
            try:
                owner = (old.st_uid, old.st_gid) if old is not None else self._owner
                if owner is not None and os.geteuid() == 0:
                    os.fchown(fd, *owner)
                if old is not None:  # set-id bits are not carried over to new content
                    os.fchmod(fd, stat.S_IMODE(old.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            # rename never follows `name`: a symlink swapped in there is replaced, not used.
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise

    # -- listing

    def walk(
        self, path: str, *, recursive: bool, limit: int, skip: frozenset[str] = frozenset()
    ) -> Iterator[Entry | None]:
        """The entries of the directory at ``path`` in sorted order, depth first
        when ``recursive``; names in ``skip`` are left out, symlinks are not
        entered, and directories deeper than :data:`MAX_DEPTH` are not either.

        Yields at most ``limit`` entries, then None if there were more. Memory
        stays bounded by ``limit`` however large a directory is.
        """
        spot = self._walk(path, follow_last=True)
        try:
            if spot.last is not None:
                os.stat(spot.last, dir_fd=spot.dir_fd, follow_symlinks=False)  # missing?
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            top = os.open(".", _DIR, dir_fd=spot.dir_fd)
            prefix = "" if spot.path() == "." else spot.path() + "/"
        except OSError as exc:
            raise _named(exc, path) from None
        finally:
            spot.close()
        yield from _listing(top, prefix, recursive, limit, skip)

    # -- the walk

    def _walk(self, path: str, *, follow_last: bool, make_parents: bool = False) -> _Spot:
        """Open each directory of ``path`` in turn from the root (see the module docstring)."""
        if not path or "\0" in path:
            raise InvalidPath("path is empty or contains a NUL character")
        try:
            size = len(path.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:
            raise InvalidPath(f"path {path!r} holds a character no file name can") from None
        if size > MAX_PATH:
            raise InvalidPath(f"path {path[:60]!r}... is {size} bytes, more than {MAX_PATH}")
        pending = self._parts(path, path)
        spot = _Spot([self._fd], [], None)
        links = 0
        try:
            while pending:
                name = pending.pop()
                if name in ("", "."):
                    continue
                if name == "..":
                    if len(spot.fds) == 1:
                        raise OutsideRoot(path)
                    os.close(spot.fds.pop())
                    spot.names.pop()
                    continue
                last = not pending
                if last and not follow_last:
                    spot.last = name
                    return spot
                if len(spot.fds) > MAX_DEPTH:
                    raise OSError(errno.ENAMETOOLONG, f"deeper than {MAX_DEPTH} directories", path)
                try:
                    fd = os.open(name, _DIR, dir_fd=spot.dir_fd)
                except OSError as exc:
                    target = _link_target(spot.dir_fd, name, exc)
                    if target is None:
                        if exc.errno == errno.ENOENT and make_parents and not last:
                            _make_dir(spot.dir_fd, name, self._owner)
                            pending.append(name)  # and open it, by the same rules
                            continue
                        if last and exc.errno in (errno.ENOENT, errno.ENOTDIR):
                            spot.last = name  # a file, or nothing yet: the caller decides
                            return spot
                        raise
                    links += 1
                    if links > MAX_SYMLINKS:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path) from None
                    if target.startswith("/"):
                        while len(spot.fds) > 1:  # an absolute target starts at the root again
                            os.close(spot.fds.pop())
                            spot.names.pop()
                    pending.extend(self._parts(target, path))
                    continue
                spot.fds.append(fd)
                spot.names.append(name)
            return spot
        except OSError as exc:
            spot.close()
            raise _named(exc, path) from None
        except BaseException:
            spot.close()
            raise

    def _parts(self, path: str, given: str) -> list[str]:
        """The components of ``path`` to walk from where the walk is, last first
        (a stack); an absolute path must start with an alias of the root."""
        pure = PurePosixPath(path)
        if pure.is_absolute():
            for alias in self.aliases:
                if pure == alias or alias in pure.parents:
                    # Lexical on purpose: what follows (`..` included) is walked by the same rules.
                    return list(pure.relative_to(alias).parts)[::-1]
            raise OutsideRoot(given)
        return path.split("/")[::-1]


def _listing(
    top: int, prefix: str, recursive: bool, limit: int, skip: frozenset[str]
) -> Iterator[Entry | None]:
    """Depth-first sorted entries from the open directory ``top`` (closed at the end)."""
    budget = limit
    # Each level: its fd, its path prefix, and its chosen entries not yet yielded.
    stack: list[tuple[int, str, list[tuple[str, bool]]]] = []
    try:
        stack.append((top, prefix, _smallest(top, budget + 1, skip)))
        while stack:
            fd, at, todo = stack[-1]
            if not todo:
                os.close(fd)
                stack.pop()
                continue
            name, is_dir = todo.pop()
            if budget == 0:
                yield None
                return
            budget -= 1
            yield Entry(at + name, is_dir)
            if recursive and is_dir and len(stack) < MAX_DEPTH:
                try:
                    child = os.open(name, _DIR, dir_fd=fd)
                except OSError:
                    continue  # gone, swapped for a symlink, unreadable: not entered
                try:
                    chosen = _smallest(child, budget + 1, skip)
                except OSError:
                    os.close(child)
                    continue
                stack.append((child, f"{at}{name}/", chosen))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _smallest(fd: int, count: int, skip: frozenset[str]) -> list[tuple[str, bool]]:
    """The first ``count`` entries of a directory by name, as a stack (last first)."""
    with os.scandir(fd) as it:
        chosen = heapq.nsmallest(
            count,
            ((e.name, e.is_dir(follow_symlinks=False)) for e in it if e.name not in skip),
        )
    chosen.reverse()
    return chosen


def _link_target(dir_fd: int, name: str, failure: OSError) -> str | None:
    """The target of the symlink ``name`` whose open failed with ``failure``,
    or None when ``name`` is not a symlink."""
    if failure.errno not in _LINK_ERRNOS:
        return None
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOENT):
            return None  # not a symlink (or gone): the first failure stands
        raise


def _make_dir(dir_fd: int, name: str, owner: tuple[int, int] | None) -> None:
    try:
        os.mkdir(name, 0o777, dir_fd=dir_fd)
    except FileExistsError:
        return  # made meanwhile: the walk opens whatever is there, by its rules
    if owner is None:
        return
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    except OSError:
        return  # swapped already; the walk will see what it is
    try:
        os.fchown(fd, *owner)
    finally:
        os.close(fd)


def _require_regular(path: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    kind = (
        "FIFO"
        if stat.S_ISFIFO(mode)
        else "socket"
        if stat.S_ISSOCK(mode)
        else "device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "special file"
    )
    raise NotRegularFile(path, kind)


def _named(exc: OSError, path: str) -> OSError:
    """``exc`` naming the path as the caller gave it, not the component that failed."""
    if exc.filename == path:
        return exc
    return OSError(exc.errno, exc.strerror or os.strerror(exc.errno or 0), path)


def _changing(path: str) -> OSError:
    return OSError(errno.EAGAIN, "it kept changing while being opened; try again", path)
