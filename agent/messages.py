"""The provider-neutral chat format every model client speaks, and the reply it returns.

The agent loop speaks one message format, the one the session store keeps
(plain JSON, nothing provider-specific)::

    {"role": "system" | "user" | "assistant" | "tool", "content": str}

An assistant message may add ``"thinking": str`` and
``"tool_calls": [{"id": str, "name": str, "arguments": {...}}]``. A call whose
arguments were not valid JSON keeps ``"arguments": {}`` plus
``"arguments_raw": <the string as sent>``; a call the server gave no id gets a
``call_<12 hex>`` id and ``"id_synthesized": true``. A tool result is
``{"role": "tool", "tool_call_id": str, "name": str, "content": str}``.

Each client turns that into its wire format and turns the reply back with the
builders here, so both providers produce exactly the same shapes.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Final

from objstore.limits import MAX_DEPTH, depth_exceeds, parse_json

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
    """Tokens the server reports for one reply; 0 where it did not say."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class ModelReply:
    """One assistant turn, already in the internal message format."""

    message: Message
    usage: Usage
    done_reason: str | None
    model: str
    request_id: str | None
    duration: float


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
        call["id"] = "call_" + secrets.token_hex(6)
        call["id_synthesized"] = True
    return call


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
