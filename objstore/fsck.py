"""fsck: verify every object's hash, every link, every ref, reflog and pack.

Problems are collected, not raised: a damaged store is exactly when a user
needs the whole list, so every check goes on past what it finds. Nothing is
written. Also checked: who can reach the store's files (permissions.py):
links, other owners and files others can write are problems; files others
can read are a warning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from . import canonical
from .errors import AgsError, ObjectError
from .nodes import Node, parse_node
from .permissions import access_report
from .reach import node_links
from .refs import names_node, ref_kind, session_of
from .store import Store, session_info
from .walk import walk

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
    kinds: dict[str, str] = {}  # id -> kind, for every object that verifies
    nodes: dict[str, Node] = {}
    ids = store.object_ids()
    for i, oid in enumerate(ids):
        if progress and i % 1000 == 0:
            progress(i, len(ids))
        try:
            kind, body = store.raw_object(oid)
        except ObjectError as e:
            problems.append(Problem(oid, str(e).removeprefix(f"object {oid} ")))
            continue
        kinds[oid] = kind
        if kind == "node":
            try:
                nodes[oid] = parse_node(oid, body)
            except ObjectError as e:
                problems.append(Problem(oid, str(e).removeprefix(f"object {oid} ")))
        elif kind == "blob":  # a file object's body is any bytes
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

    ref_names = store.ref_names()
    for name in ref_names:
        problems += _ref_problems(store, name, kinds, nodes)
    for name in store.reflog_names():
        problems += _reflog_problems(store, name, kinds, set(ids))
    return FsckReport(len(ids), len(ref_names), problems, warnings)


def _reflog_problems(
    store: Store, name: str, kinds: dict[str, str], ids: set[str]
) -> list[Problem]:
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
            if value and names_node(value) and value not in kinds and value not in ids:
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


def _span_problems(node: Node, nodes: dict[str, Node]) -> list[Problem]:
    """A span must list exactly the message blobs between its start and its node."""
    if node.span is None:
        return []
    blobs: list[str] = []
    for at in walk(node.id, nodes.get):
        if at.id == node.span.after or at.is_compaction or len(blobs) > len(node.span.messages):
            break
        blobs.append(at.content)
    if tuple(blobs[::-1]) != node.span.messages:
        return [Problem(node.id, "span does not match the messages before it")]
    return []


def _ref_problems(
    store: Store, name: str, kinds: dict[str, str], nodes: dict[str, Node]
) -> list[Problem]:
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
    if target not in kinds:
        return [Problem(name, f"names missing node {target}")]
    if kinds[target] != "node":
        return [Problem(name, f"names a {kinds[target]}, not a node")]
    if ref_kind(name) == "sessions" and target in nodes:  # a valid name: read_ref checked it
        count = rec.body.get("meta", {}).get("messages")
        if count != nodes[target].messages:
            return [Problem(name, f"says {count} messages, its head has {nodes[target].messages}")]
    return []
