"""The Store: sessions, their history and their refs, over objects and refs.

This is the public API other tools build on::

    store = Store.open()                       # $AGS_STORE, else ~/.ags
    sid = store.new_session(title="fix the build", root="/src/app")
    store.append(sid, {"role": "user", "content": "hi"})
    store.context(sid)                         # what the model sees
    fork = store.fork(f"{sid}~1")              # O(1), copies nothing

Names: a method that takes ``spec`` resolves what a user typed (a session id
or prefix, ``HEAD``, a tag, ``~N``, ``@{N}``): ``target(spec)`` gives the node
and the session, ``node_id(spec)`` only the node, ``session_id(spec)`` only the
session; ``context``, ``log``, ``state_at``, ``walk`` read history there.
``node(node_id)`` and ``blob(blob_id)`` read one object by its id.

A handle may be shared between threads: its operations take turns (turns.py),
a batch has the handle to itself until it ends, and what one thread appends
is durable when its call returns, as from one thread. The first append to a session takes
the session's writer lock, and the handle keeps it until ``release`` or
``close``; ``with store.writing(sid):`` holds it for a block instead. A
handle dropped without ``close`` is closed when it is collected (its pack
sealed, its locks released), not when the process exits.
"""

from __future__ import annotations

import inspect
import os
import secrets
import stat
import threading
import warnings
import weakref
from collections.abc import Callable, Collection, Container, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Final

from . import canonical, forks
from .block_reader import BlockReader
from .combining import AppendQueue, QueuedAppend
from .errors import (
    CorruptObject,
    InvalidInput,
    InvalidName,
    LimitExceeded,
    NothingCheckedOut,
    RefConflict,
    SessionArchived,
    StoreFormatError,
    StoreMissing,
    StoreWarning,
    UnknownSpec,
)
from .file_paths import check_file_path
from .files import (
    DIR_MODE,
    FileLock,
    atomic_write,
    make_dirs,
    read_file,
    read_only_file_system,
)
from .limits import MAX_DEPTH, MAX_FILES_PER_NODE, MAX_OBJECT_BYTES
from .listing import UPDATED, ListingIndex
from .locks import WriterLock
from .nodes import SPAN_EVERY, FileChange, Node, NodeType, Span, encode_node, parse_node
from .object_store import BlockStaging, ObjectStore, SweepResult
from .packs import Checked, SealedPack
from .permissions import check_store_access, shared_allowed
from .reflog import ReflogEntry
from .refs import (
    SESSION_ID_RE,
    Body,
    RefRecord,
    RefStore,
    check_session_id,
    check_tag_name,
    head_ref_name,
    names_node,
    now_iso,
    ref_short,
    session_ref,
    tag_ref,
    tracking_ref,
)
from .resolve import Resolver, RootPath, Target, project_root
from .session_meta import MAX_TEXT, is_time, is_title
from .specs import HEX_PREFIX, parse_spec
from .turns import Turns, one_at_a_time
from .walk import context_blobs, last_message_nodes, open_span, walk

FORMAT_NAME: Final = "ags-store"
# 2: block packs (FORMAT.md 5.5); 3: file objects and nodes' ``files`` (4.3); 4: heads
# kept in a pack's journal until it is sealed (9); 5: blocks in the array layout, 6: in
# the MessagePack layout (5.5). A store is created at 2 and raised when it first needs
# more (FORMAT.md 2).
FORMAT_VERSION: Final = 6
CREATED_VERSION: Final = 2
# Raised before the first block pack is written: any block may be in the MessagePack
# layout (FORMAT.md 5.5), which an ags of store version 5 would call corrupt.
BLOCKS_VERSION: Final = 6
FILES_VERSION: Final = 3
JOURNAL_VERSION: Final = 4  # heads kept in a pack's journal until it is sealed
CONFIG_FILE: Final = "ags-store.json"
JOBS: Final = frozenset({"import", "fetch"})  # what ``Store.one_at_a_time`` runs one at a time
LAYOUT: Final = frozenset({CONFIG_FILE, "objects", "refs", "logs", "locks", "tmp", "cache"})
META_DEPTH: Final = MAX_DEPTH - 1  # a node's meta sits one level inside the node
# The keys of a session ref's "meta" (FORMAT.md 6.1), each also a SessionInfo field.
META_FIELDS: Final = (
    "title", "created", "updated", "archived_at", "root", "forked_from", "model", "messages",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session as listed: its ref's metadata."""

    id: str
    title: str | None
    created: str
    updated: str
    messages: int
    root: str | None
    archived_at: str | None
    forked_from: dict[str, Any] | None
    model: str | None
    head: str | None
    # Where an importer took the session from (FORMAT.md 6.1 ``imported``), or None.
    imported: dict[str, Any] | None = None

    @property
    def archived(self) -> bool:
        return self.archived_at is not None


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One node of a transcript with its message (for a compaction: the summary)."""

    node: Node
    message: Any = field(compare=False)

    @property
    def id(self) -> str:
        return self.node.id


SESSION_FIELDS: Final = tuple(f.name for f in fields(SessionInfo))
ARCHIVED_AT: Final = SESSION_FIELDS.index("archived_at")
assert SESSION_FIELDS[UPDATED] == "updated"  # the listing index sorts its rows by it


def new_session_id() -> str:
    # Random, not time-ordered: a short prefix must tell sessions apart, as with Git's hashes.
    return secrets.token_hex(16)


_META_TYPES: Final = {
    "title": (str, type(None)),
    "created": (str,),
    "updated": (str,),
    "archived_at": (str, type(None)),
    "root": (str, type(None)),
    "forked_from": (dict, type(None)),
    "model": (str, type(None)),
}


def session_info(rec: RefRecord) -> SessionInfo:
    """A session ref's metadata, checked: a damaged field is a StoreFormatError that
    names the ref and the field, never a traceback."""
    meta = rec.body.get("meta", {})
    if not isinstance(meta, dict):
        raise StoreFormatError(f"ref {rec.name} is damaged: its meta is not an object")
    for key, types in _META_TYPES.items():
        if key in meta and not isinstance(meta[key], types):
            raise StoreFormatError(f"ref {rec.name} is damaged: meta.{key} is {meta[key]!r}")
    messages = meta.get("messages", 0)
    if type(messages) is not int or messages < 0:
        raise StoreFormatError(
            f"ref {rec.name} is damaged: meta.messages is {messages!r}, not a count"
        )
    if rec.target is not None and not isinstance(rec.target, str):
        raise StoreFormatError(f"ref {rec.name} is damaged: its target is {rec.target!r}")
    return SessionInfo(
        id=ref_short(rec.name),
        title=meta.get("title"),
        created=meta.get("created", ""),
        updated=meta.get("updated", ""),
        messages=messages,
        root=meta.get("root"),
        archived_at=meta.get("archived_at"),
        forked_from=meta.get("forked_from"),
        model=meta.get("model"),
        head=rec.target,
        imported=meta.get("imported"),
    )


@dataclass(slots=True)
class _Tip:
    """What a writer remembers of a session between appends: its head node, and
    the message blobs since the last span or compaction (the next span's)."""

    head: Node | None
    since: str | None  # the last span node or compaction; None: the start
    pending: list[str]
    # The ref body this handle last gave the session: checked already, so an update
    # that finds it unchanged does not check it again (``_add_node``).
    ref_body: Body | None = None


# Canonical bytes, and whether orjson wrote them (canonical.encode): then a block holding
# them may claim orjson reads it exactly without parsing them again (packs.block_payload).
Encoded = tuple[bytes, bool]


def _json_body(value: Any, where: str, max_depth: int = MAX_DEPTH) -> Encoded:
    """Canonical bytes of a value to store, or InvalidInput: checked before anything is
    written, limits included (limits.py)."""
    fast = canonical.check_json(value, where, max_depth)
    encoded = canonical.encode(value, where, fast=fast)
    if len(encoded[0]) > MAX_OBJECT_BYTES:
        raise LimitExceeded(
            f"{where}: {len(encoded[0]):,} bytes, over the limit of one object "
            f"({MAX_OBJECT_BYTES:,})",
            "too large",
        )
    return encoded


def _checked_bodies(
    content: dict[str, Any], what: str, state: dict[str, Any] | None, meta: dict[str, Any] | None
) -> tuple[Encoded, Encoded | None]:
    """The canonical bytes of a new node's message (or summary) and state, all three
    values checked against the limits before anything is written."""
    content_body = _json_body(content, what)
    state_body = _json_body(state, "state") if state is not None else None
    if meta is not None:
        _json_body(meta, "meta", META_DEPTH)
    return content_body, state_body


def _checked_files(
    files: Mapping[str, tuple[bytes | None, bytes | None]] | None,
) -> list[tuple[str, bytes | None, bytes | None]]:
    """The file changes given to ``append``, checked before anything is written and
    sorted by path: valid paths (file_paths.py), bytes or None on each side, not
    both None, each within the object size limit."""
    if files is None:
        return []
    if not isinstance(files, Mapping):
        raise InvalidInput("files must map paths to (before, after) contents")
    if len(files) > MAX_FILES_PER_NODE:
        raise LimitExceeded(
            f"{len(files):,} changed files in one message, over the limit of "
            f"{MAX_FILES_PER_NODE:,}",
            "too many files",
        )
    out = []
    for path in sorted(files, key=lambda p: p if type(p) is str else ""):
        check_file_path(path)
        pair = files[path]
        if type(pair) is not tuple or len(pair) != 2:
            raise InvalidInput(f"files[{path!r}] must be a (before, after) pair")
        before, after = pair
        for side, data in (("before", before), ("after", after)):
            if data is not None and type(data) is not bytes:
                raise InvalidInput(f"files[{path!r}] {side} must be bytes or None")
            if data is not None and len(data) > MAX_OBJECT_BYTES:
                raise LimitExceeded(
                    f"files[{path!r}] {side}: {len(data):,} bytes, over the limit of one "
                    f"object ({MAX_OBJECT_BYTES:,})",
                    "too large",
                )
        if before is None and after is None:
            raise InvalidInput(f"files[{path!r}]: a file absent before and after did not change")
        out.append((path, before, after))
    return out


def _with_meta(rec: RefRecord, **changes: Any) -> Body:
    session_info(rec)  # a damaged ref is named, not rewritten
    return {**rec.body, "meta": {**rec.body.get("meta", {}), **changes}}


def _holds_other_things(root: Path) -> bool:
    """Whether ``root`` is a directory holding more than a store's layout (which
    another process creating the store at the same moment leaves before its marker)."""
    try:
        return not {p.name for p in root.iterdir()} <= LAYOUT
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return False  # no directory, or one the access check names


def _refuse_non_directory(root: Path) -> None:
    """StoreFormatError if ``root`` is there and is no directory (a file, a FIFO, a
    device, or a link to one); a missing one is left to the caller."""
    try:
        mode = os.stat(root).st_mode
    except OSError:
        return  # missing, under a file, or unreadable: opening names it
    if stat.S_ISREG(mode):
        raise StoreFormatError(f"{root} is a file, not an ags store")
    if not stat.S_ISDIR(mode):
        raise StoreFormatError(f"{root} is no directory (a FIFO, a device), not an ags store")


def _create_store(root: Path) -> None:
    """Make the layout and then the marker (a store is one once the marker exists).
    Another process creating the same store at the same moment leaves only these."""
    if _holds_other_things(root):
        raise StoreFormatError(f"{root} is not empty and is not an ags store")
    make_dirs(root)
    os.chmod(root, DIR_MODE)  # an empty directory made by someone else's mkdir: private now
    for sub in ("objects/pack", "refs/sessions", "refs/tags", "logs", "locks", "tmp"):
        make_dirs(root / sub)
    marker = canonical.dumps({"format": FORMAT_NAME, "version": CREATED_VERSION}) + b"\n"
    atomic_write(root / "tmp", root / CONFIG_FILE, marker)


def upgrade_marker(root: Path, to: int) -> None:
    """Raise the store marker to version ``to`` before anything only it can read is
    written (FORMAT.md 2): an older ags then refuses the store instead of meeting
    packs it cannot read, or file objects its gc would not know to keep."""
    marker = root / CONFIG_FILE
    try:
        version = int(canonical.loads(read_file(marker))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # opening checked it; a marker removed meanwhile is not ours to write
    if version < to:
        body = canonical.dumps({"format": FORMAT_NAME, "version": to}) + b"\n"
        atomic_write(root / "tmp", marker, body)


def default_store_path() -> Path:
    """``$AGS_STORE``, else ``~/.ags``."""
    return Path(os.environ.get("AGS_STORE") or Path.home() / ".ags").expanduser().absolute()


def _read_node(objects: ObjectStore | BlockReader, node_id: str) -> Node:
    kind, body = objects.get(node_id)
    if kind != "node":
        raise CorruptObject(node_id, f"expected a node, found a {kind}")
    return parse_node(node_id, body)


def _close_parts(
    objects: ObjectStore, refs: RefStore, writers: dict[str, WriterLock], opener: forks.Opener
) -> None:
    """Close a handle: seal its pack, let go of every file and lock (a no-op when
    closed already, or in a child of a fork of its ``opener``: forks.py). Also what a
    handle that is collected without ``close`` runs (``weakref.finalize``), so it
    must not refer to the handle itself."""
    if opener.forked:
        return
    try:
        objects.close()
    finally:
        refs.close()
        for lock in writers.values():
            lock.release()
        writers.clear()


class Store:
    """A store on local disk. Open with ``Store.open``; close when done (or use ``with``)."""

    def __init__(self, path: Path) -> None:
        self._turns = Turns()
        self._appends = AppendQueue()  # appends of several threads, written by one (combining.py)
        self.path = path
        self.tmp_dir = path / "tmp"
        self.refs = RefStore(path / "refs", path / "logs", path / "locks", self.tmp_dir)
        self._tips: dict[str, _Tip] = {}  # per session this handle writes
        self.objects = ObjectStore(
            path / "objects",
            self.tmp_dir,
            self.refs.replay,
            path / "locks",
            partial(upgrade_marker, path, BLOCKS_VERSION),
            self._turns.leave,
            partial(upgrade_marker, path, FILES_VERSION),
            partial(upgrade_marker, path, JOURNAL_VERSION),
            self._tips.clear,  # a failed fsync cut the pack back: read the heads again
        )
        self.refs.journaled = self.objects.journaled
        # Nothing here may refer back to the handle: a cycle would keep a dropped
        # handle (and its locks) alive until the cycle collector happened to run.
        self._resolver = Resolver(self.refs, self.objects, partial(_read_node, self.objects))
        self._writers: dict[str, WriterLock] = {}
        # Per session: one append at a time, its fsync wait included (turns.py).
        self._session_turns: dict[str, threading.Lock] = {}
        self._batch_depth = 0
        self._listing = ListingIndex(path / "refs" / "sessions", path / "cache", self.tmp_dir)
        # Closing twice is harmless, so the finalizer stays armed after ``close``.
        opener = self._turns.opener
        weakref.finalize(self, _close_parts, self.objects, self.refs, self._writers, opener)

    # -- opening and closing ---------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        create: bool = True,
        allow_shared: bool | None = None,
    ) -> Store:
        """Open the store at ``path`` (default ``$AGS_STORE``, else ``~/.ags``).

        A missing store is created (mode 0700) unless ``create`` is false, then
        it is StoreMissing. A store that another user owns or can write to is
        refused (UnsafeStore, see permissions.py) unless ``allow_shared`` (default:
        ``$AGS_ALLOW_SHARED_STORE``).
        """
        root = default_store_path() if path is None else Path(path).expanduser().absolute()
        config = root / CONFIG_FILE
        shared = shared_allowed(allow_shared)
        if not os.path.lexists(config) and _holds_other_things(root):
            # Said before the access check: a mistyped --store (/, /tmp, a project)
            # is no store, and advice to chmod it all would be wrong.
            raise StoreFormatError(f"{root} is not empty and is not an ags store")
        _refuse_non_directory(root)  # so too for a file (/dev/null: "chmod -R go-rwx" it)
        check_store_access(root, shared=shared)  # before anything in it is read or written
        try:
            data = read_file(config)
        except FileNotFoundError:
            data = None
        except NotADirectoryError:
            if root.is_file():
                raise StoreFormatError(f"{root} is a file, not an ags store") from None
            raise StoreFormatError(f"{root}: a part of its path is a file") from None
        if data is None:
            if not create:
                if root.is_dir() and any(root.iterdir()):
                    raise StoreFormatError(f"{root} is not empty and is not an ags store")
                raise StoreMissing(str(root))
            _create_store(root)
            check_store_access(root, shared=shared)  # and what another made meanwhile
        else:
            try:
                cfg = canonical.loads(data)
                name, version = cfg["format"], int(cfg["version"])
            except (ValueError, KeyError, TypeError):
                raise StoreFormatError(f"{config} is unreadable") from None
            if name != FORMAT_NAME:
                raise StoreFormatError(f"{root} is not an ags store")
            if version > FORMAT_VERSION:
                raise StoreFormatError(
                    f"{root} has store format {version}; this ags reads up to {FORMAT_VERSION}"
                )
        return cls(root)

    def close(self) -> None:
        """Seal this handle's pack and release every writer lock. A handle used again
        after ``close`` opens what it needs again; closing again lets go of it. In a
        child of a fork, the parent's handle is left alone (forks.py)."""
        if self._turns.opener.forked:
            return
        with self._turns:
            self._tips.clear()
            _close_parts(self.objects, self.refs, self._writers, self._turns.opener)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- objects ---------------------------------------------------------------

    def node(self, node_id: str) -> Node:
        return _read_node(self.objects, node_id)

    def _node(self, node_id: str) -> Node:  # in a turn already
        return _read_node(self.objects, node_id)

    def blob(self, blob_id: str) -> Any:
        """The JSON value stored in a blob."""
        return self._blob(blob_id)

    def file_bytes(self, file_id: str) -> bytes:
        """The content of a ``file`` object (a file a node's ``files`` names)."""
        kind, body = self.objects.get(file_id)
        if kind != "file":
            raise CorruptObject(file_id, f"expected a file, found a {kind}")
        return body

    def _blob(self, blob_id: str) -> Any:
        kind, body = self.objects.get(blob_id)
        return self._blob_value(blob_id, kind, body)

    @staticmethod
    def _blob_value(blob_id: str, kind: str, body: bytes) -> Any:
        if kind != "blob":
            raise CorruptObject(blob_id, f"expected a blob, found a {kind}")
        try:
            return canonical.loads(body)
        except ValueError as e:
            raise CorruptObject(blob_id, f"blob is not JSON: {e}") from None

    # -- sessions --------------------------------------------------------------

    def new_session(
        self,
        title: str | None = None,
        root: RootPath = None,
        model: str | None = None,
    ) -> str:
        """Create an empty session; return its id."""
        _check_title(title)
        _check_model(model)
        root_path = project_root(root) if root is not None else None
        return self._create_session(None, title, root_path, model, None, 0)

    def _create_session(
        self,
        head: str | None,
        title: str | None,
        root: str | None,
        model: str | None,
        forked_from: dict[str, str | None] | None,
        messages: int,
    ) -> str:
        """Write the ref of a new session (one file); return its id."""
        sid = new_session_id()
        now = now_iso()
        meta = {
            "title": title,
            "created": now,
            "updated": now,
            "archived_at": None,
            "root": root,
            "forked_from": forked_from,
            "model": model,
            "messages": messages,
        }

        def create(current: RefRecord | None) -> Body:
            if current is not None:
                raise RefConflict(f"session {sid} already exists")
            return {"target": head, "meta": meta}

        self.refs.transact(session_ref(sid), "create", create)
        return sid

    def session(self, spec: str) -> SessionInfo:
        """The metadata of the session ``spec`` names."""
        sid = self.session_id(spec)
        rec = self.refs.read(session_ref(sid))
        if rec is None:
            raise UnknownSpec(f"no session {sid}")
        return session_info(rec)

    def sessions(self, include_archived: bool = False) -> list[SessionInfo]:
        """Every session, most recently updated first. A session ref that cannot be
        read is left out and named in a StoreWarning: one damaged file must not
        hide the others. Read through the listing index (listing.py): one ``stat``
        and one file when no session moved since the last listing."""
        listing = self._listing.listing(self._listing_row, _is_session_id)
        for _sid, why in listing.damaged:
            warnings.warn(StoreWarning(f"{why}; left out (ags fsck)"), stacklevel=2)
        found = listing.rows
        # The index follows the ref files; a live writer's journal is ahead of them.
        journaled = self.journaled_sessions()
        if journaled:
            rows = {row[0]: row for row in found}
            for sid in journaled & rows.keys():
                rec = self.refs.read(session_ref(sid))
                if rec is not None:
                    rows[sid] = _row(session_info(rec))
            found = sorted(rows.values(), key=lambda row: (row[UPDATED], row[0]), reverse=True)
        staged = self.refs.staged("sessions")
        if staged:  # a batch in progress sees its own sessions
            found = [row for row in found if session_ref(row[0]) not in staged]
            found += [_row(session_info(rec)) for rec in staged.values() if rec is not None]
            found.sort(key=lambda row: (row[UPDATED], row[0]), reverse=True)
        return [SessionInfo(*row) for row in found if include_archived or row[ARCHIVED_AT] is None]

    def journaled_sessions(self) -> set[str]:
        """The sessions whose newest head may be in a pack's journal rather than in their
        ref file (FORMAT.md 9): those a writer appended to since its pack was sealed."""
        return {ref_short(name) for name in self.objects.journaled_names("sessions/")}

    def _listing_row(self, sid: str) -> list[Any] | None:
        rec = self.refs.read_file(session_ref(sid))
        return None if rec is None else _row(session_info(rec))

    @property
    def read_only(self) -> bool:
        """Whether the store is on a file system mounted read-only (a backup, a snapshot):
        every read works, every write fails (FORMAT.md 5.2)."""
        return read_only_file_system(self.path)

    @property
    def writer_locks(self) -> frozenset[str]:
        """The sessions whose writer lock this handle holds."""
        return frozenset(self._writers)

    def lock(self, session: str) -> str:
        """Take the writer lock of a session (SessionBusy if another process has it)."""
        return self._hold_writer_lock(self._resolver.session_id(session))

    def _hold_writer_lock(self, sid: str) -> str:  # in a turn already
        if sid not in self._writers:
            lock = WriterLock(self.path / "locks", sid)
            lock.acquire()
            self._writers[sid] = lock
        return sid

    @contextmanager
    def one_at_a_time(self, job: str, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold ``locks/<job>`` inside: of the jobs ``JOBS`` names, one of each runs in a
        store at a time (two imports at once each took a file for new). Another
        process's is waited for; ``on_wait`` is called first if there is one."""
        if job not in JOBS:
            raise InvalidInput(f"no job {job!r} to run one at a time")
        lock = FileLock(self.path / "locks" / job)
        if not lock.acquire(blocking=False):
            if on_wait is not None:
                on_wait()
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

    def release(self, session: str) -> None:
        """Let go of a session's writer lock."""
        sid = self.session_id(session)
        lock = self._writers.pop(sid, None)
        self._tips.pop(sid, None)
        if lock:
            lock.release()

    @contextmanager
    def _session_turn(self, session: str) -> Iterator[None]:
        """The handle's turn, then the lock that lets one thread at a time write to a
        session through this handle (turn -> session, turns.py), both held inside."""
        with self._turns:
            sid = self._resolver.session_id(session)
            lock = self._session_turns.setdefault(sid, threading.Lock())
            lock.acquire()
            try:
                yield
            finally:
                lock.release()

    def _writable(self, session: str) -> tuple[str, _Tip]:
        """Lock a session for writing; return its id and what a writer needs of it.

        While this handle holds the writer lock, nobody else can move the
        head or archive the session, so the head is remembered between appends.
        A batch only checks that no other process writes the session now: it
        holds no lock (it may write more sessions than a process has file
        handles), and its end compares each ref's generation instead.
        """
        self.objects.retire_failed()  # a pack whose fsync failed: heads read again
        if self._batch_depth:
            sid = self.session_id(session)
            tip = self._tips.get(sid)
            if tip is not None:  # already checked in this batch
                return sid, tip
            if sid not in self._writers:
                probe = WriterLock(self.path / "locks", sid)
                probe.acquire()
                probe.release()
        else:
            sid = self._hold_writer_lock(self._resolver.session_id(session))
        tip = self._tips.get(sid)
        if tip is not None:
            return sid, tip
        rec = self.refs.read(session_ref(sid))
        if rec is None:
            raise UnknownSpec(f"no session {sid}")
        if session_info(rec).archived:
            raise SessionArchived(sid)
        tip = self._tips[sid] = self._tip_at(self.node(rec.target) if rec.target else None)
        return sid, tip

    def _tip_at(self, head: Node | None) -> _Tip:
        since, pending = open_span(head.id if head else None, self.node)
        return _Tip(head, since, pending)

    def append(
        self,
        session: str,
        message: dict[str, Any],
        state: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
        files: Mapping[str, tuple[bytes | None, bytes | None]] | None = None,
    ) -> str:
        """Append one message; return the new node's id. Durable when it returns.

        ``state`` None keeps the previous state. ``meta`` is kept with the node
        (a ``time`` is added unless given). ``files`` records the files the
        tool call this message answers changed: project-relative path ->
        (content before, content after), None where the file did not exist;
        each content is stored once as a ``file`` object (FORMAT.md 4.3) and
        read back with ``node(id).files`` and ``file_bytes``.
        """
        self._turns.opener.check()  # a child of a fork never queues (forks.py)
        if type(message) is not dict:
            raise InvalidInput("a message must be a JSON object")
        # Encoded and checked before the turn, so that bad input is refused in the
        # caller's thread and never queued. Hashing and compressing are left to the
        # leader (combining.py): with messages of a few KB, each call that lets go of
        # the GIL in a thread of its own cost more in thread switches than it ran.
        message_body, state_body = _checked_bodies(message, "message", state, meta)
        changes = _checked_files(files)
        if self._turns.mine():  # in a batch, which has the handle to itself
            with self._session_turn(session):
                return self._append(session, message_body, state_body, meta, changes)
        queued = QueuedAppend(
            partial(self._append, session, message_body, state_body, meta, changes)
        )
        if self._appends.join(queued):
            self._lead_appends(queued)
        else:
            queued.wait()  # done by a leader, or made the leader
            if queued.lead:
                self._lead_appends(queued)
        return queued.outcome()  # type: ignore[no-any-return]

    def _lead_appends(self, mine: QueuedAppend) -> None:
        """Gather, then run every queued append in this thread (combining.py): in the
        turn, each up to its ref update, held; then one write for all of them; then,
        outside the turn, the lead handed on and one fsync (shared, turns.py); then
        the ref locks let go and each other thread woken once."""
        let_go: list[Callable[[], None]] = []  # ref locks held until durable
        taken: list[QueuedAppend] = []
        written: list[QueuedAppend] = []
        handed = False

        def hand_on() -> None:
            nonlocal handed
            if not handed:
                handed = True
                self._appends.pass_lead()

        try:
            self._appends.gather()
            with self._turns:
                taken = self._appends.take()
                for queued in taken:
                    try:
                        queued.result = queued.work(let_go)
                    except Exception as e:  # noqa: PERF203 - that thread's error
                        queued.error = e
                    else:
                        written.append(queued)
                try:
                    self.objects.flush()
                except BaseException:
                    self._tips.clear()  # ahead of the journal now: read again
                    raise
                if written:
                    self.objects.commit(left=hand_on)
        except BaseException as e:  # a failed write or fsync, or this thread interrupted
            if not taken:  # before taking the queue: this thread's append alone fails
                self._appends.withdraw(mine)
                mine.error = e
            for queued in taken:
                if queued in written or (queued.result is None and queued.error is None):
                    queued.error = e
        finally:
            hand_on()
            for release in let_go:
                release()
            self._appends.waking(len(taken))  # this thread too
            for queued in taken:
                if queued is not mine:
                    queued.wake()

    def _append(
        self,
        session: str,
        message: Encoded,
        state: Encoded | None,
        meta: dict[str, Any] | None,
        files: list[tuple[str, bytes | None, bytes | None]],
        until_durable: list[Callable[[], None]] | None = None,
    ) -> str:
        sid, tip = self._writable(session)
        parent = tip.head
        changes = tuple(
            FileChange(
                path,
                None if before is None else self.objects.put("file", before),
                None if after is None else self.objects.put("file", after),
            )
            for path, before, after in files
        )
        message_id = self.objects.put("blob", message[0], exact=message[1])
        state_id = (
            self.objects.put("blob", state[0], exact=state[1])
            if state is not None
            else (parent.state if parent else None)
        )
        count = (parent.messages if parent else 0) + 1
        pending = [*tip.pending, message_id]
        span = Span(tip.since, tuple(pending)) if len(pending) >= SPAN_EVERY else None
        node, ref_body = self._add_node(
            sid,
            tip.ref_body,
            parent,
            "message",
            message_id,
            state_id,
            count,
            meta,
            "append",
            span=span,
            files=changes,
            until_durable=until_durable,
        )
        if span is None:
            self._tips[sid] = _Tip(node, tip.since, pending, ref_body)
        else:
            self._tips[sid] = _Tip(node, node.id, [], ref_body)
        return node.id

    def compact(
        self,
        session: str,
        summary: str | dict[str, Any],
        keep: int = 0,
        state: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> str:
        """Add a compaction node: from here the context is summary + the last ``keep`` messages.

        A ``str`` summary is stored as the message ``{"role": "user", "content": summary}``.
        Nothing is removed from the transcript.
        """
        if isinstance(summary, str):
            summary = {"role": "user", "content": summary}
        if type(summary) is not dict:
            raise InvalidInput("a summary must be a string or a JSON object")
        if type(keep) is not int or keep < 0:
            raise InvalidInput("keep must be a non-negative integer")
        summary_body, state_body = _checked_bodies(summary, "summary", state, meta)
        with self._session_turn(session):
            return self._compact(session, summary_body, state_body, keep, meta)

    def _compact(
        self,
        session: str,
        summary_body: Encoded,
        state_body: Encoded | None,
        keep: int,
        meta: dict[str, Any] | None,
    ) -> str:
        sid, tip = self._writable(session)
        parent = tip.head
        if parent is None:
            raise InvalidInput(f"session {sid} has no messages to compact")
        kept = last_message_nodes(parent.id, self.node, keep)
        summary_id = self.objects.put("blob", summary_body[0], exact=summary_body[1])
        state_id = (
            self.objects.put("blob", state_body[0], exact=state_body[1])
            if state_body is not None
            else parent.state
        )
        node, ref_body = self._add_node(
            sid,
            tip.ref_body,
            parent,
            "compaction",
            summary_id,
            state_id,
            parent.messages,
            meta,
            "compact",
            kept,
        )
        self._tips[sid] = _Tip(node, node.id, [], ref_body)
        return node.id

    def _add_node(
        self,
        sid: str,
        checked: Body | None,
        parent: Node | None,
        type: NodeType,
        content: str,
        state_id: str | None,
        count: int,
        meta: dict[str, Any] | None,
        reason: str,
        kept: list[str] | None = None,
        span: Span | None = None,
        files: tuple[FileChange, ...] = (),
        until_durable: list[Callable[[], None]] | None = None,
    ) -> tuple[Node, Body | None]:
        """Write a node after ``parent`` and move the session's head to it; return the
        node and the ref's new body. ``checked``: a body known to be sound (the one
        this handle gave the ref last), not checked again if the ref still has it."""
        full_meta = {"time": now_iso(), **(meta or {})}
        parent_id = parent.id if parent else None
        body, exact = encode_node(
            type, parent_id, content, state_id, count, full_meta, kept, span, files
        )
        node_id = self.objects.put("node", body, unique=True, exact=exact)

        def move(current: RefRecord | None) -> Body:
            if current is None or current.target != parent_id:
                raise RefConflict(f"session {sid} moved while it was being written")
            if current.body is not checked:
                session_info(current)  # a damaged ref is named, not rewritten
            meta = {**current.body.get("meta", {}), "updated": full_meta["time"], "messages": count}
            return {**current.body, "meta": meta, "target": node_id}

        journal = None if self._batch_depth else self.objects
        # No reflog line: the parent chain is the history of appends and compactions.
        record = self.refs.transact(
            session_ref(sid), reason, move, journal=journal, log=False, until_durable=until_durable
        )
        if journal is None:
            self.objects.flush()  # one write per append in a batch too (a journal's is its own)
        node = Node(
            node_id,
            type,
            parent_id,
            content,
            state_id,
            count,
            full_meta,
            tuple(kept or ()),
            span,
            files,
        )
        return node, None if record is None else record.body

    # -- reading history ---------------------------------------------------------

    def context(self, spec: str) -> list[dict[str, Any]]:
        """The active context at ``spec``: what a model resuming there sees. O(context)."""
        node_id = self.target(spec).node
        if node_id is None:
            return []
        # One reader for the walk and the messages: where blocks mix nodes and
        # messages (stores written before the groups of FORMAT.md 5.5), the blocks
        # the walk decoded give their messages too, and are decoded once.
        reader = BlockReader(self.objects)
        blob_ids = context_blobs(node_id, reader.node, reader.message_run)
        try:
            return reader.blob_values(blob_ids)
        except ValueError:  # read each again, to name the blob that is not JSON
            pairs = zip(blob_ids, reader.blob_bodies(blob_ids), strict=True)
            return [self._blob_value(oid, "blob", body) for oid, body in pairs]

    def walk(self, spec: str | None, *, spans: bool = False) -> Iterator[Node]:
        """The nodes of the history at ``spec``, newest first (walk.py; ``spans``: skip
        by spans, for readers of messages). None, or an empty session, walks nothing."""
        start = self.target(spec).node if spec is not None else None
        return walk(start, self.node, spans=spans)

    def log(self, spec: str) -> Iterator[LogEntry]:
        """The whole transcript at ``spec``, newest first, compaction nodes included."""
        for node in walk(self.target(spec).node, self.node):
            yield LogEntry(node, self.blob(node.content))

    def state_at(self, spec: str) -> dict[str, Any]:
        """The agent state in force at ``spec`` ({} if none was ever stored)."""
        node_id = self.target(spec).node
        if node_id is None:
            return {}
        state_id = self.node(node_id).state
        value = self.blob(state_id) if state_id else {}
        return value if isinstance(value, dict) else {"value": value}

    # -- forks, tags, metadata -------------------------------------------------

    def fork(self, spec: str, title: str | None = None) -> str:
        """A new session whose head is the node ``spec`` names. O(1): copies no message."""
        _check_title(title)
        target = self.target(spec)
        source = self.session(target.session) if target.session else None
        if target.node is None:
            count = 0
        elif source is not None and source.head == target.node:
            count = source.messages
        else:
            count = self.node(target.node).messages
        return self._create_session(
            target.node,
            title if title is not None else (source.title if source else None),
            source.root if source else None,
            source.model if source else None,
            {"session": target.session, "node": target.node},
            count,
        )

    def _update_meta(self, session: str, reason: str, **changes: Any) -> None:
        sid = self.session_id(session)

        def change(current: RefRecord | None) -> Body:
            if current is None:
                raise UnknownSpec(f"no session {sid}")
            meta = current.body.get("meta", {})
            if all(key in meta and meta[key] == value for key, value in changes.items()):
                session_info(current)  # a damaged ref is named, as when it is changed
                return current.body  # nothing changes: nothing written, nothing logged
            return _with_meta(current, **changes)

        self.refs.transact(session_ref(sid), reason, change)

    def set_meta(self, session: str, reason: str = "meta", **changes: Any) -> None:
        """Change descriptive metadata of a session (one ref update, no history).

        Only ``title``, ``created``, ``root``, ``model`` and ``imported`` (what an
        importer remembers of its source, FORMAT.md 6.1) may be given; the head,
        the counts and ``updated`` move only with the history.
        """
        unknown = set(changes) - _SETTABLE_META
        if unknown:
            raise InvalidInput(f"session metadata {sorted(unknown)} cannot be set")
        if "title" in changes:
            _check_title(changes["title"])
        if "created" in changes and not is_time(changes["created"]):
            raise InvalidInput("created must be a time like 2026-01-31T12:00:00.000Z")
        if changes.get("root") is not None:
            changes["root"] = project_root(changes["root"])
        _check_model(changes.get("model"))
        if "imported" in changes:
            _json_body(changes["imported"], "imported")
        if changes.get("imported") is not None and type(changes["imported"]) is not dict:
            raise InvalidInput("imported must be a JSON object or null")
        self._update_meta(session, reason, **changes)

    def set_title(self, session: str, title: str | None) -> None:
        _check_title(title)
        self._update_meta(session, "title", title=title)

    def archive(self, session: str) -> None:
        """Hide a session from listings and refuse writes to it until unarchived."""
        with self.writing(session) as sid:

            def change(current: RefRecord | None) -> Body:
                if current is None:
                    raise UnknownSpec(f"no session {sid}")
                if session_info(current).archived:
                    return current.body  # already archived: keep when, for gc's retention
                return _with_meta(current, archived_at=now_iso())

            self.refs.transact(session_ref(sid), "archive", change)

    def take_meta(self, session: str, reason: str, **changes: Any) -> None:
        """Set ``title``, ``model`` or ``archived_at`` to the values another copy of the
        session holds (a pull), exactly, under its writer lock as ``archive`` is."""
        if set(changes) - {"title", "model", "archived_at"}:
            raise InvalidInput(f"session metadata {sorted(changes)} cannot be taken")
        if "title" in changes:
            _check_title(changes["title"])
        _check_model(changes.get("model"))
        if changes.get("archived_at") is not None and not is_time(changes["archived_at"]):
            raise InvalidInput("archived_at must be a time like 2026-01-31T12:00:00.000Z")
        with self.writing(session) as sid:
            self._update_meta(sid, reason, **changes)

    def unarchive(self, session: str) -> None:
        self._update_meta(session, "unarchive", archived_at=None)

    def delete(self, session: str) -> None:
        """Remove a session's ref. Its reflog stays, so it can be recovered until gc."""
        with self.writing(session) as sid:
            self.refs.transact(session_ref(sid), "delete", lambda cur: None)

    @contextmanager
    def writing(self, session: str) -> Iterator[str]:
        """Hold the session's writer lock for the block; yield the session id.

        ``with store.writing(sid): store.append(sid, ...)`` lets go of the lock when
        the block ends, where a bare ``append`` keeps it until ``release`` or
        ``close``. A lock this handle already held is kept; either way the
        remembered head is dropped, so the next append reads the ref again.
        """
        sid = self.session_id(session)
        held = sid in self._writers
        if not held:
            self.lock(sid)
        try:
            yield sid
        finally:
            self._tips.pop(sid, None)
            if not held:
                self.release(sid)

    def rewind(
        self,
        session: str,
        spec: str,
        *,
        before_move: Callable[[str | None, str], None] | None = None,
    ) -> str:
        """Move a session's head back to ``spec``, a node of its own history; return it.

        The reflog keeps the old head: ``rewind(s, f"{s}@{{1}}")`` undoes it.
        ``before_move(old head, new head)`` runs once the rewind is known to be
        valid, under the session's writer lock, before the head moves; if it
        raises, the head does not move (what ``rewind --files`` puts files back in).
        """
        sid, tip = self._writable(session)
        node_id = self.node_id(spec)
        if not self._in_history(sid, node_id):
            raise InvalidInput(f"{spec} is not in the history of session {sid}")
        count = self.node(node_id).messages
        old = tip.head.id if tip.head else None
        if before_move is not None:
            before_move(old, node_id)

        def move(current: RefRecord | None) -> Body:
            if current is None or current.target != old:
                raise RefConflict(f"session {sid} moved while it was being rewound")
            return {**_with_meta(current, updated=now_iso(), messages=count), "target": node_id}

        self.refs.transact(session_ref(sid), f"rewind to {spec}", move)
        self._tips.pop(sid, None)
        return node_id

    def _in_history(self, sid: str, node_id: str) -> bool:
        """Whether ``node_id`` is on the chain of the session's head or of a head its
        reflog remembers (so that a rewind can be undone)."""
        rec = self.refs.read(session_ref(sid))
        moves = self.refs.reflog(session_ref(sid))  # appends are not logged: olds count too
        heads = {v for e in moves for v in (e.old, e.new) if v is not None}
        heads |= {rec.target} if rec and rec.target else set()
        seen: set[str] = set()
        for head in heads:
            for node in walk(head, self.node):
                if node.id == node_id:
                    return True
                if node.id in seen:
                    break
                seen.add(node.id)
        return False

    def tag(self, name: str, spec: str, force: bool = False) -> str:
        """Name the node ``spec`` names; return the node id. Refuses to move a tag unless forced."""
        check_tag_name(name)
        node_id = self.node_id(spec)

        def change(current: RefRecord | None) -> Body:
            if current is not None and current.target != node_id and not force:
                raise RefConflict(f"tag {name} already names {current.target}")
            if current is not None and current.target == node_id:
                return current.body
            if current is None:
                _check_tag_found(name)
                self.refs.check_tag_place(name)
            return {"target": node_id}

        self.refs.transact(tag_ref(name), f"tag {spec}", change)
        return node_id

    def tags(self) -> dict[str, str]:
        """Every tag and the node it names."""
        out = {}
        for ref in self.refs.names("tags"):
            try:
                rec = self.refs.read(ref)
            except (StoreFormatError, InvalidName) as e:
                warnings.warn(StoreWarning(f"{e}; left out (ags fsck)"), stacklevel=2)
                continue
            if rec is not None and isinstance(rec.target, str):
                out[ref_short(ref)] = rec.target
        return dict(sorted(out.items()))

    def delete_tag(self, name: str) -> None:
        check_tag_name(name)

        def change(current: RefRecord | None) -> Body | None:
            if current is None:
                raise UnknownSpec(f"no tag {name}")
            return None

        self.refs.transact(tag_ref(name), "delete", change)

    def reflog(self, spec: str) -> list[ReflogEntry]:
        """The reflog of the ref ``spec`` names, newest first."""
        name = self._resolver.ref_name(parse_spec(spec))
        return self.refs.reflog(name)[::-1]

    # -- HEAD ------------------------------------------------------------------

    def checkout(self, spec: str, root: RootPath = None) -> Target:
        """Make ``spec`` current for a project root: a plain session name attaches HEAD to
        the session, anything else detaches it at a node.

        ``root`` defaults to the project whose HEAD the current directory is
        in, else the current directory itself.
        """
        target = self.target(spec, root=root)
        if parse_spec(spec).is_plain and target.session is not None:
            value = session_ref(target.session)
        elif target.node is not None:
            value = target.node
            target = Target(target.node, None)
        else:
            raise InvalidInput(f"{spec} names an empty session; nothing to detach at")
        if root is None:
            try:
                root_path = self._resolver.head_root(None)
            except UnknownSpec:
                root_path = project_root(None)
        else:
            root_path = project_root(root)
        self.refs.transact(
            head_ref_name(root_path),
            f"checkout {spec}",
            lambda cur: {"target": value, "root": root_path},
        )
        return target

    def head(self, root: RootPath = None) -> Target | None:
        """What HEAD names for ``root`` (default: the current directory), or None if
        nothing is checked out; UnknownSpec if it names a session since deleted."""
        try:
            return self.target("HEAD", root=root)
        except NothingCheckedOut:
            return None

    # -- resolving specs -------------------------------------------------------

    def target(self, spec: str, root: RootPath = None) -> Target:
        """What ``spec`` names: a node (None for an empty session) and the session it
        was reached through, if any (resolve.py). The one resolution of a spec;
        ``node_id`` and ``session_id`` narrow it."""
        return self._resolver.lookup(spec, root)

    def node_id(self, spec: str) -> str:
        """The node id ``spec`` names (a session with no messages yet is an error)."""
        node = self.target(spec).node
        if node is None:
            raise UnknownSpec(f"{spec} names a session with no messages yet")
        return node

    def session_id(self, spec: str) -> str:
        """The id of the session ``spec`` names (a full or prefix id, sessions/..., HEAD)."""
        return self._resolver.session_id(spec)

    # -- what gc, fsck, export and sizes build on --------------------------------
    #
    # The modules built on a Store use these and nothing below them: refs by
    # name, the roots that keep objects alive, raw objects, the packs' health.

    def ref_names(self) -> list[str]:
        """Every ref name (sessions, tags, HEADs), sorted; files under ``refs/`` that
        are no ref name included (reading one is InvalidName: fsck names it)."""
        return sorted(self.refs.all_names())

    def read_ref(self, name: str) -> RefRecord | None:
        """A ref as stored, or None if there is none (StoreFormatError if it cannot
        be read, InvalidName if ``name`` is no ref name)."""
        return self.refs.read(name)

    def reflog_names(self) -> list[str]:
        """Every ref with a reflog file, deleted refs included, sorted."""
        return sorted(self.refs.log_names())

    def reflog_entries(self, name: str) -> list[ReflogEntry]:
        """The effective reflog of the ref ``name``, oldest first (FORMAT.md 7)."""
        return self.refs.reflog(name)

    def damaged_reflog_lines(self, name: str) -> list[int]:
        """Line numbers of whole reflog lines that do not parse: damage, not a crash."""
        return self.refs.damaged_log_lines(name)

    def roots(self, *, skip: Collection[str] = (), reflog_cutoff: str | None = None) -> set[str]:
        """The node ids every ref, and every reflog entry not older than
        ``reflog_cutoff``, names: what keeps objects alive. Refs in ``skip`` and
        files that are no ref name are left out; a ref that cannot be read raises
        StoreFormatError (what it reaches is unknown)."""
        return set(self.iter_roots(skip=skip, reflog_cutoff=reflog_cutoff))

    def iter_roots(
        self, *, skip: Collection[str] = (), reflog_cutoff: str | None = None
    ) -> Iterator[str]:
        """``roots`` one at a time, repeats left in: the reflogs of a big store name
        about every node it has, too many to hold as a set of strings."""
        self.objects.refresh()  # one look at the packs' journals for every ref below
        for name in self.refs.all_names():
            if name in skip:
                continue
            try:
                rec = self.refs.read(name, look_for_packs=False)
            except InvalidName:
                continue
            if rec is not None and isinstance(rec.target, str) and names_node(rec.target):
                yield rec.target
        for name in self.refs.log_names():
            if name in skip:
                continue
            for entry in self.refs.reflog(name):
                if reflog_cutoff is None or entry.time >= reflog_cutoff:
                    yield from (v for v in (entry.old, entry.new) if v and names_node(v))

    def expire_reflogs(
        self, cutoff: str, *, skip: Collection[str] = (), dry_run: bool = False
    ) -> int:
        """Drop every reflog entry older than ``cutoff`` (a time); return how many."""
        return sum(
            self.refs.expire_reflog(name, cutoff, dry_run=dry_run)
            for name in list(self.refs.log_names())
            if name not in skip
        )

    def purge(self, session: str) -> None:
        """Delete a session and its reflog: gone for good, not undoable (gc's retention)."""
        with self.writing(session) as sid:
            self.refs.transact(session_ref(sid), "delete", lambda cur: None)
            self.refs.delete_reflog(session_ref(sid))

    def fast_forward(
        self, session_id: str, head: str | None, meta: dict[str, Any], reason: str
    ) -> str:
        """Point a session at ``head``: create it with ``meta`` if it does not exist,
        move it forward if ``head`` descends from where it is (its objects written
        already, by this handle or another). Returns ``"created"``, ``"unchanged"``
        or ``"fast-forward"``; RefConflict if its history has diverged."""
        check_session_id(session_id)
        outcome = "created"
        exists = self.refs.read(session_ref(session_id)) is not None

        def change(current: RefRecord | None) -> Body:
            nonlocal outcome
            if current is None:
                return {"target": head, "meta": {name: meta.get(name) for name in META_FIELDS}}
            if current.target == head:
                outcome = "unchanged"
                return current.body
            if current.target is not None and not any(
                node.id == current.target for node in walk(head, self.node)
            ):
                raise RefConflict(f"session {session_id} has moved to another history")
            outcome = "fast-forward"
            count = self.node(head).messages if head else 0
            return _with_meta(current, messages=count, updated=now_iso()) | {"target": head}

        # Moving a session's history takes its writer lock, as an append does.
        with self.writing(session_id) if exists else nullcontext():
            self.refs.transact(session_ref(session_id), reason, change)
        return outcome

    def has_object(self, object_id: str) -> bool:
        """Whether the store holds ``object_id`` (not verified: reading it verifies)."""
        return self.objects.has(object_id)

    def add_pack(self, pack: bytes, index: bytes, name: str) -> int:
        """Add a whole block pack and its index from elsewhere (a remote's), verified
        object by object first; return how many objects were new here (FORMAT.md 5.5)."""
        return self.objects.add_pack(pack, index, name)

    def add_blocks(self, blocks: list[tuple[bytes, list[tuple[str, int, int]]]]) -> int:
        """Add block records from elsewhere, each verified by the caller (a fetch's
        ranged reads, objstore/remote/ranged.py); return how many objects were new."""
        return self.objects.add_blocks(blocks)

    @contextmanager
    def staged_blocks(self) -> Iterator[BlockStaging]:
        """Gather block records from elsewhere (``BlockStaging.add``, verified by the
        caller) into one pack that appears in the store only when the block ends
        without an error: a fetch killed midway leaves none of its objects, rather
        than some whose links name others it had not added yet."""
        staging = self.objects.block_staging(self._turns)
        try:
            yield staging
        except BaseException:
            staging.abandon()
            raise
        staging.commit()

    def tracking_refs(self, remote: str) -> dict[str, RefRecord]:
        """The remote-tracking refs of ``remote``, by session id (FORMAT.md 6)."""
        prefix = f"remotes/{remote}/"
        found = {}
        for name in self.refs.names("remotes"):
            if name.startswith(prefix):
                rec = self.refs.read(name)
                if rec is not None:
                    found[ref_short(name).partition("/")[2]] = rec
        return found

    def set_tracking_ref(
        self, remote: str, session_id: str, body: Body | None, reason: str
    ) -> None:
        """Point ``remotes/<remote>/<session>`` at what the remote was seen to hold
        (``body``: target, meta and the remote cell's etag), or delete it (None). Only
        a push or a fetch moves it; its reflog keeps where it was."""
        name = tracking_ref(remote, check_session_id(session_id))

        def change(current: RefRecord | None) -> Body | None:
            if body is None:
                return None
            if current is not None and {**current.body, **body} == current.body:
                return current.body
            return body

        self.refs.transact(name, reason, change)

    def drop_tracking_refs(self, remote: str) -> int:
        """Delete every remote-tracking ref of ``remote``, reflogs included (the remote
        is forgotten: nothing of it should keep objects alive); return how many."""
        prefix = f"remotes/{remote}/"
        names = {n for n in self.refs.names("remotes") if n.startswith(prefix)}
        names |= {n for n in self.refs.log_names() if n.startswith(prefix)}
        for name in names:
            self.refs.transact(name, "remote removed", lambda current: None)
            self.refs.delete_reflog(name)
        return len(names)

    def raw_object(self, object_id: str) -> tuple[str, bytes]:
        """``(kind, body)`` of any object, verified against its id."""
        return self.objects.get(object_id)

    def put_raw(self, kind: str, body: bytes) -> str:
        """Store an object of ``kind`` whose body is already canonical; return its id.
        In a batch it is synced at the end, otherwise with the next append."""
        return self.objects.put(kind, body)

    def sealed_packs(self) -> list[SealedPack]:
        """The sealed packs, after a fresh look: for fsck, which reads them a block at a
        time (fsck.py)."""
        return self.objects.sealed_packs()

    def unsealed_objects(self) -> Iterator[Checked]:
        """Every object outside the sealed packs, verified: ``(id, (kind, body))`` or
        ``(id, the error)``; an object stored twice may come twice."""
        return self.objects.unsealed_objects()

    def object_ids(self) -> list[str]:
        """Every object id in the store, sorted, each once."""
        return sorted(set(self.objects.ids()))

    def object_sizes(self) -> dict[str, int]:
        """Every object and the bytes its stored (compressed) form takes."""
        return self.objects.stored_sizes()

    def object_sizes_stream(self) -> Iterator[tuple[str, int, int | None]]:
        """``object_sizes`` as a stream, with the length of each object's ``kind + NUL +
        body`` where an index says it: (id, stored bytes, that length or None). An
        object stored twice comes twice."""
        return self.objects.stored_sizes_stream()

    def body_size(self, object_id: str) -> int:
        """An object's uncompressed body size (0 if it cannot be read)."""
        return self.objects.body_size(object_id)

    def object_count_hint(self) -> int:
        """About how many objects the store holds (``ObjectStore.count_hint``)."""
        return self.objects.count_hint()

    def release_pages(self) -> None:
        """Let go of the pack pages this process has read: for walks of a whole store."""
        self.objects.release_pages()

    def pack_count(self) -> int:
        return len(self.objects.sealed_packs())

    def pack_problems(self) -> list[tuple[str, str]]:
        """(pack file, what is wrong) for every damaged pack, index or record."""
        return self.objects.pack_problems()

    def sweep(
        self,
        older_than: float,
        mark: Callable[[], Container[str]],
        *,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> SweepResult:
        """Drop what ``mark()`` does not keep from the packs and loose objects older
        than ``older_than`` (see ``ObjectStore.sweep`` for why a writer loses nothing)."""
        return self.objects.sweep(older_than, mark, dry_run=dry_run, progress=progress)

    def repack(self) -> int:
        """Merge packs if there are too many; return how many were merged."""
        return self.objects.repack()

    # -- batches ---------------------------------------------------------------

    @contextmanager
    def batch(self) -> Iterator[Store]:
        """Bulk writes: nothing is synced until the block ends, then everything once.

        Objects are synced first, then the refs the block changed. If the
        block raises, its ref changes are dropped (objects written stay,
        unreferenced, for gc). A ref that another process changed meanwhile
        raises RefConflict at the end.
        """
        with self._turns:  # a batch has the handle to itself: other threads wait
            yield from self._batched()

    def _batched(self) -> Iterator[Store]:
        if self._batch_depth:
            self._batch_depth += 1
            try:
                yield self
            finally:
                self._batch_depth -= 1
            return
        self._batch_depth = 1
        self.refs.begin_batch()
        try:
            yield self
        except BaseException:
            self.refs.abort_batch()
            self._tips.clear()
            raise
        else:
            self.refs.end_batch(before_refs=self.objects.sync)
        finally:
            self._batch_depth = 0
            for sid in set(self._tips) - set(self._writers):
                del self._tips[sid]  # remembered only under a writer lock


# Every public operation takes its turn (turns.py); ``batch`` takes it for its block;
# an append or a compaction takes it itself, after encoding; ``close`` takes it only
# in the process that opened the handle (forks.py).
_TAKE_THEIR_OWN_TURN: Final = frozenset({"batch", "append", "compact", "close"})
for _name, _member in list(vars(Store).items()):
    if (
        not _name.startswith("_")
        and inspect.isfunction(_member)
        and (_name not in _TAKE_THEIR_OWN_TURN)
    ):
        setattr(Store, _name, one_at_a_time(_member))


_SETTABLE_META: Final = frozenset({"title", "created", "root", "model", "imported"})


def _check_tag_found(name: str) -> None:
    """Refuse a new tag that a spec of its name would not find (resolve.py reads the
    name as something else first): ``HEAD``, a name under ``sessions/``, ``tags/``,
    ``remotes/`` or ``HEAD/``, or hex digits only (an id prefix, now or once an id
    starting so is written)."""
    first = name.split("/", 1)[0]
    if name == "HEAD" or ("/" in name and first in ("HEAD", "sessions", "tags", "remotes")):
        why = f"{first} names something else"
    elif HEX_PREFIX.fullmatch(name):
        why = "hex digits alone are read as an id prefix"
    else:
        return
    raise InvalidName(f"tag {name} would not be found by its name ({why}): give another")


def _is_session_id(name: str) -> bool:
    return SESSION_ID_RE.fullmatch(name) is not None


def _row(info: SessionInfo) -> list[Any]:
    """A SessionInfo as a row of the listing index: its fields in order."""
    return [getattr(info, name) for name in SESSION_FIELDS]


def _check_title(title: str | None) -> None:
    if is_title(title):
        return
    if type(title) is str and len(title) <= MAX_TEXT:
        raise InvalidInput("a title cannot hold a NUL character (\\x00)")
    raise InvalidInput(f"a title must be text of at most {MAX_TEXT} characters")


def _check_model(model: str | None) -> None:
    if model is not None and (type(model) is not str or len(model) > MAX_TEXT):
        raise InvalidInput(f"a model name must be text of at most {MAX_TEXT} characters")
