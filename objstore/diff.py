"""Where two sessions part: their common ancestor and the nodes unique to each."""

from __future__ import annotations

from dataclasses import dataclass

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
