"""The provider-neutral chat format every model client speaks, and the reply it returns.

The agent loop speaks one message format, the one the session store keeps
(plain JSON, nothing provider-specific; docs/FORMAT.md section 4.1.1 has the
whole shape)::

    {"role": "system" | "user" | "assistant" | "tool", "content": str}

An assistant message may add ``"thinking": str`` and
``"tool_calls": [{"id": str, "name": str, "arguments": {...}}]``. A call whose
arguments were not valid JSON keeps ``"arguments": {}`` plus
``"arguments_raw": <the string as sent>``.

Tool-call ids: the ``id`` ags stores, and sends back to servers, is unique
in the session, whatever the server sent. The server's own id is kept when
it is usable; a call the server gave no id, or an empty one, gets a
``call_<12 hex>`` id and ``"id_synthesized": true``; a call whose id repeats
one the session already has (a server whose counter restarted, a server that
numbers calls per reply) gets a fresh one, and the server's id is kept as
``"server_id"``. "Already has" is checked against the active context and,
for the part compactions took out of it, against ``CallIdFilter``, which a
compaction node carries in its meta.

A tool result is ``{"role": "tool", "tool_call_id": str, "name": str,
"content": str}``. It answers a call of the assistant message it follows:
the results of one batch come right after the assistant message that made
the calls, and ``unanswered_calls`` matches them within that group only, by
id and else by position, never across the context.

Each client turns that into its wire format and turns the reply back with the
builders here, so both providers produce exactly the same shapes. A stored
message may hold another shape (a library caller's, an imported export's):
its content goes to a server as text (``wire_content``; OpenAI text and image
parts stay parts on OpenAI's wire), and its calls as id, name and an object of
arguments (``wire_call``), so no past message makes a server refuse a request.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from objstore import MAX_DEPTH, depth_exceeds, parse_json

Message = dict[str, Any]

ARGUMENTS_DEPTH: Final = MAX_DEPTH - 3
"""Nesting a call's arguments may have: they sit 3 levels inside the stored message
(message, tool_calls, the call), which may nest MAX_DEPTH levels."""

REPLY_DEPTH: Final = MAX_DEPTH + 8
"""Nesting a server's JSON (a reply, a stream event, an error body) may have: a
message with room for the wire format around it. Deeper JSON is refused before
Python's parser can run out of stack."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens the server reports for one reply; None where it did not say.

    A server that sends no counts (llama-cpp-python in a stream, an Ollama
    reply served from its prompt cache) is not the same as one that counts
    zero, and the two are kept apart all the way to ``ags info``.
    """

    prompt_tokens: int | None
    completion_tokens: int | None

    @property
    def reported(self) -> bool:
        return self.prompt_tokens is not None and self.completion_tokens is not None


UNREPORTED = Usage(None, None)


@dataclass(frozen=True, slots=True)
class ModelReply:
    """One assistant turn, already in the internal message format."""

    message: Message
    usage: Usage
    done_reason: str | None
    model: str
    request_id: str | None
    duration: float
    streamed: bool = True


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A tool call in the internal format, from whatever the server sent.

    ``arguments`` may be an object (Ollama), a JSON string (OpenAI style), or
    garbage; garbage (arguments nested deeper than ARGUMENTS_DEPTH included) is
    kept verbatim in ``arguments_raw`` so the transcript shows what the model
    really produced.
    """
    call: dict[str, Any] = {"id": "", "name": name if isinstance(name, str) else ""}
    if isinstance(arguments, dict) and not depth_exceeds(arguments, ARGUMENTS_DEPTH):
        call["arguments"] = arguments
    elif arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        call["arguments"] = {}  # servers send "" for a function without parameters
    else:
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        try:
            parsed = parse_json(raw, ARGUMENTS_DEPTH)
        except ValueError:  # not JSON, or nested too deep to store
            parsed = None
        if isinstance(parsed, dict):
            call["arguments"] = parsed
        else:
            call["arguments"] = {}
            call["arguments_raw"] = raw
    if isinstance(call_id, str) and call_id:
        call["id"] = call_id
    else:
        call["id"] = new_call_id()
        call["id_synthesized"] = True
    return call


def calls_of(message: Any) -> list[dict[str, Any]]:
    """The tool calls of a message that are objects: none if its ``tool_calls`` is not
    a list. A stored message can hold any JSON (an import, a library caller), and
    whatever reads one must not fail on it."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def wire_content(content: Any, *, parts: bool = False) -> Any:
    """A stored message's content as a model server takes it (PROTOCOLS.md): a string,
    or with ``parts`` (OpenAI's wire) a list of text and image parts as stored. Any
    other shape a library caller or an import stored (Anthropic blocks, an object, a
    number) goes as its text, or as its JSON where it holds none: sent as it is, the
    server refused the whole request (Ollama: "cannot unmarshal array")."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if parts and isinstance(content, list) and content and all(map(_is_wire_part, content)):
        return content
    from objstore import content_text  # here: it loads search (sqlite3), seldom needed

    text = content_text(content)
    if text or content == [] or content == {}:
        return text
    return json.dumps(content, ensure_ascii=False)


def _is_wire_part(part: Any) -> bool:
    """A content part OpenAI's wire takes: ``text`` with its text, or ``image_url``."""
    if not isinstance(part, dict):
        return False
    if part.get("type") == "text":
        return isinstance(part.get("text"), str)
    return part.get("type") == "image_url" and isinstance(part.get("image_url"), dict)


def call_function(call: dict[str, Any]) -> dict[str, Any]:
    """The object holding a stored call's name and arguments: the call itself in ags's
    shape, its ``function`` in OpenAI's."""
    fn = call.get("function")
    return fn if isinstance(fn, dict) else call


def wire_call(call: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(id, name, arguments) of a stored tool call as a server takes them back: in ags's
    shape or OpenAI's (``function``, arguments as JSON text), the arguments an object
    (never ``arguments_raw``: vLLM parses the arguments of past calls and fails the
    whole request on bad JSON)."""
    fn = call_function(call)
    call_id, name, arguments = call.get("id"), fn.get("name"), fn.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = parse_json(arguments, ARGUMENTS_DEPTH)
        except ValueError:
            arguments = None
    return (
        call_id if isinstance(call_id, str) else "",
        name if isinstance(name, str) else "",
        arguments if isinstance(arguments, dict) else {},
    )


def new_call_id() -> str:
    """A tool-call id of ags's own: ``call_`` and 48 random bits in hex."""
    return "call_" + secrets.token_hex(6)


def context_call_ids(messages: Iterable[Any]) -> set[str]:
    """Every tool-call id the messages use, in calls and in results."""
    taken: set[str] = set()
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
            taken.add(message["tool_call_id"])
        for call in calls_of(message):
            if isinstance(call.get("id"), str):
                taken.add(call["id"])
    return taken


class CallIdFilter:
    """The tool-call ids a session's compactions took out of its context.

    A Bloom filter of BITS bits: fixed in size however long the session, so a
    compaction node carries it in its meta and reading it costs one node. It
    never says "absent" for an id it holds; for an id it does not hold it
    says "present" now and then (about 2% at 500 ids, 15% at 1,000), which
    only costs that call a fresh id of ags's own, the server's kept as
    ``server_id``.
    """

    BITS = 4096
    HASHES = 4

    def __init__(self, bits: int = 0) -> None:
        self.bits = bits

    @classmethod
    def from_hex(cls, text: Any) -> CallIdFilter:
        """The filter a compaction stored (an empty one for anything else)."""
        if isinstance(text, str) and len(text) == cls.BITS // 4:
            try:
                return cls(int(text, 16))
            except ValueError:
                pass
        return cls()

    def hex(self) -> str:
        return f"{self.bits:0{self.BITS // 4}x}"

    def _positions(self, call_id: str) -> list[int]:
        digest = hashlib.blake2b(call_id.encode(), digest_size=4 * self.HASHES).digest()
        return [
            int.from_bytes(digest[4 * i : 4 * i + 4], "big") % self.BITS for i in range(self.HASHES)
        ]

    def add(self, call_id: str) -> None:
        for position in self._positions(call_id):
            self.bits |= 1 << position

    def __contains__(self, call_id: object) -> bool:
        if not isinstance(call_id, str):
            return False
        return all(self.bits >> position & 1 for position in self._positions(call_id))


def with_unique_call_ids(
    message: Message, taken: set[str], compacted: Container[str] = ()
) -> Message:
    """``message`` with every call id unique against ``taken`` and ``compacted``
    (and each other).

    A call whose id is already taken gets a fresh one, and the server's id is
    kept as ``server_id``; ``taken`` grows by the ids given out.
    """
    calls = calls_of(message)
    if not calls:
        return message
    unique: list[dict[str, Any]] = []
    for call in calls:
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id or call_id in taken or call_id in compacted:
            fresh = new_call_id()
            while fresh in taken or fresh in compacted:
                fresh = new_call_id()
            call = {**call, "id": fresh}
            if isinstance(call_id, str) and call_id and not call.get("id_synthesized"):
                call["server_id"] = call_id
            else:
                call["id_synthesized"] = True
        taken.add(call["id"])
        unique.append(call)
    return {**message, "tool_calls": unique}


def unanswered_calls(messages: Sequence[Any]) -> list[tuple[int, dict[str, Any]]]:
    """The tool calls no result answers, each with the index of the last message
    of its group (the assistant message that made it, or the last result after it).

    A result answers a call of the assistant message it follows, never one
    elsewhere in the context: ids can repeat between turns (servers restart
    their counters), so matching across the context would take one turn's
    result for another turn's call. Within the group a result takes the first
    open call with its id, else the first open call.
    """
    missing: list[tuple[int, dict[str, Any]]] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        open_calls = calls_of(message)
        if not open_calls or message.get("role") != "assistant":
            i += 1
            continue
        last = i
        while last + 1 < len(messages) and _is_result(messages[last + 1]):
            last += 1
            result_id = messages[last].get("tool_call_id")
            match = next((c for c in open_calls if c.get("id") == result_id), None)
            if match is None and open_calls:
                match = open_calls[0]
            if match is not None:
                open_calls.remove(match)
        missing += [(last, c) for c in open_calls]
        i = last + 1
    return missing


def _is_result(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "tool"


def assistant_message(content: str, thinking: str, tool_calls: list[dict[str, Any]]) -> Message:
    """The internal assistant message; optional keys only when they carry something."""
    message: Message = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def normalised_done_reason(reason: Any, has_tool_calls: bool) -> str | None:
    """One vocabulary for Ollama's ``done_reason`` and OpenAI's ``finish_reason``.

    Ollama never says ``tool_calls`` and some OpenAI-style servers say ``stop``
    next to tool calls, so a turn that ends in calls reads ``tool_calls``.
    """
    if not isinstance(reason, str) or not reason:
        return None
    if reason == "function_call" or (reason == "stop" and has_tool_calls):
        return "tool_calls"
    return reason


def token_count(value: Any) -> int:
    """A count the server reported (tokens, a context window); 0 unless a positive int."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def reported_count(value: Any) -> int | None:
    """A usage count as the server reported it: an int >= 0, or None if it sent none."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
