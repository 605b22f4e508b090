"""The client for Ollama's native API: ``POST /api/chat`` streamed as NDJSON.

Also where ``OLLAMA_HOST`` is read the way ollama reads it, and where the
context window is found among the several figures Ollama reports.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from agent.http_chat import HTTPChatClient, RetryPolicy
from agent.messages import (
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

DEFAULT_OLLAMA_MODEL = "gemma4"
OLLAMA_PORT = 11434


def ollama_host_url(value: str | None) -> str:
    """The base URL for an ``OLLAMA_HOST`` value, parsed the way ollama parses it.

    Accepts ``host``, ``host:port``, ``:port``, ``[::1]:port`` and full URLs.
    Without a scheme the port defaults to 11434; with ``http://`` or
    ``https://`` it defaults to that scheme's port, as in ollama's
    ``envconfig.Host``. A wildcard listen address (``0.0.0.0``, ``::``) is
    where a server listens, not where a client can connect, so it becomes the
    loopback address.
    """
    text = (value or "").strip().strip("\"'")
    default = f"http://127.0.0.1:{OLLAMA_PORT}"
    if not text:
        return default
    scheme, sep, rest = text.partition("://")
    port = str(OLLAMA_PORT)
    if not sep:
        scheme, rest = "http", text
    elif scheme == "http":
        port = "80"
    elif scheme == "https":
        port = "443"
    hostport, _, path = rest.partition("/")
    host = hostport
    bracketed = re.fullmatch(r"\[([^\]]*)\](?::(.*))?", hostport)
    if bracketed:
        host, port = bracketed.group(1), bracketed.group(2) or port
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    if not (port.isascii() and port.isdigit() and len(port) <= 5) or int(port) > 65535:
        return default
    if host in {"", "0.0.0.0", "::"}:
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    url = f"{scheme}://{host}:{port}"
    return f"{url}/{path}".rstrip("/") if path else url


def _same_ollama_model(a: Any, b: str) -> bool:
    """Names are equal up to the implicit ``:latest`` tag."""
    if not isinstance(a, str):
        return False

    def tagged(name: str) -> str:
        return name if ":" in name.rsplit("/", 1)[-1] else name + ":latest"

    return tagged(a) == tagged(b)


def ollama_wire_message(message: Message) -> dict[str, Any]:
    """An internal message as Ollama's ``/api/chat`` wants it."""
    role = message.get("role", "")
    wire: dict[str, Any] = {"role": role, "content": wire_content(message.get("content"))}
    if role == "assistant":
        if message.get("thinking"):
            wire["thinking"] = wire_content(message["thinking"])
        if calls := calls_of(message):
            wire["tool_calls"] = [
                {"id": call_id, "function": {"name": name, "arguments": arguments}}
                for call_id, name, arguments in map(wire_call, calls)
            ]
    elif role == "tool":
        wire["tool_name"] = message.get("name", "")
        if message.get("tool_call_id"):
            wire["tool_call_id"] = message["tool_call_id"]
    return wire


class OllamaClient(HTTPChatClient):
    """Ollama's native API: ``POST /api/chat``, streamed as NDJSON.

    ``options`` goes into every request as Ollama's ``options`` (``num_ctx``,
    ``temperature``, ``num_predict``, ...); ``think`` is sent when not None.
    ``stream_tools=False`` sends requests that offer tools unstreamed (Ollama
    streams whole calls, so the default, None, streams them).
    """

    provider = "ollama"

    def __init__(
        self,
        model: str = DEFAULT_OLLAMA_MODEL,
        base_url: str | None = None,
        *,
        options: Mapping[str, Any] | None = None,
        think: bool | str | None = None,
        stream_tools: bool | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | httpx.Timeout | None = None,
    ) -> None:
        url = base_url or ollama_host_url(os.environ.get("OLLAMA_HOST"))
        super().__init__(model, url, retry, timeout)
        self.options = dict(options or {})
        self.think = think
        self.stream_tools = stream_tools

    def _not_found_hint(self) -> str:
        return f"pull it with `ollama pull {self.model}`"

    def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        on_text: Callable[[str], None] | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> ModelReply:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [ollama_wire_message(m) for m in messages],
            "stream": not (tools and self.stream_tools is False),
        }
        if tools:
            body["tools"] = tools
        if self.options:
            body["options"] = self.options
        if self.think is not None:
            body["think"] = self.think
        return self._with_retries(lambda: self._chat_once(body, on_text), on_retry)

    def _chat_once(
        self, body: Mapping[str, Any], on_text: Callable[[str], None] | None
    ) -> ModelReply:
        started = time.monotonic()
        content: list[str] = []
        thinking: list[str] = []
        calls: list[dict[str, Any]] = []
        final: dict[str, Any] | None = None
        # Unstreamed, the answer is one JSON object on one line: the same reader serves.
        with self._stream("/api/chat", body) as response:
            for line in self._lines(response):
                if not line.strip():
                    continue
                chunk = self._json_object(line, "a line of the /api/chat stream")
                if "error" in chunk:
                    raise self._in_band_error(chunk)
                message = chunk.get("message")
                if isinstance(message, dict):
                    piece = message.get("content")
                    if isinstance(piece, str) and piece:
                        content.append(piece)
                        if on_text is not None:
                            on_text(piece)
                    if isinstance(message.get("thinking"), str):
                        thinking.append(message["thinking"])
                    # Whole calls arrive on done:false lines and are not repeated at the end.
                    listed = message.get("tool_calls")
                    if listed is not None and not isinstance(listed, list):
                        raise self._protocol_error(f"tool_calls not in a list: {line[:120]!r}")
                    for call in listed or []:
                        if not isinstance(call, dict):
                            continue  # as the OpenAI wire's fragments: what is no call is none
                        function = call.get("function")
                        function = function if isinstance(function, dict) else {}
                        calls.append(
                            tool_call(
                                call.get("id"), function.get("name"), function.get("arguments")
                            )
                        )
                if chunk.get("done") is True:
                    final = chunk
        if final is None:
            raise self._ended_early()
        model = final.get("model")
        return ModelReply(
            message=assistant_message("".join(content), "".join(thinking), calls),
            # Both counts are omitempty: a missing one is unknown, not zero.
            usage=Usage(
                reported_count(final.get("prompt_eval_count")),
                reported_count(final.get("eval_count")),
            ),
            done_reason=normalised_done_reason(final.get("done_reason"), bool(calls)),
            model=model if isinstance(model, str) and model else self.model,
            request_id=response.headers.get("x-request-id"),
            duration=time.monotonic() - started,
            streamed=bool(body["stream"]),
        )

    def context_length(self) -> int | None:
        """The context window in tokens, the best figure the server gives.

        In order: ``num_ctx`` from this client's options (what the runner
        will allocate); the window of the loaded model (``/api/ps``); a
        ``num_ctx`` set in the Modelfile; the trained maximum from
        ``/api/show`` model_info ``<arch>.context_length``. The trained
        maximum can be far above what a runner allocates by default, and
        Ollama trims an over-long chat silently, so the earlier figures win.
        """
        num_ctx = token_count(self.options.get("num_ctx"))
        if num_ctx:
            return num_ctx
        running = self._fetch_json("GET", "/api/ps", optional=True)
        if isinstance(running, dict):
            models = running.get("models")
            for entry in models if isinstance(models, list) else []:
                if isinstance(entry, dict) and (
                    _same_ollama_model(entry.get("name"), self.model)
                    or _same_ollama_model(entry.get("model"), self.model)
                ):
                    loaded = token_count(entry.get("context_length"))
                    if loaded:
                        return loaded
        shown = self._fetch_json("POST", "/api/show", {"model": self.model})
        if not isinstance(shown, dict):
            raise self._protocol_error("/api/show did not answer a JSON object")
        parameters = shown.get("parameters")
        if isinstance(parameters, str):  # "key value" per line
            found = re.search(r"(?m)^\s*num_ctx\s+(\d+)\s*$", parameters)
            if found:
                return int(found.group(1))
        info = shown.get("model_info")
        if isinstance(info, dict):
            arch = info.get("general.architecture")
            trained = token_count(info.get(f"{arch}.context_length"))
            return trained or None
        return None
