"""Where two sessions part: their common ancestor and the nodes unique to each, and
what the files their nodes changed hold at each of two nodes."""

from __future__ import annotations

from dataclasses import dataclass

from .nodes import Node
from .store import LogEntry, Store
from .walk import walk


@dataclass(frozen=True, slots=True)
class SessionDiff:
    base: str | None  # the newest node both histories share (None: nothing shared)
    only_a: list[LogEntry]  # newest first
    only_b: list[LogEntry]


def diff_sessions(store: Store, a: str, b: str) -> SessionDiff:
    """Compare the histories ``a`` and ``b`` name (sessions, nodes, tags).

    Histories are chains (one parent per node), so the common ancestor is the
    first node of b's chain that a's chain holds. Costs one walk of each.
    """
    chain_a = list(walk(store.target(a).node, store.node))
    depth = {node.id: i for i, node in enumerate(chain_a)}
    only_b: list[LogEntry] = []
    base = None
    for node in walk(store.target(b).node, store.node):
        if node.id in depth:
            base = node.id
            break
        only_b.append(LogEntry(node, store.blob(node.content)))
    unique_a = chain_a[: depth[base]] if base else chain_a
    only_a = [LogEntry(node, store.blob(node.content)) for node in unique_a]
    return SessionDiff(base, only_a, only_b)


@dataclass(frozen=True, slots=True)
class FileDelta:
    """A file whose content differs between two nodes, as the nodes' ``files`` tell
    it: the ``file`` object at ``a`` and at ``b`` (None: no file there)."""

    path: str
    a: str | None
    b: str | None


def diff_files(store: Store, a: str, b: str) -> list[FileDelta]:
    """The files that the nodes between ``a`` and ``b`` changed and that differ between
    them, sorted by path: what restoring ``b``'s files over ``a``'s would change.

    Only what the nodes recorded is known (the file tools' changes, not a shell's).
    A file changed on ``a``'s side since the common ancestor is at ``a`` what its
    newest change there left; a file changed only on ``b``'s side is at ``a`` what
    it was before the oldest change there, the ancestor's content; and the same
    the other way round. Costs one walk of each chain.
    """
    chain_a = list(walk(store.target(a).node, store.node))
    depth = {node.id: i for i, node in enumerate(chain_a)}
    only_b: list[Node] = []
    base = None
    for node in walk(store.target(b).node, store.node):
        if node.id in depth:
            base = node.id
            break
        only_b.append(node)
    only_a = chain_a[: depth[base]] if base else chain_a
    side_a, side_b = _net(only_a), _net(only_b)
    out = []
    for path in sorted(side_a.keys() | side_b.keys()):
        at_a = side_a[path][1] if path in side_a else side_b[path][0]
        at_b = side_b[path][1] if path in side_b else side_a[path][0]
        if at_a != at_b:
            out.append(FileDelta(path, at_a, at_b))
    return out


def _net(newest_first: list[Node]) -> dict[str, tuple[str | None, str | None]]:
    """Per path the nodes changed: (content before the oldest change, after the newest)."""
    net: dict[str, tuple[str | None, str | None]] = {}
    for node in newest_first:
        for change in node.files:
            after = net[change.path][1] if change.path in net else change.after
            net[change.path] = (change.before, after)
    return net
