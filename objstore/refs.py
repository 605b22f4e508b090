"""Refs: named pointers, changed only by compare-and-swap, each with a reflog.

Ref names and where they live:

* ``sessions/<session id>`` -> ``refs/sessions/<id>``: a session's head node
  and its metadata;
* ``tags/<name>`` -> ``refs/tags/<name>``: a node;
* ``HEAD/<root key>`` -> ``refs/HEAD/<key>``: what a project root has checked
  out (``sessions/<id>``, or a node id when detached);
* ``remotes/<remote>/<session id>`` -> ``refs/remotes/<remote>/<id>``: a
  remote-tracking ref, the head a remote's session had when last seen (a push
  or a fetch moves it; nothing else does).

A ref file is canonical JSON and a newline: ``{"generation": N, "target": ...}``
plus fields of its own kind. ``generation`` goes up by one on every update and
never repeats for a name, deletion included.

Every update goes through ``RefStore.transact``, the one way to change a ref:

1. take the ref's lock (an ``flock`` on one of 256 striped lock files; one a
   handle's threads keep while they append, ``_Stripe``);
2. read the current value and let the caller's ``change`` decide the new one
   (a compare-and-swap raises ``RefConflict`` there);
3. write the new file into ``tmp/`` and fsync it;
4. append the reflog line and fsync it;
5. rename the file over the ref and fsync the directory;
6. unlock.

Readers take no lock: they see the old file or the new one, never a mix.

A *journaled* update (an append or a compaction: ``transact(..., journal=...)``,
which writes no reflog line) writes no ref file at all: the update is recorded
in the writer's pack, whose one fsync also covers the objects the update
points at, and that record is the ref's newest value until the pack is
sealed. Sealing writes the ref file (``replay``, the same rule recovery
applies to a pack a crash left), so the file catches up once per pack, not
once per append. A reader therefore reads a ref as the newer, by generation,
of its file and of the journaled updates in the packs not sealed yet
(``read``; the journal is looked at first, since a pack goes away only after
its refs' files are written). A missing file means the ref is absent,
whatever a journal says: creation and deletion are never journaled.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Final, Protocol

import blake3

from . import canonical, files
from .errors import InvalidName, RefConflict, StoreFormatError
from .reflog import ReflogEntry, read_reflog, unreadable_lines

SESSION_ID_RE: Final = re.compile(r"[0-9a-f]{32}")
TAG_PART_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
# A remote's name as config.json allows it (FORMAT.md 15); ".lock" endings are refused there.
REMOTE_NAME_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
LOCK_STRIPES: Final = 256
OPEN_STRIPES: Final = 16  # stripe lock files a handle keeps open between updates
OPEN_PINS: Final = 64  # ref files a handle keeps open between journaled updates
OPEN_TURNS: Final = 256  # idle per-ref turns a handle keeps (``RefStore._forget``)
MAX_LINGER: Final = 0.02
"""Seconds a handle keeps a stripe's flock after it took it, for its next updates of
refs of the stripe (``_Stripe``): another process waiting for the stripe waits at
most about this long more than it did."""

REAPER_IDLE: Final = 1.0
"""Seconds the thread that lets go of lingering flocks (``RefStore._reap_lingers``)
waits for another before it ends: one thread per handle that goes on appending, not
one for every group of appends."""

Body = dict[str, Any]
Change = Callable[["RefRecord | None"], "Body | None"]
# A ref's newest journaled update; with False, in the packs already known (no new look).
Journaled = Callable[[str, bool], "dict[str, Any] | None"]


class Journal(Protocol):
    """Where journaled ref updates are recorded: the writer's pack (ObjectStore)."""

    def journal_ref_update(self, update: dict[str, Any], *, write: bool = True) -> None: ...

    def commit(self) -> None:
        """Make the journal durable; the caller may lose its turn (turns.py) here."""


def iso_time(t: float) -> str:
    """The one time format of refs, reflogs and metadata: UTC, milliseconds; sorts as text."""
    global _last_second
    second, seconds = int(t // 1), _last_second  # one read: another thread may replace it
    if seconds[0] != second:  # formatted once a second, not once an append
        seconds = _last_second = (second, second_text(second))
    return f"{seconds[1]}.{int(t * 1000) % 1000:03d}Z"


def second_text(second: int) -> str:
    """``iso_time`` of a whole second, without the milliseconds. Years before 1000
    too have four digits (``strftime``'s ``%Y`` writes year 1 as ``1``, a time that
    no longer sorts, nor reads back)."""
    t = time.gmtime(second)
    return (
        f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}"
        f"T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
    )


_last_second: tuple[int | None, str] = (None, "")


def now_iso() -> str:
    return iso_time(time.time())


@lru_cache(maxsize=4096)
def _stripe_number(name: str) -> int:
    """Which of the LOCK_STRIPES lock files guards ref ``name`` (FORMAT.md 9); kept
    for the refs a handle updates again and again (a session it appends to)."""
    return blake3.blake3(name.encode()).digest()[0] % LOCK_STRIPES


def check_session_id(session_id: str) -> str:
    if type(session_id) is not str or not SESSION_ID_RE.fullmatch(session_id):
        raise InvalidName(f"not a session id: {session_id!r}")
    return session_id


def check_tag_name(name: str) -> str:
    """Tag names: ``/``-separated parts of letters, digits and ``._+-``, not starting with ``.``."""
    if type(name) is not str or not name:
        raise InvalidName(f"bad tag name: {name!r}")
    if len(name) > 200:
        raise InvalidName(f"bad tag name {name[:40]!r}...: {len(name):,} characters, over 200")
    parts = name.split("/")
    if not all(TAG_PART_RE.fullmatch(p) for p in parts) or name.endswith(".lock"):
        raise InvalidName(
            f"bad tag name {name!r}: use /-separated parts of letters, digits and ._+-, "
            "none empty or starting with '.', and no .lock at the end"
        )
    return name


def check_ref_name(name: str) -> str:
    """Return ``name`` if it is a valid ref name, else raise InvalidName."""
    kind, sep, rest = name.partition("/") if type(name) is str else ("", "", "")
    if sep and kind == "sessions":
        check_session_id(rest)
    elif sep and kind == "tags":
        check_tag_name(rest)
    elif not sep or not (
        (kind == "HEAD" and SESSION_ID_RE.fullmatch(rest))
        or (kind == "remotes" and _tracking_name_ok(rest))
    ):
        raise InvalidName(f"bad ref name: {name!r}")
    return name


def _tracking_name_ok(rest: str) -> bool:
    remote, sep, sid = rest.partition("/")
    return bool(
        sep
        and REMOTE_NAME_RE.fullmatch(remote)
        and not remote.endswith(".lock")
        and SESSION_ID_RE.fullmatch(sid)
    )


REF_KINDS: Final = ("sessions", "tags", "HEAD", "remotes")
"""The kinds of ref, each a directory under ``refs/`` (FORMAT.md 6)."""


def session_ref(sid: str) -> str:
    return f"sessions/{sid}"


def tag_ref(name: str) -> str:
    return f"tags/{name}"


def tracking_ref(remote: str, sid: str) -> str:
    """The remote-tracking ref of session ``sid`` on remote ``remote``."""
    return f"remotes/{remote}/{sid}"


def ref_kind(name: str) -> str:
    """``sessions``, ``tags``, ``HEAD`` or ``remotes``: the part before the first ``/``."""
    return name.partition("/")[0]


def ref_short(name: str) -> str:
    """What a ref name names within its kind: a session id, a tag name, a root key."""
    return name.partition("/")[2]


def session_of(value: str | None) -> str | None:
    """The session id a ``sessions/<id>`` value names (a session ref's name, or an
    attached HEAD's target); None for anything else."""
    if value is not None and value.startswith("sessions/"):
        return ref_short(value)
    return None


def names_node(target: str) -> bool:
    """Whether a ref target is a node id: every target without a ``/`` is (an
    attached HEAD names ``sessions/<id>`` instead)."""
    return "/" not in target


def head_ref_name(root: str) -> str:
    """The ref that holds HEAD for a project root (an absolute path)."""
    return "HEAD/" + blake3.blake3(root.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class RefRecord:
    name: str
    generation: int
    target: str | None
    body: Body = field(repr=False)


@dataclass(frozen=True, slots=True)
class _Pin:
    """A ref file kept open: its descriptor, what ``lstat`` said of it, its record, and
    the flock of its stripe it was read under (``_Stripe.taken``)."""

    fd: int
    key: tuple[int, int, int, int, int]
    record: RefRecord
    taken: int


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class _Staged:
    base_generation: int | None  # what the ref on disk was when the batch first touched it
    record: RefRecord | None
    entries: list[ReflogEntry]


_FLOCKS_TAKEN: Final = itertools.count(1)  # numbers the stripe flocks a process takes


class _Stripe:
    """One stripe's lock file, shared by the threads of a handle: flocked from the
    first of them taking it until the last lets go, and then (``leave``) kept until
    MAX_LINGER after the flock was taken, for the handle's next update of a ref of
    the stripe to take without a system call. ``holders`` (changed
    under the store's guard) counts the threads using or waiting for it, ``inside``
    (under ``_mutex``) those holding it. ``taken`` names the flock it holds (no
    other flock of the process has its number): a ref file read under the flock
    still held cannot have been replaced by another process since."""

    def __init__(self, path: Path) -> None:
        self.lock = files.FileLock(path)
        self.holders = 0
        self.inside = 0
        self.taken = 0  # which flock (``_FLOCKS_TAKEN``) it holds, or last held
        self.taken_at = 0.0
        self._mutex = threading.Lock()

    def enter(self) -> None:
        with self._mutex:  # the thread taking the flock makes the others wait for it
            if not self.inside and not self.lock.held:
                self.lock.acquire()
                self.taken = next(_FLOCKS_TAKEN)
                self.taken_at = time.monotonic()
            self.inside += 1

    def leave(self) -> bool:
        """Let go; returns whether the flock lingers (held with no thread inside)."""
        with self._mutex:
            self.inside -= 1
            if self.inside:
                return False
            if time.monotonic() - self.taken_at < MAX_LINGER:
                return True
            self.lock.unlock()
            return False

    def close(self) -> None:
        """Close the lock file (the flock with it), with no thread inside: after a
        thread that ends its linger (``end_linger``, outside the handle's guard) has
        unlocked it, not between its look at the file and the unlock (which could
        then unlock another file given the same descriptor)."""
        with self._mutex:
            self.lock.release()

    def end_linger(self) -> None:
        """Unlock the flock if it lingers."""
        with self._mutex:
            if not self.inside:
                self.lock.unlock()


def _unreadable_folder(error: OSError) -> None:
    """``os.walk``'s onerror for the folders of refs and reflogs: one that is missing
    holds no refs (none made yet, or removed since it was listed); any other error
    is raised."""
    if isinstance(error, FileNotFoundError):
        return
    raise StoreFormatError(f"{error.filename} cannot be read ({error.strerror})")


class RefStore:
    def __init__(
        self,
        root: Path,
        logs: Path,
        locks: Path,
        tmp_dir: Path,
        journaled: Journaled = lambda name, look: None,
    ) -> None:
        self.root = root
        self.journaled = journaled  # the live packs' journals (ObjectStore.journaled)
        self._root = os.fspath(root)
        self._logs = os.fspath(logs)
        self._locks = locks
        self._tmp_dir = os.fspath(tmp_dir)
        self._staged: dict[str, _Staged] | None = None
        # The threads of a handle share its stripe locks (``_Stripe``) and take turns
        # per ref name (``_ref_turns``: name -> [lock, threads using or waiting]).
        self._guard = threading.Lock()  # over the two dicts below
        self._stripe_locks: dict[int, _Stripe] = {}
        self._ref_turns: dict[str, list[Any]] = {}
        self._pins: dict[str, _Pin] = {}  # ref files kept open (``_read_pinned``)
        self._lingering: set[_Stripe] = set()  # flocks kept (under the guard)
        self._linger_due = math.inf  # when the first of them is to be let go
        # The thread that lets go of each kept flock when its time is up, while any is
        # kept (``_reap_lingers``), and when it wakes next (under the guard).
        self._reaper: threading.Thread | None = None
        self._reap_at = math.inf
        self._reap = threading.Condition(self._guard)
        self._closed = False

    # -- reading -------------------------------------------------------------

    def path(self, name: str) -> str:
        return f"{self._root}/{check_ref_name(name)}"

    def log_path(self, name: str) -> str:
        return f"{self._logs}/{check_ref_name(name)}"

    def read(
        self, name: str, *, look_for_packs: bool = True, pinned: _Stripe | None = None
    ) -> RefRecord | None:
        """The ref's value: a batch's staged one, else the newer of its file and its
        newest journaled update (module doc). ``look_for_packs=False`` takes the
        journals of the packs this handle already knows only; ``pinned``, the stripe
        whose flock the caller holds, keeps the file open to read it again by a stat,
        or by nothing while that flock is held (``_read_pinned``)."""
        if self._staged is not None and name in self._staged:
            return self._staged[name].record
        update = self.journaled(name, look_for_packs)  # before the file: see the module doc
        record = self._read_file(name) if pinned is None else self._read_pinned(name, pinned)
        if record is None or update is None or journaled_generation(update) <= record.generation:
            return record
        body = update["body"]
        if body is None:
            return None
        return RefRecord(name, int(body["generation"]), body["target"], body)

    def read_file(self, name: str) -> RefRecord | None:
        """The ref as its file holds it, whatever a batch in progress has staged."""
        return self._read_file(name)

    def _read_file(self, name: str) -> RefRecord | None:
        try:
            data = files.read_file(self.path(name))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None  # a directory of longer names (tags/t of tags/t/a) is no ref either
        except PermissionError as e:
            raise StoreFormatError(f"ref {name} cannot be read ({e.strerror})") from None
        return self._parsed(name, data)

    @staticmethod
    def _parsed(name: str, data: bytes) -> RefRecord:
        try:
            body = canonical.loads(data)
            record = RefRecord(name, int(body["generation"]), body["target"], body)
        except (ValueError, KeyError, TypeError):
            record = None
        if record is None or not (record.target is None or type(record.target) is str):
            raise StoreFormatError(f"ref {name} is unreadable")  # a target is an id, or null
        return record

    def _read_pinned(self, name: str, stripe: _Stripe) -> RefRecord | None:
        """``_read_file``, for a ref this handle updates again and again (a session it
        journals appends to): the file is kept open after a read, and the next read
        is an ``lstat`` that finds the same file unless it was replaced.

        Every writer replaces a ref file (rename, section 9 of FORMAT.md), never
        writes one in place, so a replaced file is a new inode. The open file keeps
        its inode from being freed, so its number cannot come back for another
        file: the same inode number (and size and times) means the same file,
        whatever the clock's granularity. A file read under the flock ``stripe`` still
        holds needs no stat: every writer of a ref file holds its stripe's flock, and
        this handle unpins a ref whose file it writes (``_commit``)."""
        pin = self._pins.get(name)
        if pin is not None and pin.taken == stripe.taken:
            return pin.record
        path = self.path(name)
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if pin is not None and st is not None and pin.key == _stat_key(st):
            del self._pins[name]  # most recently used last, read under this flock
            self._pins[name] = replace(pin, taken=stripe.taken)
            return pin.record
        self._unpin(name)
        try:
            fd = files.open_fd(path, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            return self._read_file(name)  # the same answer, or the same error, unpinned
        try:
            key = _stat_key(os.fstat(fd))
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            record = self._parsed(name, b"".join(chunks))
        except BaseException:
            os.close(fd)
            raise
        if len(self._pins) >= OPEN_PINS:  # bound the open files: drop the oldest
            self._unpin(next(iter(self._pins)))
        self._pins[name] = _Pin(fd, key, record, stripe.taken)
        return record

    def _unpin(self, name: str) -> None:
        pin = self._pins.pop(name, None)
        if pin is not None:
            os.close(pin.fd)

    def all_names(self) -> Iterator[str]:
        """Every ref name of every kind, unsorted."""
        for kind in REF_KINDS:
            yield from self.names(kind)

    def names(self, kind: str) -> Iterator[str]:
        """Every ref name of a kind (one of REF_KINDS), unsorted. A folder of refs that
        cannot be read is StoreFormatError, not skipped: gc would sweep what its refs
        reach, and fsck would pass the store."""
        base = self.root / kind
        seen: set[str] = set()
        for dirpath, _dirs, filenames in os.walk(base, onerror=_unreadable_folder):
            rel = os.path.relpath(dirpath, self.root)
            for fn in filenames:
                name = f"{rel}/{fn}"
                seen.add(name)
                yield name
        if self._staged:
            for name, st in self._staged.items():
                if name.startswith(kind + "/") and name not in seen and st.record:
                    yield name

    def check_tag_place(self, name: str) -> None:
        """Refuse a new tag whose file would be a folder of another tag's (``a`` beside
        ``a/b``), or sit in one: a ref is a file named by its name (FORMAT.md 6)."""
        parts = name.split("/")
        for i in range(1, len(parts)):
            above = "/".join(parts[:i])
            if os.path.isfile(self.path(tag_ref(above))):
                raise RefConflict(f"tag {name} cannot be made: tag {above} exists")
        path = self.path(tag_ref(name))
        if os.path.isdir(path):
            inside = f"tags/{name}/"
            below = next((ref_short(r) for r in self.names("tags") if r.startswith(inside)), None)
            if below is not None:
                raise RefConflict(f"tag {name} cannot be made: tag {below} exists")
            files.remove_empty_tree(path)  # folders left by a deleted a/b
        logs = self.log_path(tag_ref(name))
        if os.path.isdir(logs) and not files.remove_empty_tree(logs):
            raise RefConflict(
                f"tag {name} cannot be made: the reflogs of deleted tags inside {name}/ are "
                "kept until gc expires them"
            )

    def staged(self, kind: str) -> dict[str, RefRecord | None]:
        """The refs of a kind that the batch in progress has changed (None: deleted), by
        name; empty outside a batch."""
        prefix = kind + "/"
        return {
            name: st.record for name, st in (self._staged or {}).items() if name.startswith(prefix)
        }

    def reflog(self, name: str) -> list[ReflogEntry]:
        """The effective reflog of a ref, oldest first (see reflog.py). A ref file that
        cannot be read does not hide its log: every line is taken."""
        try:
            current = self.read(name)
        except StoreFormatError:
            current = None
        entries = read_reflog(self.log_path(name), current.generation if current else None)
        if self._staged is not None and name in self._staged:
            entries += self._staged[name].entries
        return entries

    def damaged_log_lines(self, name: str) -> list[int]:
        """The numbers of the whole reflog lines that do not parse (reflog.py)."""
        return unreadable_lines(self.log_path(name))

    def log_names(self) -> Iterator[str]:
        """The name of every ref that has a reflog file, deleted refs included (a folder
        that cannot be read is StoreFormatError, as in ``names``)."""
        for dirpath, _dirs, filenames in os.walk(self._logs, onerror=_unreadable_folder):
            rel = os.path.relpath(dirpath, self._logs)
            for fn in filenames:
                name = f"{rel}/{fn}"
                with suppress(InvalidName):
                    yield check_ref_name(name)

    def expire_reflog(self, name: str, cutoff: str, *, dry_run: bool = False) -> int:
        """Drop the reflog entries of ``name`` older than ``cutoff`` (an ISO time);
        return how many. A deleted ref whose last entry goes loses its log file."""
        with self._lock(name):
            path = self.log_path(name)
            current = self.read(name)
            entries = read_reflog(path, current.generation if current else None)
            keep = [e for e in entries if e.time >= cutoff]
            dropped = len(entries) - len(keep)
            if dropped == 0 or dry_run:
                return dropped
            if keep or current is not None:
                files.atomic_write(self._tmp_dir, path, b"".join(e.line() for e in keep))
            else:
                os.unlink(path)
                files.fsync_dir(os.path.dirname(path))
            return dropped

    def delete_reflog(self, name: str) -> None:
        """Remove a reflog file (gc, after it dropped the ref for good)."""
        with self._lock(name), suppress(FileNotFoundError):
            os.unlink(self.log_path(name))
            files.fsync_dir(os.path.dirname(self.log_path(name)))

    # -- writing -------------------------------------------------------------

    @contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        """Hold the lock of ``name`` (``_take``/``_let_go``)."""
        held = self._take(name)
        try:
            yield
        finally:
            self._let_go(name, held)

    def _take(self, name: str) -> tuple[_Stripe, list[Any]]:
        """Take the lock of ``name``: in this handle, its turn among the threads updating
        it; between processes, the flock of its stripe, which the handle's threads
        share. (Each thread with a lock file of its own made threads updating
        different refs of one stripe wait for each other, for as long as an
        append waits for its fsync, and every other thread behind them.)"""
        number = _stripe_number(name)
        with self._guard:
            turn = self._ref_turns.get(name)
            if turn is None:
                turn = self._ref_turns[name] = [threading.RLock(), 0]
            turn[1] += 1
            stripe = self._stripe_locks.pop(number, None)
            if stripe is None:
                stripe = _Stripe(self._locks / f"ref-{number:02x}")
                if len(self._stripe_locks) >= OPEN_STRIPES:  # bound the open files
                    idle = next((n for n, o in self._stripe_locks.items() if not o.holders), None)
                    if idle is not None:
                        self._stripe_locks.pop(idle).close()
            self._stripe_locks[number] = stripe  # most recently used last
            stripe.holders += 1  # kept open until let go
        try:
            turn[0].acquire()
            try:
                stripe.enter()
            except BaseException:
                turn[0].release()
                raise
        except BaseException:
            self._forget(name, stripe, turn)
            raise
        return stripe, turn

    def _let_go(self, name: str, held: tuple[_Stripe, list[Any]]) -> None:
        """Let go of the lock ``_take`` took. The stripe's flock lingers (``_Stripe``),
        for the next update of a ref of the stripe (the next append to a session) to
        take without two system calls, and without the stat of a pinned ref
        (``_read_pinned``); the handle's threads let go of each lingering flock when
        its time is up, and the reaper (``_reap_lingers``) does when they do not.

        (A flock that lingered only while other updates were in progress, the last
        to end letting go of all, was taken again by nearly every append: threads
        appending through one handle have their updates made in groups
        (combining.py), and every group ended. 8 threads x 1,000 appends made
        15,300 ``flock`` calls and 9,500 stats so, 2,500 and 3,100 now.)"""
        stripe, turn = held
        try:
            if stripe.leave():
                with self._guard:
                    if stripe not in self._lingering:
                        self._lingering.add(stripe)
                        due = stripe.taken_at + MAX_LINGER
                        self._linger_due = min(self._linger_due, due)
                        self._wake_reaper(due)
        finally:
            turn[0].release()
            self._forget(name, stripe, turn)

    def _forget(self, name: str, stripe: _Stripe, turn: list[Any]) -> None:
        with self._guard:
            stripe.holders -= 1
            turn[1] -= 1
            # An idle ref's turn is kept for its next update (a session appended to
            # again and again), up to OPEN_TURNS of them: not a lock made per append.
            if not turn[1] and len(self._ref_turns) > OPEN_TURNS:
                del self._ref_turns[name]
            ending = self._ended_lingers()
        for lingering in ending:
            lingering.end_linger()

    def _ended_lingers(self) -> list[_Stripe]:
        """The lingering flocks to let go of now, those held MAX_LINGER or more, taken
        out of ``_lingering`` (under the guard)."""
        now = time.monotonic()
        if now < self._linger_due:  # (math.inf when none lingers)
            return []
        ending = [s for s in self._lingering if s.taken_at + MAX_LINGER <= now]
        self._lingering.difference_update(ending)
        due = (s.taken_at + MAX_LINGER for s in self._lingering)
        self._linger_due = min(due, default=math.inf)
        return ending

    def _wake_reaper(self, due: float) -> None:
        """Have the reaper wake by ``due``, when a flock that now lingers is to be let
        go (under the guard): start it, or wake it if it would sleep longer."""
        if self._reaper is None:
            if not self._closed:
                self._reaper = threading.Thread(
                    target=self._reap_lingers, name="ags-ref-lingers", daemon=True
                )
                self._reaper.start()
        elif due < self._reap_at:
            self._reap.notify()

    def _reap_lingers(self) -> None:
        """The reaper: lets go of each lingering flock when its time is up, when no
        update of the handle does (an agent waiting for its model). It ends when the
        handle closes, or when no flock has lingered for REAPER_IDLE (a handle never
        closed keeps no thread)."""
        with self._guard:
            try:
                while not self._closed:
                    ending = self._ended_lingers()
                    if ending:
                        self._guard.release()
                        try:
                            for lingering in ending:
                                lingering.end_linger()
                        finally:
                            self._guard.acquire()
                    elif self._lingering:
                        self._reap_at = self._linger_due
                        self._reap.wait(self._reap_at - time.monotonic())
                    else:
                        self._reap_at = math.inf
                        if not self._reap.wait(REAPER_IDLE) and not self._lingering:
                            break
            finally:  # (even on an error: the next flock to linger starts another)
                self._reap_at = math.inf
                self._reaper = None

    def transact(
        self,
        name: str,
        reason: str,
        change: Change,
        *,
        journal: Journal | None = None,
        log: bool = True,
        until_durable: list[Callable[[], None]] | None = None,
    ) -> RefRecord | None:
        """Update one ref atomically; ``change(current)`` returns the new body or None to delete.

        ``change`` runs under the ref's lock; it raises (``RefConflict`` for a
        failed compare-and-swap) to leave the ref as it is. Returning the
        current body unchanged writes nothing. With a ``journal`` the update
        is journaled (see the module doc); inside a batch it is staged.
        ``log=False`` writes no reflog line (an append: the parent chain is its
        history, FORMAT.md 7).

        ``until_durable`` (appends written together, combining.py): a journaled update
        is held in the pack, not written nor made durable here, and what lets go of
        the ref's lock is added to the list, for the caller to run (in this thread)
        once the update is durable.
        """
        check_ref_name(name)
        held = self._take(name)
        kept = False
        try:
            # A journaled update is made under the session's writer lock (Store), taken
            # with a fresh look: no pack this handle does not know can have journaled
            # the ref since, so the pack directory is not listed again. Its file
            # changes only if another process updates the ref (a retitle): a stat
            # tells (``_read_pinned``).
            journaled = journal is not None and self._staged is None
            current = self.read(
                name, look_for_packs=not journaled, pinned=held[0] if journaled else None
            )
            body = change(current)
            if current is not None and body is current.body:
                return current
            if current is None and body is None:
                return None
            gen = (current.generation if current else self._last_logged_gen(name)) + 1
            record = None
            if body is not None:
                body = {**body, "generation": gen}
                record = RefRecord(name, gen, body.get("target"), body)
            # A creation is not logged: the first value is in the ref itself (a
            # fork's also in its metadata), so a new ref costs one file, not two.
            entries = []
            if current is not None and log:
                target = record.target if record else None
                entries.append(ReflogEntry(current.target, target, gen, now_iso(), reason))
            if self._staged is not None:
                st = self._staged.get(name)
                if st is None:
                    st = self._staged[name] = _Staged(
                        current.generation if current else None, None, []
                    )
                st.record = record
                st.entries += entries
            elif journal is not None and current is not None and record is not None and not log:
                # No file, no rename: the pack's record is the ref until the pack is
                # sealed, and its one fsync makes the objects and the update durable.
                update = {"body": record.body, "log": None, "ref": name}
                if until_durable is None:
                    journal.journal_ref_update(update)
                    journal.commit()
                else:
                    journal.journal_ref_update(update, write=False)
                    until_durable.append(partial(self._let_go, name, held))
                    kept = True
            else:
                self._commit(name, self._write_file(record, durable=True), entries, durable=True)
            return record
        finally:
            if not kept:
                self._let_go(name, held)

    def _generation(self, name: str) -> int:
        """The generation of the ref's file (0 if missing or unreadable), read without
        its lock: a hint for ``replay``."""
        try:
            record = self._read_file(name)
        except StoreFormatError:
            return 0
        return record.generation if record is not None else 0

    def _last_logged_gen(self, name: str) -> int:
        entries = read_reflog(self.log_path(name), None)
        return max((e.gen for e in entries), default=0)

    def _write_file(self, record: RefRecord | None, *, durable: bool) -> str | None:
        """Step 3: the new ref file, in ``tmp/`` (None when the ref is being deleted)."""
        if record is None:
            return None
        return files.write_new(self._tmp_dir, canonical.dumps(record.body) + b"\n", durable=durable)

    def _commit(
        self,
        name: str,
        tmp: str | None,
        entries: list[ReflogEntry],
        *,
        durable: bool,
    ) -> None:
        """Steps 4-5, with the lock held: log the update, then put the new file in place
        (a pin of the old one is let go: ``_read_pinned`` would not stat it)."""
        self._unpin(name)
        path = self.path(name)
        try:
            if entries:
                files.append_line(
                    self.log_path(name), b"".join(e.line() for e in entries), durable=durable
                )
            if tmp is not None:
                files.replace(tmp, path, durable=durable)
        except BaseException:
            if tmp is not None:
                with suppress(FileNotFoundError):  # (gone if the rename was done)
                    os.unlink(tmp)
            raise
        if tmp is None:
            with suppress(FileNotFoundError):
                os.unlink(path)
            if durable:
                files.fsync_dir(os.path.dirname(path))
            if ref_kind(name) == "tags":  # the folders of a tag a/b (a tag a may be made)
                files.remove_empty_dirs(os.path.dirname(path), stop=f"{self._root}/tags")

    def compare_and_swap(
        self, name: str, expected: str | None, target: str | None, reason: str
    ) -> RefRecord | None:
        """Point ``name`` at ``target`` if it now points at ``expected`` (None: absent).

        ``target`` None deletes the ref. Other fields of the body are kept.
        """

        def change(current: RefRecord | None) -> Body | None:
            have = current.target if current else None
            if have != expected or (current is None and expected is not None):
                raise RefConflict(f"ref {name} is at {have}, not {expected}")
            if target is None:
                return None
            return {**(current.body if current else {}), "target": target}

        return self.transact(name, reason, change)

    # -- batches -------------------------------------------------------------

    def begin_batch(self) -> None:
        self._staged = {}

    def end_batch(self, before_refs: Callable[[], None]) -> None:
        """Write every staged ref: new files synced, then renamed, then directories synced.

        ``before_refs`` runs first (the store syncs its objects there), so a
        ref never becomes durable before what it points at. A batch is not
        atomic across refs: a conflict on one ref leaves those before it written.
        """
        staged, self._staged = self._staged or {}, None
        if not staged:
            return
        before_refs()
        tmps = {name: self._write_file(st.record, durable=False) for name, st in staged.items()}
        files.sync_paths(t for t in tmps.values() if t is not None)
        touched: list[str] = []
        try:
            for name, st in staged.items():
                with self._lock(name):
                    disk = self.read(name)  # the batch is over: file and journals
                    if (disk.generation if disk else None) != st.base_generation:
                        raise RefConflict(f"ref {name} changed while a batch was writing it")
                    self._commit(name, tmps.pop(name), st.entries, durable=False)
                touched += [self.path(name), self.log_path(name)]
        finally:
            for tmp in tmps.values():
                if tmp is not None:
                    os.unlink(tmp)
            files.sync_paths(touched)

    def abort_batch(self) -> None:
        self._staged = None

    # -- recovery --------------------------------------------------------------

    def replay(self, updates: list[dict[str, Any]]) -> None:
        """Bring ref files up to the journaled updates of a pack, oldest first: what a
        writer does when it seals its pack, and recovery for a pack a crash left.

        An update is applied only if the ref file is older (lower generation)
        or unreadable. A missing ref file means the ref was deleted after the
        update (creation and deletion are never journaled), so nothing is
        applied. A file another writer moved past the pack's updates is left
        as it is.
        """
        by_ref: dict[str, list[dict[str, Any]]] = {}
        for update in updates:
            try:
                name = check_ref_name(update["ref"])
                journaled_generation(update)
            except (KeyError, TypeError, ValueError, InvalidName):
                continue
            by_ref.setdefault(name, []).append(update)
        # Each ref's newest value is written to tmp/ first and all of them synced
        # together (where the file system commits them at once, as ext4 does, one
        # commit for all rather than two fsyncs per ref), then put in place under
        # the ref's lock where the ref file is older, and each directory synced once.
        # A ref whose file is up to date already (a recovery after a plain kill -9)
        # gets no file: a replay that has nothing to do writes nothing.
        ready: dict[str, str] = {}
        try:
            for name, items in by_ref.items():
                body = items[-1]["body"]  # the newest: a pack journals a ref in order
                if body is not None and journaled_generation(items[-1]) > self._generation(name):
                    data = canonical.dumps(body) + b"\n"
                    ready[name] = files.write_new(self._tmp_dir, data, durable=False)
            files.sync_paths(ready.values())
            moved: set[str] = set()
            for name, items in by_ref.items():
                tmp = ready.pop(name, None)
                with self._lock(name):
                    if self._replay_one(name, items, tmp):
                        moved.add(os.path.dirname(self.path(name)))
                    elif tmp is not None:
                        os.unlink(tmp)
            for directory in moved:
                files.fsync_dir(directory)
        finally:
            for tmp in ready.values():
                with suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _replay_one(self, name: str, items: list[dict[str, Any]], tmp: str | None) -> bool:
        """Bring one ref up to ``items``, its updates in the pack; ``tmp``: the last
        one's file, synced (None for a deletion, or where the ref file was up to date
        when ``replay`` looked). Returns whether it put ``tmp`` in place (or removed
        the ref), with the ref's directory still to sync."""
        logged = read_reflog(self.log_path(name), None)
        logged_gens = {e.gen for e in logged}
        newer: list[dict[str, Any]] = []
        if os.path.lexists(self.path(name)):
            try:
                current = self._read_file(name)
                have = current.generation if current else 0
            except StoreFormatError:
                have = 0  # torn by a power loss: any journaled value is better
            newer = [u for u in items if journaled_generation(u) > have]
            limit = max([have, *(journaled_generation(u) for u in newer)])
        else:
            limit = max(logged_gens, default=0)  # deleted since: restore lines up to the delete
        # The rename of a ref file can survive a power loss that its unsynced
        # reflog line does not: restore every journaled line the log lacks.
        lines = [
            ReflogEntry(log["old"], log["new"], int(log["gen"]), log["time"], log["reason"])
            for log in (u["log"] for u in items if u["log"] is not None)
            if int(log["gen"]) not in logged_gens and int(log["gen"]) <= limit
        ]
        if not newer:
            if lines:
                files.append_line(self.log_path(name), b"".join(e.line() for e in lines))
            return False
        if newer[-1] is not items[-1] or (tmp is None and newer[-1]["body"] is not None):
            # Generations out of order (not ags's writing), or the file moved back
            # since ``replay`` looked: written here, alone.
            body = newer[-1]["body"]
            record = None
            if body is not None:
                record = RefRecord(name, int(body["generation"]), body.get("target"), body)
            self._commit(name, self._write_file(record, durable=True), lines, durable=True)
            return False
        # Reflog lines to restore are synced here (rare: a plain append logs none).
        self._commit(name, tmp, lines, durable=bool(lines))
        return True

    def close(self) -> None:
        with self._guard:
            self._closed = True
            self._reap.notify()
            reaper = self._reaper
        if reaper is not None and reaper is not threading.current_thread():
            reaper.join()  # it may be unlocking, outside the guard
        for name in list(self._pins):
            self._unpin(name)
        with self._guard:
            self._lingering.clear()
            self._linger_due = math.inf
            for number, stripe in list(self._stripe_locks.items()):
                if not stripe.holders:
                    del self._stripe_locks[number]
                    stripe.close()


def journaled_generation(update: dict[str, Any]) -> int:
    """The generation a journaled update gave its ref: its reflog line's, or, for an
    update that writes none (an append), its body's (FORMAT.md 5.1)."""
    log = update["log"]
    return int(log["gen"] if log is not None else update["body"]["generation"])
