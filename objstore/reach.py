"""Links between objects, and what a set of roots reaches.

A node links to its parent (a node), its message or summary (a blob), its
state (a blob), a compaction's kept nodes, and a span's messages (blobs) and
the node the span starts after, and the ``file`` objects of the files it
changed (before and after). Blobs and files link to nothing. gc marks with this,
fsck checks every link with it, export follows it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from .errors import ObjectError
from .nodes import Node


@dataclass(frozen=True, slots=True)
class Link:
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


def reachable(
    roots: Iterable[str],
    node: Callable[[str], Node],
    *,
    skip_missing: bool = True,
) -> set[str]:
    """Every object id the node ids ``roots`` reach, the roots included.

    Each node is read once, so shared history (forks) costs nothing twice. An
    object that cannot be read is kept in the set (gc must not drop what it
    cannot see) and, with ``skip_missing``, not followed; fsck reports it.
    """
    seen: set[str] = set()
    stack = [r for r in roots if r is not None]
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
