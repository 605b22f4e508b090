"""Turns a source's records, fed one at a time in transcript order, into ags
messages in the common shape (agent/messages.py), the same way for every tool.

What the builder guarantees, so that ``ags chat --resume`` can send the result
to any OpenAI-style server:

* parts of one assistant turn (text, thinking, tool calls) that arrive as
  several records are joined into one assistant message;
* every tool call is answered before the next user or assistant message: a
  call the source never answered gets a result saying so (marked
  ``"synthesized": true``); calls still open at the end of the source are
  left open, since the source agent may be running them now (ags's own
  resume answers them "outcome unknown");
* a tool result whose call is not in the transcript (it was compacted away, or
  the file starts mid-turn) becomes a user message, since a server refuses a
  tool message that answers nothing.

Every message keeps the source records it was made from, verbatim, under
``source``; records that make no message of their own (metadata, progress,
abandoned branches) ride along with the next message under ``source.extra``.
A message that closes the source up to a record boundary carries
``source.through`` (records consumed) and ``source.digest`` (the running
digest after them): the places a re-import may fork from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .records import Item


@dataclass(slots=True)
class _Assistant:
    group: Any
    texts: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    records: list[Any] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    through: int = 0
    digest: str = ""
    extra: list[Any] = field(default_factory=list)  # records kept before the turn began


class TranscriptBuilder:
    """Collects items; the tool's mapper calls one method per record."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.items: list[Item] = []
        self._pending: _Assistant | None = None
        self._open_calls: dict[str, str] = {}  # call id -> tool name, not yet answered
        self._names: dict[str, str] = {}  # every call id seen -> tool name
        self._extra: list[Any] = []
        self._fed = 0  # records fed so far
        self._digest = ""

    # -- the record clock ---------------------------------------------------------

    def advance(self, digest: str) -> None:
        """One more source record is about to be fed; ``digest`` is the running digest
        after it. Called before the mapper handles the record."""
        self._fed += 1
        self._digest = digest

    def take(self) -> list[Item]:
        out, self.items = self.items, []
        return out

    # -- what mappers call ----------------------------------------------------------

    def extra(self, record: Any) -> None:
        """A record that makes no message: kept with the next message."""
        self._extra.append(record)

    def assistant(
        self,
        record: Any,
        *,
        group: Any = None,
        text: str = "",
        thinking: str = "",
        calls: list[dict[str, Any]] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """A part of an assistant turn; parts with the same ``group`` (not None)
        join one message, and so do consecutive parts with group None."""
        pending = self._pending
        if pending is None or pending.group != group:
            self.close()
            self._settle_open_calls()
            pending = self._pending = _Assistant(group, extra=self._extra)
            self._extra = []
        if text:
            pending.texts.append(text)
        if thinking:
            pending.thinking.append(thinking)
        for call in calls or ():
            pending.calls.append(call)
        pending.records.append(record)
        pending.meta.update(meta or {})
        pending.through, pending.digest = self._fed, self._digest

    def user(
        self,
        record: Any,
        text: str,
        *,
        meta: dict[str, Any] | None = None,
        role: str = "user",
        **extra_keys: Any,
    ) -> None:
        self.close()
        self._settle_open_calls()
        message = {"role": role, "content": text, **extra_keys}
        self._emit(message, [record], meta or {}, boundary=True)

    def tool_result(
        self,
        record: Any,
        call_id: str,
        text: str,
        *,
        meta: dict[str, Any] | None = None,
        error: bool = False,
        last: bool = True,
    ) -> None:
        """The answer to a call; ``last`` False when more messages come from this record."""
        self.close()
        if call_id in self._open_calls:
            name = self._open_calls.pop(call_id)
            message: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": call_id,
                "name": name,
                "content": text,
            }
            if error:
                message["is_error"] = True
        else:
            name = self._names.get(call_id, "")
            self._settle_open_calls()
            message = {"role": "user", "content": _orphan_text(call_id, name, text)}
            message["orphan_tool_result"] = call_id
        self._emit(message, [record], meta or {}, boundary=last)

    def open_call_named(self, name: str) -> str | None:
        """The oldest unanswered call of a tool (for sources that answer by name)."""
        self.close()
        return next((cid for cid, n in self._open_calls.items() if n == name), None)

    def compaction(
        self, records: list[Any], summary: str, *, meta: dict[str, Any] | None = None
    ) -> None:
        self.close()
        self._settle_open_calls()
        # What the model saw from here: the summary; earlier calls cannot be answered any more.
        self._open_calls.clear()
        message = {"role": "user", "content": summary}
        self._emit(message, records, meta or {}, boundary=True, compaction=True)

    def close(self) -> None:
        """Emit the assistant turn being joined, if any."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        message: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(pending.texts)}
        if pending.thinking:
            message["thinking"] = "\n\n".join(pending.thinking)
        if pending.calls:
            message["tool_calls"] = pending.calls
            for call in pending.calls:
                self._open_calls[call["id"]] = call["name"]
                self._names[call["id"]] = call["name"]
        self._emit(
            message,
            pending.records,
            pending.meta,
            at=(pending.through, pending.digest),
            extra=pending.extra,
        )

    # -- internals --------------------------------------------------------------------

    def _settle_open_calls(self) -> None:
        """Answer, before the conversation moves on, the calls the source never answered."""
        for call_id, name in list(self._open_calls.items()):
            message = {
                "role": "tool",
                "tool_call_id": call_id,
                "name": name,
                "content": "(no result was recorded for this call in the source transcript)",
                "synthesized": True,
            }
            self.items.append(Item({**message, "source": {"tool": self.tool, "records": []}}))
        self._open_calls.clear()

    def _emit(
        self,
        message: dict[str, Any],
        records: list[Any],
        meta: dict[str, Any],
        *,
        boundary: bool = False,
        compaction: bool = False,
        at: tuple[int, str] | None = None,
        extra: list[Any] | None = None,
    ) -> None:
        source: dict[str, Any] = {"tool": self.tool, "records": records}
        if extra is None:
            extra, self._extra = self._extra, []
        if extra:
            source["extra"] = extra
        if boundary or at is not None:
            # An assistant turn is emitted when the record after it arrives, so it
            # ends where its own last record ended.
            source["through"], source["digest"] = at or (self._fed, self._digest)
        message["source"] = source
        self.items.append(Item(message, dict(meta), compaction))


def _orphan_text(call_id: str, name: str, text: str) -> str:
    what = f"{name} call {call_id}" if name else f"call {call_id}"
    return f"[result of tool {what}, whose request is not in this transcript]\n{text}"


def call(call_id: Any, name: Any, arguments: Any, fallback_id: str) -> dict[str, Any]:
    """A tool call in the common shape. Unlike a live reply, a call with no id gets a
    deterministic one (``fallback_id``), so that importing twice gives equal messages."""
    import json

    out: dict[str, Any] = {
        "id": call_id if isinstance(call_id, str) and call_id else fallback_id,
        "name": name if isinstance(name, str) else "",
    }
    if isinstance(arguments, dict):
        out["arguments"] = arguments
    elif arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        out["arguments"] = {}
    else:
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            out["arguments"] = parsed
        else:
            out["arguments"] = {}
            out["arguments_raw"] = raw
    if out["id"] == fallback_id:
        out["id_synthesized"] = True
    return out
