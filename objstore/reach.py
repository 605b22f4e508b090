"""Links between objects, and what a set of roots reaches.

A node links to its parent (a node), its message or summary (a blob), its
state (a blob), a compaction's kept nodes, and a span's messages (blobs) and
the node the span starts after, and the ``file`` objects of the files it
changed (before and after). Blobs and files link to nothing. gc marks with this,
fsck checks every link with it, export follows it, and a push and an import
write in its order (``in_link_order``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, NamedTuple, Protocol, TypeVar

from .errors import ObjectError
from .nodes import Node


class Link(NamedTuple):
    """One link of a node. A named tuple, not a frozen dataclass: a walk of a whole
    store makes millions, and a tuple is made three times as fast."""

    field: str  # where in the node body: "parent", "kept[2]", "span.messages[0]", ...
    target: str
    kind: str  # what the target must be: "node", "blob" or "file"


def node_links(node: Node) -> Iterator[Link]:
    if node.parent is not None:
        yield Link("parent", node.parent, "node")
    yield Link("message" if node.type == "message" else "summary", node.content, "blob")
    if node.state is not None:
        yield Link("state", node.state, "blob")
    for i, kept in enumerate(node.kept):
        yield Link(f"kept[{i}]", kept, "node")
    if node.span is not None:
        if node.span.after is not None:
            yield Link("span.after", node.span.after, "node")
        for i, blob in enumerate(node.span.messages):
            yield Link(f"span.messages[{i}]", blob, "blob")
    for change in node.files:
        for side, target in (("before", change.before), ("after", change.after)):
            if target is not None:
                yield Link(f"files[{json.dumps(change.path)}].{side}", target, "file")


class IdCollection(Protocol):
    """What a walk records ids in: a ``set`` of strings, or an ``IdSet``."""

    def add(self, oid: str, /) -> Any: ...
    def __contains__(self, oid: object, /) -> bool: ...


C = TypeVar("C", bound=IdCollection)
T = TypeVar("T")

READS_BETWEEN_RELEASES = 1024


def scanning(read: Callable[[str], T], release: Callable[[], None]) -> Callable[[str], T]:
    """``read``, calling ``release`` every READS_BETWEEN_RELEASES reads: a walk over a
    whole store reads its packs through memory maps, and without letting go of
    their pages now and then (``Store.release_pages``) its memory would grow to
    the size of the store (each page fault maps up to 64 KiB around it)."""
    count = 0

    def scan(oid: str) -> T:
        nonlocal count
        count += 1
        if count % READS_BETWEEN_RELEASES == 0:
            release()
        return read(oid)

    return scan


def reachable(
    roots: Iterable[str],
    node: Callable[[str], Node],
    *,
    skip_missing: bool = True,
) -> set[str]:
    """Every object id the node ids ``roots`` reach, the roots included.

    Each node is read once, so shared history (forks) costs nothing twice. A node
    that cannot be read is kept in the set and, with ``skip_missing``, not followed
    (fsck reports it); without, its ObjectError is raised: gc stops on it, since
    what it links to would look unreachable.
    """
    return reach_into(set(), roots, node, skip_missing=skip_missing)


def reach_into(
    seen: C,
    roots: Iterable[str],
    node: Callable[[str], Node],
    *,
    skip_missing: bool = True,
) -> C:
    """``reachable``, recorded in ``seen`` (an ``IdSet`` for a whole store), which it
    returns; what ``seen`` holds already is taken as reached and not followed.
    ``roots`` is read one at a time, so it may be a stream of any length."""
    for root in roots:
        if root is None or root in seen:
            continue
        stack = [root]
        while stack:
            oid = stack.pop()
            if oid in seen:
                continue
            seen.add(oid)
            try:
                n = node(oid)
            except ObjectError:
                if skip_missing:
                    continue
                raise
            for link in node_links(n):
                if link.target in seen:
                    continue
                if link.kind != "node":  # blobs and files link to nothing
                    seen.add(link.target)
                else:
                    stack.append(link.target)
    return seen


def in_link_order(roots: Iterable[str | None], node: Callable[[str], Node]) -> Iterator[str]:
    """Every object id the node ids ``roots`` reach (what ``reachable`` returns), each
    once, and each after every object it links to: a node's blobs and files when the
    node is first read, the node itself once every node it links to has come. The
    order to write in when the writer may be killed midway (a push's packs, an
    import): whatever part of it was written, every link of every object in that
    part names an object written before it, so nothing written is left naming what
    is not there (``ags fsck``: "parent names missing"). A node that cannot be read
    comes as itself, not followed (as in ``reachable``).

    A depth-first walk without recursion: its stack holds, for each node on the
    way down a chain (a session of a million messages: a million), its id and the
    ids of the nodes it links to that are still to come."""
    seen: set[str] = set()
    for root in roots:
        if root is None or root in seen:
            continue
        seen.add(root)
        stack = [(root, (yield from _open(root, node, seen)))]
        while stack:
            oid, pending = stack[-1]
            while pending and pending[-1] in seen:
                pending.pop()
            if pending:
                child = pending.pop()
                seen.add(child)
                stack.append((child, (yield from _open(child, node, seen))))
            else:
                stack.pop()
                yield oid


def _open(oid: str, node: Callable[[str], Node], seen: set[str]) -> Generator[str, None, list[str]]:
    """Yield the blobs and files ``oid`` links to that were not seen; return the nodes
    it links to (all of them: which were seen is asked when their turn comes)."""
    try:
        n = node(oid)
    except ObjectError:
        return []
    nodes = []
    for link in node_links(n):
        if link.kind == "node":
            nodes.append(link.target)
        elif link.target not in seen:
            seen.add(link.target)
            yield link.target
    nodes.reverse()  # the parent first
    return nodes
