"""fsck: verify every object's hash, every link, every ref, reflog and pack.

Problems are collected, not raised: a damaged store is exactly when a user
needs the whole list, so every check goes on past what it finds. Nothing is
written. Also checked: who can reach the store's files (permissions.py):
links, other owners and files others can write are problems; files others
can read are a warning.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from .errors import AgsError, ObjectError
from .limits import check_json_text
from .nodes import Node, parse_node
from .permissions import access_report
from .reach import node_links
from .refs import names_node, ref_kind, session_of
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

    @property
    def ok(self) -> bool:
        return not self.problems


def check_store(store: Store, progress: Progress | None = None) -> FsckReport:
    """Every problem of the store. Objects are read in storage order, each block once,
    in memory about 120 bytes an object. ``progress(done, total)`` is called every
    1,000 objects with ``total`` -1 (not known before the end), then once with both."""
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
    seen = _Seen()
    record_problems: list[tuple[str, str]] = []
    for oid, result in store.checked_objects(record_problems):
        if progress and seen.count % 1000 == 0:
            progress(seen.count, -1)
        problems += seen.add(oid, result)
    problems += [Problem(name, why) for name, why in record_problems]
    if progress:
        progress(seen.count, seen.count)
    problems += seen.settle_waiting()
    seen.finish()
    problems += seen.link_problems(store)
    problems += seen.span_problems()

    ref_names = store.ref_names()
    for name in ref_names:
        problems += _ref_problems(store, name, seen)
    for name in store.reflog_names():
        problems += _reflog_problems(store, name, seen)
    return FsckReport(seen.unique(), len(ref_names), list(dict.fromkeys(problems)), warnings)


WAIT_OBJECTS: Final = 1024  # objects read before a node's unresolved links are checked
_KINDS: Final = ("node", "blob", "file")  # what a link may name (reach.Link.kind), by code
_KIND_CODES: Final = {kind: code for code, kind in enumerate(_KINDS)}


def _key(oid: str) -> int:
    """What fsck remembers of an id: its first 60 bits, which fit a signed 64-bit array
    entry (-1 for what is not an id)."""
    if len(oid) != 64:
        return -1
    try:
        return int(oid[:15], 16)
    except ValueError:
        return -1


class _Seen:
    """What fsck has read, kept small enough for a store of millions of objects: ids
    as the int of their first 60 bits (a false match needs two ids sharing them),
    nodes as arrays of the parts the checks need, never whole Node objects.

    A node's links are checked as it is read when their targets were read before
    it (objects are written after what they name, so nearly always); otherwise
    once WAIT_OBJECTS more objects are read (a merge may have put a node before
    its message in their block), and after the last object if still unresolved."""

    def __init__(self) -> None:
        self.count = 0
        self.finished = False  # finish() has sorted what was read
        self.counted = 0
        self.blob_keys = array("q")
        self.nodes: set[int] = set()
        self.blobs: set[int] = set()
        self.other_kinds: dict[int, str] = {}
        self.unreadable: set[int] = set()  # read, and failed (reported already)
        # Links that wait for the last object: target key, kind code, number of the
        # node in later_ids (32 raw bytes each), read again only if a link fails.
        self.later_target = array("q")
        self.later_kind = bytearray()
        self.later_node = array("l")
        self.later_ids = bytearray()
        # Per node, in reading order: its key, parent key (-1 none), content key,
        # whether it is a compaction.
        self.node_key = array("q")
        self.node_parent = array("q")
        self.node_content = array("q")
        self.node_compaction = bytearray()
        self.node_messages = array("q")
        self.spans: list[tuple[str, int, array[int]]] = []  # node id, after key, messages
        # Nodes whose links wait (WAIT_OBJECTS): id, node, whether it is simple (a
        # parent, a content, a state), and those three keys (-1: none).
        self.waiting: list[tuple[str, Node, bool, int, int, int]] = []

    def kind(self, key: int) -> str | None:
        if self.finished:
            if self.position(key) >= 0:
                return "node"
            at = bisect_left(self.blob_keys, key)
            if at < len(self.blob_keys) and self.blob_keys[at] == key:
                return "blob"
        elif key in self.nodes:
            return "node"
        elif key in self.blobs:
            return "blob"
        return self.other_kinds.get(key)

    def known(self, key: int) -> bool:
        return self.kind(key) is not None or key in self.unreadable

    def unique(self) -> int:
        if self.finished:
            return self.counted
        return len(self.nodes) + len(self.blobs) + len(self.other_kinds) + len(self.unreadable)

    def add(self, oid: str, result: tuple[str, bytes] | ObjectError) -> list[Problem]:
        self.count += 1
        if len(self.waiting) and self.count % WAIT_OBJECTS == 0:
            return self._read(oid, result) + self.settle_waiting()
        return self._read(oid, result)

    def settle_waiting(self) -> list[Problem]:
        """Check the links of the nodes that waited; what is still missing waits for
        the last object."""
        problems = []
        nodes, blobs = self.nodes, self.blobs
        for oid, node, simple, parent, content, state in self.waiting:
            if not (
                simple
                and (parent == -1 or parent in nodes)
                and content in blobs
                and (state == -1 or state in blobs)
            ):
                problems += self._links(oid, node)
        self.waiting = []
        return problems

    def _read(self, oid: str, result: tuple[str, bytes] | ObjectError) -> list[Problem]:
        key = _key(oid)
        if isinstance(result, ObjectError):
            self.unreadable.add(key)
            return [Problem(oid, str(result).removeprefix(f"object {oid} "))]
        kind, body = result
        if kind != "node":
            (self.blobs.add(key) if kind == "blob" else self.other_kinds.__setitem__(key, kind))
            if kind != "blob":  # a file object's body is any bytes
                return []
            try:
                check_json_text(body)  # within the format's limits, as every read needs it
            except ValueError as e:
                return [Problem(oid, f"is not a blob ags can read: {e}")]
            return []
        try:
            node = parse_node(oid, body)
        except ObjectError as e:
            self.other_kinds[key] = "node"  # a node, though not one ags can read
            return [Problem(oid, str(e).removeprefix(f"object {oid} "))]
        nodes, blobs = self.nodes, self.blobs
        nodes.add(key)
        self.node_key.append(key)
        parent = -1 if node.parent is None else _key(node.parent)
        content = _key(node.content)
        self.node_parent.append(parent)
        self.node_content.append(content)
        self.node_compaction.append(node.is_compaction)
        self.node_messages.append(node.messages if type(node.messages) is int else -1)
        if node.span is not None:
            after = -1 if node.span.after is None else _key(node.span.after)
            self.spans.append((oid, after, array("q", map(_key, node.span.messages))))
        # What nearly every node is: a parent, a message and a state, and nothing else.
        simple = node.span is None and not node.kept and not node.files
        state = -1 if node.state is None else _key(node.state)
        if (
            simple
            and (parent == -1 or parent in nodes)
            and content in blobs
            and (state == -1 or state in blobs)
        ):
            return []  # each link names what was read before it
        self.waiting.append((oid, node, simple, parent, content, state))
        return []

    def _links(self, oid: str, node: Node) -> list[Problem]:
        """Check a node's links against what was read; one whose target was not read
        yet waits for the last object."""
        nodes, blobs, other_kinds = self.nodes, self.blobs, self.other_kinds
        problems: list[Problem] = []
        deferred = False
        for link in node_links(node):
            target = _key(link.target)
            # kind(), inline: this runs for every link of every node of the store
            have = (
                "node"
                if target in nodes
                else "blob"
                if target in blobs
                else other_kinds.get(target)
            )
            if have is None and target not in self.unreadable:
                if not deferred:
                    deferred = True
                    self.later_ids += bytes.fromhex(oid)
                self.later_target.append(target)
                self.later_kind.append(_KIND_CODES[link.kind])
                self.later_node.append(len(self.later_ids) // 32 - 1)
            elif have is not None and have != link.kind:
                problems.append(Problem(oid, f"{link.field} names a {have}, not a {link.kind}"))
        return problems

    def _node_link_problems(self, node: Node) -> list[Problem]:
        problems = []
        for link in node_links(node):
            key = _key(link.target)
            have = self.kind(key)
            if have is None and key not in self.unreadable:
                problems.append(Problem(node.id, f"{link.field} names missing {link.target}"))
            elif have is not None and have != link.kind:
                problems.append(Problem(node.id, f"{link.field} names a {have}, not a {link.kind}"))
        return problems

    def link_problems(self, store: Store) -> list[Problem]:
        """The links of the nodes read before what they name, now that all is read; a
        node with a link that fails is read again for the exact messages."""
        failed: dict[int, None] = {}
        for target, code, number in zip(
            self.later_target, self.later_kind, self.later_node, strict=True
        ):
            have = self.kind(target)
            if (have is None and target not in self.unreadable) or (
                have is not None and have != _KINDS[code]
            ):
                failed[number] = None
        problems = []
        for number in failed:
            oid = self.later_ids[number * 32 : number * 32 + 32].hex()
            _kind, body = store.raw_object(oid)  # it verified once; read it again
            problems += self._node_link_problems(parse_node(oid, body))
        return problems

    def finish(self) -> None:
        """After the last object: the sets become sorted arrays (``position`` for nodes,
        ``blob_keys``), about half their memory, and ``kind`` looks there."""
        self.counted = self.unique()
        self.blob_keys = array("q", sorted(self.blobs))
        self.blobs = set()
        self.nodes = set()  # the sorted node_key holds the same keys
        self.finished = True
        order = sorted(range(len(self.node_key)), key=self.node_key.__getitem__)
        for name in ("node_key", "node_parent", "node_content", "node_messages"):
            column = getattr(self, name)
            setattr(self, name, array("q", (column[i] for i in order)))
        self.node_compaction = bytearray(self.node_compaction[i] for i in order)

    def position(self, key: int) -> int:
        """Where a node is in the sorted arrays (``finish``), or -1."""
        at = bisect_left(self.node_key, key)
        return at if at < len(self.node_key) and self.node_key[at] == key else -1

    def messages(self, node_id: str) -> int | None:
        """A node's message count, if it was read and parsed."""
        at = self.position(_key(node_id))
        return None if at < 0 else self.node_messages[at]

    def span_problems(self) -> list[Problem]:
        """A span must list exactly the message blobs between its start and its node."""
        keys, parent, content = self.node_key, self.node_parent, self.node_content
        problems = []
        for oid, after, messages in self.spans:
            blobs: list[int] = []
            at = self.position(_key(oid))
            while at >= 0:
                if keys[at] == after or self.node_compaction[at] or len(blobs) > len(messages):
                    break
                blobs.append(content[at])
                at = self.position(parent[at]) if parent[at] != -1 else -1
            if blobs[::-1] != list(messages):
                problems.append(Problem(oid, "span does not match the messages before it"))
        return problems


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
            if value and names_node(value) and not seen.known(_key(value)):
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


def _ref_problems(store: Store, name: str, seen: _Seen) -> list[Problem]:
    try:
        rec = store.read_ref(name)
        if rec is not None and ref_kind(name) == "sessions":
            session_info(rec)
    except AgsError as e:
        return [Problem(name, str(e))]
    if rec is None or rec.target is None:
        return []
    if not isinstance(rec.target, str):
        return [Problem(name, f"its target is {rec.target!r}")]
    target = rec.target
    if ref_kind(name) == "HEAD" and session_of(target) is not None:
        return []  # attached to a session, which may since have been deleted: not damage
    have = seen.kind(_key(target))
    if have is None:
        return [Problem(name, f"names missing node {target}")]
    if have != "node":
        return [Problem(name, f"names a {have}, not a node")]
    has = seen.messages(target)
    if ref_kind(name) == "sessions" and has is not None:  # read_ref checked the name
        count = rec.body.get("meta", {}).get("messages")
        if count != has:
            return [Problem(name, f"says {count} messages, its head has {has}")]
    return []
