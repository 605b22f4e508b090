"""A fake model server on 127.0.0.1 that speaks both wire formats the agent uses.

Ollama's native API (``/api/chat`` as NDJSON or one JSON object, ``/api/show``,
``/api/tags``, ``/api/ps``, ``/api/version``) and the OpenAI chat-completions
API (``/v1/chat/completions`` as SSE or one JSON object, ``/v1/models``, and
llama.cpp's ``/props``), with the shapes and quirks written down in
PROTOCOLS.md. It is a real HTTP server, so clients are tested over real
sockets: chunked streams, dropped connections, status codes, headers.

Each chat request takes the next scripted reply from a queue (an empty queue
answers ``DEFAULT_TEXT``). A reply is a JSON object; the same vocabulary works
in process and in a ``--script`` file:

``text``            content, streamed in ``chunks`` pieces (default 3)
``thinking``        reasoning text, streamed before the content
``tool_calls``      ``[{"name", "arguments": {...}, "id"?, "arguments_raw"?}]``;
                    ids are generated unless given, ``omit_ids`` is true (no
                    id at all) or ``empty_ids`` is true (``"id": ""``);
                    ``arguments_raw`` is sent verbatim (also on /api/chat,
                    which real Ollama never does)
``index_quirk``     OpenAI wire only: ``"same"`` gives every call index 0
                    (ollama#15457), ``"missing"`` leaves index out (ollama#7881)
``done_reason``     overrides the done/finish reason as sent
``usage``           ``{"prompt_tokens", "completion_tokens"}`` overriding the counts
``omit_usage``      true: no counts at all
``error``           ``{"status", "message", "type"?, "retry_after"?, "body"?,
                    "content_type"?, "headers"?}``: answer that HTTP error in
                    the endpoint's error format (``body`` replaces the body
                    verbatim, sent as ``content_type``, default JSON;
                    ``headers`` are sent too, a redirect's Location)
``context_overflow``  true, or a style (``ollama``, ``vllm``, ``vllm_new``,
                    ``llamacpp``, ``llamacpp_500``): answer the server's
                    context-too-long error
``stream_error``    ``{"message", "after"?, "code"?, "type"?, "field"?}``: after
                    ``after`` stream chunks send an in-band error (an NDJSON
                    line, a ``data:`` event, or with ``field`` the old
                    llama.cpp ``error:`` line) and end the stream
``drop_after``      cut the connection after that many stream chunks
``end_after``       end the body cleanly after that many chunks, without the
                    final ``done`` line or ``[DONE]``
``delay``           seconds to wait before answering
``chunk_delay``     seconds to wait before each stream chunk after the first
                    (a model writing at a person's reading pace)

Token counts are deterministic so tests can rely on them: prompt tokens are
the characters of all message contents // 4; completion tokens are the
characters of the reply's text, thinking and tool-call arguments // 4, at
least 1.

``call_ids="counter"`` makes tool-call ids ``call_<reply>_<call>``, counted
from ``call_0_0`` by each server instance, as a server's counter restarts with
it; the default is each flavor's own (unique) form.

``flavor`` picks which OpenAI-compatible server is imitated: ``vllm`` (tool
arguments in fragments, usage in a final ``choices: []`` chunk,
``max_model_len``), ``llamacpp`` (fragments, usage and ``timings`` on the
finish chunk, ``/props``, ignores the model name), ``ollama`` (whole tool
calls in one delta, ``reasoning``) or ``llama_cpp_python`` (llama-cpp-python's
server as docs/PROTOCOLS.md section 3.6 describes it: no usage in a stream,
and a stream it cannot serve, a context overflow, gets an empty event
stream; the same request unstreamed gets the 400, so the reply is served
again to the next request). With ``function_calling`` false (the model's own
chat template) it ignores tools; true (``--chat_format
chatml-function-calling``) it calls them only when the request has a
``tool_choice``, and only unstreamed: a streamed request with tools and a
``tool_choice`` gets an empty event stream too.

Run as a process: ``python tests/model_server.py --script FILE.json [--port 0]
[--record FILE.jsonl]`` prints ``PORT <n>`` once listening. The script is a
list of replies, or an object with ``replies`` plus any ``FakeModelServer``
option (``models``, ``flavor``, ``context_length``, ``runtime_context``,
``modelfile_num_ctx``, ``api_key``, ``reject_over_context``, ``call_ids``). ``--record``
appends every request received as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, Final

import pytest

DEFAULT_TEXT = "This is the fake model's default reply."
CREATED = 1746007000
_GO_KINDS: Final = {list: "array", dict: "object", bool: "bool", int: "number", float: "number"}


def _ollama_unbound(body: Any) -> str | None:
    """The error Ollama's decoding of ``/api/chat`` into its Go structs answers (400) for
    a message field of the wrong JSON type: ``content``, ``thinking``, ``tool_name``
    are strings, a call's ``arguments`` an object. None when it decodes."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        fields = [(k, message.get(k), str) for k in ("content", "thinking", "tool_name")]
        for call in message.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                fields.append(("tool_calls.function.arguments", fn.get("arguments"), dict))
        for name, value, wanted in fields:
            if value is not None and not isinstance(value, wanted):
                kind = _GO_KINDS.get(type(value), "string")
                go_type = "string" if wanted is str else "api.ToolCallFunctionArguments"
                return (
                    f"json: cannot unmarshal {kind} into Go struct field "
                    f"ChatRequest.messages.{name} of type {go_type}"
                )
    return None


OLLAMA_OVERFLOW = (
    "the prompt is longer than the context length currently available to the model; "
    "shorten the prompt, adjust the context length in settings, or use a model with a "
    "longer context length"
)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    def as_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "body": self.body,
        }


class _ConnectionDropped(Exception):
    """The script asked for the connection to be cut."""


def prompt_tokens(messages: Any) -> int:
    """Characters of all message contents // 4 (text parts of content arrays count)."""
    total = 0
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    return total // 4


def _pieces(text: str, count: int) -> list[str]:
    """``text`` in ``count`` consecutive non-empty pieces (fewer if it is short)."""
    if not text:
        return []
    size = -(-len(text) // max(count, 1))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _tagged(name: str) -> str:
    return name if ":" in name else name + ":latest"


class FakeModelServer:
    """The server; mutable attributes are read at each request, so tests may change them."""

    def __init__(
        self,
        replies: Iterable[dict[str, Any]] = (),
        *,
        models: Iterable[str] = ("gemma4",),
        flavor: str = "vllm",
        context_length: int = 32768,
        runtime_context: int | None = None,
        modelfile_num_ctx: int | None = None,
        api_key: str | None = None,
        reject_over_context: bool = False,
        call_ids: str = "flavor",
        function_calling: bool = False,
        port: int = 0,
        record_path: Path | None = None,
    ) -> None:
        self.models = list(models)
        self.flavor = flavor
        self.context_length = context_length
        self.runtime_context = runtime_context or context_length
        self.modelfile_num_ctx = modelfile_num_ctx
        self.api_key = api_key
        self.reject_over_context = reject_over_context
        self.call_ids = call_ids
        self.function_calling = function_calling
        self.record_path = record_path
        self.requests: list[RecordedRequest] = []
        self.loaded: set[str] = set()
        self._replies: deque[dict[str, Any]] = deque(replies)
        self._lock = threading.Lock()
        self._calls = 0
        self._replies_with_calls = 0
        self._httpd = _HTTPServer(("127.0.0.1", port), _Handler)
        self._httpd.fake = self
        self._thread: threading.Thread | None = None

    # --- control -----------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeModelServer:
        # A short poll interval: stop() waits up to one interval for the loop to notice.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add(self, *replies: dict[str, Any]) -> None:
        """Queue replies for the next chat requests, in order."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted replies not yet served."""
        with self._lock:
            return len(self._replies)

    def chat_bodies(self) -> list[Any]:
        """The bodies of every chat request received, in order."""
        chat_paths = {"/api/chat", "/v1/chat/completions"}
        with self._lock:
            return [r.body for r in self.requests if r.path in chat_paths]

    # --- used by the handler --------------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)
            if self.record_path is not None:
                with self.record_path.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(request.as_json()) + "\n")

    def _next_reply(self) -> dict[str, Any]:
        with self._lock:
            return self._replies.popleft() if self._replies else {"text": DEFAULT_TEXT}

    def _serve_again(self, reply: dict[str, Any]) -> None:
        """Give ``reply`` to the next request too (it was not really served)."""
        with self._lock:
            self._replies.appendleft(reply)

    def _next_call_id(self, style: str) -> str:
        with self._lock:
            self._calls += 1
            n = self._calls
        if style == "vllm":
            return f"chatcmpl-tool-{n:032x}"
        if style == "llamacpp":
            return f"{n:032d}"
        if style == "llama_cpp_python":
            return f"call__{n}_cmpl-{n:08x}-0000-4000-8000-{n:012x}"
        return f"call_{n:08x}"  # Ollama: call_ plus 8 lowercase letters or digits

    def _next_counter(self) -> int:
        """The number of replies with tool calls served before this one."""
        with self._lock:
            n = self._replies_with_calls
            self._replies_with_calls += 1
        return n

    def _knows(self, model: Any) -> bool:
        return isinstance(model, str) and _tagged(model) in {_tagged(m) for m in self.models}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout, retry) leaves a broken pipe behind; not news.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked streaming, keep-alive
    # Headers and body go out in separate writes; with Nagle on, each small
    # response waits for the client's delayed ACK (40 ms on Linux).
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def fake(self) -> FakeModelServer:
        return self.server.fake

    # --- plumbing -------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(None)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self._dispatch(body)

    def _dispatch(self, body: Any) -> None:
        if getattr(self, "_broken", False):
            # llama-cpp-python (uvicorn) closes a connection whose stream it broke
            # off, under the next request sent on it.
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        path = self.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.fake._record(RecordedRequest(self.command, path, headers, body))
        routes = {
            ("POST", "/api/chat"): self._ollama_chat,
            ("POST", "/api/show"): self._ollama_show,
            ("GET", "/api/tags"): self._ollama_tags,
            ("GET", "/api/ps"): self._ollama_ps,
            ("GET", "/api/version"): self._ollama_version,
            ("POST", "/v1/chat/completions"): self._openai_chat,
            ("GET", "/v1/models"): self._openai_models,
            ("GET", "/props"): self._llamacpp_props,
        }
        route = routes.get((self.command, path))
        if path.startswith(("/v1/", "/props")) and not self._authorised():
            return
        if route is None:
            self._not_a_route(path)
            return
        try:
            route(body if isinstance(body, dict) else {})
        except _ConnectionDropped:
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def _authorised(self) -> bool:
        if not self.fake.api_key:
            return True
        if self.headers.get("Authorization") == f"Bearer {self.fake.api_key}":
            return True
        self._send_json(
            401,
            {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}},
        )
        return False

    def _not_a_route(self, path: str) -> None:
        if path.startswith("/api/") or self.fake.flavor == "ollama":
            self._send_bytes(404, b"404 page not found", "text/plain")  # Go's mux
        else:
            self._send_json(404, {"detail": "Not Found"})  # vLLM's FastAPI

    def _send_bytes(
        self, status: int, data: bytes, content_type: str, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_json(self, status: int, payload: Any, extra: dict[str, str] | None = None) -> None:
        self._send_bytes(status, json.dumps(payload).encode(), "application/json", extra)

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def _stream(self, content_type: str, units: list[bytes], reply: dict[str, Any]) -> None:
        """Send ``units`` as a chunked body, applying the reply's stream faults."""
        self._start_stream(content_type)
        drop = reply.get("drop_after")
        end = reply.get("end_after")
        pace = float(reply.get("chunk_delay") or 0)
        for sent, unit in enumerate(units):
            if pace and sent:
                self.wfile.flush()
                time.sleep(pace)
            if drop is not None and sent >= drop:
                raise _ConnectionDropped
            if end is not None and sent >= end:
                break
            self._chunk(unit)
        self._end_stream()

    def _error_reply(self, reply: dict[str, Any], openai: bool) -> bool:
        """Answer a scripted HTTP error or overflow; True if the reply was one."""
        if "error" in reply:
            spec = reply["error"]
            status = int(spec.get("status", 500))
            extra = {"Retry-After": str(spec["retry_after"])} if "retry_after" in spec else {}
            extra |= spec.get("headers", {})
            if "body" in spec:
                body = spec["body"]
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self._send_bytes(status, data, spec.get("content_type", "application/json"), extra)
            elif openai:
                payload = self._openai_error(status, spec.get("message", "error"), spec.get("type"))
                self._send_json(status, payload, extra)
            else:
                self._send_json(status, {"error": spec.get("message", "error")}, extra)
            return True
        if reply.get("context_overflow"):
            style = reply["context_overflow"]
            self._overflow(style if isinstance(style, str) else None, openai, None)
            return True
        return False

    def _openai_error(self, status: int, message: str, etype: str | None) -> dict[str, Any]:
        default = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
        code = None if self.fake.flavor == "ollama" else status
        return {
            "error": {"message": message, "type": etype or default, "param": None, "code": code}
        }

    def _overflow(self, style: str | None, openai: bool, tokens: int | None) -> None:
        window = self.fake.runtime_context
        asked = tokens if tokens is not None else window + 294
        style = style or (self.fake.flavor if openai else "ollama")
        if not openai or style == "ollama":
            if openai:
                self._send_json(400, self._openai_error(400, OLLAMA_OVERFLOW, None))
            else:
                self._send_json(400, {"error": OLLAMA_OVERFLOW})
        elif style == "llamacpp":
            message = (
                f"request ({asked} tokens) exceeds the available context size "
                f"({window} tokens), try increasing it"
            )
            error = {"code": 400, "message": message, "type": "exceed_context_size_error"}
            self._send_json(400, {"error": {**error, "n_prompt_tokens": asked, "n_ctx": window}})
        elif style == "llama_cpp_python":
            message = (
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested {asked} tokens ({asked} in the messages, None in the completion). "
                "Please reduce the length of the messages or completion."
            )
            error = {"message": message, "type": "invalid_request_error"}
            error |= {"param": "messages", "code": "context_length_exceeded"}
            self._send_json(400, {"error": error})
        elif style == "llamacpp_500":
            self._send_json(
                500,
                {
                    "error": {
                        "message": "Context size has been exceeded.",
                        "type": "server_error",
                        "code": 500,
                    }
                },
            )
        elif style == "vllm_new":
            message = (
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested 512 output tokens and your prompt contains at least {asked} "
                f"input tokens, for a total of at least {asked + 512} tokens."
            )
            self._send_json(400, self._openai_error(400, message, "BadRequestError"))
        else:
            message = (
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested {asked + 512} tokens ({asked} in the messages, 512 in the "
                "completion). Please reduce the length of the messages or completion."
            )
            self._send_json(400, self._openai_error(400, message, "BadRequestError"))

    def _common_checks(self, body: dict[str, Any], openai: bool) -> dict[str, Any] | None:
        """The reply to serve, or None when the request was already answered."""
        model = body.get("model")
        ignores_model = openai and self.fake.flavor in {"llamacpp", "llama_cpp_python"}
        if not ignores_model and not self.fake._knows(model):
            if not openai:
                self._send_json(404, {"error": f"model '{model}' not found"})
            elif self.fake.flavor == "ollama":
                message = f'model "{model}" not found, try pulling it first'
                self._send_json(404, self._openai_error(404, message, None))
            else:
                message = f"The model `{model}` does not exist."
                self._send_json(404, self._openai_error(404, message, "NotFoundError"))
            return None
        reply = self.fake._next_reply()
        if reply.get("delay"):
            time.sleep(float(reply["delay"]))
        tokens = prompt_tokens(body.get("messages"))
        over = self.fake.reject_over_context and tokens > self.fake.runtime_context
        if openai and self.fake.flavor == "llama_cpp_python" and body.get("stream"):
            calling = self.fake.function_calling and body.get("tools") and body.get("tool_choice")
            if reply.get("context_overflow") or over or calling:
                self.fake._serve_again(reply)
                self._start_stream("text/event-stream")
                self._end_stream()
                self._broken = True
                return None
        if self._error_reply(reply, openai):
            return None
        if over:
            self.fake._serve_again(reply)  # refused before the model saw it
            self._overflow(None, openai, tokens)
            return None
        if isinstance(model, str):
            self.fake.loaded.add(_tagged(model))
        return reply

    def _usage(self, body: dict[str, Any], reply: dict[str, Any]) -> tuple[int, int] | None:
        if reply.get("omit_usage"):
            return None
        given = reply.get("usage") or {}
        produced = reply.get("text", "") + reply.get("thinking", "")
        for call in reply.get("tool_calls", []):
            produced += call.get("arguments_raw") or json.dumps(call.get("arguments", {}))
        prompt = given.get("prompt_tokens", prompt_tokens(body.get("messages")))
        return prompt, given.get("completion_tokens", max(1, len(produced) // 4))

    def _calls(self, reply: dict[str, Any], style: str) -> list[dict[str, Any]]:
        """The reply's tool calls with ids filled in as this server would."""
        scripted = reply.get("tool_calls", [])
        counter = self.fake._next_counter() if scripted and self.fake.call_ids == "counter" else 0
        calls = []
        for i, call in enumerate(scripted):
            call_id: str | None
            if "id" in call:
                call_id = call["id"]
            elif reply.get("omit_ids"):
                call_id = None
            elif reply.get("empty_ids"):
                call_id = ""
            elif self.fake.call_ids == "counter":
                call_id = f"call_{counter}_{i}"
            else:
                call_id = self.fake._next_call_id(style)
            calls.append({**call, "id": call_id})
        return calls

    # --- Ollama native --------------------------------------------------------

    def _ollama_chat(self, body: dict[str, Any]) -> None:
        refused = _ollama_unbound(body)
        if refused:  # Go's JSON decoding of the request, before anything else
            self._send_json(400, {"error": refused})
            return
        reply = self._common_checks(body, openai=False)
        if reply is None:
            return
        started = time.monotonic()
        model = body["model"]
        usage = self._usage(body, reply)
        calls = [self._ollama_call(i, c) for i, c in enumerate(self._calls(reply, "ollama"))]

        def line(message: dict[str, Any], done: bool, **extra: Any) -> dict[str, Any]:
            created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
            return {
                "model": model,
                "created_at": created,
                "message": {"role": "assistant", **message},
                "done": done,
                **extra,
            }

        metrics: dict[str, Any] = {
            "done_reason": reply.get("done_reason", "stop"),
            "total_duration": int((time.monotonic() - started) * 1e9) + 250_000_000,
            "load_duration": 41_295_167,
        }
        if usage is not None:
            metrics |= {
                "prompt_eval_count": usage[0],
                "prompt_eval_duration": 24_573_166,
                "eval_count": usage[1],
                "eval_duration": 115_959_084,
            }
        if body.get("stream", True) is False:
            message: dict[str, Any] = {"content": reply.get("text", "")}
            if reply.get("thinking"):
                message["thinking"] = reply["thinking"]
            if calls:
                message["tool_calls"] = calls
            self._send_json(200, line(message, True, **metrics))
            return
        chunks = int(reply.get("chunks", 3))
        lines = [
            line({"content": "", "thinking": p}, False)
            for p in _pieces(reply.get("thinking", ""), chunks)
        ]
        lines += [line({"content": p}, False) for p in _pieces(reply.get("text", ""), chunks)]
        lines += [line({"content": "", "tool_calls": [c]}, False) for c in calls]
        if "stream_error" in reply:
            spec = reply["stream_error"]
            lines = lines[: int(spec.get("after", 1))] + [{"error": spec.get("message", "error")}]
        else:
            lines.append(line({"content": ""}, True, **metrics))
        units = [json.dumps(x).encode() + b"\n" for x in lines]
        self._stream("application/x-ndjson", units, reply)

    @staticmethod
    def _ollama_call(index: int, call: dict[str, Any]) -> dict[str, Any]:
        arguments = call["arguments_raw"] if "arguments_raw" in call else call.get("arguments", {})
        wire: dict[str, Any] = {
            "function": {"index": index, "name": call["name"], "arguments": arguments}
        }
        if call.get("id") is not None:
            wire = {"id": call["id"], **wire}
        return wire

    def _ollama_show(self, body: dict[str, Any]) -> None:
        model = body.get("model") or body.get("name")
        if not self.fake._knows(model):
            self._send_json(404, {"error": f"model '{model}' not found"})
            return
        parameters = 'stop "<end_of_turn>"\ntemperature 1'
        if self.fake.modelfile_num_ctx:
            parameters += f"\nnum_ctx {self.fake.modelfile_num_ctx}"
        self._send_json(
            200,
            {
                "modelfile": f"FROM {model}\n",
                "parameters": parameters,
                "template": "{{ .Prompt }}",
                "details": self._details(),
                "model_info": {
                    "general.architecture": "gemma3",
                    "general.parameter_count": 4_300_000_000,
                    "gemma3.context_length": self.fake.context_length,
                    "gemma3.embedding_length": 2560,
                    "tokenizer.ggml.tokens": [],
                },
                "capabilities": ["completion", "tools"],
                "modified_at": "2025-07-07T20:32:53.844124Z",
            },
        )

    @staticmethod
    def _details() -> dict[str, Any]:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": "gemma3",
            "families": ["gemma3"],
            "parameter_size": "4.3B",
            "quantization_level": "Q4_K_M",
        }

    def _ollama_tags(self, body: dict[str, Any]) -> None:
        models = [
            {
                "name": _tagged(m),
                "model": _tagged(m),
                "modified_at": "2025-07-07T20:32:53.844124Z",
                "size": 3_338_801_804,
                "digest": "a2af6cc3eb7fa8be8504abaf9b04e88f17a119ec3f04a3addf55f92841195f5a",
                "details": self._details(),
            }
            for m in self.fake.models
        ]
        self._send_json(200, {"models": models})

    def _ollama_ps(self, body: dict[str, Any]) -> None:
        models = [
            {
                "name": m,
                "model": m,
                "size": 6_591_830_464,
                "digest": "a2af6cc3eb7fa8be8504abaf9b04e88f17a119ec3f04a3addf55f92841195f5a",
                "details": self._details(),
                "expires_at": "2099-01-01T00:00:00Z",
                "size_vram": 6_591_830_464,
                "context_length": self.fake.runtime_context,
            }
            for m in sorted(self.fake.loaded)
        ]
        self._send_json(200, {"models": models})

    def _ollama_version(self, body: dict[str, Any]) -> None:
        self._send_json(200, {"version": "0.12.6"})

    # --- OpenAI-compatible ----------------------------------------------------

    def _openai_chat(self, body: dict[str, Any]) -> None:
        reply = self._common_checks(body, openai=True)
        if reply is None:
            return
        flavor = self.fake.flavor
        model = body.get("model") or "model"
        usage = self._usage(body, reply)
        calling = self.fake.function_calling and body.get("tool_choice")
        if flavor == "llama_cpp_python" and not calling:
            # Its chat formats ignore tools, and chatml-function-calling does
            # unless a tool_choice is given.
            reply = {k: v for k, v in reply.items() if k != "tool_calls"}
            reply.setdefault("text", DEFAULT_TEXT)
        calls = self._calls(reply, flavor)
        completion_id = f"chatcmpl-{len(self.fake.requests):08x}"
        finish = reply.get("done_reason") or ("tool_calls" if calls else "stop")
        reasoning_key = "reasoning_content" if flavor == "llamacpp" else "reasoning"
        usage_body = (
            {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "total_tokens": usage[0] + usage[1],
            }
            if usage is not None
            else None
        )
        if not body.get("stream", False):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": reply.get("text") or (None if calls else ""),
            }
            if reply.get("thinking"):
                message[reasoning_key] = reply["thinking"]
            if calls:
                message["tool_calls"] = [self._openai_whole_call(i, c) for i, c in enumerate(calls)]
                if flavor == "llama_cpp_python":  # and the legacy field, name and all
                    function = message["tool_calls"][0]["function"]
                    message["function_call"] = {**function, "name": function["name"] + ":"}
            payload: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion",
                "created": CREATED,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            }
            if usage_body is not None:
                payload["usage"] = usage_body
            self._send_json(200, payload)
            return

        # llama-cpp-python sends no usage in a stream, whatever stream_options say.
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if flavor == "llama_cpp_python":
            include_usage, usage_body = False, None

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            out: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            if include_usage and flavor == "vllm":
                out["usage"] = None
            return out

        chunks = int(reply.get("chunks", 3))
        first: dict[str, Any] = {"role": "assistant", "content": ""}
        if flavor == "llamacpp":
            first["content"] = None
        elif flavor == "llama_cpp_python":
            del first["content"]
        events: list[dict[str, Any]] = [chunk(first)]
        events += [chunk({reasoning_key: p}) for p in _pieces(reply.get("thinking", ""), chunks)]
        events += [chunk({"content": p}) for p in _pieces(reply.get("text", ""), chunks)]
        for i, call in enumerate(calls):
            events += [chunk({"tool_calls": [f]}) for f in self._openai_fragments(i, call, reply)]
        finish_chunk = chunk({}, finish)
        if flavor == "llamacpp" and usage is not None:
            # llama.cpp puts usage and timings on the finish chunk itself.
            finish_chunk["usage"] = usage_body
            finish_chunk["timings"] = {
                "cache_n": 0,
                "prompt_n": usage[0],
                "predicted_n": usage[1],
                "prompt_ms": 24.5,
                "predicted_ms": 115.9,
            }
        events.append(finish_chunk)
        if include_usage and usage_body is not None and flavor != "llamacpp":
            events.append({**chunk({}), "choices": [], "usage": usage_body})
        units = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]
        if "stream_error" in reply:
            spec = reply["stream_error"]
            error: dict[str, Any] = {
                "message": spec.get("message", "error"),
                "type": spec.get("type", "server_error"),
            }
            if "code" in spec:
                error["code"] = spec["code"]
            field = b"error: " if spec.get("field") else b"data: "
            units = units[: int(spec.get("after", 1))]
            units.append(field + json.dumps({"error": error}).encode() + b"\n\n")
        units.append(b"data: [DONE]\n\n")
        self._stream("text/event-stream", units, reply)

    @staticmethod
    def _arguments_text(call: dict[str, Any]) -> str:
        raw = call.get("arguments_raw")
        return raw if isinstance(raw, str) else json.dumps(call.get("arguments", {}))

    def _openai_whole_call(self, index: int, call: dict[str, Any]) -> dict[str, Any]:
        whole: dict[str, Any] = {
            "index": index,
            "type": "function",
            "function": {"name": call["name"], "arguments": self._arguments_text(call)},
        }
        if call.get("id") is not None:
            whole["id"] = call["id"]
        return whole

    def _openai_fragments(
        self, index: int, call: dict[str, Any], reply: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """One call as the flavor streams it: whole (Ollama) or in argument fragments."""
        quirk = reply.get("index_quirk")
        if self.fake.flavor == "ollama":
            fragments = [self._openai_whole_call(index, call)]
        else:
            head: dict[str, Any] = {
                "index": index,
                "type": "function",
                "function": {"name": call["name"], "arguments": ""},
            }
            if call.get("id") is not None:
                head["id"] = call["id"]
            tail = [
                {"index": index, "function": {"arguments": piece}}
                for piece in _pieces(self._arguments_text(call), 3)
            ]
            fragments = [head, *tail]
        for fragment in fragments:
            if quirk == "same":
                fragment["index"] = 0
            elif quirk == "missing":
                del fragment["index"]
        return fragments

    def _openai_models(self, body: dict[str, Any]) -> None:
        flavor = self.fake.flavor
        data: list[dict[str, Any]] = []
        for name in self.fake.models:
            entry: dict[str, Any] = {"id": name, "object": "model"}
            if flavor != "llama_cpp_python":
                entry["created"] = CREATED
            if flavor == "vllm":
                entry |= {
                    "owned_by": "vllm",
                    "root": name,
                    "parent": None,
                    "max_model_len": self.fake.context_length,
                    "permission": [],
                }
            elif flavor == "llamacpp":
                entry |= {
                    "owned_by": "llamacpp",
                    "meta": {"n_ctx_train": self.fake.context_length, "n_vocab": 262144},
                }
            elif flavor == "llama_cpp_python":
                entry |= {"owned_by": "me", "permissions": []}  # no window anywhere
            else:
                entry |= {"id": _tagged(name), "owned_by": "library"}
            data.append(entry)
        self._send_json(200, {"object": "list", "data": data})

    def _llamacpp_props(self, body: dict[str, Any]) -> None:
        if self.fake.flavor != "llamacpp":
            self._not_a_route("/props")
            return
        settings = {"n_ctx": self.fake.runtime_context, "temperature": 0.8}
        self._send_json(200, {"default_generation_settings": settings, "total_slots": 1})


# --- pytest and process entry points --------------------------------------------


@pytest.fixture(name="model_server")
def model_server_fixture() -> Iterator[FakeModelServer]:
    """A started fake server with an empty script; add replies with ``.add``.

    Use it with ``from model_server import model_server_fixture  # noqa: F401``;
    the fixture is named ``model_server``.
    """
    with FakeModelServer() as server:
        yield server


@contextmanager
def model_server_process(script: Path, record: Path | None = None, port: int = 0) -> Iterator[str]:
    """This file run as its own process serving ``script``; yields the base URL."""
    command = [sys.executable, __file__, "--script", str(script), "--port", str(port)]
    if record is not None:
        command += ["--record", str(record)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"model server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve scripted model replies on 127.0.0.1.")
    parser.add_argument(
        "--script",
        type=Path,
        required=True,
        help="JSON list of replies, or an object with 'replies' and server options",
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--record", type=Path, help="append every request here as JSON lines")
    args = parser.parse_args(argv)
    script = json.loads(args.script.read_text(encoding="utf-8"))
    options: dict[str, Any] = {} if isinstance(script, list) else dict(script)
    replies = script if isinstance(script, list) else options.pop("replies", [])
    server = FakeModelServer(replies, port=args.port, record_path=args.record, **options)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"PORT {server.port}", flush=True)
    try:
        server._httpd.serve_forever()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        server._httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
