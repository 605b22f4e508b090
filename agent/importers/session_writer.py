"""Writes one source session into the store, idempotently and incrementally.

What an ags session remembers of its source is in its metadata, under
``imported`` (docs/IMPORT.md, FORMAT.md 6.1): the tool, the source file's path,
size and modification time, the source session's identity, how many source
records the session holds (``records``), the running digest over their keys
(``digest``), the node the import left the head at (``head``) and ``seq``,
which grows by one each time a changed source is imported as a fork.

The decision, per source file:

* its path is claimed by a session and size and time are unchanged:
  ``unchanged``, nothing read or written (one ``stat``);
* the first ``records`` records still hash to ``digest``: the source grew;
  the new records are appended to the same session (``updated``), or nothing
  is written when there are none. If someone went on with the session in ags
  since (the head moved), the new records go to a fork at the import point;
* otherwise the source changed its past: the newest message of the old session
  whose ``source.digest`` matches the new records at its ``source.through`` is
  where the new session forks; the old one is left as it is. Unless the source
  is another file than the one the session was imported from and all of it is
  that session's already (an older copy: a backup, a copied folder): then it
  is ``unchanged``, and nothing is written, its claim included.
* a source no session claims, whose first records are a session imported
  from another file (Claude Code copies the history it resumes), forks that
  session where the copy ends, so the history is stored once.

Each source is written in one ``Store.batch``: a failure leaves no partial
session behind, and the objects and refs are synced once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from objstore import InvalidInput, LimitExceeded, SessionInfo, Store

from .records import ImportRow, Item, chain_digest
from .transcript_builder import TranscriptBuilder

IMPORTER_VERSION: Final = 1
MAX_TITLE: Final = 200


class Source(Protocol):
    """One source session, as a tool's module reads it."""

    tool: str
    path: Path
    identity: str  # stable id of the source session, e.g. "claude-code:<uuid>"
    size: int
    mtime_ns: int
    problems: list[str]
    unknown: int

    def keys(self) -> list[str]:
        """The keys of the records on the transcript's path, in order (reads the file)."""

    def feed(
        self, builder: TranscriptBuilder, start: int, stop: int, digests: list[str]
    ) -> Iterator[None]:
        """Feed records ``start`` to ``stop`` to ``builder`` (``digests[i]``: the running
        digest after ``i`` records), yielding after each. A feed from 0 starts over."""

    def meta(self) -> dict[str, Any]:
        """title, root, model, created (each may be None), known after ``keys``."""

    def parent_link(self) -> tuple[str, str] | None:
        """For a sidechain: (the parent's identity, the prompt that started it)."""


@dataclass(slots=True)
class Claims:
    """The imported sessions in the store, by what they were imported from."""

    by_identity: dict[str, SessionInfo] = field(default_factory=dict)
    by_path: dict[str, SessionInfo] = field(default_factory=dict)
    by_first: dict[str, list[SessionInfo]] = field(default_factory=dict)

    @classmethod
    def load(cls, store: Store) -> Claims:
        """One read of every session ref (no message is read)."""
        claims = cls()
        for info in store.sessions(include_archived=True):
            claims.add(info)
        return claims

    def add(self, info: SessionInfo) -> None:
        imp = info.imported
        if not isinstance(imp, dict) or "identity" not in imp:
            return

        def newer(old: SessionInfo | None) -> bool:
            return old is None or _seq(info) >= _seq(old)

        if newer(self.by_identity.get(imp["identity"])):
            self.by_identity[imp["identity"]] = info
        if not imp.get("sidechain") and newer(self.by_path.get(imp.get("path", ""))):
            self.by_path[imp.get("path", "")] = info
        if imp.get("first"):
            self.by_first.setdefault(imp["first"], []).append(info)


def _seq(info: SessionInfo) -> int:
    imp = info.imported or {}
    seq = imp.get("seq", 0)
    return seq if isinstance(seq, int) else 0


def unchanged_by_stat(claims: Claims, path: Path, size: int, mtime_ns: int) -> SessionInfo | None:
    """The session a file was imported into, if the file has not changed since."""
    info = claims.by_path.get(str(path))
    imp = info.imported if info else None
    if info and imp and imp.get("size") == size and imp.get("mtime_ns") == mtime_ns:
        return info
    return None


@dataclass(slots=True)
class _Plan:
    action: str  # "append", "fork", "new", "nothing", "copy" (nothing, and not claimed)
    session: str | None = None  # append: the session; fork: the session forked from
    spec: str | None = None  # fork: where
    start: int = 0  # records already in the base
    seq: int = 0


def write_source(store: Store, src: Source, claims: Claims, *, dry_run: bool) -> ImportRow:
    """Import one source session; the row says what happened."""
    row = ImportRow(str(src.path), src.tool)
    keys = src.keys()
    row.problems += src.problems
    row.unknown_records = src.unknown
    digests = [""]
    for key in keys:
        digests.append(chain_digest(digests[-1], key))
    own = claims.by_identity.get(src.identity)
    plan = _plan(store, own, claims, keys, digests, src.path)
    row.records = len(keys)
    if own is not None and own.archived and plan.action != "nothing":
        row.session, row.messages, row.records = own.id, own.messages, _records(own)
        row.problems.append(f"session {own.id} is archived; unarchive it to import what was added")
        return row
    if plan.action == "copy":
        assert own is not None
        row.session, row.messages = own.id, own.messages
        return row
    if plan.action == "nothing":
        assert own is not None
        row.session, row.messages = own.id, own.messages
        imp = own.imported or {}
        if not dry_run and (imp.get("size"), imp.get("mtime_ns")) != (src.size, src.mtime_ns):
            # Grown by records that make no message: remember the new size, so the
            # next run needs only a stat again.
            imported = {**imp, "size": src.size, "mtime_ns": src.mtime_ns, "path": str(src.path)}
            retitle = _title_change(own, imp, src.meta())
            if retitle:
                imported["title"] = retitle["title"]
            store.set_meta(own.id, "import", imported=imported, **retitle)
            claims.add(store.session(own.id))
        return row

    builder = TranscriptBuilder(src.tool)
    for _ in src.feed(builder, 0, plan.start, digests):
        builder.take()  # replaying what the base holds: the builder's state, not its output
    builder.close()
    builder.take()
    meta = src.meta()
    if dry_run:
        count = 0
        if plan.action == "append" and plan.session:
            count = store.session(plan.session).messages
        elif plan.action == "fork" and plan.spec:
            count = store.node(store.node_id(plan.spec)).messages
        for _ in src.feed(builder, plan.start, len(keys), digests):
            count += sum(1 for item in builder.take() if not item.compaction)
        builder.close()
        count += sum(1 for item in builder.take() if not item.compaction)
        row.status = "updated" if plan.action == "append" else "created"
        row.session, row.messages = plan.session if plan.action == "append" else None, count
        row.forked_from = plan.session if plan.action != "append" else None
        return row

    with store.batch():
        if plan.action == "append":
            assert plan.session is not None
            sid = plan.session
            row.status = "updated"
        else:
            title = _title(meta)
            if plan.action == "fork" and plan.spec:
                sid = store.fork(plan.spec, title=title)
                row.forked_from = plan.session
            else:
                sid = store.new_session(title=title, root=meta.get("root"), model=meta.get("model"))
            row.status = "created"
        empty = store.session(sid).head is None
        written = 0
        for _ in src.feed(builder, plan.start, len(keys), digests):
            items = builder.take()
            written += len(items)
            empty = _write_items(store, sid, items, row, empty)
        builder.close()
        items = builder.take()
        written += len(items)
        _write_items(store, sid, items, row, empty)
        info = store.session(sid)
        if plan.action == "append" and not written:
            row.status = "unchanged"  # new records that made no message of their own
        imported = {
            "version": IMPORTER_VERSION,
            "tool": src.tool,
            "identity": src.identity,
            "path": str(src.path),
            "size": src.size,
            "mtime_ns": src.mtime_ns,
            "records": len(keys),
            "digest": digests[-1],
            "first": keys[0] if keys else None,
            "head": info.head,
            "seq": plan.seq,
        }
        link = src.parent_link()
        if link is not None:
            imported["sidechain"] = True
            imported["parent"] = (
                (own.imported or {}).get("parent")
                if own and plan.action == "append"
                else _parent_node(store, claims, *link)
            )
        changes: dict[str, Any] = {"imported": imported}
        if plan.action != "append":
            if _title(meta) and info.title != _title(meta):
                changes["title"] = _title(meta)  # a fork takes its source's title otherwise
            if meta.get("created"):
                changes["created"] = meta["created"]
            if meta.get("root") and plan.action == "fork":
                changes["root"] = meta["root"]
        if meta.get("model"):
            changes["model"] = meta["model"]
        if plan.action == "append" and own is not None:
            changes |= _title_change(info, own.imported or {}, meta)
            imported["title"] = changes.get("title", (own.imported or {}).get("title"))
        else:
            imported["title"] = _title(meta)
        store.set_meta(sid, "import", **changes)
    final = store.session(sid)
    claims.add(final)
    row.session, row.messages = sid, final.messages
    return row


def _title_change(info: SessionInfo, imp: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The source's new title, unless the session was renamed in ags since it was imported."""
    title = _title(meta)
    if title and title != imp.get("title") and info.title == imp.get("title"):
        return {"title": title}
    return {}


def _records(info: SessionInfo) -> int:
    value = (info.imported or {}).get("records", 0)
    return value if isinstance(value, int) else 0


def _plan(
    store: Store,
    own: SessionInfo | None,
    claims: Claims,
    keys: list[str],
    digests: list[str],
    path: Path,
) -> _Plan:
    if own is not None:
        imp = own.imported or {}
        n = imp.get("records", 0)
        seq = _seq(own)
        if isinstance(n, int) and 0 <= n < len(digests) and digests[n] == imp.get("digest"):
            if own.head == imp.get("head"):
                if n == len(keys):
                    return _Plan("nothing", own.id)
                return _Plan("append", own.id, None, n, seq)
            # Someone went on with the imported session in ags: keep their work, fork.
            return _Plan("fork", own.id, imp.get("head") or None, n, seq + 1)
        spec, n = _fork_point(store, own, digests)
        if spec is not None and n == len(keys) and str(path) != imp.get("path"):
            # Another file holding an older state of the session (a backup, a copied
            # folder): all of it is in the session already. As a fork, it became the
            # identity's newest claimant, and the original's next records went to it.
            return _Plan("copy", own.id)
        if spec is not None:
            return _Plan("fork", own.id, spec, n, seq + 1)
        return _Plan("new", own.id, None, 0, seq + 1)
    best: tuple[int, SessionInfo] | None = None
    for cand in claims.by_first.get(keys[0], []) if keys else []:
        imp = cand.imported or {}
        n = imp.get("records", 0)
        matches = isinstance(n, int) and 0 < n < len(digests) and digests[n] == imp.get("digest")
        if matches and imp.get("head") and (best is None or n > best[0]):
            best = (n, cand)
    if best is not None:
        n, cand = best
        head = (cand.imported or {})["head"]
        return _Plan("fork", cand.id, cand.id if cand.head == head else head, n, 0)
    return _Plan("new", None, None, 0, 0)


def _fork_point(store: Store, own: SessionInfo, digests: list[str]) -> tuple[str | None, int]:
    """The newest node of ``own`` (from its import point back) whose message closes the
    source at a record boundary that the new records share, as a spec, and that boundary."""
    head = (own.imported or {}).get("head") or own.head
    if head is None:
        return None, 0
    at_head = own.head == head
    for steps, entry in enumerate(store.log(head)):
        message = entry.message
        source = message.get("source") if isinstance(message, dict) else None
        if isinstance(source, dict):
            through, digest = source.get("through"), source.get("digest")
            if (
                isinstance(through, int)
                and 0 < through < len(digests)
                and digests[through] == digest
            ):
                return (f"{own.id}~{steps}" if at_head else entry.node.id), through
    return None, 0


def _write_items(store: Store, sid: str, items: list[Item], row: ImportRow, empty: bool) -> bool:
    """Append items; return whether the session is still empty."""
    for item in items:
        try:
            _write_item(store, sid, item, empty)
        except InvalidInput as e:
            why = e.limit if isinstance(e, LimitExceeded) else str(e)
            row.problems.append(f"a message could not be stored as it is ({why}); kept a stub")
            _write_item(store, sid, _stub(item, why), empty)
        empty = False
    return empty


def _write_item(store: Store, sid: str, item: Item, empty: bool) -> None:
    if item.compaction and not empty:
        store.compact(sid, item.message, keep=0, meta=item.meta)
    else:
        store.append(sid, item.message, meta=item.meta)


def _stub(item: Item, why: str) -> Item:
    """What is stored instead of a message the store refuses (too large, too deep)."""
    message = item.message
    stub: dict[str, Any] = {k: message[k] for k in ("role", "tool_call_id", "name") if k in message}
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        stub["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "arguments": {}}
            for c in calls
            if isinstance(c, dict)
        ]
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    stub["content"] = (text[:4000] + "\n[cut: the message was too large to store]") if text else ""
    source = message.get("source")
    old: dict[str, Any] = source if isinstance(source, dict) else {}
    stub["source"] = {k: old[k] for k in ("tool", "through", "digest") if k in old} | {
        "omitted": why
    }
    return Item(
        stub, {k: v for k, v in item.meta.items() if k in ("time", "model")}, item.compaction
    )


def _parent_node(store: Store, claims: Claims, identity: str, prompt: str) -> dict[str, Any]:
    """Where a sidechain hangs off its parent: the parent's message with the tool
    call that started it (its prompt), else the parent's import point."""
    parent = claims.by_identity.get(identity)
    if parent is None:
        return {"session": None, "node": None, "tool_call_id": None, "identity": identity}
    head = (parent.imported or {}).get("head") or parent.head
    fallback = {"session": parent.id, "node": head, "tool_call_id": None}
    if head is None or not prompt:
        return fallback
    for entry in store.log(head):
        message = entry.message
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else ():
            args = call.get("arguments") if isinstance(call, dict) else None
            if isinstance(args, dict) and prompt.strip() in (
                str(args.get("prompt", "")).strip(),
                str(args.get("message", "")).strip(),
            ):
                return {"session": parent.id, "node": entry.node.id, "tool_call_id": call["id"]}
    return fallback


def _title(meta: dict[str, Any]) -> str | None:
    title = meta.get("title")
    if isinstance(title, str) and title.strip():
        return _cut(title)
    return None


def _cut(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_TITLE else line[: MAX_TITLE - 1] + "…"
