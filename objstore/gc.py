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
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

from .errors import InvalidInput, ObjectError, SessionBusy, StoreFormatError
from .id_set import MARK_KEY_BYTES, IdSet
from .object_store import MIN_GRACE
from .reach import reach_into, scanning
from .refs import iso_time, session_ref
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
    for _root in roots(store):  # a damaged ref stops gc before it changes anything
        pass
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
                store.purge(sid)
            except SessionBusy:
                skipped.append(sid)
                continue
            dropped.append(sid)
    gone = {session_ref(s) for s in dropped}
    if reflog_cutoff is not None:
        expired = store.expire_reflogs(reflog_cutoff, skip=gone, dry_run=dry_run)

    def mark() -> IdSet:
        found = roots(store, skip=gone, reflog_cutoff=reflog_cutoff)
        if progress:
            progress("mark", 0, 1)
        # An IdSet and a reader that lets go of pack pages: the mark holds every id
        # of the store and reads most of its packs (FORMAT.md 11 gives the bound).
        # A node that cannot be read hides what it links to: its parent and
        # everything before it would look unreachable, and be swept. So gc stops.
        try:
            marked = reach_into(
                IdSet(store.object_count_hint(), key_bytes=MARK_KEY_BYTES),
                found,
                scanning(store.node, store.release_pages),
                skip_missing=False,
            )
        except ObjectError as e:
            raise StoreFormatError(
                f"gc stopped before sweeping anything: {e}, so what it links to cannot "
                "be followed; repair or remove it first (ags fsck lists the damage)"
            ) from None
        store.release_pages()
        if progress:
            progress("mark", 1, 1)
        return marked

    def sweep_progress(done: int, total: int) -> None:
        if progress:
            progress("sweep", done, total)

    swept = store.sweep(now - grace, mark, dry_run=dry_run, progress=sweep_progress)
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


def roots(
    store: Store, *, skip: Collection[str] = (), reflog_cutoff: str | None = None
) -> Iterator[str]:
    """``Store.iter_roots``, with a damaged ref named as what stops gc: what it reaches
    is unknown, and sweeping could lose it."""
    try:
        yield from store.iter_roots(skip=skip, reflog_cutoff=reflog_cutoff)
    except StoreFormatError as e:
        raise StoreFormatError(
            f"gc stopped before changing anything: {e}; repair or remove it first "
            "(ags fsck lists the damage)"
        ) from None
