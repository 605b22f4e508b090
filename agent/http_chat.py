"""The HTTP machinery both model clients share: streaming, retries, and error mapping.

Transient failures (connection errors, timeouts, a stream cut short, HTTP 429
and 5xx) are retried with exponential backoff; every retry is reported through
``on_retry`` and starts the request over, discarding the partial reply, so
nothing is ever merged twice. Everything else becomes one of the errors in
``agent.errors``. The error body shapes servers use are listed in
docs/PROTOCOLS.md. A base URL is checked when the client is made, so a bad
one is refused before anything is written.
"""

from __future__ import annotations

import email.utils
import functools
import json
import re
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Self, TypeVar

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
from agent.messages import REPLY_DEPTH, token_count
from objstore import parse_json

# Reads wait long: a server may load a model from disk before the first byte.
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=10.0)
MAX_REPLY_BYTES: Final = 256 << 20
"""Bytes of one reply read at most: a real one is far smaller (a streamed reply of
a million tokens is about 150 MB of events), and a server that never stops would
otherwise fill memory (the store would refuse the message anyway, at 128 MiB)."""
_NEWLINE: Final = re.compile(r"\r\n|\r|\n")

T = TypeVar("T")


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


class _Retry(Exception):
    """One attempt failed in a way that another attempt may not."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


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
    """Read the error body shapes in docs/PROTOCOLS.md (section 4, item 7) into one form."""
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
    prompt = token_count(error.fields.get("n_prompt_tokens")) or None
    window = token_count(error.fields.get("n_ctx")) or None
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


def checked_base_url(value: str) -> str:
    """``value`` without a trailing slash, or ModelConfigError if it cannot be a server's URL."""
    text = value.strip().rstrip("/")
    problem = None
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as exc:
        problem = str(exc)
    else:
        if url.scheme not in {"http", "https"}:
            problem = "it needs http:// or https://"
        elif not url.host:
            problem = "it names no host"
        elif url.port is not None and not 0 < url.port < 65536:
            problem = f"port {url.port} is out of range"
    if problem is None:
        return text
    hint = f" (did you mean http://{text}?)" if "://" not in text and text else ""
    raise ModelConfigError(f"unusable model server URL {value!r}: {problem}{hint}")


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS setup, built once: loading the CA bundle costs ~40 ms a client."""
    return httpx.create_ssl_context()


class HTTPChatClient:
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
        self.base_url = checked_base_url(base_url)
        self.retry = retry or RetryPolicy()
        self._timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self._http = self._new_http()

    def _new_http(self) -> httpx.Client:
        return httpx.Client(
            timeout=self._timeout, headers={"User-Agent": "ags"}, verify=_tls_context()
        )

    def _reconnect(self) -> None:
        """Drop the pooled connections: a server that broke off a reply may have left
        one that it will close under the next request (docs/PROTOCOLS.md 3.6)."""
        self._http.close()
        self._http = self._new_http()

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
        last, number = "", 0
        for number in range(1, self.retry.attempts + 1):
            try:
                return attempt()
            except _Retry as failure:
                last = failure.reason
                if number == self.retry.attempts:
                    break
                if (failure.retry_after or 0) > self.retry.max_retry_after:
                    last += (
                        f"; it asks to wait {failure.retry_after:,.0f} s (Retry-After), "
                        f"more than ags waits ({self.retry.max_retry_after:,.0f} s)"
                    )
                    break  # asking again sooner is what it asked not to have
                wait = self.retry.delay(number, failure.retry_after)
                if on_retry is not None:
                    on_retry(
                        f"{failure.reason}; attempt {number + 1} of {self.retry.attempts} "
                        f"in {wait:.2f}s"
                    )
                time.sleep(wait)
        raise ModelUnavailable(self.base_url, number, last)

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

    def _post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` and return the JSON object of a successful answer (not retried here)."""
        with self._stream(path, body) as response:
            return self._json_object(self._body(response).decode(errors="replace"), "the reply")

    def _body(self, response: httpx.Response) -> bytes:
        """A reply's whole body, at most MAX_REPLY_BYTES of it (else a protocol error)."""
        chunks, size = [], 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            self._check_size(size)
            chunks.append(chunk)
        return b"".join(chunks)

    def _lines(self, response: httpx.Response) -> Iterator[str]:
        """A streamed reply's lines (ended by CR, LF or CRLF, as SSE has it), read
        until MAX_REPLY_BYTES, so that neither an endless stream nor an endless
        line fills memory. (httpx's ``iter_lines`` keeps any line whole, however
        long, and knows no limit.)"""
        pending: list[str] = []
        after_cr, size = False, 0
        for text in response.iter_text():
            size += len(text)  # (characters: at least the bytes' count over four)
            self._check_size(size)
            if after_cr and text.startswith("\n"):
                text = text[1:]  # the LF of a CRLF split between two reads
            after_cr = text.endswith("\r")
            pieces = _NEWLINE.split(text)
            pending.append(pieces[0])
            if len(pieces) == 1:
                continue
            yield "".join(pending)
            yield from pieces[1:-1]
            pending = [pieces[-1]]
        if any(pending):
            yield "".join(pending)

    def _check_size(self, size: int) -> None:
        """Counted as decoded: a compressed reply (httpx asks for gzip) may grow a
        thousandfold as it is decoded."""
        if size > MAX_REPLY_BYTES:
            raise ModelProtocolError(
                self.base_url,
                f"the reply passed {MAX_REPLY_BYTES >> 20} MiB and was not read further",
                "does the server ever stop?",
            )

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
                return parse_json(response.content, REPLY_DEPTH)
            except ValueError as exc:
                if optional:
                    return None
                raise ModelProtocolError(self.base_url, f"{path} did not answer JSON") from exc

        return self._with_retries(attempt, None)

    # Errors.

    def _http_error(self, response: httpx.Response) -> Exception:
        if response.is_redirect:  # never followed: a key must not go to another host
            where = one_line(response.headers.get("Location") or "(no Location)", 200)
            return ModelRequestFailed(
                self.base_url,
                response.status_code,
                f"redirected to {where}; ags follows no redirect: give that as the base URL",
            )
        try:
            payload: Any = parse_json(response.content, REPLY_DEPTH)
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
            return ContextTooLong.reported(self.base_url, message, prompt, window)
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
            value = parse_json(text, REPLY_DEPTH)
        except ValueError as exc:
            raise self._protocol_error(f"{what} is not JSON ({exc}): {text[:120]!r}") from None
        if not isinstance(value, dict):
            raise self._protocol_error(f"{what} is not a JSON object: {text[:120]!r}")
        return value
