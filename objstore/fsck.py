"""fsck: verify every object's hash, every link, every ref and every pack index.

Problems are collected, not raised: a damaged store is exactly when a user
needs the whole list. Nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import canonical
from .errors import AgsError, ObjectError
from .nodes import Node, parse_node
from .reach import node_links
from .refs import SESSION_ID_RE
from .store import Store

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

    @property
    def ok(self) -> bool:
        return not self.problems


def check_store(store: Store, progress: Progress | None = None) -> FsckReport:
    problems: list[Problem] = []
    for pack in store.objects.sealed_packs():
        problems += [Problem(pack.path.name, p) for p in pack.index_problems()]

    kinds: dict[str, str] = {}  # id -> kind, for every object that verifies
    nodes: dict[str, Node] = {}
    ids = sorted(set(store.objects.ids()))
    for i, oid in enumerate(ids):
        if progress and i % 1000 == 0:
            progress(i, len(ids))
        try:
            kind, body = store.objects.get(oid)
        except ObjectError as e:
            problems.append(Problem(oid, str(e).removeprefix(f"object {oid} ")))
            continue
        kinds[oid] = kind
        if kind == "node":
            try:
                nodes[oid] = parse_node(oid, body)
            except ObjectError as e:
                problems.append(Problem(oid, str(e).removeprefix(f"object {oid} ")))
        else:
            try:
                canonical.loads(body)  # within the format's limits, as every read needs it
            except ValueError as e:
                problems.append(Problem(oid, f"is not a blob ags can read: {e}"))
    if progress:
        progress(len(ids), len(ids))

    for oid, node in nodes.items():
        for link in node_links(node):
            have = kinds.get(link.target)
            if have is None and link.target not in ids:
                problems.append(Problem(oid, f"{link.field} names missing {link.target}"))
            elif have is not None and have != link.kind:
                problems.append(Problem(oid, f"{link.field} names a {have}, not a {link.kind}"))
        problems += _span_problems(node, nodes)

    refs = 0
    for kind in ("sessions", "tags", "HEAD"):
        for name in sorted(store.refs.names(kind)):
            refs += 1
            problems += _ref_problems(store, name, kinds, nodes)
    for name in sorted(store.refs.log_names()):
        for entry in store.refs.reflog(name):
            for value in (entry.old, entry.new):
                if value and "/" not in value and value not in kinds and value not in ids:
                    problems.append(Problem(f"reflog {name}", f"names missing node {value}"))
    return FsckReport(len(ids), refs, problems)


def _span_problems(node: Node, nodes: dict[str, Node]) -> list[Problem]:
    """A span must list exactly the message blobs between its start and its node."""
    if node.span is None:
        return []
    blobs: list[str] = []
    at: Node | None = node
    while at is not None and at.id != node.span.after:
        if at.is_compaction or len(blobs) > len(node.span.messages):
            break
        blobs.append(at.content)
        at = nodes.get(at.parent) if at.parent else None
    if tuple(blobs[::-1]) != node.span.messages:
        return [Problem(node.id, "span does not match the messages before it")]
    return []


def _ref_problems(
    store: Store, name: str, kinds: dict[str, str], nodes: dict[str, Node]
) -> list[Problem]:
    try:
        rec = store.refs.read(name)
    except AgsError as e:
        return [Problem(name, str(e))]
    if rec is None or rec.target is None:
        return []
    target = rec.target
    if name.startswith("HEAD/") and target.startswith("sessions/"):
        return []  # attached to a session, which may since have been deleted: not damage
    if target not in kinds:
        return [Problem(name, f"names missing node {target}")]
    if kinds[target] != "node":
        return [Problem(name, f"names a {kinds[target]}, not a node")]
    kind, _, rest = name.partition("/")
    if kind == "sessions" and SESSION_ID_RE.fullmatch(rest):
        count = rec.body.get("meta", {}).get("messages")
        if count != nodes[target].messages:
            return [Problem(name, f"says {count} messages, its head has {nodes[target].messages}")]
    return []
