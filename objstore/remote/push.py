"""Push: send a remote the objects it lacks, then move its ref cells (docs/REMOTES.md 4).

The order is what makes a killed push harmless: every pack and index is
written (``put_new``, acknowledged) before any cell names what is in it, so no
remote ref ever names an object the remote does not hold; a push killed before
its swaps leaves orphan packs, which remote gc drops after its grace period;
a re-run sends its packs again under new names (layout.new_pack_name says
why never under an old one).

**What is missing**, without asking the remote: a remote ref's target ``R``
reaches only objects the remote holds (the invariant above). A fast-forward
from ``R`` to the local head sends the nodes walked from the head back to
``R`` and the objects they link to that are not already linked from the few
nodes at and before ``R`` (a span's messages and an unchanged state are
those); so one new message costs O(1) objects whatever the session's length.
Links come from ``reach.node_links``, the one list of what a node names.
A ref the remote does not have yet, or a forced one, gets everything its
target reaches (objects shared with another ref of the same push go once),
except a **fork**: a new session forked from one the remote has sends only
what follows its fork point, relying on the parent's cell reaching that point.
Relying on another ref is made safe beside remote gc by a *pin*
(``pins/<random>``, naming the fork points) written before that cell is read:
gc marks what young pins name after it has read every ref (REMOTES.md 4).

**Compare-and-swap**: each cell is swapped from the version read before the
objects were sent. A lost swap means someone pushed meanwhile; if what they
pushed is one of the nodes this push sent (it is behind our head on the
same chain) the swap is tried again from there, otherwise the ref is
rejected ("ags pull, then push") unless ``force``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Final

from ..errors import CorruptObject, InvalidName, RefConflict
from ..id_set import IdSet
from ..nodes import SPAN_EVERY, Node, parse_node
from ..objects import ID_RE
from ..packs import encode_block_pack
from ..reach import in_link_order, node_links, scanning
from ..refs import RefRecord, ref_kind, ref_short
from ..store import Store
from ..walk import walk
from .errors import SwapFailed
from .layout import (
    PACKED_BLOCKS_VERSION,
    Marker,
    cell_key,
    check_cell_value,
    checked_marker,
    ensure_marker,
    index_key,
    new_pack_name,
    pack_key,
    pin_body,
    pin_key,
    raise_marker,
    ref_of_cell,
)
from .storage import Cell, RemoteStorage

PACK_CONTENT_BYTES: Final = 32 * 1024 * 1024
"""Uncompressed object bytes per pack sent: one PUT, whose compressed bytes (about a
third) and index entries are held in memory while it is built."""
PARALLEL: Final = 16  # requests in flight for ref cells

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class RefPush:
    """What a push did to one ref: ``outcome`` is ``created``, ``fast-forward``,
    ``forced``, ``up to date``, ``updated`` (metadata only), ``deleted`` (``delete``)
    or ``rejected``."""

    ref: str  # sessions/<id> or tags/<name>
    old: str | None  # the remote's target before
    new: str | None  # the local target pushed
    outcome: str
    why: str | None = None  # for a rejection: what to do
    etag: str | None = None  # the cell's version once pushed (what a fetch compares)
    value: Any = None  # what the cell holds once pushed (its tracking ref's body)


@dataclass(frozen=True, slots=True)
class PushResult:
    refs: list[RefPush]
    objects: int  # objects sent
    packs: int  # packs sent (each with its index)

    @property
    def rejected(self) -> list[RefPush]:
        return [r for r in self.refs if r.outcome == "rejected"]


def cell_value(rec: RefRecord) -> dict[str, Any]:
    """A remote cell's value for a local ref: its body without its generation (the
    cell has its own) and without ``meta.imported``: what an importer remembers of
    files on this machine (their paths), which an export leaves out too."""
    value = {k: v for k, v in rec.body.items() if k != "generation"}
    if isinstance(value.get("meta"), dict):
        value["meta"] = {k: v for k, v in value["meta"].items() if k != "imported"}
    return value


def _target(cell: Cell) -> str | None:
    """The node a cell names; None for none, or for a value ags did not write (which
    only ``--force`` gets past, check_cell_value)."""
    value = cell.value
    target = value.get("target") if isinstance(value, dict) else None
    return target if isinstance(target, str) and ID_RE.fullmatch(target) else None


def nodes_since(store: Store, head: str, base: str) -> list[str] | None:
    """The node ids from ``head`` back to ``base`` (excluded), newest first, if ``base``
    is an ancestor of ``head``; None if it is not (or ``base`` is not in this store).
    A node's message count never falls along a chain, so the walk stops as soon as it
    is below ``base``'s."""
    if not store.has_object(base):
        return None
    floor = store.node(base).messages
    found: list[str] = []
    for node in walk(head, store.node):
        if node.id == base:
            return found
        if node.messages < floor:
            return None
        found.append(node.id)
    return None


def _new_objects(store: Store, new_nodes: list[str], base: str) -> Iterator[str]:
    """The nodes ``new_nodes`` (newest first) and what they link to that is not linked
    from ``base`` and the SPAN_EVERY nodes before it (all on the remote already);
    oldest first, each node after its blobs and files (``send_objects`` says why)."""
    known: set[str] = set()
    for i, node in enumerate(walk(base, store.node)):
        if i > SPAN_EVERY:
            break
        known.update(link.target for link in node_links(node) if link.kind != "node")
    for node_id in reversed(new_nodes):
        for link in node_links(store.node(node_id)):
            if link.kind != "node" and link.target not in known:
                known.add(link.target)
                yield link.target
        yield node_id


@dataclass(slots=True)
class _Plan:
    ref: str
    rec: RefRecord
    cell: Cell
    outcome: str
    # The remote targets this push's objects make safe to swap from: the ref's old
    # target and the nodes sent after it, or (everything sent) any node sent.
    covered: frozenset[str] = frozenset()
    everything: bool = False  # all its target reaches is sent


def _read_cells(storage: RemoteStorage, refs: list[str]) -> dict[str, Cell]:
    with ThreadPoolExecutor(PARALLEL) as pool:
        cells = pool.map(storage.read_cell, (cell_key(r) for r in refs))
        return dict(zip(refs, cells, strict=True))


def _fork_point(store: Store, rec: RefRecord, cell: Cell) -> tuple[str, str] | None:
    """(parent session, fork point) of a session the remote lacks that was forked from
    a node its own history still descends from; None for anything else."""
    if _target(cell) is not None or ref_kind(rec.name) != "sessions" or rec.target is None:
        return None
    meta = rec.body.get("meta")
    origin = meta.get("forked_from") if isinstance(meta, dict) else None
    if not isinstance(origin, dict):
        return None
    parent, point = origin.get("session"), origin.get("node")
    if not isinstance(parent, str) or not isinstance(point, str) or not ID_RE.fullmatch(point):
        return None
    if parent == ref_short(rec.name) or nodes_since(store, rec.target, point) is None:
        return None
    return parent, point


def _absent(cells: dict[str, Cell], ref: str) -> bool:
    """Whether this push read ``ref``'s cell and found no target there."""
    return ref in cells and _target(cells[ref]) is None


def _held_fork_points(
    storage: RemoteStorage, store: Store, forks: dict[str, tuple[str, str]]
) -> dict[str, str]:
    """Of ``forks`` (ref -> (parent session, fork point)), the refs whose fork point the
    remote holds now, and that point: one pin naming them all is written first, then
    the parents' cells are read (after it: the order remote gc's argument needs)."""
    if not forks:
        return {}
    points = sorted({point for _parent, point in forks.values()})
    storage.put_new(pin_key(), pin_body(points))
    parents = sorted({f"sessions/{parent}" for parent, _point in forks.values()})
    cells = _read_cells(storage, parents)
    held = {}
    for ref, (parent, point) in forks.items():
        now = _target(cells[f"sessions/{parent}"])
        # What the parent's cell reaches is on the remote (FORMAT.md 16.4's invariant).
        if now is not None and store.has_object(now) and nodes_since(store, now, point) is not None:
            held[ref] = point
    return held


def _plan(
    store: Store,
    reader: _Reader,
    rec: RefRecord,
    cell: Cell,
    force: bool,
    fork_point: str | None = None,
    seen_etag: str | None = None,
    checked: bool = False,
) -> tuple[_Plan, Iterable[str]]:
    """What to do with one ref, and the objects it needs sent. ``checked``: compare
    ``seen_etag``, the cell's etag when this store last fetched or pushed it (its
    tracking ref), before a change of metadata alone."""
    value, old, head = cell_value(rec), _target(cell), rec.target
    if cell.value == value:
        return _Plan(rec.name, rec, cell, "up to date"), ()
    if checked and old == head and cell.exists and not force and cell.etag != seen_etag:
        # Metadata only, and the remote's changed since this store last saw it: a
        # pull names what changed on both sides (FORMAT.md 16.5); a push would drop it.
        return _Plan(rec.name, rec, cell, "rejected"), ()
    if old == head or (head is None and (old is None or force)):
        # Metadata only (or an empty session); emptying a remote history is forced.
        outcome = "updated" if cell.exists else "created"
        if old != head:
            outcome = "forced"
        return _Plan(rec.name, rec, cell, outcome, frozenset([old] if old else []), force), ()
    if head is None:
        return _Plan(rec.name, rec, cell, "rejected"), ()
    since = nodes_since(store, head, old) if old is not None else None
    if old is not None and since is not None:
        plan = _Plan(rec.name, rec, cell, "fast-forward", frozenset([old, *since]))
        return plan, _new_objects(store, since, old)
    if old is None and fork_point is not None:
        since = nodes_since(store, head, fork_point) or []
        plan = _Plan(rec.name, rec, cell, "created", frozenset([fork_point, *since]))
        return plan, _new_objects(store, since, fork_point)
    if old is None or force:
        closure = list(in_link_order([head], reader.node))  # send_objects says why
        outcome = "created" if old is None else "forced"
        return _Plan(rec.name, rec, cell, outcome, frozenset(closure), True), closure
    return _Plan(rec.name, rec, cell, "rejected"), ()


class _Reader:
    """Reads objects for a push once each: a node read to follow its links keeps its
    content for the pack (a push of a whole history otherwise reads every node twice).
    Reads go through ``reach.scanning``: the objects of a push of many sessions lie
    all over the store's packs, whose pages would otherwise all stay mapped."""

    def __init__(self, store: Store) -> None:
        self._kept: dict[str, bytes] = {}
        self._read = scanning(store.raw_object, store.release_pages)

    def node(self, oid: str) -> Node:
        kind, body = self._read(oid)
        if kind != "node":
            raise CorruptObject(oid, f"expected a node, found a {kind}")
        self._kept[oid] = b"node\0" + body
        return parse_node(oid, body)

    def forget(self, oid: str) -> None:
        """Drop what was kept of ``oid``: it will not be sent (another ref sent it)."""
        self._kept.pop(oid, None)

    def contents(self, oids: Iterable[str]) -> Iterator[tuple[str, bytes]]:
        for oid in oids:
            content = self._kept.pop(oid, None)
            if content is None:
                kind, body = self._read(oid)
                content = kind.encode("ascii") + b"\0" + body
            yield oid, content


def send_objects(
    storage: RemoteStorage,
    store: Store,
    marker: Marker,
    oids: Iterable[str],
    reader: _Reader | None = None,
    after_pack: Callable[[], None] | None = None,
) -> int:
    """Send ``oids`` as block packs, each pack before its index; return how many packs.

    ``oids`` comes in link order (``reach.in_link_order``): each object after the
    objects it links to that the remote lacks. A push killed between two packs
    leaves its packs behind (remote gc's to sweep), and a fetch or clone meanwhile
    takes them in: every link in them must name an object the remote holds, or that
    store's fsck finds nodes whose parents are missing.

    Objects are compressed block by block as they are read, so what is held is one
    pack's compressed bytes and index entries, never its objects. ``oids`` may be a
    generator that plans as it goes: ``after_pack`` runs once each pack is stored,
    before the next object is asked for, so everything asked for so far is stored.

    ``marker``: the remote's marker as the caller read it, raised to
    PACKED_BLOCKS_VERSION before the first pack is written (its blocks may be in the
    MessagePack layout, which an ags that reads remote format 2 would take for damage)."""
    source = (reader or _Reader(store)).contents(oids)
    packs = 0

    def one_pack(first: tuple[str, bytes]) -> Iterator[tuple[str, bytes]]:
        item: tuple[str, bytes] | None = first
        size = 0
        while item is not None:
            yield item
            size += len(item[1])
            if size >= PACK_CONTENT_BYTES:
                return
            item = next(source, None)

    for first in source:  # each turn takes objects from ``source`` up to a pack's worth
        pack, index = encode_block_pack(one_pack(first))
        marker = raise_marker(storage, marker, PACKED_BLOCKS_VERSION)
        name = new_pack_name()
        storage.put_new(pack_key(name), pack)
        storage.put_new(index_key(name), index)  # after the pack: an index names a whole pack
        packs += 1
        del pack, index
        if after_pack is not None:
            after_pack()
    return packs


def _swap(storage: RemoteStorage, plan: _Plan, force: bool) -> RefPush:
    head, old, cell = plan.rec.target, _target(plan.cell), plan.cell
    value = cell_value(plan.rec)
    for _ in range(8):  # each round lost to a writer that moved the ref meanwhile
        try:
            done = storage.swap(cell, value)
            return RefPush(plan.ref, old, head, plan.outcome, etag=done.etag, value=value)
        except SwapFailed as e:
            current = e.current if e.current is not None else storage.read_cell(cell.key)
            if current.value == value:
                return RefPush(plan.ref, old, head, "up to date", etag=current.etag, value=value)
            now = _target(current)
            # Go on only if every object the new version would need is on the remote
            # already (``now`` reaches it) or was sent by this push, and not over
            # metadata that changed under a push of metadata alone (as ``_plan``).
            safe = now in plan.covered or (plan.everything and (now is None or force))
            safe = safe and (force or plan.outcome != "updated")
            if not safe:
                why = "the remote moved since you fetched; ags pull, then push"
                if force:
                    why = "the remote moved while pushing; push again"
                return RefPush(plan.ref, now, head, "rejected", why)
            cell = current
    return RefPush(plan.ref, old, head, "rejected", "the remote kept moving; push again")


def push(
    store: Store,
    storage: RemoteStorage,
    refs: list[str],
    *,
    force: bool = False,
    progress: Progress | None = None,
    seen: Mapping[str, RefRecord] | None = None,
) -> PushResult:
    """Push the local refs ``refs`` (``sessions/<id>``, ``tags/<name>``) to ``storage``.

    ``seen``: the remote-tracking refs of this remote by session id
    (``Store.tracking_refs``); a push that changes only a session's metadata is
    rejected when the remote's cell moved since its tracking ref saw it.

    Checks the remote (``checked_marker``: one holding other things is refused
    before anything is written there), writes the marker on an empty remote,
    reads each ref's cell, sends what is missing as packs, then swaps the
    cells. Rejected refs are in the result (nothing of theirs is overwritten);
    the caller moves remote-tracking refs (``record_push``)."""
    marker = ensure_marker(storage, checked_marker(storage))
    records: dict[str, RefRecord] = {}
    for ref in refs:
        rec = store.read_ref(ref)
        if rec is None:
            raise RefConflict(f"{ref} does not exist here")
        records[ref] = rec
    cells = _read_cells(storage, list(records))
    if not force:  # a cell some other program wrote is not overwritten unasked
        for ref, cell in cells.items():
            check_cell_value(storage.url, ref, cell.value)
    forks = {
        ref: found
        for ref, rec in records.items()
        if cells[ref].value != cell_value(rec)
        and (found := _fork_point(store, rec, cells[ref]))
        and not _absent(cells, f"sessions/{found[0]}")  # then sent whole, with its parent
    }
    fork_points = _held_fork_points(storage, store, forks)
    # Refs are planned, sent and swapped in rounds of about one pack, so that what a
    # push holds does not grow with the store: each cell is swapped once the pack
    # holding the last object it needs is stored.
    plans: list[_Plan] = []
    ready: list[_Plan] = []  # every object they need is in a stored pack
    swapped: dict[str, RefPush] = {}
    # 16 bytes of each id: two of the objects of a push sharing them (about one chance
    # in 10**26 for two million) would leave one unsent; whole ids take twice the memory.
    sent = IdSet(key_bytes=16)
    reader = _Reader(store)

    def objects() -> Iterator[str]:
        for done, (ref, rec) in enumerate(records.items(), 1):
            checked = seen is not None and ref_kind(ref) == "sessions"
            tracked = seen.get(ref_short(ref)) if seen is not None else None
            seen_etag = tracked.body.get("etag") if tracked is not None else None
            plan, oids = _plan(
                store, reader, rec, cells[ref], force, fork_points.get(ref), seen_etag, checked
            )
            plans.append(replace(plan, covered=frozenset()))  # what the result needs
            for oid in oids:
                if sent.add(oid):
                    yield oid
                else:
                    reader.forget(oid)
            ready.append(plan)
            if progress is not None:
                progress("sending sessions", done, len(records))

    with ThreadPoolExecutor(PARALLEL) as pool:

        def swap_ready() -> None:
            todo = [p for p in ready if p.outcome not in ("up to date", "rejected")]
            outcomes = pool.map(lambda p: _swap(storage, p, force), todo)
            swapped.update(zip((p.ref for p in todo), outcomes, strict=True))
            ready.clear()

        packs = send_objects(storage, store, marker, objects(), reader, swap_ready)
        swap_ready()
    results = []
    for plan in plans:
        if plan.ref in swapped:
            results.append(swapped[plan.ref])
        elif plan.outcome == "rejected":
            results.append(
                RefPush(
                    plan.ref,
                    _target(plan.cell),
                    plan.rec.target,
                    "rejected",
                    "the remote has changes you do not have; ags pull first (or --force)",
                )
            )
        else:
            results.append(
                RefPush(
                    plan.ref,
                    _target(plan.cell),
                    plan.rec.target,
                    plan.outcome,
                    etag=plan.cell.etag,
                    value=plan.cell.value,
                )
            )
    return PushResult(results, len(sent), packs)


def delete_refs(
    store: Store, storage: RemoteStorage, refs: list[str], *, force: bool = False
) -> PushResult:
    """Delete the remote refs ``refs`` (``sessions/<id>``, ``tags/<name>``): each cell is
    swapped to a tombstone (``null``) from the version read, so a push that lands
    meanwhile makes the delete fail rather than be lost. A ref whose remote head this
    store does not hold (work it has never seen) is refused unless ``force``; one the
    remote does not have is refused. Nothing is sent; remote gc sweeps what it freed."""
    for ref in refs:
        if ref_of_cell(cell_key(ref)) != ref:
            raise InvalidName(f"{ref} names no session or tag (sessions/<id>, tags/<name>)")
    if checked_marker(storage) is None:
        return PushResult(
            [RefPush(r, None, None, "rejected", "the remote has no such ref") for r in refs], 0, 0
        )
    cells = _read_cells(storage, refs)
    results = []
    for ref, cell in cells.items():
        if not force:
            check_cell_value(storage.url, ref, cell.value)
        old = _target(cell)
        if cell.value is None:
            results.append(RefPush(ref, None, None, "rejected", "the remote has no such ref"))
        elif old is not None and not store.has_object(old) and not force:
            why = "the remote has changes you have not seen; ags fetch to look (or --force)"
            results.append(RefPush(ref, old, None, "rejected", why))
        else:
            try:
                done = storage.swap(cell, None)
                results.append(RefPush(ref, old, None, "deleted", etag=done.etag))
            except SwapFailed:
                why = "the remote moved while deleting; ags fetch to look, then delete again"
                results.append(RefPush(ref, old, None, "rejected", why))
    return PushResult(results, 0, 0)


def record_push(store: Store, remote: str, result: PushResult) -> None:
    """Move the remote-tracking refs of the sessions pushed to what the remote now holds,
    and drop those of the sessions deleted there (one batch: one sync)."""
    moved = [
        r
        for r in result.refs
        if ref_kind(r.ref) == "sessions"
        and (r.outcome == "deleted" or (r.outcome != "rejected" and isinstance(r.value, dict)))
    ]
    if not moved:
        return
    with store.batch():
        for r in moved:
            if r.outcome == "deleted":
                store.set_tracking_ref(remote, ref_short(r.ref), None, f"push {remote} --delete")
                continue
            # What was pushed, not the local ref now: it may have moved on meanwhile.
            body = {**r.value, "etag": r.etag}
            store.set_tracking_ref(remote, ref_short(r.ref), body, f"push {remote}")
