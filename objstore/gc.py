"""Garbage collection: drop archived sessions past retention, expire reflog
entries, sweep what nothing reaches any more.

What is kept: every object reached from a session, a tag, a HEAD, or a reflog
entry that has not expired (so rewinds and deletes stay undoable until then),
and every object written less than the grace period ago, whether reachable
or not (a writer's objects exist before the ref that reaches them). Why a
writer running beside gc loses nothing is argued at ``ObjectStore.sweep``.

A session dropped for retention goes with its reflog: it sat archived for
the whole retention period, which was its time to be undone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from .errors import InvalidInput, InvalidName, SessionBusy, StoreFormatError
from .object_store import MIN_GRACE
from .reach import reachable
from .refs import RefRecord, iso_time
from .resolve import session_ref
from .store import Store

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass(frozen=True, slots=True)
class GcReport:
    dry_run: bool
    sessions_dropped: list[str]
    reflog_entries_expired: int
    objects_swept: int
    bytes_freed: int
    packs_rewritten: int
    loose_packed: int
    sessions_skipped: list[str] = field(default_factory=list)  # busy: a writer holds them


def collect_garbage(
    store: Store,
    *,
    archived_older_than: float | None = 30 * 86400,
    grace: float = 3600,
    reflog_older_than: float | None = 90 * 86400,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> GcReport:
    """Collect garbage in ``store``; durations are seconds (None: never)."""
    if grace < MIN_GRACE:
        raise InvalidInput(
            f"the grace period must be at least {MIN_GRACE // 60} minutes: "
            "a writer running beside gc relies on it"
        )
    for kind in ("sessions", "tags", "HEAD"):  # a damaged ref stops gc before any change
        for name in store.refs.names(kind):
            _read_ref(store, name)
    now = time.time()
    to_drop = []
    if archived_older_than is not None:
        cutoff = iso_time(now - archived_older_than)
        to_drop = [
            s.id
            for s in store.sessions(include_archived=True)
            if s.archived_at is not None and s.archived_at < cutoff
        ]
    reflog_cutoff = iso_time(now - reflog_older_than) if reflog_older_than is not None else None

    dropped, skipped = [], []
    expired = 0
    if dry_run:
        dropped = to_drop
    else:
        for sid in to_drop:
            try:
                store.delete(sid)
            except SessionBusy:
                skipped.append(sid)
                continue
            store.refs.delete_reflog(session_ref(sid))
            dropped.append(sid)
    gone = {session_ref(s) for s in dropped}
    if reflog_cutoff is not None:
        for name in list(store.refs.log_names()):
            if name not in gone:
                expired += store.refs.expire_reflog(name, reflog_cutoff, dry_run=dry_run)

    def mark() -> set[str]:
        roots = root_nodes(store, skip_refs=gone, reflog_cutoff=reflog_cutoff)
        if progress:
            progress("mark", 0, 1)
        found = reachable(roots, store.node)
        if progress:
            progress("mark", 1, 1)
        return found

    def sweep_progress(done: int, total: int) -> None:
        if progress:
            progress("sweep", done, total)

    swept = store.objects.sweep(now - grace, mark, dry_run=dry_run, progress=sweep_progress)
    return GcReport(
        dry_run,
        dropped,
        expired,
        swept.objects_swept,
        swept.bytes_freed,
        swept.packs_rewritten,
        swept.loose_packed,
        skipped,
    )


def _read_ref(store: Store, name: str) -> RefRecord | None:
    """A ref as gc needs it: None for a stray file that is no ref name (fsck names
    it); a damaged ref stops gc, since what it reaches is unknown and sweeping
    could lose it."""
    try:
        return store.refs.read(name)
    except InvalidName:
        return None
    except StoreFormatError as e:
        raise StoreFormatError(
            f"gc stopped before changing anything: {e}; repair or remove it first "
            "(ags fsck lists the damage)"
        ) from None


def root_nodes(
    store: Store, *, skip_refs: Collection[str] = (), reflog_cutoff: str | None = None
) -> set[str]:
    """The node ids every ref and every unexpired reflog entry names."""
    roots: set[str] = set()
    for kind in ("sessions", "tags", "HEAD"):
        for name in store.refs.names(kind):
            if name in skip_refs:
                continue
            rec = _read_ref(store, name)
            if rec is not None and isinstance(rec.target, str) and "/" not in rec.target:
                roots.add(rec.target)
    for name in store.refs.log_names():
        if name in skip_refs:
            continue
        for entry in store.refs.reflog(name):
            if reflog_cutoff is not None and entry.time < reflog_cutoff:
                continue
            for value in (entry.old, entry.new):
                if value and "/" not in value:
                    roots.add(value)
    return roots
