"""Nodes: the commit-like objects that chain a session's history.

A node body is canonical JSON. Fields common to both types:

* ``type``: ``"message"`` or ``"compaction"``;
* ``parent``: the previous node's id, or null for the first node;
* ``state``: the agent-state blob in force after this node, or null;
* ``messages``: how many message nodes the chain holds up to and including
  this one (so a count never needs a walk);
* ``meta``: an object (time, model, token usage, ...), kept as given.

A ``message`` node adds ``message``: the blob of one chat message. A
``compaction`` node adds ``summary``, the blob of the summary message, and
``kept``, the ids of the message nodes whose messages stay verbatim after it,
oldest first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from . import canonical
from .errors import CorruptObject

NodeType = Literal["message", "compaction"]


@dataclass(frozen=True, slots=True)
class Node:
    """One node, decoded. ``content`` is the message blob id (or the summary's)."""

    id: str
    type: NodeType
    parent: str | None
    content: str
    state: str | None
    messages: int
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    kept: tuple[str, ...] = ()

    @property
    def is_compaction(self) -> bool:
        return self.type == "compaction"


def node_body(
    type: NodeType,
    parent: str | None,
    content: str,
    state: str | None,
    messages: int,
    meta: dict[str, Any],
    kept: list[str] | None = None,
) -> bytes:
    body: dict[str, Any] = {
        "type": type,
        "parent": parent,
        "state": state,
        "messages": messages,
        "meta": meta,
    }
    if type == "message":
        body["message"] = content
    else:
        body["summary"] = content
        body["kept"] = list(kept or [])
    return canonical.dumps(body)


def parse_node(oid: str, body: bytes) -> Node:
    """Decode a node body; raise CorruptObject if it is not a well-formed node."""
    try:
        d = canonical.loads(body)
        kind = d["type"]
        if kind == "message":
            content, kept = d["message"], ()
        elif kind == "compaction":
            content, kept = d["summary"], tuple(d["kept"])
        else:
            raise ValueError(f"unknown node type {kind!r}")
        node = Node(
            oid, kind, d["parent"], content, d["state"], int(d["messages"]), d["meta"], kept
        )
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptObject(oid, f"not a valid node ({e})") from None
    # Links are not checked here: every lookup checks an id before using it.
    return node
