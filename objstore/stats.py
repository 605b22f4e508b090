"""Sizes and counts: what the store takes on disk, and what one session takes.

Three sizes of an object: *stored* (its compressed stored form), *unique*
(its uncompressed body, counted once however many sessions share it), and
*logical* (counted once per session that reaches it: what a store keeping
each session as its own file would hold). logical / unique is the dedup
ratio; unique / stored the compression ratio.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass

from .errors import ObjectError, StoreWarning
from .id_set import MARK_KEY_BYTES, IdSet
from .nodes import Node
from .reach import node_links, reach_into, scanning
from .store import SessionInfo, Store
from .walk import NodeReader, walk


@dataclass(frozen=True, slots=True)
class StoreUsage:
    path: str
    disk_bytes: int  # every file under the store directory
    objects: int
    packs: int
    stored_bytes: int
    unique_bytes: int
    logical_bytes: int
    sessions: int

    @property
    def dedup_ratio(self) -> float:
        return self.logical_bytes / self.unique_bytes if self.unique_bytes else 1.0

    @property
    def compression_ratio(self) -> float:
        return self.unique_bytes / self.stored_bytes if self.stored_bytes else 1.0


@dataclass(frozen=True, slots=True)
class SessionUsage:
    session: SessionInfo
    nodes: int
    compactions: int
    roles: dict[str, int]
    usage: dict[str, int]  # prompt_tokens, completion_tokens
    objects: int
    stored_bytes: int
    unique_stored_bytes: int  # reached by no other session, tag or HEAD
    shared_stored_bytes: int


def store_usage(store: Store) -> StoreUsage:
    """The sizes of the whole store, in memory bounded by the number of objects (about
    45 bytes an object, FORMAT.md 11), not by their ids or the store's bytes."""
    # Column 0: the object's unique (uncompressed body) size. Keys are 8-byte prefixes:
    # these are statistics, and the id set says why that is close enough.
    unique = IdSet(store.object_count_hint(), columns=1, key_bytes=8)
    stored_bytes = unique_bytes = 0
    for oid, stored, content in store.object_sizes_stream():
        if oid in unique:
            continue
        body = content - len("blob\0") if content is not None else store.body_size(oid)
        unique.set(oid, body)
        stored_bytes += stored
        unique_bytes += body
    disk = 0
    for dirpath, _dirs, files in os.walk(store.path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                disk += os.lstat(os.path.join(dirpath, name)).st_size
    sessions = store.sessions(include_archived=True)
    memo = IdSet(len(unique) // 2, columns=2, key_bytes=8)  # node: (total, state key)
    read = scanning(store.node, store.release_pages)
    logical = 0
    for s in sessions:
        try:
            logical += _logical_bytes(s.head, read, unique, memo)
        except ObjectError as e:  # one damaged history must not stop the report
            warnings.warn(
                StoreWarning(f"session {s.id}: {e}; its logical size is left out (ags fsck)"),
                stacklevel=2,
            )
    store.release_pages()
    packs = store.pack_count()
    return StoreUsage(
        str(store.path),
        disk,
        len(unique),
        packs,
        stored_bytes,
        unique_bytes,
        logical,
        len(sessions),
    )


def _state_key(state: str | None) -> int:
    return -1 if state is None else int(state[:15], 16)


def _logical_bytes(head: str | None, read: NodeReader, unique: IdSet, memo: IdSet) -> int:
    """The bytes a session's transcript would take as a file of its own: every node
    and its message, each new state, and the files each node changed, along the
    chain. ``memo`` carries the total per node across sessions, so forks cost only
    their own nodes."""

    def size(oid: str | None) -> int:
        return (unique.get(oid, 0) or 0) if oid is not None else 0

    chain: list[Node] = []
    total, state = 0, -1
    for node in walk(head, read):
        known = memo.get(node.id, 0)
        if known is not None:
            total, state = known, memo.get(node.id, 1) or 0
            break
        chain.append(node)
    for node in reversed(chain):
        total += size(node.id) + size(node.content)
        key = _state_key(node.state)
        if node.state is not None and key != state:
            total += size(node.state)
        state = key
        for change in node.files:
            total += size(change.before) + size(change.after)
        memo.set(node.id, total, state)
    return total


def session_usage(store: Store, spec: str) -> SessionUsage:
    info = store.session(spec)
    mine: set[str] = set()  # what the head reaches: every node of the log and its links
    others_roots: set[str] = set()
    for other in store.sessions(include_archived=True):
        if other.id != info.id and other.head:
            others_roots.add(other.head)
    others_roots |= set(store.tags().values())
    # What every other session reaches is most of a big store: an IdSet, read through
    # a reader that lets go of pack pages, as gc's mark does.
    others = reach_into(
        IdSet(store.object_count_hint(), key_bytes=MARK_KEY_BYTES),
        others_roots,
        scanning(store.node, store.release_pages),
    )
    store.release_pages()
    roles: dict[str, int] = {}
    nodes = compactions = 0
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    for entry in store.log(info.id) if info.head else []:
        nodes += 1
        mine.add(entry.node.id)
        mine.update(link.target for link in node_links(entry.node))
        if entry.node.is_compaction:
            compactions += 1
            continue
        role = entry.message.get("role") if isinstance(entry.message, dict) else None
        role = role if isinstance(role, str) else "?"  # a stored message can hold any JSON
        roles[role] = roles.get(role, 0) + 1
        node_usage = entry.node.meta.get("usage")
        if isinstance(node_usage, dict):
            for key in usage:
                value = node_usage.get(key)
                usage[key] += value if isinstance(value, int) else 0
    state_usage = store.state_at(info.id).get("usage") if info.head else None
    if isinstance(state_usage, dict):  # the agent's running total includes summary calls
        usage = {k: int(state_usage.get(k, 0) or 0) for k in usage}
    sizes = {oid: size for oid, size, _content in store.object_sizes_stream() if oid in mine}
    stored = sum(sizes.get(o, 0) for o in mine)
    unique = sum(sizes.get(o, 0) for o in mine if o not in others)
    return SessionUsage(
        info, nodes, compactions, roles, usage, len(mine), stored, unique, stored - unique
    )
