"""fsck: verify every object's hash, every link, every ref, reflog and pack.

Problems are collected, not raised: a damaged store is exactly when a user
needs the whole list, so every check goes on past what it finds. Nothing is
written. Also checked: who can reach the store's files (permissions.py):
links, other owners and files others can write are problems; files others
can read are a warning.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from itertools import chain, compress
from typing import Final

from . import fsck_read
from .errors import AgsError, ObjectError, StoreFormatError
from .fsck_read import key, plan, read_parts
from .nodes import Node, parse_node
from .packs import Checked, SealedPack
from .permissions import access_report
from .reach import node_links
from .refs import RefRecord, names_node, ref_kind, session_of
from .session_meta import meta_damage
from .store import Store, session_info

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Problem:
    where: str  # an object id, a ref name, a pack file
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass(frozen=True, slots=True)
class FsckReport:
    objects: int
    refs: int
    problems: list[Problem]
    warnings: list[str] = field(default_factory=list)  # worth knowing, not damage
    bytes_read: int = 0  # of packs, their indexes and loose objects
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def check_store(
    store: Store, progress: Progress | None = None, *, workers: int | None = None
) -> FsckReport:
    """Every problem of the store. Sealed packs are read in parts, each block once,
    by ``workers`` processes side by side (by default one per core for a big store,
    fsck_read.read_parts); in memory here about 25 bytes an object while they read
    (flat arrays of keys, ``_Seen``) and about 75 at the peak after (the set of one
    kind), and a block in each worker. ``progress(done, total)`` is called after
    each part with ``total`` -1 (not known before the end), then once with both."""
    start = time.perf_counter()
    problems: list[Problem] = []
    warnings: list[str] = []
    access = access_report(store.path)
    problems += [Problem(path, what) for path, what in access.problems]
    loose = access.open_to_others
    if loose:
        shown = ", ".join(loose[:3]) + (f" and {len(loose) - 3} more" if len(loose) > 3 else "")
        warnings.append(
            f"{len(loose)} files or directories of the store can be read by other users "
            f"({shown}): chmod -R go-rwx {store.path}"
        )
    problems += [Problem(name, why) for name, why in store.pack_problems()]
    # Refs are read before the objects: what they name was written before them, so
    # the read finds it even while a writer goes on; and the nodes they name are the
    # ones whose message count the read keeps.
    refs = [(name, _read_ref(store, name)) for name in store.ref_names()]
    wanted = frozenset(
        key(rec.target)
        for name, rec in refs
        if isinstance(rec, RefRecord) and ref_kind(name) == "sessions"
        and isinstance(rec.target, str)
    )  # fmt: skip
    seen = _Seen()
    packs = store.sealed_packs()
    pack_problems: list[list[str]] = [[] for _ in packs]
    parts = plan(packs, pack_problems)
    sums = [[0, 0, 0] for _ in packs]  # per pack: objects placed, their placements, index sum
    index_problems: list[Problem] = []
    for part, found in zip(parts, read_parts(packs, parts, wanted, workers), strict=True):
        number, what, first, stop = part
        pack = packs[number]
        sums[number][0] += found.placed
        sums[number][1] += found.placements
        sums[number][2] += found.index_sum
        pack_problems[number] += found.pack_problems
        if found.index_problem and not any(p.where == pack.path.name for p in index_problems):
            index_problems.append(Problem(pack.path.name, found.index_problem))
        source = None if what == fsck_read.INDEX else _part_nodes(pack, first, stop)
        seen.add(found, source)
        if progress:
            progress(seen.count, -1)
    problems += index_problems
    for number, pack in enumerate(packs):
        read_again: list[Checked] = []
        for item in pack.settle(*sums[number]):
            if isinstance(item, str):
                pack_problems[number].append(item)
            else:
                read_again.append(item)
        if read_again:
            seen.add_checked(read_again, wanted)
    seen.add_checked(store.unsealed_objects(), wanted, store.unsealed_objects)
    if progress:
        progress(seen.count, seen.count)
    problems += seen.problems
    for pack, found_problems in zip(packs, pack_problems, strict=True):
        problems += [Problem(pack.path.name, why) for why in found_problems]
    named = {key(rec.target) for _, rec in refs if isinstance(rec, RefRecord) and rec.target}
    seen.resolve(chain(named, _reflog_targets(store)))
    problems += seen.link_problems()
    ref_problems = [p for name, rec in refs for p in _ref_problems(name, rec, seen)]
    for name in store.reflog_names():
        ref_problems += _reflog_problems(store, name, seen)
    objects = seen.unique()
    problems += seen.span_problems() + ref_problems
    read = sum(pack.size + pack.index_size for pack in packs) + seen.unsealed_bytes
    return FsckReport(
        objects,
        len(refs),
        list(dict.fromkeys(problems)),
        warnings,
        read,
        time.perf_counter() - start,
    )


def _part_nodes(pack: SealedPack, first: int, stop: int) -> Callable[[], Iterable[Node]]:
    return lambda: fsck_read.nodes_of_part(pack, first, stop)


def _checked_nodes(items: Iterable[Checked]) -> Iterator[Node]:
    for oid, result in items:
        if not isinstance(result, ObjectError) and result[0] == "node":
            with suppress(ObjectError):
                yield parse_node(oid, result[1])


_KINDS = ("node", "blob", "file")  # the order of Found.targets


class _Seen:
    """What the read of every object found (fsck_read.Found, merged). While the read
    goes on, only flat arrays: the keys of what was read, by kind, and the targets
    of every link, by kind, all parts in a row (8 bytes a key). At the end
    (``resolve``) the keys of one kind at a time become a set (C-speed membership
    for millions of links, about 64 bytes a key), and each part's targets of that
    kind are looked up in it; a part whose links do not all name what they must is
    read again for the exact messages. One set at a time, not all at once: at 1M
    messages the sets of every kind took 122 MB together."""

    def __init__(self) -> None:
        self.count = 0
        self.unsealed_bytes = 0  # content of the objects read one by one
        # Keys read, by kind (node, blob, file): the node keys in reading order, which
        # the span columns below follow.
        self.keys = (array("q"), array("q"), array("q"))
        self.bad_nodes: set[int] = set()  # nodes ags cannot read: still nodes, for links
        self.unreadable: set[int] = set()  # read, and failed (reported already)
        self.problems: list[Problem] = []
        self.targets = (array("q"), array("q"), array("q"))  # by kind, as keys
        # Per part that can be read again: how, and where its link columns end
        # (``_ends``; they start where the previous part's end).
        self.parts: list[tuple[Callable[[], Iterable[Node]], tuple[int, ...]]] = []
        self.spans = fsck_read.Found()  # only its span columns
        self.messages: dict[int, int] = {}
        # Per node read, in reading order (``keys[0]``): its parent's key, its
        # content's, and whether it is a compaction (for span_problems).
        self.parents = array("q")
        self.contents = array("q")
        self.compactions = bytearray()
        self._asked: set[int] = set()  # keys whose kind ``resolve`` looked up
        self._kinds: dict[int, str] = {}  # their kinds (those read)
        self._failing: list[Callable[[], Iterable[Node]]] = []  # parts to read again
        self._unique = 0
        self._sets: tuple[set[int], set[int], set[int]] | None = None  # see ``kind``

    def add(self, found: fsck_read.Found, source: Callable[[], Iterable[Node]] | None) -> None:
        """Merge what a part found; ``source`` reads its nodes again."""
        self.count += found.count
        for keys, read in zip(self.keys, (found.nodes, found.blobs, found.files), strict=True):
            keys += read
        self.bad_nodes.update(found.bad_nodes)
        self.unreadable.update(found.unreadable)
        self.problems += [Problem(oid, what) for oid, what in found.problems]
        for targets, more in zip(self.targets, found.targets, strict=True):
            targets += more
        spans = self.spans
        spans.span_nodes += found.span_nodes
        spans.span_after += found.span_after
        spans.span_sizes += found.span_sizes
        spans.span_messages += found.span_messages
        self.parents += found.parents
        self.contents += found.contents
        self.compactions += found.compactions
        if source is not None and (any(found.targets) or found.nodes):
            self.parts.append((source, self._ends()))
        self.messages.update(found.messages)

    def _ends(self) -> tuple[int, ...]:
        """Where the link columns end now: ``targets`` of each kind, the per-node
        columns, span starts, span messages (``resolve`` takes each part's slices)."""
        spans = self.spans
        return (
            *map(len, self.targets),
            len(self.parents),
            len(spans.span_after),
            len(spans.span_messages),
        )

    def _links(
        self, code: int, start: tuple[int, ...], end: tuple[int, ...]
    ) -> Iterator[Iterable[int]]:
        """The targets of kind ``code`` of the links of a part whose columns run from
        ``start`` to ``end``: ``targets``, and for nodes and blobs the columns."""
        yield self.targets[code][start[code] : end[code]]
        kept = (-1).__ne__  # no parent, no span start (an id that is not one is in targets)
        if code == 0:
            yield filter(kept, self.parents[start[3] : end[3]])
            yield filter(kept, self.spans.span_after[start[4] : end[4]])
        elif code == 1:
            yield self.contents[start[3] : end[3]]
            yield self.spans.span_messages[start[5] : end[5]]

    def add_checked(
        self,
        items: Iterable[Checked],
        wanted: frozenset[int],
        again: Callable[[], Iterable[Checked]] | None = None,
    ) -> None:
        """Objects read one by one (not from a sealed pack's records); ``again`` reads
        them once more if their links must be looked at (by default, a list is kept)."""
        if again is None:
            kept = list(items)
            items, again = kept, lambda: kept
        reader = fsck_read.Reader(wanted)
        reader.checked(items)
        self.unsealed_bytes += reader.found.content_bytes
        self.add(reader.found, lambda: _checked_nodes(again()))

    def resolve(self, asked: Iterable[int]) -> None:
        """After the read: look up every part's link targets, one kind at a time, and
        the kind of each key of ``asked`` (what refs and reflogs name)."""
        self._asked = set(asked)
        for code, kind in enumerate(_KINDS):
            have = set(self.keys[code])
            self._unique += len(have)
            if code == 0:
                self._unique += len(self.bad_nodes)
                have |= self.bad_nodes
            for found in filter(have.__contains__, self._asked):
                self._kinds.setdefault(found, kind)
            start: tuple[int, ...] = (0,) * 6
            for source, end in self.parts:
                if not all(map(have.issuperset, self._links(code, start, end))):
                    self._failing.append(source)
                start = end
            del have
        self._unique += len(self.unreadable)
        self.targets = (array("q"), array("q"), array("q"))

    def kind(self, target: int) -> str | None:
        if target in self._asked:
            return self._kinds.get(target)
        # A key ``resolve`` was not asked about (a link of a part read again, or a
        # reflog line written since): the sets of every kind, made once.
        if self._sets is None:
            nodes = set(self.keys[0]) | self.bad_nodes
            self._sets = (nodes, set(self.keys[1]), set(self.keys[2]))
        for have, kind in zip(self._sets, _KINDS, strict=True):
            if target in have:
                return kind
        return None

    def known(self, target: int) -> bool:
        return self.kind(target) is not None or target in self.unreadable

    def unique(self) -> int:
        """Objects read, each counted once (known after ``resolve``)."""
        return self._unique

    def link_problems(self) -> list[Problem]:
        """Every link that names a missing object or one of the wrong kind: each node
        of each part ``resolve`` found a link of that does not name what it must,
        read again and checked link by link."""
        problems = []
        failing, self._failing = list(dict.fromkeys(self._failing)), []
        for source in failing:
            for node in source():
                problems += self._node_link_problems(node)
        return problems

    def _node_link_problems(self, node: Node) -> list[Problem]:
        problems = []
        for link in node_links(node):
            target = key(link.target)
            have = self.kind(target)
            if have is None and target not in self.unreadable:
                problems.append(Problem(node.id, f"{link.field} names missing {link.target}"))
            elif have is not None and have != link.kind:
                problems.append(Problem(node.id, f"{link.field} names a {have}, not a {link.kind}"))
        return problems

    def span_problems(self) -> list[Problem]:
        """A span must list exactly the message blobs between its start and its node:
        each is walked back through the nodes read, found by key (``_Positions``).
        Run last: it lets go of what only the links and refs need (the keys of blobs
        and files, any sets) before it makes its own."""
        self._sets = None
        self.keys = (self.keys[0], array("q"), array("q"))
        keys, parents, compactions = self.keys[0], self.parents, self.compactions
        spans = self.spans
        span_keys = [
            key(spans.span_nodes[at : at + 32].hex()) for at in range(0, len(spans.span_nodes), 32)
        ]
        positions = _Positions(keys, set(span_keys), compactions)
        positions.add(parents[at] for at in map(positions.find, span_keys) if at >= 0)
        walks: list[_SpanWalk] = []
        first = 0
        columns = zip(span_keys, spans.span_after, spans.span_sizes, strict=True)
        for number, (node, after, size) in enumerate(columns):
            messages = spans.span_messages[first : first + size]
            first += size
            at = positions.find(node)
            if at >= 0 and parents[at] != -1:
                below = positions.find(parents[at])
                if self._listed_in_a_row(at, below, after, messages):
                    continue
            walks.append(_SpanWalk(number, after, messages, at))
        # A walk whose next node is not where the nodes read just before lie (a
        # session's history going on in another pack) waits; the places of every
        # node the waiting walks need are then found in one pass, and they go on.
        wrong: list[int] = []
        while walks:
            waiting = []
            for walk in walks:
                if self._walk_on(walk, positions):
                    waiting.append(walk)
                elif not walk.matches():
                    wrong.append(walk.number)
            positions.add(w.wanted for w in waiting)
            walks = waiting
        return [
            Problem(
                spans.span_nodes[n * 32 : n * 32 + 32].hex(),
                "span does not match the messages before it",
            )
            for n in sorted(wrong)
        ]

    def _walk_on(self, walk: _SpanWalk, positions: _Positions) -> bool:
        """Walk back from ``walk.at``, gathering message blobs, to the span's start (or
        where it cannot be what the span lists); True if it stopped at a node whose
        place ``positions`` does not know yet (``walk.wanted``), to go on from there."""
        keys, parents, contents, compactions = (
            self.keys[0], self.parents, self.contents, self.compactions,
        )  # fmt: skip
        at, after, blobs = walk.at, walk.after, walk.blobs
        if at == UNPLACED:  # placed by ``add`` since
            at = positions.find(walk.wanted)
        size = len(walk.messages)
        while at >= 0:
            if keys[at] == after or compactions[at] or len(blobs) > size:
                break
            blobs.append(contents[at])
            parent = parents[at]
            if parent == -1 or parent == after:
                break  # the walk would stop at the parent, read or not
            at = positions.find(parent, at)
            if at == UNPLACED:
                walk.at, walk.wanted = UNPLACED, parent
                return True
        return False

    def _listed_in_a_row(self, at: int, below: int, after: int, messages: array[int]) -> bool:
        """Whether the walk of span_problems from the span node at ``at`` would find
        ``messages``, when its other nodes were read in a row, oldest first, ending
        at ``below`` (the place of its parent): what a session's nodes are. Checked
        with a few comparisons of array slices, in C, instead of a step a node; any
        other span (False) is walked."""
        keys, parents, contents, compactions = (
            self.keys[0], self.parents, self.contents, self.compactions,
        )  # fmt: skip
        size = len(messages)
        first = below - size + 2  # the place of the oldest node of the span
        return (
            size >= 2
            and first >= 0
            and keys[at] != after
            and not compactions[at]
            and contents[at] == messages[-1]
            and parents[at] not in (-1, after)
            # each node of the run is the parent of the one after it, none is the
            # walk's end or a compaction, their messages are the span's, and the
            # oldest's parent ends the walk
            and keys[first:below] == parents[first + 1 : below + 1]
            and after not in keys[first : below + 1]
            and compactions.count(0, first, below + 1) == size - 1
            and contents[first : below + 1] == messages[:-1]
            and parents[first] in (-1, after)
        )

    def messages_of(self, node_id: str) -> int | None:
        """A node's message count, if it is the target of a session ref and was read."""
        return self.messages.get(key(node_id))


class _Positions:
    """Where a node is in the reading order (its index in ``keys``), for the walks of
    spans. A session's nodes are written one after another, and a pack keeps them
    so, so a walk's next node (the parent) is first looked for among the WINDOW
    read just before the node it comes from, in C (``array.index``); the starts of
    the walks (span nodes and their parents) and compactions are found once, in
    one pass each, and so are the nodes walks wait for (``add``). No dict of every
    node's place: at 1M messages that took 44-100 MB."""

    WINDOW = 64

    def __init__(self, keys: array[int], starts: set[int], compactions: bytearray) -> None:
        self._keys = keys
        self._known: dict[int, int] = {}
        self.add(starts)
        places = list(compress(range(len(keys)), compactions))
        self._known.update(zip(map(keys.__getitem__, places), places, strict=True))

    def add(self, wanted: Iterable[int]) -> None:
        """Find the place of each key of ``wanted`` now, in one pass."""
        wanted = set(wanted) - self._known.keys()
        if not wanted:
            return
        keys = self._keys
        places = list(compress(range(len(keys)), map(wanted.__contains__, keys)))
        self._known.update(dict.fromkeys(wanted, -1))  # not read, unless found now
        # The last place of a key stored twice, as a dict of every node gives.
        self._known.update(zip(map(keys.__getitem__, places), places, strict=True))

    def find(self, node: int, near: int = 0) -> int:
        """The place of ``node`` (-1: not read), looked for first just before ``near``;
        UNPLACED if neither there nor found by ``add``."""
        at = self._known.get(node)
        if at is not None:
            return at
        if near > 0:
            if self._keys[near - 1] == node:  # the parent read right before: most often
                return near - 1
            with suppress(ValueError):
                return self._keys.index(node, max(0, near - self.WINDOW), near - 1)
        return UNPLACED


UNPLACED: Final = -2
"""``_Positions.find`` of a node whose place is not known yet: ``add`` it first."""


class _SpanWalk:
    """A walk of span_problems under way: the span's number, where its walk stops and
    the blobs it lists; the walk's next node (``at``) and the blobs found so far,
    newest first; ``wanted``, the node it waits for when ``at`` is UNPLACED."""

    __slots__ = ("number", "after", "messages", "at", "blobs", "wanted")

    def __init__(self, number: int, after: int, messages: array[int], at: int) -> None:
        self.number, self.after, self.messages, self.at = number, after, messages, at
        self.blobs: list[int] = []
        self.wanted = -1

    def matches(self) -> bool:
        return self.blobs[::-1] == self.messages.tolist()


def _read_ref(store: Store, name: str) -> RefRecord | None | AgsError:
    try:
        rec = store.read_ref(name)
        if rec is not None and ref_kind(name) in ("sessions", "remotes"):
            session_info(rec)
            damage = meta_damage(rec.body.get("meta"))
            if damage is not None:
                raise StoreFormatError(f"ref {name} is damaged: {damage}")
    except AgsError as e:
        return e
    return rec


def _reflog_targets(store: Store) -> Iterator[int]:
    """The key of every node a reflog names."""
    for name in store.reflog_names():
        for entry in store.reflog_entries(name):
            for value in (entry.old, entry.new):
                if value and names_node(value):
                    yield key(value)


def _reflog_problems(store: Store, name: str, seen: _Seen) -> list[Problem]:
    """A reflog's damaged lines and missing nodes, and a ref file that is gone
    although its reflog says the ref still points somewhere."""
    where = f"reflog {name}"
    problems = [Problem(where, f"line {n} is damaged") for n in store.damaged_reflog_lines(name)]
    try:
        missing_ref = store.read_ref(name) is None
    except AgsError:
        missing_ref = False  # there, but damaged: reported with the ref
    entries = store.reflog_entries(name)
    for entry in entries:
        for value in (entry.old, entry.new):
            if value and names_node(value) and not seen.known(key(value)):
                problems.append(Problem(where, f"names missing node {value}"))
    if entries and entries[-1].new is not None and missing_ref:
        problems.append(
            Problem(
                name,
                f"the ref file is missing, but its reflog says it points at {entries[-1].new} "
                f"(gen {entries[-1].gen}); was it deleted by hand?",
            )
        )
    return problems


def _ref_problems(name: str, rec: RefRecord | None | AgsError, seen: _Seen) -> list[Problem]:
    if isinstance(rec, AgsError):
        return [Problem(name, str(rec))]
    if rec is None or rec.target is None:
        return []
    if not isinstance(rec.target, str):
        return [Problem(name, f"its target is {rec.target!r}")]
    target = rec.target
    if ref_kind(name) == "HEAD" and session_of(target) is not None:
        return []  # attached to a session, which may since have been deleted: not damage
    have = seen.kind(key(target))
    if have is None:
        return [Problem(name, f"names missing node {target}")]
    if have != "node":
        return [Problem(name, f"names a {have}, not a node")]
    has = seen.messages_of(target)
    if ref_kind(name) == "sessions" and has is not None:  # read_ref checked the name
        count = rec.body.get("meta", {}).get("messages")
        if count != has:
            return [Problem(name, f"says {count} messages, its head has {has}")]
    return []
