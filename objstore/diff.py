"""Where two sessions part: their common ancestor and the nodes unique to each."""

from __future__ import annotations

from dataclasses import dataclass

from .store import LogEntry, Store


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
    head_a, head_b = store.lookup(a).node, store.lookup(b).node
    chain_a: dict[str, int] = {}
    at = head_a
    while at is not None:
        chain_a[at] = len(chain_a)
        at = store.node(at).parent
    only_b: list[LogEntry] = []
    base = None
    at = head_b
    while at is not None:
        if at in chain_a:
            base = at
            break
        node = store.node(at)
        only_b.append(LogEntry(node, store.blob(node.content)))
        at = node.parent
    only_a = []
    for nid in list(chain_a)[: chain_a[base] if base else len(chain_a)]:
        node = store.node(nid)
        only_a.append(LogEntry(node, store.blob(node.content)))
    return SessionDiff(base, only_a, only_b)
