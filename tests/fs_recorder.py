"""Record the file-system calls a process makes under one directory, and rebuild
from the record what a power cut at any point would have left on the disk.

The recorder wraps the ``os`` functions ags writes with (``open``, ``write``,
``pwrite``, ``ftruncate``, ``fsync``, ``rename``/``replace``, ``unlink``,
``mkdir``): each call runs for real and is logged, with the bytes written.
Marks (``Recorder.mark``) put the program's own events in the same order,
such as "this append was acknowledged".

The disk model (``PowerCut``) follows what POSIX promises and real file
systems deliver, and no more:

* a file's data survives only up to its last ``fsync`` that has returned: what
  was written before that fsync began survives, later writes and truncations
  are lost (``"zeros"`` keeps the later length, filled with zeros, as XFS can
  after a crash); an fsync still running when the power goes promises
  nothing, so a cut between an fsync's start and its return (``"synced"``)
  keeps the file as the fsync before it left it;
* a name change (a creation, rename, unlink or mkdir) survives once the
  directory that holds the new name (for an unlink, the old one) is
  fsynced (that fsync having returned); before that it may or may not have
  happened, each independently of the others: a state applies the pending
  ones a subset chooses;
* a file in a directory whose creation did not survive is gone.

Inodes are tracked by identity, not by path, so a file renamed before or
after its fsync keeps its data, and a reused inode number is a new file.
"""

from __future__ import annotations

import os
import pickle
import random
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Op = tuple[Any, ...]

_WRAPPED = ("open", "write", "pwrite", "ftruncate", "fsync", "rename", "replace", "unlink",
            "remove", "mkdir", "close")  # fmt: skip


class Recorder:
    """Log every write-side file-system call under ``root`` made through ``os``."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.abspath(root)
        self.ops: list[Op] = []
        self._real = {name: getattr(os, name) for name in _WRAPPED}
        self._fds: dict[int, tuple[str, Any]] = {}  # fd -> ("file", inode id) / ("dir", path)
        self._inodes: dict[tuple[int, int], int] = {}  # (dev, ino) -> inode id
        self._next_id = 0
        self._next_sync = 0

    # -- installing --------------------------------------------------------------

    def install(self) -> None:
        for name in _WRAPPED:
            setattr(os, name, getattr(self, f"_{name}"))

    def uninstall(self) -> None:
        for name, fn in self._real.items():
            setattr(os, name, fn)

    def mark(self, *event: Any) -> None:
        self.ops.append(("mark", *event))

    def dump(self, path: Path) -> None:
        with open(path, "wb") as f:
            pickle.dump(self.ops, f)

    # -- helpers -----------------------------------------------------------------

    def _inside(self, path: Any) -> str | None:
        p = os.path.abspath(os.fspath(path))
        return p if p == self.root or p.startswith(self.root + "/") else None

    def _new_inode(self, st: os.stat_result) -> int:
        self._next_id += 1
        self._inodes[(st.st_dev, st.st_ino)] = self._next_id
        return self._next_id

    def _inode(self, st: os.stat_result) -> int:
        key = (st.st_dev, st.st_ino)
        return self._inodes[key] if key in self._inodes else self._new_inode(st)

    # -- the wrapped calls -------------------------------------------------------

    def _open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        where = self._inside(path) if dir_fd is None else None
        existed = where is not None and os.path.lexists(where)
        fd: int = self._real["open"](path, flags, mode, dir_fd=dir_fd)
        if where is None:
            return fd
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            self._fds[fd] = ("dir", where)
            return fd
        if flags & os.O_CREAT and not existed:
            inode = self._new_inode(st)
            self.ops.append(("link", where, inode))
        else:
            inode = self._inode(st)
        self._fds[fd] = ("file", inode, bool(flags & os.O_APPEND))
        if flags & os.O_TRUNC:
            self.ops.append(("truncate", inode, 0))
        return fd

    def _write(self, fd: int, data: Any) -> int:
        entry = self._fds.get(fd)
        if entry is None:
            return int(self._real["write"](fd, data))
        offset = os.fstat(fd).st_size if entry[2] else os.lseek(fd, 0, os.SEEK_CUR)
        n = int(self._real["write"](fd, data))
        self.ops.append(("write", entry[1], offset, bytes(memoryview(data)[:n])))
        return n

    def _pwrite(self, fd: int, data: Any, offset: int) -> int:
        n = int(self._real["pwrite"](fd, data, offset))
        entry = self._fds.get(fd)
        if entry is not None:
            self.ops.append(("write", entry[1], offset, bytes(memoryview(data)[:n])))
        return n

    def _ftruncate(self, fd: int, size: int) -> None:
        self._real["ftruncate"](fd, size)
        entry = self._fds.get(fd)
        if entry is not None:
            self.ops.append(("truncate", entry[1], size))

    def _fsync(self, fd: int) -> None:
        # Recorded as it starts (what it covers: another thread's write during it is not
        # covered) and as it returns (when that is durable: not while it runs).
        entry = self._fds.get(fd)
        op = None
        if entry is not None:
            self._next_sync += 1
            kind = "fsync_dir" if entry[0] == "dir" else "fsync"
            op = (kind, entry[1], self._next_sync)
            self.ops.append(op)
        try:
            self._real["fsync"](fd)
        except BaseException:
            if op is not None:
                self.ops.remove(op)
            raise
        if op is not None:
            self.ops.append(("synced", op[2]))

    def _close(self, fd: int) -> None:
        self._fds.pop(fd, None)
        self._real["close"](fd)

    def _rename(self, src: Any, dst: Any, **kw: Any) -> None:
        s, d = self._inside(src), self._inside(dst)
        inode = self._inode(os.lstat(src)) if s and d else None
        self._real["rename"](src, dst, **kw)
        if inode is not None:
            self.ops.append(("rename", s, d, inode))

    def _replace(self, src: Any, dst: Any, **kw: Any) -> None:
        self._rename(src, dst, **kw)

    def _unlink(self, path: Any, **kw: Any) -> None:
        p = self._inside(path)
        inode = self._inode(os.lstat(path)) if p else None
        self._real["unlink"](path, **kw)
        if p:
            self.ops.append(("unlink", p, inode))

    def _remove(self, path: Any, **kw: Any) -> None:
        self._unlink(path, **kw)

    def _mkdir(self, path: Any, mode: int = 0o777, **kw: Any) -> None:
        self._real["mkdir"](path, mode, **kw)
        p = self._inside(path)
        if p:
            self.ops.append(("mkdir", p))


def _parent(path: str) -> str:
    return os.path.dirname(path)


def _commits(op: Op, directory: str) -> bool:
    """Whether an fsync of ``directory`` makes the name change ``op`` durable."""
    kind = op[0]
    if kind in ("link", "mkdir", "unlink"):
        return _parent(op[1]) == directory
    return kind == "rename" and _parent(op[2]) == directory


@dataclass
class DiskState:
    """What the disk holds at one point of a record."""

    files: dict[str, bytes]  # path -> content
    dirs: set[str]
    marks: list[tuple[Any, ...]]  # the marks made before the point
    pending: int  # name changes not yet made durable


@dataclass
class PowerCut:
    """Replays a record up to a point and builds the disk states a power cut leaves."""

    ops: list[Op]
    root: str

    @classmethod
    def load(cls, record: Path, root: Path) -> PowerCut:
        with open(record, "rb") as f:
            return cls(pickle.load(f), os.path.abspath(root))

    def points(self) -> list[int]:
        """Op indexes worth cutting at (state before op i): before every sync starts and
        returns, rename and unlink, and right after every mark."""
        out = {len(self.ops)}
        for i, op in enumerate(self.ops):
            if op[0] in ("fsync", "fsync_dir", "synced", "rename", "unlink"):
                out.add(i)
            elif op[0] == "mark":
                out.add(i + 1)
        return sorted(out)

    def states(self, point: int, variants: Iterable[str], rng: random.Random) -> list[DiskState]:
        """The disk states of a power cut before op ``point``, one per variant:
        ``none`` / ``all`` pending name changes applied, ``some`` a random subset;
        data as synced (``zeros``: also the unsynced length, as zeros)."""
        synced: dict[int, bytes] = {}
        synced_from: dict[int, int] = {}  # inode -> the start (op index) of its fsync
        running: dict[int, tuple[int, Any]] = {}  # fsyncs started, not returned
        current: dict[int, bytearray] = {}
        durable: list[tuple[int, Op]] = []  # name changes, with their place in the record
        pending: list[tuple[int, Op]] = []
        marks = []
        for i, op in enumerate(self.ops[:point]):
            kind = op[0]
            if kind == "mark":
                marks.append(op[1:])
            elif kind == "link":
                current[op[2]] = bytearray()
                synced.setdefault(op[2], b"")
                pending.append((i, op))
            elif kind in ("rename", "unlink", "mkdir"):
                pending.append((i, op))
            elif kind == "write":
                data = current.setdefault(op[1], bytearray())
                end = op[2] + len(op[3])
                if len(data) < op[2]:
                    data.extend(b"\0" * (op[2] - len(data)))
                data[op[2] : end] = op[3]
            elif kind == "truncate":
                data = current.setdefault(op[1], bytearray())
                del data[op[2] :]
                data.extend(b"\0" * (op[2] - len(data)))
            elif kind == "fsync":
                running[op[2]] = (i, (op[1], bytes(current.get(op[1], b""))))
            elif kind == "fsync_dir":
                running[op[2]] = (i, [p for p in pending if _commits(p[1], op[1])])
            elif kind == "synced":
                started, what = running.pop(op[1])
                if isinstance(what, list):  # a directory's: the changes made before it
                    durable += [p for p in what if p in pending]
                    pending = [p for p in pending if p not in what]
                elif started > synced_from.get(what[0], -1):  # not behind a newer fsync
                    synced[what[0]], synced_from[what[0]] = what[1], started
        out = []
        for variant in variants:
            if variant.startswith("none"):
                chosen: list[tuple[int, Op]] = []
            elif variant.startswith("some"):
                chosen = [p for p in pending if rng.random() < 0.5]
            else:
                chosen = pending
            names: dict[str, int] = {}
            dirs = {self.root}
            for _i, op in sorted(durable + chosen, key=lambda p: p[0]):
                kind = op[0]
                if kind == "link":
                    names[op[1]] = op[2]
                elif kind == "mkdir":
                    dirs.add(op[1])
                elif kind == "rename":
                    if names.get(op[1]) == op[3]:
                        del names[op[1]]
                    names[op[2]] = op[3]
                elif kind == "unlink" and names.get(op[1]) == op[2]:
                    del names[op[1]]
            files = {}
            for path, inode in names.items():
                if not all(d in dirs for d in _ancestors(path, self.root)):
                    continue  # its directory never reached the disk
                data = synced.get(inode, b"")
                if variant.endswith("zeros"):
                    data += b"\0" * max(0, len(current.get(inode, b"")) - len(data))
                files[path] = data
            out.append(DiskState(files, dirs, marks, len(pending)))
        return out

    def materialize(self, state: DiskState, dest: Path) -> Path:
        """Write ``state`` under ``dest``; return where the recorded root now is."""
        for d in sorted(state.dirs):
            if all(a in state.dirs for a in _ancestors(d, self.root)):
                (dest / os.path.relpath(d, self.root)).mkdir(parents=True, exist_ok=True)
        for path, data in state.files.items():
            target = dest / os.path.relpath(path, self.root)
            target.write_bytes(data)
            os.chmod(target, 0o600)
        for d in sorted(state.dirs, reverse=True):
            p = dest / os.path.relpath(d, self.root)
            if p.exists():
                os.chmod(p, 0o700)
        return dest


def _ancestors(path: str, root: str) -> list[str]:
    """The directories from ``root`` down to ``path``'s parent."""
    out = []
    d = _parent(path)
    while len(d) >= len(root):
        out.append(d)
        if d == root:
            break
        d = _parent(d)
    return out
