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

Every ``SPAN_EVERY``-th message node after a compaction (or after the start)
also carries a ``span``: ``{"after": <node id or null>, "messages": [...]}``,
the message blobs of the nodes after ``after`` up to and including this one,
oldest first. ``after`` is the previous span node, the compaction, or null for
the start. Reading a context then takes one node per span instead of one per
message: resume reads about one object per message, not two. A span only
repeats what the chain says; it never changes the meaning of the history.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from . import canonical
from .errors import CorruptObject, InvalidInput
from .file_paths import check_file_path
from .limits import MAX_FILES_PER_NODE

NodeType = Literal["message", "compaction"]
SPAN_EVERY: Final = 32
"""Message nodes per span. A context read parses one node per span plus the plain
nodes after the last one: 32 nearly halves the node reads of a 3,000-message
resume against 16 (what chains written before hold; a span of any length reads),
while a short context after a compaction walks at most 31 plain nodes (64 cost
those contexts more than it saved long ones)."""
_ID: Final = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Span:
    """Message blobs of the nodes after ``after`` up to the node carrying the span."""

    after: str | None
    messages: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FileChange:
    """One file a node changed: its content before and after, as ids of ``file``
    objects; None where the file did not exist (``before`` None: created;
    ``after`` None: deleted)."""

    path: str
    before: str | None
    after: str | None


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
    span: Span | None = None
    files: tuple[FileChange, ...] = ()  # sorted by path

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
    span: Span | None = None,
    files: tuple[FileChange, ...] = (),
) -> bytes:
    return encode_node(type, parent, content, state, messages, meta, kept, span, files)[0]


def encode_node(
    type: NodeType,
    parent: str | None,
    content: str,
    state: str | None,
    messages: int,
    meta: dict[str, Any],
    kept: list[str] | None = None,
    span: Span | None = None,
    files: tuple[FileChange, ...] = (),
) -> tuple[bytes, bool]:
    """``node_body``, and whether orjson wrote it (canonical.encode)"""
    body: dict[str, Any] = {
        "type": type,
        "parent": parent,
        "state": state,
        "messages": messages,
        "meta": meta,
    }
    if type == "message":
        body["message"] = content
        if span is not None:
            body["span"] = {"after": span.after, "messages": list(span.messages)}
        if files:
            body["files"] = {
                f.path: {side: oid for side, oid in (("before", f.before), ("after", f.after))
                         if oid is not None}
                for f in files
            }  # fmt: skip
    else:
        body["summary"] = content
        body["kept"] = list(kept or [])
    # Every field but meta is ids, whole numbers or null: meta decides the encoder.
    return canonical.encode(body, fast=canonical.check_json(meta))


def parse_node(oid: str, body: bytes) -> Node:
    """Decode a node body; raise CorruptObject if it is not a well-formed node."""
    try:
        d = canonical.loads(body)
    except (ValueError, InvalidInput) as e:
        raise CorruptObject(oid, f"not a valid node ({e})") from None
    return node_from_value(oid, d)


def node_from_value(oid: str, d: Any) -> Node:
    """The node whose body parses to ``d`` (``parse_node`` after the parse: a reader that
    parsed the body itself, as a context read does for a block that claims it may,
    FORMAT.md 5.5); CorruptObject if it is not a well-formed node."""
    try:
        kind = d["type"]
        span = None
        if kind == "message":
            content, kept = d["message"], ()
            if "span" in d:
                span = Span(d["span"]["after"], tuple(d["span"]["messages"]))
            files = parse_files(d["files"]) if "files" in d else ()
        elif kind == "compaction":
            content, kept, files = d["summary"], tuple(d["kept"]), ()
            if "files" in d:
                raise ValueError("a compaction changes no files")
        else:
            raise ValueError(f"unknown node type {kind!r}")
        node = Node(
            oid,
            kind,
            d["parent"],
            content,
            d["state"],
            int(d["messages"]),
            d["meta"],
            kept,
            span,
            files,
        )
    except (ValueError, KeyError, TypeError, InvalidInput) as e:
        raise CorruptObject(oid, f"not a valid node ({e})") from None
    # Links are not checked here: every lookup checks an id before using it.
    return node


def parse_files(value: Any) -> tuple[FileChange, ...]:
    """A node's ``files`` field as FileChanges sorted by path; ValueError or
    InvalidInput for one that breaks FORMAT.md 4.2."""
    if type(value) is not dict or not value:
        raise ValueError("files must be a non-empty object")
    if len(value) > MAX_FILES_PER_NODE:
        raise ValueError(f"files names {len(value)} paths, over {MAX_FILES_PER_NODE}")
    out = []
    for path in sorted(value):
        check_file_path(path)
        sides = value[path]
        if type(sides) is not dict or not sides or set(sides) - {"before", "after"}:
            raise ValueError(f"files[{path!r}] must hold before, after or both")
        for oid in sides.values():
            if type(oid) is not str or not _ID.fullmatch(oid):
                raise ValueError(f"files[{path!r}] names {oid!r}, not an object id")
        out.append(FileChange(path, sides.get("before"), sides.get("after")))
    return tuple(out)
