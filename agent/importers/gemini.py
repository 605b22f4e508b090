"""Gemini CLI chat files: ``~/.gemini/tmp/<project hash>/chats/session-*.json``
(one JSON document per session, rewritten as the chat goes on; before 0.58),
``session-*.jsonl`` (0.58 and later: an append-only log in which a changed
message is written again), and the checkpoints ``/chat save`` writes
(``checkpoint-*.json`` beside ``chats/``: the raw Gemini API history, a list
of ``{"role", "parts"}``). docs/IMPORT.md has the mapping.

A chat is rebuilt whole before it is mapped, so memory follows the chat here,
not the largest message. Messages may change after they are written (tool
results and token counts are added to the last answer), so a message's key is
its whole content: a changed message is a changed past, imported as a fork; an
answer whose tool calls are still running is left for the next import.
``logs.json`` holds only the user's prompts and is not imported.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from objstore import NestingTooDeep, parse_json

from ..errors import SourceError
from .records import (
    LINE_DEPTH,
    ags_time,
    clean,
    finite_float,
    iter_lines,
    list_field,
    parse_line,
    record_key,
    stat_of,
    str_field,
    text_of,
    token_count,
    torn_problem,
)
from .transcript_builder import TranscriptBuilder, call

TOOL: Final = "gemini"
KNOWN_TYPES: Final = frozenset({"user", "gemini", "info", "error", "warning"})


def default_paths() -> list[Path]:
    return [Path.home() / ".gemini" / "tmp"]


def accepts(path: Path) -> bool:
    name = path.name
    if name.startswith("session-") and path.parent.name == "chats":
        return path.suffix in (".json", ".jsonl")
    return path.suffix == ".json" and name.startswith("checkpoint-")


class GeminiSource:
    tool = TOOL

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size, self.mtime_ns = stat_of(path)
        self.problems: list[str] = []
        self.unknown = 0
        if path.suffix == ".jsonl":
            doc: Any = self._read_jsonl(path)
        else:
            doc = self._read_json(path)
        self._doc: dict[str, Any] = {}
        if isinstance(doc, list):  # a checkpoint: the API history
            self._messages = [m for m in doc if isinstance(m, dict)]
            self._checkpoint = True
            self.identity = f"{TOOL}:checkpoint:{path.parent.name}/{path.name}"
        elif isinstance(doc, dict) and isinstance(doc.get("messages"), list):
            self._doc = doc
            self._messages = [m for m in doc["messages"] if isinstance(m, dict)]
            self._checkpoint = False
            self.identity = f"{TOOL}:{doc.get('sessionId') or path.stem}"
        else:
            raise SourceError(f"{path} is not a Gemini CLI chat or checkpoint file")
        if not self._checkpoint:
            self.unknown = sum(str_field(m, "type") not in KNOWN_TYPES for m in self._messages)
            # An answer whose tool calls are still running is rewritten in place when they
            # finish: wait for it, rather than import it half done and fork later.
            if self._messages and _running(self._messages[-1]):
                self._messages.pop()
        # A checkpoint holds no time at all, and a chat may lack its start: the time the
        # file was last written stands for them (the epoch made "updated 56 years ago",
        # and such a session sorted last in ags ls).
        self._start = ags_time(self._doc.get("startTime")) or ags_time(self.mtime_ns / 1e9)
        self._time = self._start or "1970-01-01T00:00:00.000Z"

    @property
    def has_messages(self) -> bool:
        return bool(self._messages)

    def _read_json(self, path: Path) -> Any:
        try:
            data = path.read_bytes()
        except OSError as e:
            raise SourceError(f"cannot read {path}: {e.strerror or e}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            text = data.decode("utf-8", errors="replace")
            self.problems.append(f"not UTF-8 (byte {e.start}); bad bytes replaced by U+FFFD")
        try:
            return clean(parse_json(text, LINE_DEPTH, parse_float=finite_float))
        except NestingTooDeep:
            raise SourceError(f"{path} nests deeper than {LINE_DEPTH} levels") from None
        except ValueError as e:
            raise SourceError(f"{path} is not a complete JSON document ({e})") from None

    def _read_jsonl(self, path: Path) -> dict[str, Any]:
        """The append-only log (0.58 and later): a metadata line, then messages, each
        written again (same ``id``) when it changes, ``{"$set": {...}}`` snapshots and
        ``message_update`` records; the latest version of each message wins."""
        doc: dict[str, Any] = {}
        messages: dict[str, dict[str, Any]] = {}
        try:
            fp = path.open("rb")
        except OSError as e:
            raise SourceError(f"cannot read {path}: {e.strerror or e}") from None
        with fp:
            for line in iter_lines(fp):
                rec = parse_line(line)
                if rec.problem == "torn":
                    self.problems.append(torn_problem(line))
                    continue
                if rec.problem:
                    self.problems.append(rec.problem)
                value = rec.value
                if value is None:
                    continue
                if isinstance(value.get("$set"), dict):
                    changes = value["$set"]
                    if isinstance(changes.get("messages"), list):
                        messages = {
                            str(m.get("id", n)): m
                            for n, m in enumerate(changes["messages"])
                            if isinstance(m, dict)
                        }
                    doc.update({k: v for k, v in changes.items() if k != "messages"})
                elif value.get("type") == "message_update" and "id" in value:
                    old = messages.get(str(value["id"]), {})
                    update = {k: v for k, v in value.items() if k != "type"}
                    messages[str(value["id"])] = {**old, **update}
                elif str_field(value, "type") in KNOWN_TYPES or ("id" in value and "type" in value):
                    messages[str(value.get("id"))] = value
                else:  # the metadata line, and whatever a newer version adds
                    doc.update({k: v for k, v in value.items() if k != "type"})
        doc["messages"] = list(messages.values())
        if "sessionId" not in doc:
            raise SourceError(f"{path} has no Gemini CLI session metadata")
        return doc

    def keys(self) -> list[str]:
        return [record_key(m) for m in self._messages]

    def meta(self) -> dict[str, Any]:
        title = self._doc.get("summary") if isinstance(self._doc.get("summary"), str) else None
        model = None
        for m in self._messages:
            if title is None and (m.get("type") == "user" or m.get("role") == "user"):
                first = _parts_text(m.get("content", m.get("parts"))).strip()
                if first and not first.startswith("<"):  # <session_context> is no title
                    title = first.split("\n", 1)[0]
            if isinstance(m.get("model"), str):
                model = m["model"]
        return {
            "title": title,
            "root": None,
            "model": model,
            "created": self._start,
        }

    def parent_link(self) -> tuple[str, str] | None:
        return None

    def feed(
        self, builder: TranscriptBuilder, start: int, stop: int, digests: list[str]
    ) -> Iterator[None]:
        for i in range(start, stop):
            builder.advance(digests[i + 1])
            message = self._messages[i]
            if self._checkpoint:
                self._map_content(builder, message, i)
            else:
                self._map_message(builder, message, i)
            yield

    def _map_message(self, builder: TranscriptBuilder, m: dict[str, Any], index: int) -> None:
        self._time = ags_time(m.get("timestamp")) or self._time
        meta: dict[str, Any] = {"time": self._time}
        kind = m.get("type")
        if kind == "user":
            builder.user(m, _parts_text(m.get("content")), meta=meta)
            return
        if kind != "gemini":
            builder.extra(m)  # info / error / warning: shown to the user, not sent to the model
            return
        if isinstance(m.get("model"), str):
            meta["model"] = m["model"]
        tokens = m.get("tokens")
        if isinstance(tokens, dict):
            meta["usage"] = {
                "prompt_tokens": token_count(tokens.get("input")),
                "completion_tokens": token_count(tokens.get("output")),
            }
        thoughts = m.get("thoughts")
        thinking = (
            "\n\n".join(
                ": ".join(str(t[k]) for k in ("subject", "description") if t.get(k))
                for t in thoughts
                if isinstance(t, dict)
            )
            if isinstance(thoughts, list)
            else ""
        )
        tool_calls = [c for c in list_field(m, "toolCalls") if isinstance(c, dict)]
        calls = [
            call(c.get("id"), c.get("name"), c.get("args"), f"call_{index}_{n}")
            for n, c in enumerate(tool_calls)
        ]
        builder.assistant(
            m,
            group=("gemini", index),
            text=_parts_text(m.get("content")),
            thinking=thinking,
            calls=calls,
            meta=meta,
        )
        for n, (c, made) in enumerate(zip(tool_calls, calls, strict=True)):
            if (
                "result" not in c
                and "error" not in c
                and c.get("status") not in ("error", "cancelled")
            ):
                continue  # not run yet
            record = {"same_record_as": "the assistant message before", "tool_call": n}
            builder.tool_result(
                record,
                made["id"],
                _tool_output(c),
                meta=meta,
                error=c.get("status") == "error",
                last=n == len(calls) - 1,
            )

    def _map_content(self, builder: TranscriptBuilder, m: dict[str, Any], index: int) -> None:
        meta = {"time": self._time}
        parts = [p for p in list_field(m, "parts") if isinstance(p, dict)]
        if m.get("role") == "model":
            calls = [
                call(fc.get("id"), fc.get("name"), fc.get("args"), f"call_{index}_{n}")
                for n, p in enumerate(parts)
                if isinstance(fc := p.get("functionCall"), dict)
            ]
            texts = [
                p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought")
            ]
            thoughts = [
                p["text"] for p in parts if isinstance(p.get("text"), str) and p.get("thought")
            ]
            builder.assistant(
                m,
                group=("model", index),
                text="\n".join(texts),
                thinking="\n".join(thoughts),
                calls=calls,
                meta=meta,
            )
            return
        responses = [
            p["functionResponse"] for p in parts if isinstance(p.get("functionResponse"), dict)
        ]
        others = [p for p in parts if "functionResponse" not in p]
        count = len(responses) + (1 if others else 0)
        for n, fr in enumerate(responses):
            call_id = fr.get("id") or self._call_by_name(builder, fr.get("name"))
            record = m if n == 0 else {"same_record_as": "the previous message", "part": n}
            builder.tool_result(
                record,
                str(call_id or ""),
                _response_text(fr.get("response")),
                meta=meta,
                last=n == count - 1,
            )
        if others:
            builder.user(
                m if not responses else {"same_record_as": "the previous message"},
                _parts_text(others),
                meta=meta,
            )

    def _call_by_name(self, builder: TranscriptBuilder, name: Any) -> str | None:
        """Old API histories answer calls by name only: the oldest open call of that name."""
        return builder.open_call_named(name) if isinstance(name, str) else None


def _running(message: dict[str, Any]) -> bool:
    calls = message.get("toolCalls")
    return (
        message.get("type") == "gemini"
        and isinstance(calls, list)
        and any(
            isinstance(c, dict) and "result" not in c and str_field(c, "status") not in _DONE
            for c in calls
        )
    )


_DONE: Final = frozenset({"success", "error", "cancelled"})


def _parts_text(content: Any) -> str:
    """Text of a Gemini ``PartListUnion``: a string, a part, or a list of them."""
    if isinstance(content, list):
        return "\n".join(t for t in (_parts_text(p) for p in content) if t)
    if isinstance(content, dict):
        if isinstance(content.get("text"), str):
            return str(content["text"])
        if isinstance(content.get("functionResponse"), dict):
            return _response_text(content["functionResponse"].get("response"))
        return ""
    return text_of(content)


def _response_text(response: Any) -> str:
    if isinstance(response, dict):
        for key in ("output", "error", "content"):
            if key in response:
                return text_of(response[key])
    return text_of(response) if not isinstance(response, dict) else json.dumps(response)


def _tool_output(c: dict[str, Any]) -> str:
    result = c.get("result")
    text = _parts_text(result) if result is not None else ""
    if not text and isinstance(c.get("resultDisplay"), str):
        text = c["resultDisplay"]
    if c.get("error") and not text:
        text = text_of(c["error"])
    return text


def sources(path: Path) -> list[GeminiSource]:
    """The file's session; none while it holds no message yet (a chat just opened, or
    one whose messages a snapshot emptied), as a Claude Code file of snapshots only."""
    source = GeminiSource(path)
    return [source] if source.has_messages else []
