"""Codex CLI rollout files: ``~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl``
(``$CODEX_HOME/sessions``). docs/IMPORT.md has the mapping.

Since 0.2x a line is ``{"timestamp", "type", "payload"}`` with type
``session_meta``, ``response_item`` (the model's input and output items:
``message``, ``reasoning``, ``function_call``, ``function_call_output``,
``custom_tool_call``, ``local_shell_call``, ...), ``event_msg`` (what the UI
showed; it repeats the response items), ``turn_context`` (model, cwd) and
``compacted``. Older files start with a bare meta object (``id``,
``timestamp``, ``instructions``) and hold bare response items and
``{"record_type": "state"}`` lines. A rollout is a plain list: every line is on
the session's path, in file order.
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
    iter_lines,
    line_key,
    open_turn,
    parse_line,
    raw_text,
    stat_of,
    str_field,
    text_of,
    torn_problem,
)
from .transcript_builder import TranscriptBuilder, call

TOOL: Final = "codex"
KNOWN_TYPES: Final = frozenset(
    {
        "session_meta",
        "response_item",
        "event_msg",
        "turn_context",
        "compacted",
    }
)
KNOWN_ITEMS: Final = frozenset(
    {
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "local_shell_call",
        "web_search_call",
        "ghost_snapshot",
    }
)
ASSISTANT_SIDE: Final = frozenset(
    {
        "reasoning",
        "function_call",
        "custom_tool_call",
        "local_shell_call",
    }
)


def default_paths() -> list[Path]:
    base = os.environ.get("CODEX_HOME")
    return [Path(base, "sessions") if base else Path.home() / ".codex" / "sessions"]


def accepts(path: Path) -> bool:
    """A rollout: ``rollout-*.jsonl``, or any ``.jsonl`` in a ``YYYY/MM/DD`` folder."""
    if path.suffix != ".jsonl":
        return False
    day, month, year = path.parent.name, path.parent.parent.name, path.parent.parent.parent.name
    dated = len(year) == 4 and all(p.isdigit() for p in (day, month, year))
    return path.name.startswith("rollout-") or dated


class CodexSource:
    tool = TOOL

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size, self.mtime_ns = stat_of(path)
        self.problems: list[str] = []
        self.unknown = 0
        self._entries: list[Entry] = []
        self._meta: dict[str, Any] = {}
        self._reader = LineReader(path)
        self._model: str | None = None
        self._time = "1970-01-01T00:00:00.000Z"
        self._title: str | None = None
        try:
            fp = path.open("rb")
        except OSError as e:
            raise SourceError(f"cannot read {path}: {e.strerror or e}") from None
        with fp:
            for line in iter_lines(fp):
                self._index(line)
        held = open_turn(self._entries, list(range(len(self._entries))))
        if held:
            del self._entries[len(self._entries) - held :]
            self.problems.append(
                f"the last assistant turn ({held} records) waits for its tool results: "
                "left for the next import"
            )
        ident = self._meta.get("id") or path.stem.removeprefix("rollout-")
        self.identity = f"{TOOL}:{ident}"
        if not any(e.kind == "session_meta" for e in self._entries[:50]):
            damaged = bool(self._entries) and self._entries[0].kind == ""
            why = (
                "its first line, where the session_meta line goes, is not a JSON object"
                if damaged
                else "no session_meta line"
            )
            raise SourceError(f"{path} is not a Codex rollout ({why})")

    def _index(self, line: Any) -> None:
        rec = parse_line(line)
        if rec.problem == "torn":
            self.problems.append(torn_problem(line))
            return
        if rec.problem:
            self.problems.append(rec.problem)
        if not line.data.strip():
            return
        value = rec.value
        kind, payload = _split(value) if value is not None else ("", None)
        unknown_type = value is not None and kind not in KNOWN_TYPES and kind != "state"
        unknown_item = (
            kind == "response_item"
            and isinstance(payload, dict)
            and str_field(payload, "type") not in KNOWN_ITEMS
        )
        if unknown_type or unknown_item:
            self.unknown += 1
        if kind == "session_meta" and isinstance(payload, dict) and not self._meta:
            self._meta = payload
            self._time = ags_time(payload.get("timestamp")) or self._time
        if kind == "turn_context" and isinstance(payload, dict):
            if isinstance(payload.get("model"), str):
                self._model = payload["model"]
            if not self._meta.get("cwd") and isinstance(payload.get("cwd"), str):
                self._meta = {**self._meta, "cwd": payload["cwd"]}
        if (
            self._title is None
            and kind == "response_item"
            and isinstance(payload, dict)
            and payload.get("type") == "message"
            and payload.get("role") == "user"
        ):
            text = text_of(payload.get("content")).strip()
            if text and not text.startswith("<"):
                self._title = text.split("\n", 1)[0]
        entry = Entry(line.number, line.offset, len(line.data), line_key(line.data), kind)
        if kind == "response_item" and isinstance(payload, dict):
            item = str_field(payload, "type")
            if item in ASSISTANT_SIDE or (item == "message" and payload.get("role") == "assistant"):
                entry.turn = "assistant"  # consecutive assistant items are one message
                entry.calls = item in ASSISTANT_SIDE and item != "reasoning"
        self._entries.append(entry)

    def keys(self) -> list[str]:
        return [e.key for e in self._entries]

    def meta(self) -> dict[str, Any]:
        cwd = self._meta.get("cwd")
        return {
            "title": self._title,
            "root": cwd if isinstance(cwd, str) and os.path.isabs(cwd) else None,
            "model": self._model,
            "created": ags_time(self._meta.get("timestamp")),
        }

    def parent_link(self) -> tuple[str, str] | None:
        return None

    def feed(
        self, builder: TranscriptBuilder, start: int, stop: int, digests: list[str]
    ) -> Iterator[None]:
        if start == 0:
            self._model_now: str | None = None
        try:
            for i in range(start, stop):
                builder.advance(digests[i + 1])
                record = self._reader.read(self._entries[i])
                if record.value is None:
                    builder.extra({"text": raw_text(record)})
                else:
                    self._map(builder, record.value, i)
                yield
        finally:
            self._reader.close()

    def _map(self, builder: TranscriptBuilder, value: dict[str, Any], index: int) -> None:
        kind, payload = _split(value)
        self._time = ags_time(value.get("timestamp")) or self._time
        meta: dict[str, Any] = {"time": self._time}
        if kind == "turn_context" and isinstance(payload, dict):
            if isinstance(payload.get("model"), str):
                self._model_now = payload["model"]
            builder.extra(value)
            return
        if kind == "compacted" and isinstance(payload, dict):
            summary = text_of(payload.get("message"))
            if not summary and isinstance(payload.get("replacement_history"), list):
                summary = text_of(payload["replacement_history"])
            builder.compaction([value], summary or "(compacted)", meta=meta)
            return
        if kind != "response_item" or not isinstance(payload, dict):
            builder.extra(value)
            return
        item = str_field(payload, "type")
        fallback = f"call_{index}"
        if item == "message":
            role = payload.get("role")
            text = text_of(payload.get("content"))
            if role == "assistant":
                if self._model_now:
                    meta["model"] = self._model_now
                builder.assistant(value, text=text, meta=meta)
            elif role in ("developer", "system"):
                builder.user(value, text, meta=meta, role="system")
            else:
                builder.user(value, text, meta=meta)
        elif item == "reasoning":
            parts = payload.get("summary")
            thought = text_of(parts) if parts else text_of(payload.get("content"))
            builder.assistant(value, thinking=thought, meta=meta)
        elif item in ASSISTANT_SIDE:
            if item == "function_call":
                c = call(
                    payload.get("call_id"), payload.get("name"), payload.get("arguments"), fallback
                )
            elif item == "custom_tool_call":
                c = call(
                    payload.get("call_id"),
                    payload.get("name"),
                    {"input": payload.get("input")},
                    fallback,
                )
            else:
                action = payload.get("action")
                c = call(
                    payload.get("call_id") or payload.get("id"),
                    "local_shell",
                    action if isinstance(action, dict) else {},
                    fallback,
                )
            builder.assistant(value, calls=[c], meta=meta)
        elif item in ("function_call_output", "custom_tool_call_output"):
            builder.tool_result(
                value,
                str(payload.get("call_id") or ""),
                _output_text(payload.get("output")),
                meta=meta,
            )
        else:
            builder.extra(value)


def _split(value: dict[str, Any] | None) -> tuple[str, Any]:
    """(type, payload) of a line in either layout."""
    if value is None:
        return "", None
    kind = value.get("type")
    if "payload" in value and isinstance(kind, str):
        return kind, value["payload"]
    if value.get("record_type") == "state":
        return "state", value
    if isinstance(kind, str):  # before 0.2x: a bare response item
        return "response_item", value
    if "id" in value and "timestamp" in value:  # before 0.2x: the first line, bare meta
        return "session_meta", value
    return "", value


def _output_text(output: Any) -> str:
    """A call's output: a string, in older versions a JSON string of
    ``{"output": ..., "metadata": ...}``, or a list of content items."""
    if isinstance(output, str):
        if output.startswith("{"):
            import json

            try:
                parsed = json.loads(output)
            except ValueError:
                return output
            if isinstance(parsed, dict) and isinstance(parsed.get("output"), str):
                return str(parsed["output"])
        return output
    return text_of(output)


def sources(path: Path) -> list[CodexSource]:
    return [CodexSource(path)]
