"""The client for OpenAI-compatible servers (vLLM, llama.cpp, Ollama's /v1).

``POST /v1/chat/completions`` streamed as server-sent events, with the
fragments of streamed tool calls joined back into whole calls; the quirks of
each server are written down in docs/PROTOCOLS.md.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent.errors import ModelProtocolError
from agent.http_chat import HTTPChatClient, RetryPolicy
from agent.messages import (
    UNREPORTED,
    Message,
    ModelReply,
    Usage,
    assistant_message,
    calls_of,
    normalised_done_reason,
    reported_count,
    token_count,
    tool_call,
    wire_call,
    wire_content,
)

DEFAULT_OPENAI_BASE_URL = "http://localhost:8000"  # vLLM's default port
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


def openai_wire_message(message: Message) -> dict[str, Any]:
    """An internal message as ``/v1/chat/completions`` wants it."""
    role = message.get("role", "")
    # An empty string, not null, next to tool calls: some servers reject null content.
    content = wire_content(message.get("content"), parts=True)
    wire: dict[str, Any] = {"role": role, "content": content}
    calls = calls_of(message) if role == "assistant" else []
    if calls:
        wire["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for call_id, name, args in map(wire_call, calls)
        ]
    elif role == "tool":
        wire["tool_call_id"] = message.get("tool_call_id", "")
    return wire


def sse_events(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(field, payload) per server-sent event; field is ``data`` or ``error``.

    ``error`` is the non-standard field older llama.cpp builds used for
    in-stream errors. Comment lines (``: ping``) are skipped. A bare JSON line
    counts as data, for servers that forget the ``data:`` prefix.
    """
    data: list[str] = []
    errors: list[str] = []
    for line in lines:
        if not line:
            if errors:
                yield "error", "\n".join(errors)
            elif data:
                yield "data", "\n".join(data)
            data, errors = [], []
            continue
        if line.startswith(":"):
            continue
        if line.startswith("{"):
            data.append(line)
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "error":
            errors.append(value)
    if errors:
        yield "error", "\n".join(errors)
    elif data:
        yield "data", "\n".join(data)


class ToolCallAssembler:
    """Builds whole tool calls from streamed fragments.

    Fragments join by ``index``, and by ``id`` where one is given: a new id at
    an index already in use starts a new call (Ollama's /v1 gives every
    parallel call index 0, ollama#15457), and a fragment with no index
    continues the latest call unless it brings a new id or name (Ollama before
    0.4.7 sent no index, ollama#7881).
    """

    def __init__(self) -> None:
        self._calls: list[dict[str, Any]] = []
        self._by_index: dict[int, int] = {}
        self._by_id: dict[str, int] = {}

    def add(self, fragment: Any) -> None:
        if not isinstance(fragment, dict):
            return
        function = fragment.get("function")
        function = function if isinstance(function, dict) else {}
        index, call_id, name = fragment.get("index"), fragment.get("id"), function.get("name")
        call_id = call_id if isinstance(call_id, str) and call_id else None
        slot = self._slot(index if isinstance(index, int) else None, call_id, name)
        call = self._calls[slot]
        if call_id and not call["id"]:
            call["id"] = call_id
            self._by_id.setdefault(call_id, slot)
        if isinstance(name, str) and name and not call["name"]:
            call["name"] = name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call["arguments"].append(arguments)
        elif arguments is not None:  # an object where a string belongs; keep it usable
            call["arguments"].append(json.dumps(arguments))

    def _slot(self, index: int | None, call_id: str | None, name: Any) -> int:
        if index is not None:
            # The index decides; a new id at an index in use is a new call
            # (ollama#15457), and a known id at a new index is one too (a server
            # that repeats ids within a reply).
            if index in self._by_index:
                known = self._calls[self._by_index[index]]
                if not (call_id and known["id"] and known["id"] != call_id):
                    return self._by_index[index]
        elif call_id and call_id in self._by_id:
            return self._by_id[call_id]
        elif self._calls and not call_id and not name:
            return len(self._calls) - 1
        self._calls.append({"id": "", "name": "", "arguments": []})
        slot = len(self._calls) - 1
        if index is not None:
            self._by_index[index] = slot
        return slot

    def calls(self) -> list[dict[str, Any]]:
        return [tool_call(c["id"], c["name"], "".join(c["arguments"])) for c in self._calls]


@dataclass(slots=True)
class _OpenAIStream:
    """What one streamed (or plain) chat completion of the server at ``base_url`` has
    said so far."""

    base_url: str

    content: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    tools: ToolCallAssembler = field(default_factory=ToolCallAssembler)
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    completion_id: str | None = None

    def feed(self, chunk: Mapping[str, Any], on_text: Callable[[str], None] | None) -> None:
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        if isinstance(chunk.get("id"), str):
            self.completion_id = chunk["id"]
        # Usage may come on any chunk: a final choices:[] chunk, llama.cpp's finish chunk.
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = Usage(
                reported_count(usage.get("prompt_tokens")),
                reported_count(usage.get("completion_tokens")),
            )
        elif self.usage is None and isinstance(chunk.get("timings"), dict):
            timings = chunk["timings"]
            prompt = reported_count(timings.get("prompt_n"))
            if prompt is not None:
                prompt += reported_count(timings.get("cache_n")) or 0
            self.usage = Usage(prompt, reported_count(timings.get("predicted_n")))
        choices = chunk.get("choices")
        if choices is not None and not isinstance(choices, list):
            raise ModelProtocolError(self.base_url, "a chunk with choices that are not a list")
        for choice in choices or []:
            if not isinstance(choice, dict) or choice.get("index") not in (0, None):
                continue
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                delta = choice.get("message")  # a non-streamed completion
            if isinstance(delta, dict):
                self._feed_delta(delta, on_text)
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]

    def _feed_delta(self, delta: Mapping[str, Any], on_text: Callable[[str], None] | None) -> None:
        piece = delta.get("content")
        if isinstance(piece, str) and piece:
            self.content.append(piece)
            if on_text is not None:
                on_text(piece)
        for key in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str):
                self.thinking.append(delta[key])
                break
        fragments = delta.get("tool_calls")
        if fragments is not None and not isinstance(fragments, list):
            raise ModelProtocolError(self.base_url, "a chunk with tool_calls that are not a list")
        for fragment in fragments or []:
            self.tools.add(fragment)


class OpenAIClient(HTTPChatClient):
    """An OpenAI-compatible server (vLLM, llama.cpp, Ollama's /v1): SSE chat completions.

    The API key is read from the environment variable ``api_key_env`` at each
    request and sent as a Bearer token; it is never kept on the client, so it
    cannot end up in a session, a log line or a repr. ``params`` are merged into
    every request body (``temperature``, ``max_tokens``, ...).

    Requests stream, and offer tools with ``tool_choice: "auto"`` (some servers,
    llama-cpp-python among them, ignore tools without it). A server that
    answers a stream with no event at all (llama-cpp-python does, for a
    context overflow and for tool calls it cannot stream) is asked again
    once without streaming, which brings its real error or its answer.
    ``stream_tools``: None finds out whether requests with tools can stream
    (after one empty stream that the unstreamed request answered, they are
    no longer streamed), True always streams them, False never does.
    What llama-cpp-python sends is in docs/PROTOCOLS.md section 3.6.
    """

    provider = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        *,
        api_key_env: str = DEFAULT_API_KEY_ENV,
        params: Mapping[str, Any] | None = None,
        stream_tools: bool | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | httpx.Timeout | None = None,
    ) -> None:
        url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_OPENAI_BASE_URL).rstrip("/")
        # Accept both the server root and the /v1 URL people copy from docs.
        url = url.removesuffix("/v1")
        super().__init__(model, url, retry, timeout)
        self.api_key_env = api_key_env
        self.params = dict(params or {})
        self.stream_tools = stream_tools

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "").strip()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _key_env(self) -> str | None:
        return self.api_key_env

    def _not_found_hint(self) -> str:
        return f"see the served names at {self.base_url}/v1/models"

    def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        on_text: Callable[[str], None] | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> ModelReply:
        body: dict[str, Any] = {
            **self.params,
            "model": self.model,
            "messages": [openai_wire_message(m) for m in messages],
        }
        if tools:
            body["tools"] = tools
            body.setdefault("tool_choice", "auto")
        return self._with_retries(lambda: self._chat_once(body, on_text, on_retry), on_retry)

    def _chat_once(
        self,
        body: dict[str, Any],
        on_text: Callable[[str], None] | None,
        on_retry: Callable[[str], None] | None,
    ) -> ModelReply:
        started = time.monotonic()
        if body.get("tools") and self.stream_tools is False:
            return self._unstreamed(body, on_text, started)
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        reply = _OpenAIStream(self.base_url)
        finished = False
        events = lines = 0

        def counted(raw: Iterable[str]) -> Iterator[str]:
            nonlocal lines
            for line in raw:
                lines += 1
                yield line

        with self._stream("/v1/chat/completions", streamed) as response:
            content_type = response.headers.get("content-type", "")
            if "json" in content_type:
                # A server that ignored stream=true answers one chat.completion.
                completion = self._body(response).decode(errors="replace")
                chunk = self._json_object(completion, "the completion")
                self._check_chunk(chunk)
                reply.feed(chunk, on_text)
                finished = True
            else:
                for kind, payload in sse_events(counted(self._lines(response))):
                    events += 1
                    if payload.strip() == "[DONE]":
                        finished = True
                        break
                    chunk = self._json_object(payload, "an SSE event")
                    if kind == "error":
                        raise self._in_band_error(chunk)
                    self._check_chunk(chunk)
                    reply.feed(chunk, on_text)
        if not finished and reply.finish_reason is None:
            if not events and (lines == 0 or "event-stream" in content_type):
                # An empty stream: llama-cpp-python's answer to a prompt over its
                # window and to tool calls it cannot stream. The same request
                # unstreamed gets its real error, or the answer.
                if on_retry is not None:
                    on_retry("the server sent an empty event stream; asking again unstreamed")
                self._reconnect()  # llama-cpp-python closes that connection under the next request
                answer = self._unstreamed(body, on_text, started)
                if body.get("tools") and self.stream_tools is None:
                    self.stream_tools = False  # it answers, so streaming was the trouble
                return answer
            if not events:
                # A complete body with no event in it is not a cut stream: retrying
                # will not help (a web page, a proxy, the wrong provider).
                raise self._protocol_error(
                    f"a 200 reply with no server-sent events in it (Content-Type {content_type!r})"
                )
            raise self._ended_early()
        return self._reply(reply, started, response.headers.get("x-request-id"), True)

    def _unstreamed(
        self, body: Mapping[str, Any], on_text: Callable[[str], None] | None, started: float
    ) -> ModelReply:
        reply = _OpenAIStream(self.base_url)
        completion = self._post_json("/v1/chat/completions", {**body, "stream": False})
        self._check_chunk(completion)
        if not isinstance(completion.get("choices"), list):
            raise self._protocol_error("a chat completion without choices")
        reply.feed(completion, on_text)
        return self._reply(reply, started, None, False)

    def _reply(
        self, reply: _OpenAIStream, started: float, request_id: str | None, streamed: bool
    ) -> ModelReply:
        calls = reply.tools.calls()
        return ModelReply(
            message=assistant_message("".join(reply.content), "".join(reply.thinking), calls),
            usage=reply.usage or UNREPORTED,
            done_reason=normalised_done_reason(reply.finish_reason, bool(calls)),
            model=reply.model or self.model,
            request_id=request_id or reply.completion_id,
            duration=time.monotonic() - started,
            streamed=streamed,
        )

    def _check_chunk(self, chunk: Mapping[str, Any]) -> None:
        """Raise for an in-band error event, in any of the shapes servers use."""
        if chunk.get("choices"):
            return
        if "error" in chunk or "error_message" in chunk or chunk.get("object") == "error":
            raise self._in_band_error(chunk)

    def context_length(self) -> int | None:
        """The context window in tokens, or None if the server does not say.

        vLLM gives ``max_model_len`` in ``/v1/models``. llama.cpp gives the
        runtime window in ``/props`` and the trained one in
        ``/v1/models`` ``meta.n_ctx_train``; the runtime one is what counts.
        """
        listing = self._fetch_json("GET", "/v1/models", optional=True)
        entry: dict[str, Any] = {}
        if isinstance(listing, dict) and isinstance(listing.get("data"), list):
            models = [m for m in listing["data"] if isinstance(m, dict)]
            named = [m for m in models if m.get("id") == self.model]
            # llama.cpp in single-model mode serves whatever name is asked for.
            entry = named[0] if named else models[0] if len(models) == 1 else {}
        served = token_count(entry.get("max_model_len"))
        if served:
            return served
        props = self._fetch_json("GET", "/props", optional=True)
        if isinstance(props, dict):
            settings = props.get("default_generation_settings")
            runtime = token_count(settings.get("n_ctx")) if isinstance(settings, dict) else 0
            if runtime:
                return runtime
        meta = entry.get("meta")
        trained = token_count(meta.get("n_ctx_train")) if isinstance(meta, dict) else 0
        return trained or None
