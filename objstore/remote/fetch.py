"""Fetch and pull: bring a remote's sessions into the store (docs/REMOTES.md 5).

``fetch`` lists the remote's ref cells, reads again only those whose etag
moved since the remote-tracking ref last saw them (so a fetch where nothing
moved is one LIST), and, if a head it learns is not here, fetches the packs
it has not fetched before: each index first, then, if it lists an object this
store lacks, the blocks holding those (ranged reads, ranged.py) or the whole
pack when most of it is needed. A pack is added only after every block and object
in it verified and its index matched; what every pack brings goes into one
local pack that appears only once all of them are in (``Store.staged_blocks``),
so a fetch killed midway adds no object at all, never one whose links name
objects it had not fetched yet. The remote-tracking refs
``remotes/<name>/<session>`` move last, in one batch, and only to heads that
are here, so a fetch killed midway leaves them naming objects the store holds.

``pull`` fetches, then moves each local session to its tracking ref when
that is a fast-forward (or creates it); a session that diverged is left as
it is and named, never rewritten: the rule of import.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .. import canonical
from ..errors import RefConflict, SessionBusy
from ..files import atomic_write, make_dirs, read_file
from ..pack_format import BLOCK_IDX_ENTRY, ENTRIES_AT, parse_index
from ..packs import verified_block_pack
from ..refs import RefRecord, ref_kind, ref_short, session_ref, tracking_ref
from ..session_meta import meta_damage
from ..store import Store, session_info
from .layout import (
    PACK_KEY_RE,
    PACKS,
    REFS,
    cell_damage,
    cell_key,
    index_key,
    pack_key,
    read_marker,
    ref_of_cell,
)
from .push import PARALLEL, nodes_since
from .ranged import fetch_pack_part
from .storage import RemoteStorage

Progress = Callable[[str, int, int], None]
CACHE_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class RefFetch:
    ref: str  # sessions/<id> or tags/<name>
    old: str | None  # what the tracking ref (or local tag) named before
    new: str | None
    outcome: str  # "new", "updated", "deleted", "tag created", "tag differs", "damaged"
    why: str | None = None  # for "damaged": what is wrong with the remote's cell


@dataclass(slots=True)
class FetchResult:
    refs: list[RefFetch] = field(default_factory=list)
    packs: int = 0  # packs fetched
    objects: int = 0  # objects new here


def _cache_path(store: Store, remote: str) -> Path:
    return store.path / "cache" / "remotes" / remote / "packs.json"


def _fetched_packs(store: Store, remote: str) -> set[str]:
    """The remote packs fetched before (derived data: lost, every index is read again)."""
    try:
        body = canonical.loads(read_file(_cache_path(store, remote)))
        if body.get("version") == CACHE_VERSION and isinstance(body.get("packs"), list):
            return {p for p in body["packs"] if isinstance(p, str)}
    except (OSError, ValueError, AttributeError):
        pass
    return set()


def _save_fetched_packs(store: Store, remote: str, names: set[str]) -> None:
    path = _cache_path(store, remote)
    make_dirs(path.parent)
    body = {"packs": sorted(names), "version": CACHE_VERSION}
    atomic_write(store.tmp_dir, path, canonical.dumps(body) + b"\n")


def index_ids(index: bytes, name: str) -> list[str]:
    """The object ids a block pack's index lists (FORMAT.md 5.3)."""
    head = parse_index(index, f"{name}: its index")
    size = BLOCK_IDX_ENTRY.size
    end = ENTRIES_AT + head.entries * size
    return [index[at : at + 32].hex() for at in range(ENTRIES_AT, end, size)]


def fetch_packs(
    store: Store, storage: RemoteStorage, remote: str, progress: Progress | None
) -> tuple[int, int]:
    """Fetch every pack not fetched before that holds an object this store lacks:
    (packs fetched, objects new here)."""
    done = _fetched_packs(store, remote)
    names = sorted(
        {
            m.group(1)
            for info in storage.list(PACKS)
            if (m := PACK_KEY_RE.fullmatch(info.key)) and m.group(2) == "idx"
        }
    )
    todo = [n for n in names if n not in done]
    packs = objects = 0
    # One local pack for the whole fetch, in the store only once every remote pack is
    # in it: a remote's packs name one another's objects, in no order their names
    # tell, so a fetch killed after some of them left nodes whose parents it had not
    # fetched yet (Store.staged_blocks).
    with store.staged_blocks() as staging:
        for i, name in enumerate(todo):
            index = storage.get(index_key(name))
            where = f"{storage.url} pack {name}"
            if not all(staging.has(oid) for oid in index_ids(index, where)):
                part = fetch_pack_part(staging, storage, name, index, where)
                if part is None:  # most of it is needed: one GET of the whole
                    pack = storage.get(pack_key(name))
                    objects += staging.add(verified_block_pack(pack, index, where))
                    del pack
                else:
                    objects += part[0]
                packs += 1
            done.add(name)
            if progress is not None:
                progress("fetching packs", i + 1, len(todo))
    if todo:
        _save_fetched_packs(store, remote, done & set(names))
    return packs, objects


def _cell_target(value: Any) -> str | None:
    return value.get("target") if isinstance(value, dict) else None


def fetch(
    store: Store,
    storage: RemoteStorage,
    remote: str,
    *,
    progress: Progress | None = None,
    on_wait: Callable[[], None] | None = None,
) -> FetchResult:
    """Bring the remote's heads into ``remotes/<remote>/<session>`` and their objects
    into the store; create local tags the store does not have. One fetch or pull
    into a store runs at a time (two pulls at once: one failed on a tracking ref
    the other's batch was writing); another process's is waited for, ``on_wait``
    told first."""
    with store.one_at_a_time("fetch", on_wait):
        return _fetch(store, storage, remote, progress)


def _fetch(
    store: Store, storage: RemoteStorage, remote: str, progress: Progress | None
) -> FetchResult:
    result = FetchResult()
    if read_marker(storage) is None:
        return result  # an empty remote: nothing to fetch
    tracking = store.tracking_refs(remote)
    listed = {}
    for info in storage.list(REFS):
        ref = ref_of_cell(info.key)
        if ref is not None:
            listed[ref] = info
        else:  # in a ref's place: a folder of files, a name no store can hold
            stray = f"{storage.url}: {info.key} is not the key of a ref cell"
            result.refs.append(RefFetch(info.key, None, None, "damaged", stray))
    # Read again only the cells whose etag moved since they were last seen.
    stale = [
        ref
        for ref, info in listed.items()
        if ref_kind(ref) == "tags"
        or info.etag is None
        or ref_short(ref) not in tracking
        or tracking[ref_short(ref)].body.get("etag") != info.etag
        or meta_damage(tracking[ref_short(ref)].body.get("meta")) is not None
    ]
    with ThreadPoolExecutor(PARALLEL) as pool:
        read = pool.map(storage.read_cell, (REFS + r for r in stale))
        cells = dict(zip(stale, read, strict=True))
    damaged = {ref: why for ref, cell in cells.items() if (why := cell_damage(ref, cell.value))}
    heads = {_cell_target(c.value) for r, c in cells.items() if r not in damaged} - {None}
    if any(not store.has_object(h) for h in heads if h is not None):
        result.packs, result.objects = fetch_packs(store, storage, remote, progress)
    for ref, cell in cells.items():
        head = _cell_target(cell.value)
        if ref not in damaged and head is not None and not store.has_object(head):
            damaged[ref] = f"{cell_key(ref)} names node {head}, which no pack of the remote holds"
    # A damaged cell is named and left out; the refs it would have moved stay as they
    # were (a tracking ref is not deleted for it), and every other ref is fetched.
    for ref, why in sorted(damaged.items()):
        del cells[ref]
        result.refs.append(RefFetch(ref, None, None, "damaged", f"{storage.url}: {why}"))
    with store.batch():
        for ref, cell in sorted(cells.items()):
            head = _cell_target(cell.value)
            if ref_kind(ref) == "tags":
                _fetch_tag(store, ref, head, result)
                continue
            sid = ref_short(ref)
            before = tracking.get(sid)
            old = before.target if before is not None else None
            if cell.value is None:
                if before is not None:
                    store.set_tracking_ref(remote, sid, None, f"fetch {remote}")
                    result.refs.append(RefFetch(ref, old, None, "deleted"))
                continue
            body = {**cell.value, "etag": cell.etag}
            store.set_tracking_ref(remote, sid, body, f"fetch {remote}")
            if old != head or before is None:
                result.refs.append(RefFetch(ref, old, head, "new" if before is None else "updated"))
        for sid, before in tracking.items():
            if session_ref(sid) not in listed:
                store.set_tracking_ref(remote, sid, None, f"fetch {remote}")
                result.refs.append(RefFetch(session_ref(sid), before.target, None, "deleted"))
    return result


def _fetch_tag(store: Store, ref: str, head: str | None, result: FetchResult) -> None:
    """A remote tag the store lacks is created (as git fetch does); one that names
    another node here is left as it is and reported."""
    if head is None:
        return
    local = store.read_ref(ref)
    if local is None:
        store.tag(ref_short(ref), head)
        result.refs.append(RefFetch(ref, None, head, "tag created"))
    elif local.target != head:
        result.refs.append(RefFetch(ref, local.target, head, "tag differs"))


SYNCED_META: Final = ("title", "archived_at", "model")
"""The metadata a pull brings: what a person sets on a session (``ags title``,
``archive``) and its model. ``created``, ``root`` and ``forked_from`` are set once;
``updated`` and ``messages`` follow the history."""


@dataclass(frozen=True, slots=True)
class SessionPull:
    session: str
    old: str | None
    new: str | None
    # "created", "fast-forward", "up to date", "updated" (metadata only), "ahead",
    # "diverged", "busy", "damaged" (the remote's ref: left out, fetch says why)
    outcome: str
    meta: tuple[str, ...] = ()  # the metadata taken from the remote
    # metadata changed on both sides since they last agreed: the local values kept
    kept: tuple[str, ...] = ()
    why: str | None = None  # for "damaged": what is wrong with the remote's ref


def pull(
    store: Store,
    storage: RemoteStorage,
    remote: str,
    sessions: list[str] | None = None,
    *,
    progress: Progress | None = None,
    on_wait: Callable[[], None] | None = None,
) -> tuple[FetchResult, list[SessionPull]]:
    """Fetch, then fast-forward each local session (all the remote has, or
    ``sessions``) to its remote-tracking ref, creating the ones the store lacks.
    One at a time in a store, as ``fetch``."""
    with store.one_at_a_time("fetch", on_wait):
        fetched = _fetch(store, storage, remote, progress)
        return fetched, _pull_all(store, remote, sessions, fetched)


def _pull_all(
    store: Store, remote: str, sessions: list[str] | None, fetched: FetchResult
) -> list[SessionPull]:
    tracking = store.tracking_refs(remote)
    damaged = {
        ref_short(r.ref): r.why
        for r in fetched.refs
        if r.outcome == "damaged" and ref_kind(r.ref) == "sessions"
    }
    wanted = sorted(tracking.keys() | damaged.keys()) if sessions is None else sessions
    for sid in wanted:
        if sid not in tracking and sid not in damaged:
            raise RefConflict(f"remote {remote} has no session {sid}")
    with store.batch():  # one sync for every session moved, not a few per session
        return [_pull_one(store, remote, sid, tracking.get(sid), damaged) for sid in wanted]


def _pull_one(
    store: Store, remote: str, sid: str, rec: RefRecord | None, damaged: dict[str, str | None]
) -> SessionPull:
    """Move one local session to its remote-tracking ref ``rec`` if that is safe, then
    bring the metadata the remote changed (``_meta_changes``). A session whose remote
    cell the fetch found ``damaged``, or whose tracking ref is (written by an ags that
    checked less), is left as it is."""
    local = store.read_ref(session_ref(sid))
    old = local.target if local is not None else None
    if sid in damaged or rec is None:
        return SessionPull(sid, old, None, "damaged", why=damaged.get(sid))
    damage = meta_damage(rec.body.get("meta"))
    if damage is not None:
        why = f"{tracking_ref(remote, sid)} is damaged: {damage}"
        return SessionPull(sid, old, rec.target, "damaged", why=why)
    head = rec.target
    meta = rec.body["meta"]
    if local is not None and old == head:
        outcome = "up to date"
    elif old is not None and head is not None and nodes_since(store, old, head) is not None:
        outcome = "ahead"
    else:
        try:
            outcome = store.fast_forward(sid, head, meta, f"pull {remote}")
        except SessionBusy:  # a writer holds it: left for the next pull
            return SessionPull(sid, old, head, "busy")
        except RefConflict:
            return SessionPull(sid, old, head, "diverged")
        if outcome == "created":
            return SessionPull(sid, old, head, outcome)
    taken, kept = _meta_changes(store, remote, sid, meta)
    if taken:
        try:
            store.take_meta(sid, f"pull {remote}", **taken)
        except SessionBusy:
            return SessionPull(sid, old, head, "busy")
        if outcome == "up to date":
            outcome = "updated"
    return SessionPull(sid, old, head, outcome, tuple(taken), kept)


def _meta_changes(
    store: Store, remote: str, sid: str, theirs: dict[str, Any]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Which of the remote's ``SYNCED_META`` values to take, and which local ones to
    keep because both sides changed since they last agreed.

    Metadata has no history to merge from, so the reflogs tell who changed what
    since the last sync (a pull into the session, a push from it): a local
    metadata-only update after it is a local change; a fetch that moved the
    tracking ref after it is a remote one. Only the remote changed: its values are
    taken (a fast-forward). Only the local one: kept (a push sends them). Both:
    kept, and named (as git names a conflict), until a push or a change makes
    them agree."""
    rec = store.read_ref(session_ref(sid))
    mine = session_info(rec) if rec is not None else None
    differ = [k for k in SYNCED_META if mine is not None and getattr(mine, k) != theirs.get(k)]
    if not differ:
        return {}, ()
    pulled = f"pull {remote}"
    local = store.reflog_entries(session_ref(sid))
    tracking = store.reflog_entries(tracking_ref(remote, sid))
    synced = max(
        [e.time for e in local if e.reason == pulled]
        + [e.time for e in tracking if e.reason == f"push {remote}"],
        default="",
    )
    # Reflog times are in milliseconds: a tie counts as a local change, so that one
    # is never overwritten unseen.
    mine_changed = any(e.time >= synced and e.old == e.new and e.reason != pulled for e in local)
    theirs_changed = any(e.time > synced and e.reason == f"fetch {remote}" for e in tracking)
    if mine_changed and theirs_changed:
        return {}, tuple(differ)
    if mine_changed:
        return {}, ()
    return {k: theirs.get(k) for k in differ}, ()
