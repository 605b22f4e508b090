"""Claude Code transcripts: ``~/.claude/projects/<project>/<session uuid>.jsonl``,
and its subagents' ``agent-<id>.jsonl`` (beside it in older versions, under
``<session uuid>/subagents/`` in newer ones). docs/IMPORT.md has the mapping.

A transcript is a tree, not a list: each record names its ``parentUuid``; a
rewind starts a branch; a ``compact_boundary`` starts a new root that names
the last record before it in ``logicalParentUuid``; subagent runs written into
the main file are marked ``isSidechain``. The session is the path from the
newest main-line record back to the start; each sidechain becomes a session
of its own, linked to its parent; records off the path are kept verbatim with
the next message.

Memory: the first pass keeps a small entry per line (offsets, uuids, a digest);
the second reads back one line at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from ..errors import SourceError
from .records import (
    Entry,
    LineReader,
    ags_time,
    dict_field,
    iter_lines,
    line_key,
    open_turn,
    parse_line,
    raw_text,
    stat_of,
    text_of,
    token_count,
    torn_problem,
)
from .transcript_builder import TranscriptBuilder, call

TOOL: Final = "claude-code"
KNOWN_TYPES: Final = frozenset(
    {
        "user",
        "assistant",
        "system",
        "summary",
        "custom-title",
        "ai-title",
        "file-history-snapshot",
        "queue-operation",
        "progress",
        "attachment",
        "pr-link",
    }
)


def default_paths() -> list[Path]:
    base = os.environ.get("CLAUDE_CONFIG_DIR")
    return [Path(base, "projects") if base else Path.home() / ".claude" / "projects"]


def accepts(path: Path) -> bool:
    return path.suffix == ".jsonl"


def is_agent_file(path: Path) -> bool:
    return path.name.startswith("agent-")


class _Index:
    """The first pass over one file: every line's entry, the tree, titles and times."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[Entry] = []
        self.by_uuid: dict[str, int] = {}
        self.problems: list[str] = []
        self.unknown = 0
        self.titles: dict[str, str] = {}  # "custom" / "summary" -> the latest
        self.summary_leaves: list[tuple[str, str]] = []
        self.session_id: str | None = None
        self.agent_id: str | None = None
        self.cwd: str | None = None
        self.first_time: str | None = None
        self.model: str | None = None
        self.first_user: dict[str, str] = {}  # chain root uuid -> first user text
        size, self.mtime_ns = stat_of(path)
        self.size = size
        try:
            fp = path.open("rb")
        except OSError as e:
            raise SourceError(f"cannot read {path}: {e.strerror or e}") from None
        with fp:
            for line in iter_lines(fp):
                self._add(line)

    def _add(self, line: Any) -> None:
        rec = parse_line(line)
        if rec.problem == "torn":
            self.problems.append(torn_problem(line))
            return
        if rec.problem:
            self.problems.append(rec.problem)
        value = rec.value
        if value is None:
            if line.data.strip():
                self.entries.append(
                    Entry(line.number, line.offset, len(line.data), line_key(line.data), "")
                )
            return
        kind = str(value["type"]) if isinstance(value.get("type"), str) else ""
        if kind not in KNOWN_TYPES:
            self.unknown += 1
        sid = value.get("sessionId") if isinstance(value.get("sessionId"), str) else None
        self.session_id = self.session_id or sid
        if isinstance(value.get("agentId"), str):
            self.agent_id = self.agent_id or value["agentId"]
        if isinstance(value.get("cwd"), str) and self.cwd is None:
            self.cwd = value["cwd"]
        if self.first_time is None:
            self.first_time = ags_time(value.get("timestamp"))
        uuid = value.get("uuid") if isinstance(value.get("uuid"), str) else None
        parent = value.get("parentUuid")
        if parent is None:
            parent = value.get("logicalParentUuid")  # a compaction's new root
        entry = Entry(
            line.number,
            line.offset,
            len(line.data),
            line_key(line.data, sid),
            kind,
            uuid,
            parent if isinstance(parent, str) else None,
            value.get("isSidechain") is True,
        )
        if kind == "assistant":
            msg: dict[str, Any] = value["message"] if isinstance(value.get("message"), dict) else {}
            entry.turn = str(msg.get("id") or uuid or line.number)
            blocks = msg.get("content")
            entry.calls = isinstance(blocks, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks
            )
        if uuid and kind != "summary":
            self.by_uuid[uuid] = len(self.entries)
        self.entries.append(entry)
        if kind == "custom-title" and isinstance(value.get("customTitle"), str):
            self.titles["custom"] = value["customTitle"]
        elif kind == "summary" and isinstance(value.get("summary"), str):
            self.summary_leaves.append((str(value.get("leafUuid")), value["summary"]))
        elif kind == "assistant":
            model = dict_field(value, "message").get("model")
            if isinstance(model, str) and model and not model.startswith("<"):
                self.model = model

    def path_to(self, leaf: int, *, sidechain: bool | None) -> list[int]:
        """Entry indexes from the root to ``leaf``, following parents (and only
        sidechain or only main-line records, unless ``sidechain`` is None)."""
        out: list[int] = []
        seen: set[int] = set()
        at: int | None = leaf
        while at is not None and at not in seen:
            entry = self.entries[at]
            if sidechain is not None and entry.sidechain != sidechain:
                break
            seen.add(at)
            out.append(at)
            at = self.by_uuid.get(entry.parent) if entry.parent else None
        return out[::-1]

    def title(self) -> str | None:
        if "custom" in self.titles:
            return self.titles["custom"]
        for leaf, text in reversed(self.summary_leaves):
            # Summaries of other sessions are written into a file too (a known bug):
            # trust only one whose leaf is in this file.
            if leaf in self.by_uuid:
                return text
        return None


class ClaudeSource:
    """One Claude Code session: a main file's main line, one of its in-file
    sidechains, or a subagent's file."""

    tool = TOOL

    def __init__(
        self,
        index: _Index,
        path_entries: list[int],
        identity: str,
        parent: tuple[str, str] | None,
        extras: list[int],
        *,
        primary: bool = True,
    ) -> None:
        self._index = index
        self.path = index.path
        self.size, self.mtime_ns = index.size, index.mtime_ns
        self.identity = identity
        # A file's problems and unknown records are reported once, with its first session.
        self.problems = index.problems if primary else []
        self.unknown = index.unknown if primary else 0
        self._path = path_entries
        self._extras = extras  # entry indexes kept with the next message, in file order
        self._parent = parent
        self._reader = LineReader(index.path, drop="sessionId")  # (as _add keys lines)
        self._next_extra = 0
        self._boundary: dict[str, Any] | None = None
        self._time = index.first_time or "1970-01-01T00:00:00.000Z"
        self._first_user: str | None = None

    def keys(self) -> list[str]:
        return [self._index.entries[i].key for i in self._path]

    def meta(self) -> dict[str, Any]:
        index = self._index
        title = index.title() if self._parent is None else None
        first = self._first_user_text()
        if title is None and first:
            title = ("subagent: " if self._parent else "") + first.strip().split("\n", 1)[0]
        root = index.cwd if index.cwd and os.path.isabs(index.cwd) else None
        return {"title": title, "root": root, "model": index.model, "created": index.first_time}

    def parent_link(self) -> tuple[str, str] | None:
        if self._parent is None:
            return None
        return self._parent[0], self._first_user_text() or ""

    def _first_user_text(self) -> str | None:
        if self._first_user is not None:
            return self._first_user
        for i in self._path[:50]:
            value = self._reader.read(self._index.entries[i]).value or {}
            if value.get("type") == "user" and not value.get("isMeta"):
                content = dict_field(value, "message").get("content")
                if isinstance(content, list) and any(
                    isinstance(b, dict) and b.get("type") == "tool_result" for b in content
                ):
                    continue
                text = text_of(content).strip()
                if text and not text.startswith("<"):
                    self._first_user = text
                    return text
        self._first_user = ""
        return None

    def feed(
        self, builder: TranscriptBuilder, start: int, stop: int, digests: list[str]
    ) -> Iterator[None]:
        entries = self._index.entries
        if start == 0:
            self._next_extra = 0
        try:
            for i in range(start, stop):
                entry = entries[self._path[i]]
                while (
                    self._next_extra < len(self._extras)
                    and self._extras[self._next_extra] < self._path[i]
                ):
                    builder.extra(self._extra_value(entries[self._extras[self._next_extra]]))
                    self._next_extra += 1
                builder.advance(digests[i + 1])
                record = self._reader.read(entry)
                value = record.value if record.value is not None else {"text": raw_text(record)}
                self._map(builder, value)
                yield
            self._flush_boundary(builder)
        finally:
            self._reader.close()

    def _extra_value(self, entry: Entry) -> Any:
        record = self._reader.read(entry)
        return record.value if record.value is not None else {"text": raw_text(record)}

    def _map(self, builder: TranscriptBuilder, value: dict[str, Any]) -> None:
        kind = value.get("type")
        self._time = ags_time(value.get("timestamp")) or self._time
        meta: dict[str, Any] = {"time": self._time}
        if self._boundary is not None and not value.get("isCompactSummary"):
            self._flush_boundary(builder)
        if kind == "assistant":
            self._assistant(builder, value, meta)
        elif kind == "user":
            self._user(builder, value, meta)
        elif kind == "system" and value.get("subtype") == "compact_boundary":
            builder.close()
            self._boundary = value
        else:
            builder.extra(value)

    def _flush_boundary(self, builder: TranscriptBuilder) -> None:
        boundary, self._boundary = self._boundary, None
        if boundary is not None:
            text = text_of(boundary.get("content")) or "Conversation compacted"
            builder.compaction(
                [boundary], text, meta={"time": self._time, **_compact_meta(boundary)}
            )

    def _assistant(
        self, builder: TranscriptBuilder, value: dict[str, Any], meta: dict[str, Any]
    ) -> None:
        msg: dict[str, Any] = value["message"] if isinstance(value.get("message"), dict) else {}
        blocks = msg.get("content")
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        texts: list[str] = []
        thinking: list[str] = []
        calls: list[dict[str, Any]] = []
        for n, block in enumerate(blocks if isinstance(blocks, list) else []):
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "thinking" and isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
            elif kind == "redacted_thinking":
                thinking.append("[redacted thinking]")
            elif kind == "tool_use":
                fallback = f"call_{(value.get('uuid') or '')[:8]}_{n}"
                calls.append(call(block.get("id"), block.get("name"), block.get("input"), fallback))
        if isinstance(msg.get("model"), str):
            meta["model"] = msg["model"]
        usage = msg.get("usage")
        if isinstance(usage, dict):
            meta["usage"] = _usage(usage)
        if isinstance(value.get("requestId"), str):
            meta["request_id"] = value["requestId"]
        group = msg.get("id") or value.get("uuid")
        builder.assistant(
            value,
            group=group,
            text="\n".join(texts),
            thinking="\n".join(thinking),
            calls=calls,
            meta=meta,
        )

    def _user(
        self, builder: TranscriptBuilder, value: dict[str, Any], meta: dict[str, Any]
    ) -> None:
        msg: dict[str, Any] = value["message"] if isinstance(value.get("message"), dict) else {}
        content = msg.get("content")
        if value.get("isCompactSummary"):
            records = [r for r in (self._boundary, value) if r is not None]
            boundary, self._boundary = self._boundary, None
            extra = _compact_meta(boundary) if boundary else {}
            builder.compaction(records, text_of(content), meta={**meta, **extra})
            return
        if not isinstance(content, list):
            builder.user(value, text_of(content), meta=meta)
            return
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        others = [
            b for b in content if not (isinstance(b, dict) and b.get("type") == "tool_result")
        ]
        parts = len(results) + (1 if others else 0)
        for n, block in enumerate(results):
            # One record, several messages: the record is kept whole with the first.
            record = value if n == 0 else {"same_record_as": "the previous message", "block": n}
            builder.tool_result(
                record,
                str(block.get("tool_use_id") or ""),
                _result_text(block.get("content")),
                meta=meta,
                error=block.get("is_error") is True,
                last=n == parts - 1,
            )
        if others:
            text = "\n".join(_block_text(b) for b in others)
            builder.user(
                value if not results else {"same_record_as": "the previous message"},
                text,
                meta=meta,
            )


def _block_text(block: Any) -> str:
    if isinstance(block, str):
        return block
    if not isinstance(block, dict):
        return ""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    return f"[{kind}]" if isinstance(kind, str) else ""


def _result_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(_block_text(b) for b in content)
    return text_of(content)


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    def n(key: str) -> int:
        return token_count(usage.get(key))

    prompt = n("input_tokens") + n("cache_read_input_tokens") + n("cache_creation_input_tokens")
    return {"prompt_tokens": prompt, "completion_tokens": n("output_tokens")}


def _compact_meta(boundary: dict[str, Any]) -> dict[str, Any]:
    info = boundary.get("compactMetadata")
    if not isinstance(info, dict):
        return {}
    out: dict[str, Any] = {"automatic": info.get("trigger") == "auto"}
    if token_count(info.get("preTokens")):
        out["pre_tokens"] = info["preTokens"]
    return out


def sources(path: Path) -> list[ClaudeSource]:
    """The sessions one file holds: the main line first, then its sidechains."""
    index = _Index(path)
    entries = index.entries
    agent_file = is_agent_file(path)
    if agent_file:
        leaf = _last_leaf(index, None)
        path_entries = _settled(
            index, index.path_to(leaf, sidechain=None) if leaf is not None else []
        )
        agent = index.agent_id or path.stem.removeprefix("agent-")
        parent_sid = index.session_id or path.parent.parent.name
        on_path = set(path_entries)
        extras = [i for i in range(len(entries)) if i not in on_path]
        return [
            ClaudeSource(
                index, path_entries, f"{TOOL}:agent:{agent}", (f"{TOOL}:{parent_sid}", ""), extras
            )
        ]
    leaf = _last_leaf(index, False)
    path_entries = _settled(index, index.path_to(leaf, sidechain=False) if leaf is not None else [])
    if not path_entries:
        if any(e.kind in KNOWN_TYPES for e in entries):
            return []  # opened, but no conversation yet (only snapshots, say)
        raise SourceError(f"{path} holds no Claude Code records")
    file_sid = path.stem
    sidechains, covered = _sidechains(index, file_sid)
    on_path = set(path_entries)
    extras = [i for i, e in enumerate(entries) if i not in on_path and not e.sidechain]
    _say_if_broken(index, path_entries, extras)
    stray = [i for i, e in enumerate(entries) if e.sidechain and i not in covered]
    if stray:  # kept with the main line, rather than nowhere
        extras = sorted(extras + stray)
        index.problems.append(
            f"{len(stray)} sidechain records are on no chain that ends (their parents "
            "loop): kept as extra records"
        )
    out = [ClaudeSource(index, path_entries, f"{TOOL}:{file_sid}", None, extras)]
    return out + sidechains


def _say_if_broken(index: _Index, path: list[int], extras: list[int]) -> None:
    """A problem when the conversation's first record names a parent the file does not
    hold (a damaged line, a record lost) while messages came before it: the path back
    from the last record stops there, and those messages are kept as extra records
    only, never seen by ``ags log`` or a resume. Said, so that nobody takes the
    session for the whole conversation."""
    root = index.entries[path[0]]
    if not root.parent or root.parent in index.by_uuid:
        return
    before = sum(
        1 for i in extras if i < path[0] and index.entries[i].kind in ("user", "assistant")
    )
    if before:
        index.problems.append(
            f"line {root.number}: its parent record {root.parent} is not in the file, so "
            f"the conversation starts there; {before} earlier messages are kept only "
            "as extra records"
        )


def _settled(index: _Index, path: list[int]) -> list[int]:
    """The path without an assistant turn still waiting for its tool results."""
    held = open_turn(index.entries, path)
    if not held:
        return path
    index.problems.append(
        f"the last assistant turn ({held} records) waits for its tool results: "
        "left for the next import"
    )
    return path[:-held]


def _last_leaf(index: _Index, sidechain: bool | None) -> int | None:
    """The newest record of the line the session is on (as Claude Code resumes it)."""
    for i in range(len(index.entries) - 1, -1, -1):
        e = index.entries[i]
        if (
            e.uuid
            and e.kind in ("user", "assistant", "system")
            and (sidechain is None or e.sidechain == sidechain)
        ):
            return i
    return None


def _sidechains(index: _Index, file_sid: str) -> tuple[list[ClaudeSource], set[int]]:
    """Subagent runs written into the main file: one session per sidechain leaf; and
    the entries they hold, on their chains or as their extra records."""
    entries = index.entries
    parents = {e.parent for e in entries if e.sidechain and e.parent}
    out: list[ClaudeSource] = []
    covered: set[int] = set()
    for i, e in enumerate(entries):
        if not e.sidechain or not e.uuid or e.uuid in parents:
            continue
        chain = index.path_to(i, sidechain=True)
        if not chain:
            continue
        root = entries[chain[0]].uuid
        on_chain = set(chain)
        span = range(chain[0], chain[-1] + 1)
        extras = [j for j in span if entries[j].sidechain and j not in on_chain]
        identity = f"{TOOL}:{file_sid}:sidechain:{root}"
        parent = (f"{TOOL}:{file_sid}", "")
        out.append(ClaudeSource(index, chain, identity, parent, extras, primary=False))
        covered.update(chain, extras)
    return out, covered
