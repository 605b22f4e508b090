"""Model clients: one chat turn against Ollama's native API or an OpenAI-compatible server.

The agent loop speaks one provider-neutral message format, the one the session
store keeps (plain JSON, nothing provider-specific)::

    {"role": "system" | "user" | "assistant" | "tool", "content": str}

An assistant message may add ``"thinking": str`` and
``"tool_calls": [{"id": str, "name": str, "arguments": {...}}]``. A call whose
arguments were not valid JSON keeps ``"arguments": {}`` plus
``"arguments_raw": <the string as sent>``; a call the server gave no id gets a
``call_<12 hex>`` id and ``"id_synthesized": true``. A tool result is
``{"role": "tool", "tool_call_id": str, "name": str, "content": str}``.

Each client turns that into its wire format, streams the reply, and turns the
reply back. Transient failures (connection errors, timeouts, a stream cut
short, HTTP 429 and 5xx) are retried with exponential backoff; every retry is
reported through ``on_retry`` and starts the request over, discarding the
partial reply, so nothing is ever merged twice. Everything else becomes one of
the errors in ``agent.errors``. The wire formats, quirks included, are written
down in PROTOCOLS.md.
"""

from __future__ import annotations

import email.utils
import functools
import json
import os
import re
import secrets
import ssl
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, Self, TypeVar

import httpx

from agent.errors import (
    AuthFailed,
    ContextTooLong,
    ModelConfigError,
    ModelNotFound,
    ModelProtocolError,
    ModelRequestFailed,
    ModelUnavailable,
    one_line,
)

DEFAULT_OLLAMA_MODEL = "gemma4"
OLLAMA_PORT = 11434
DEFAULT_OPENAI_BASE_URL = "http://localhost:8000"  # vLLM's default port
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"

# Reads wait long: a server may load a model from disk before the first byte.
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=10.0)

Message = dict[str, Any]
T = TypeVar("T")


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


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently transient failures are retried.

    ``attempts`` counts the first try. The n-th retry waits
    ``base_delay * 2**(n-1)`` seconds, at most ``max_delay``, unless the
    server sent Retry-After, which is honoured up to ``max_retry_after``.
    """

    attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 30.0

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        return float(min(self.base_delay * 2 ** (retry - 1), self.max_delay))


class ModelClient(Protocol):
    """What the agent loop needs from a model server."""

    model: str
    base_url: str

    def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        on_text: Callable[[str], None] | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> ModelReply: ...

    def context_length(self) -> int | None: ...

    def close(self) -> None: ...


class _Retry(Exception):
    """One attempt failed in a way that another attempt may not."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


# --- messages ---------------------------------------------------------------


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A tool call in the internal format, from whatever the server sent.

    ``arguments`` may be an object (Ollama), a JSON string (OpenAI style), or
    garbage; garbage is kept verbatim in ``arguments_raw`` so the transcript
    shows what the model really produced.
    """
    call: dict[str, Any] = {"id": "", "name": name if isinstance(name, str) else ""}
    if isinstance(arguments, dict):
        call["arguments"] = arguments
    elif arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        call["arguments"] = {}  # servers send "" for a function without parameters
    else:
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        try:
            parsed = json.loads(raw)
        except ValueError:
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


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# --- errors from servers -----------------------------------------------------

_CONTEXT_TEXT = re.compile(
    r"context length|context size|context window|maximum context|context_length_exceeded"
    r"|exceed_context_size",
    re.IGNORECASE,
)
_RETRIED_STATUS = {408, 425, 429}


@dataclass(frozen=True, slots=True)
class _ServerError:
    """An error as a server reported it, whichever of the body shapes it used."""

    status: int | None
    message: str
    type: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    retry_after: float | None = None


def _server_error(status: int | None, payload: Any, retry_after: float | None) -> _ServerError:
    """Read the error body shapes listed in PROTOCOLS.md (section 4, item 7) into one form."""
    if isinstance(payload, dict):
        inner = payload.get("error")
        if isinstance(inner, str):  # Ollama native
            return _ServerError(status, inner, None, payload, retry_after)
        if isinstance(inner, dict):  # OpenAI, newer vLLM, llama.cpp
            code = inner.get("code")
            in_band = code if status is None and isinstance(code, int) else status
            message = str(inner.get("message") or inner.get("type") or inner)
            etype = inner.get("type") or (code if isinstance(code, str) else None)
            return _ServerError(in_band, message, etype, inner, retry_after)
        if "message" in payload:  # older vLLM (object: error), some llama.cpp 500s
            etype = payload.get("type")
            return _ServerError(status, str(payload["message"]), etype, payload, retry_after)
        if "error_message" in payload:  # some vLLM-backed providers
            etype = payload.get("error_type")
            return _ServerError(status, str(payload["error_message"]), etype, payload, retry_after)
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return _ServerError(status, text or "(empty body)", None, {}, retry_after)


def _int_in(pattern: str, text: str) -> int | None:
    found = re.search(pattern, text, re.IGNORECASE)
    return int(found.group(1)) if found else None


def _context_counts(error: _ServerError) -> tuple[int | None, int | None]:
    """(prompt tokens, window) from llama.cpp's fields or vLLM's/llama.cpp's wording."""
    prompt = _count(error.fields.get("n_prompt_tokens")) or None
    window = _count(error.fields.get("n_ctx")) or None
    text = error.message
    window = window or _int_in(r"maximum context length is (\d+)", text)
    window = window or _int_in(r"available context size \((\d+)", text)
    prompt = (
        prompt
        or _int_in(r"\((\d+) in the messages", text)
        or _int_in(r"prompt contains at least (\d+) input tokens", text)
        or _int_in(r"request \((\d+) tokens\)", text)
    )
    return prompt, window


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds; it may be a number or an HTTP date."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


# --- the shared client machinery --------------------------------------------


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS setup, built once: loading the CA bundle costs ~40 ms a client."""
    return httpx.create_ssl_context()


class _HTTPChatClient:
    """What both providers share: the HTTP client, retries, and error mapping."""

    provider = ""

    def __init__(
        self,
        model: str,
        base_url: str,
        retry: RetryPolicy | None,
        timeout: float | httpx.Timeout | None,
    ) -> None:
        if not model:
            raise ModelConfigError(f"no model name given for the {self.provider} provider")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._http = httpx.Client(
            timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
            headers={"User-Agent": "ags"},
            verify=_tls_context(),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"

    # Hooks the providers fill in.

    def _headers(self) -> dict[str, str]:
        return {}

    def _not_found_hint(self) -> str:
        raise NotImplementedError

    def _key_env(self) -> str | None:
        return None

    # Retries.

    def _with_retries(self, attempt: Callable[[], T], on_retry: Callable[[str], None] | None) -> T:
        last = ""
        for number in range(1, self.retry.attempts + 1):
            try:
                return attempt()
            except _Retry as failure:
                last = failure.reason
                if number == self.retry.attempts:
                    break
                wait = self.retry.delay(number, failure.retry_after)
                if on_retry is not None:
                    on_retry(
                        f"{failure.reason}; attempt {number + 1} of {self.retry.attempts} "
                        f"in {wait:.2f}s"
                    )
                time.sleep(wait)
        raise ModelUnavailable(self.base_url, self.retry.attempts, last)

    @contextmanager
    def _transport_errors(self) -> Iterator[None]:
        """Turn httpx's failures into a retry or a configuration error.

        Wraps the whole read of a stream, so a connection dropped mid-reply
        is a retry like a connection refused up front.
        """
        try:
            yield
        except httpx.TimeoutException as exc:
            raise _Retry(f"timed out ({type(exc).__name__})") from exc
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            raise _Retry(f"connection failed: {one_line(str(exc), 120)}") from exc
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise ModelConfigError(f"unusable model server URL {self.base_url!r}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise ModelUnavailable(self.base_url, 1, one_line(str(exc))) from exc

    @contextmanager
    def _stream(self, path: str, body: Mapping[str, Any]) -> Iterator[httpx.Response]:
        """POST ``body`` and yield the successful response for streaming."""
        with (
            self._transport_errors(),
            self._http.stream(
                "POST", self.base_url + path, json=body, headers=self._headers()
            ) as response,
        ):
            if not response.is_success:
                response.read()
                raise self._http_error(response)
            yield response

    def _fetch_json(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, optional: bool = False
    ) -> Any:
        """The JSON answer of a small request, retried like a chat.

        ``optional``: a 4xx other than an auth failure means "this server does
        not have that endpoint" and gives None.
        """

        def attempt() -> Any:
            with self._transport_errors():
                response = self._http.request(
                    method, self.base_url + path, json=body, headers=self._headers()
                )
            if (
                optional
                and 400 <= response.status_code < 500
                and response.status_code
                not in {
                    401,
                    403,
                    *_RETRIED_STATUS,
                }
            ):
                return None
            if not response.is_success:
                raise self._http_error(response)
            try:
                return response.json()
            except ValueError as exc:
                if optional:
                    return None
                raise ModelProtocolError(self.base_url, f"{path} did not answer JSON") from exc

        return self._with_retries(attempt, None)

    # Errors.

    def _http_error(self, response: httpx.Response) -> Exception:
        try:
            payload: Any = response.json()
        except ValueError:
            payload = response.text
        error = _server_error(
            response.status_code, payload, _retry_after(response.headers.get("Retry-After"))
        )
        return self._classify(error)

    def _in_band_error(self, payload: Any) -> Exception:
        """An error sent inside a 200 stream; its code, if any, stands in for the status."""
        return self._classify(_server_error(None, payload, None))

    def _classify(self, error: _ServerError) -> Exception:
        """The exception for an error: a ModelError to raise, or a _Retry."""
        status, message = error.status, error.message
        if _CONTEXT_TEXT.search(f"{message} {error.type or ''}"):
            prompt, window = _context_counts(error)
            return ContextTooLong(self.base_url, message, prompt, window)
        if status in {401, 403}:
            return AuthFailed(self.base_url, status, message, self._key_env())
        if status == 404:
            if "model" in message.lower():
                return ModelNotFound(self.model, self.base_url, self._not_found_hint())
            return ModelRequestFailed(
                self.base_url, 404, f"{message} (is the base URL and provider right?)"
            )
        shown = f"HTTP {status}: {one_line(message, 160)}" if status else one_line(message, 160)
        # An in-band error without a code is most often a crashed or evicted
        # runner, which a fresh request can get past.
        if status is None or status >= 500 or status in _RETRIED_STATUS:
            return _Retry(shown, error.retry_after)
        return ModelRequestFailed(self.base_url, status, message)

    def _ended_early(self) -> _Retry:
        return _Retry("the stream ended before the reply was complete")

    def _protocol_error(self, detail: str) -> ModelProtocolError:
        return ModelProtocolError(self.base_url, detail)

    def _json_object(self, text: str, what: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except ValueError:
            raise self._protocol_error(f"{what} is not JSON: {text[:120]!r}") from None
        if not isinstance(value, dict):
            raise self._protocol_error(f"{what} is not a JSON object: {text[:120]!r}")
        return value


# --- Ollama native -----------------------------------------------------------


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
    if not port.isdigit() or int(port) > 65535:
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
    wire: dict[str, Any] = {"role": role, "content": message.get("content") or ""}
    if role == "assistant":
        if message.get("thinking"):
            wire["thinking"] = message["thinking"]
        if message.get("tool_calls"):
            wire["tool_calls"] = [
                {
                    "id": call.get("id", ""),
                    "function": {
                        "name": call.get("name", ""),
                        "arguments": call.get("arguments", {}),
                    },
                }
                for call in message["tool_calls"]
            ]
    elif role == "tool":
        wire["tool_name"] = message.get("name", "")
        if message.get("tool_call_id"):
            wire["tool_call_id"] = message["tool_call_id"]
    return wire


class OllamaClient(_HTTPChatClient):
    """Ollama's native API: ``POST /api/chat``, streamed as NDJSON.

    ``options`` goes into every request as Ollama's ``options`` (``num_ctx``,
    ``temperature``, ...); ``think`` is sent when not None.
    """

    provider = "ollama"

    def __init__(
        self,
        model: str = DEFAULT_OLLAMA_MODEL,
        base_url: str | None = None,
        *,
        options: Mapping[str, Any] | None = None,
        think: bool | str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | httpx.Timeout | None = None,
    ) -> None:
        url = base_url or ollama_host_url(os.environ.get("OLLAMA_HOST"))
        super().__init__(model, url, retry, timeout)
        self.options = dict(options or {})
        self.think = think

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
            "stream": True,
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
        with self._stream("/api/chat", body) as response:
            for line in response.iter_lines():
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
                    for call in message.get("tool_calls") or []:
                        function = call.get("function", {}) if isinstance(call, dict) else {}
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
            usage=Usage(_count(final.get("prompt_eval_count")), _count(final.get("eval_count"))),
            done_reason=normalised_done_reason(final.get("done_reason"), bool(calls)),
            model=model if isinstance(model, str) and model else self.model,
            request_id=response.headers.get("x-request-id"),
            duration=time.monotonic() - started,
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
        num_ctx = _count(self.options.get("num_ctx"))
        if num_ctx:
            return num_ctx
        running = self._fetch_json("GET", "/api/ps", optional=True)
        if isinstance(running, dict):
            for entry in running.get("models") or []:
                if isinstance(entry, dict) and (
                    _same_ollama_model(entry.get("name"), self.model)
                    or _same_ollama_model(entry.get("model"), self.model)
                ):
                    loaded = _count(entry.get("context_length"))
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
            trained = _count(info.get(f"{arch}.context_length"))
            return trained or None
        return None


# --- OpenAI-compatible -------------------------------------------------------


def openai_wire_message(message: Message) -> dict[str, Any]:
    """An internal message as ``/v1/chat/completions`` wants it."""
    role = message.get("role", "")
    # An empty string, not null, next to tool calls: some servers reject null content.
    wire: dict[str, Any] = {"role": role, "content": message.get("content") or ""}
    if role == "assistant" and message.get("tool_calls"):
        wire["tool_calls"] = [
            {
                "id": call.get("id", ""),
                "type": "function",
                "function": {
                    "name": call.get("name", ""),
                    # The parsed form, never arguments_raw: vLLM json-decodes the
                    # arguments of past calls and fails the whole request on bad JSON.
                    "arguments": json.dumps(call.get("arguments", {}), ensure_ascii=False),
                },
            }
            for call in message["tool_calls"]
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
            self._by_id[call_id] = slot
        if isinstance(name, str) and name and not call["name"]:
            call["name"] = name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call["arguments"].append(arguments)
        elif arguments is not None:  # an object where a string belongs; keep it usable
            call["arguments"].append(json.dumps(arguments))

    def _slot(self, index: int | None, call_id: str | None, name: Any) -> int:
        if call_id and call_id in self._by_id:
            return self._by_id[call_id]
        if index is not None and index in self._by_index:
            known = self._calls[self._by_index[index]]
            if not (call_id and known["id"] and known["id"] != call_id):
                return self._by_index[index]
        elif index is None and self._calls and not call_id and not name:
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
    """What one streamed (or plain) chat completion has said so far."""

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
                _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
            )
        elif self.usage is None and isinstance(chunk.get("timings"), dict):
            timings = chunk["timings"]
            prompt = _count(timings.get("prompt_n")) + _count(timings.get("cache_n"))
            self.usage = Usage(prompt, _count(timings.get("predicted_n")))
        for choice in chunk.get("choices") or []:
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
        for fragment in delta.get("tool_calls") or []:
            self.tools.add(fragment)


class OpenAIClient(_HTTPChatClient):
    """An OpenAI-compatible server (vLLM, llama.cpp, Ollama's /v1): SSE chat completions.

    The API key is read from the environment variable ``api_key_env`` at each
    request and sent as a Bearer token; it is never kept on the client, so it
    cannot end up in a session, a log line or a repr. ``params`` are merged into
    every request body (``temperature``, ``max_tokens``, ...).
    """

    provider = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        *,
        api_key_env: str = DEFAULT_API_KEY_ENV,
        params: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | httpx.Timeout | None = None,
    ) -> None:
        url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_OPENAI_BASE_URL).rstrip("/")
        # Accept both the server root and the /v1 URL people copy from docs.
        url = url.removesuffix("/v1")
        super().__init__(model, url, retry, timeout)
        self.api_key_env = api_key_env
        self.params = dict(params or {})

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
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = tools
        return self._with_retries(lambda: self._chat_once(body, on_text), on_retry)

    def _chat_once(
        self, body: Mapping[str, Any], on_text: Callable[[str], None] | None
    ) -> ModelReply:
        started = time.monotonic()
        reply = _OpenAIStream()
        finished = False
        events = 0
        with self._stream("/v1/chat/completions", body) as response:
            if "json" in response.headers.get("content-type", ""):
                # A server that ignored stream=true answers one chat.completion.
                chunk = self._json_object(response.read().decode(), "the completion")
                self._check_chunk(chunk)
                reply.feed(chunk, on_text)
                finished = True
            else:
                for kind, payload in sse_events(response.iter_lines()):
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
            if not events:
                # A complete body with no event in it is not a cut stream: retrying
                # will not help (a web page, a proxy, the wrong provider).
                raise self._protocol_error(
                    f"a 200 reply with no server-sent events in it "
                    f"(Content-Type {response.headers.get('content-type')!r})"
                )
            raise self._ended_early()
        calls = reply.tools.calls()
        return ModelReply(
            message=assistant_message("".join(reply.content), "".join(reply.thinking), calls),
            usage=reply.usage or Usage(0, 0),
            done_reason=normalised_done_reason(reply.finish_reason, bool(calls)),
            model=reply.model or self.model,
            request_id=response.headers.get("x-request-id") or reply.completion_id,
            duration=time.monotonic() - started,
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
        served = _count(entry.get("max_model_len"))
        if served:
            return served
        props = self._fetch_json("GET", "/props", optional=True)
        if isinstance(props, dict):
            settings = props.get("default_generation_settings")
            runtime = _count(settings.get("n_ctx")) if isinstance(settings, dict) else 0
            if runtime:
                return runtime
        meta = entry.get("meta")
        trained = _count(meta.get("n_ctx_train")) if isinstance(meta, dict) else 0
        return trained or None


# --- construction --------------------------------------------------------------

PROVIDERS = ("ollama", "openai")


def make_client(
    provider: str,
    base_url: str | None = None,
    model: str | None = None,
    *,
    api_key_env: str = DEFAULT_API_KEY_ENV,
    retry: RetryPolicy | None = None,
    timeout: float | httpx.Timeout | None = None,
) -> ModelClient:
    """A client for ``provider`` (``ollama`` or ``openai``).

    Ollama defaults to ``OLLAMA_HOST`` (else http://127.0.0.1:11434) and the
    model ``gemma4``. OpenAI-compatible servers default to ``OPENAI_BASE_URL``
    (else http://localhost:8000) and need a model name.
    """
    name = provider.strip().lower()
    if name == "ollama":
        return OllamaClient(model or DEFAULT_OLLAMA_MODEL, base_url, retry=retry, timeout=timeout)
    if name == "openai":
        if not model:
            raise ModelConfigError(
                "the openai provider needs a model name: the one the server serves "
                "(GET <base URL>/v1/models lists them)"
            )
        return OpenAIClient(model, base_url, api_key_env=api_key_env, retry=retry, timeout=timeout)
    raise ModelConfigError(
        f"unknown model provider {provider!r}: use one of {', '.join(PROVIDERS)}"
    )


__all__ = [
    "DEFAULT_OLLAMA_MODEL",
    "ModelClient",
    "ModelReply",
    "OllamaClient",
    "OpenAIClient",
    "RetryPolicy",
    "ToolCallAssembler",
    "Usage",
    "make_client",
    "ollama_host_url",
    "ollama_wire_message",
    "openai_wire_message",
    "sse_events",
    "tool_call",
]
