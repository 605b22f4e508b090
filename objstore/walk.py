"""The walk back through a history: from a node along ``parent`` links, newest first.

Every reader of a chain goes through this module: the transcript (``Store.log``),
the active context (``context_blobs``), a writer's open span, diffs, exports,
sizes, the search index, fsck. The caller ends the walk where it needs to
(``break`` at a compaction, at a node it already knows); the walk itself
stops at the first node and, with a reader that returns None, at a node the
reader does not have (an export document's nodes, fsck's verified ones).

Spans (FORMAT.md 4.2) let a reader of messages skip: ``walk(..., spans=True)``
goes from a node that carries a span straight to the node the span starts
after, so a context of n messages costs about n/32 node reads (plus the plain
nodes between the head and its last span). ``context_blobs`` steps the same way
and may take a run of such nodes at once from a reader that has them together
(``BlockReader.message_run``: the nodes of an array block, parsed in one call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .errors import ObjectMissing
from .nodes import Node

NodeReader = Callable[[str], "Node | None"]
RunReader = Callable[[str], "tuple[list[str], str | None] | None"]


def walk(head: str | None, read: NodeReader, *, spans: bool = False) -> Iterator[Node]:
    """The nodes from ``head`` back to the first, newest first.

    With ``spans``, a node with a span is followed by its span's ``after``: the
    nodes in between are skipped, their messages are the span's.
    """
    at = head
    while at is not None:
        node = read(at)
        if node is None:
            return
        yield node
        at = _next(node, spans)


def _next(node: Node, spans: bool) -> str | None:
    """Where a walk goes from ``node``: its span's start with ``spans``, else its parent."""
    return node.span.after if spans and node.span is not None else node.parent


def context_blobs(head: str | None, read: NodeReader, runs: RunReader | None = None) -> list[str]:
    """The message blobs of the active context at ``head``, oldest first: the last
    compaction's summary and kept messages, then the messages after it (4.2).

    ``runs``, if given, may take several message nodes at once where ``walk`` with
    ``spans`` would read them one by one: from a node, the message blobs of it and
    of the nodes that walk would go on to next (newest first), and the id that walk
    would go to after the last of them; None where it takes none (the node is then
    read by ``read``, a compaction always is)."""
    newest_first: list[str] = []
    compaction = None
    at = head
    while at is not None:
        if runs is not None:
            run = runs(at)
            if run is not None:
                newest_first += run[0]
                at = run[1]
                continue
        node = read(at)
        if node is None:
            break
        if node.is_compaction:
            compaction = node
            break
        if node.span is not None:
            newest_first += reversed(node.span.messages)
        else:
            newest_first.append(node.content)
        at = _next(node, spans=True)
    front = []
    if compaction is not None:
        front = [compaction.content, *(_read(read, k).content for k in compaction.kept)]
    return front + newest_first[::-1]


def last_message_nodes(head: str | None, read: NodeReader, k: int) -> list[str]:
    """The ids of the last ``k`` message nodes in the active context at ``head``,
    oldest first (what a compaction keeping ``k`` keeps)."""
    newest_first: list[str] = []
    compaction = None
    for node in walk(head, read):
        if node.is_compaction:
            compaction = node
            break
        if len(newest_first) == k:
            break
        newest_first.append(node.id)
    missing = k - len(newest_first)
    earlier = list(compaction.kept[-missing:]) if compaction is not None and missing > 0 else []
    return earlier + newest_first[::-1]


def open_span(head: str | None, read: NodeReader) -> tuple[str | None, list[str]]:
    """Where the next span starts and the messages it holds so far: the last span
    node or compaction before ``head`` (None: the start of the chain) and the
    message blobs after it, oldest first (fewer than SPAN_EVERY)."""
    pending: list[str] = []
    for node in walk(head, read):
        if node.is_compaction or node.span is not None:
            return node.id, pending[::-1]
        pending.append(node.content)
    return None, pending[::-1]


def _read(read: NodeReader, node_id: str) -> Node:
    node = read(node_id)
    if node is None:
        raise ObjectMissing(node_id)
    return node
