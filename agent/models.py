"""Model clients: one chat turn against Ollama's native API or an OpenAI-compatible server.

This module is the public face of the model clients: the ``ModelClient``
protocol the agent loop needs, ``make_client`` to build one by provider name,
and the names from the modules that do the work:

* ``agent.messages``: the provider-neutral message format and ``ModelReply``;
* ``agent.http_chat``: streaming, retries and error mapping, both clients' base;
* ``agent.ollama``: ``OllamaClient``, Ollama's native ``/api/chat``;
* ``agent.openai_compat``: ``OpenAIClient``, ``/v1/chat/completions`` over SSE.

The wire formats, quirks included, are written down in docs/PROTOCOLS.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import httpx

from agent.errors import ModelConfigError
from agent.http_chat import DEFAULT_TIMEOUT, RetryPolicy
from agent.messages import (
    UNREPORTED,
    Message,
    ModelReply,
    Usage,
    assistant_message,
    normalised_done_reason,
    tool_call,
)
from agent.ollama import (
    DEFAULT_OLLAMA_MODEL,
    OLLAMA_PORT,
    OllamaClient,
    ollama_host_url,
    ollama_wire_message,
)
from agent.openai_compat import (
    DEFAULT_API_KEY_ENV,
    DEFAULT_OPENAI_BASE_URL,
    OpenAIClient,
    ToolCallAssembler,
    openai_wire_message,
    sse_events,
)


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


PROVIDERS = ("ollama", "openai")


def make_client(
    provider: str,
    base_url: str | None = None,
    model: str | None = None,
    *,
    api_key_env: str = DEFAULT_API_KEY_ENV,
    max_output_tokens: int | None = None,
    stream_tools: bool | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | httpx.Timeout | None = None,
) -> ModelClient:
    """A client for ``provider`` (``ollama`` or ``openai``).

    Ollama defaults to ``OLLAMA_HOST`` (else http://127.0.0.1:11434) and the
    model ``gemma4``. OpenAI-compatible servers default to ``OPENAI_BASE_URL``
    (else http://localhost:8000) and need a model name. ``max_output_tokens``
    caps each reply (Ollama's ``num_predict``, OpenAI's ``max_tokens``);
    ``stream_tools`` is the clients' setting of that name.
    """
    name = provider.strip().lower()
    if name == "ollama":
        options = {"num_predict": max_output_tokens} if max_output_tokens else None
        return OllamaClient(
            model or DEFAULT_OLLAMA_MODEL,
            base_url,
            options=options,
            stream_tools=stream_tools,
            retry=retry,
            timeout=timeout,
        )
    if name == "openai":
        if not model:
            raise ModelConfigError(
                "the openai provider needs a model name: the one the server serves "
                "(GET <base URL>/v1/models lists them)"
            )
        params = {"max_tokens": max_output_tokens} if max_output_tokens else None
        return OpenAIClient(
            model,
            base_url,
            api_key_env=api_key_env,
            params=params,
            stream_tools=stream_tools,
            retry=retry,
            timeout=timeout,
        )
    raise ModelConfigError(
        f"unknown model provider {provider!r}: use one of {', '.join(PROVIDERS)}"
    )


__all__ = [
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_OLLAMA_MODEL",
    "DEFAULT_OPENAI_BASE_URL",
    "DEFAULT_TIMEOUT",
    "OLLAMA_PORT",
    "PROVIDERS",
    "Message",
    "ModelClient",
    "ModelReply",
    "OllamaClient",
    "OpenAIClient",
    "UNREPORTED",
    "RetryPolicy",
    "ToolCallAssembler",
    "Usage",
    "assistant_message",
    "make_client",
    "normalised_done_reason",
    "ollama_host_url",
    "ollama_wire_message",
    "openai_wire_message",
    "sse_events",
    "tool_call",
]
