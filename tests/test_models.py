"""The model clients against a real HTTP server speaking Ollama's and OpenAI's wire formats."""

from __future__ import annotations

import gzip
import json
import re
import socket
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from model_server import (  # noqa: F401  (model_server_fixture provides the fixture)
    FakeModelServer,
    model_server_fixture,
    model_server_process,
    prompt_tokens,
)

from agent import http_chat
from agent.errors import (
    AuthFailed,
    ContextTooLong,
    ModelConfigError,
    ModelNotFound,
    ModelProtocolError,
    ModelRequestFailed,
    ModelUnavailable,
)
from agent.models import (
    ModelClient,
    OllamaClient,
    OpenAIClient,
    RetryPolicy,
    Usage,
    make_client,
    ollama_host_url,
)

FAST = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.01, max_retry_after=0.05)
SYSTEM: dict[str, Any] = {"role": "system", "content": "You are terse."}
USER: dict[str, Any] = {"role": "user", "content": "List the files, please."}
READ_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}
SYNTHETIC_ID = re.compile(r"call_[0-9a-f]{12}")


@pytest.fixture
def ollama(model_server: FakeModelServer) -> Iterator[OllamaClient]:
    with OllamaClient(base_url=model_server.url, retry=FAST, timeout=5) as client:
        yield client


@pytest.fixture
def openai(model_server: FakeModelServer) -> Iterator[OpenAIClient]:
    with OpenAIClient("gemma4", model_server.url, retry=FAST, timeout=5) as client:
        yield client


def chat_with_log(
    client: ModelClient, messages: list[dict[str, Any]], **kwargs: Any
) -> tuple[Any, list[str], list[str]]:
    text: list[str] = []
    retries: list[str] = []
    reply = client.chat(messages, on_text=text.append, on_retry=retries.append, **kwargs)
    return reply, text, retries


# --- streaming text --------------------------------------------------------------


def test_ollama_streams_text_in_fragments_with_usage(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    model_server.add({"text": "Here are the files: a.txt and b.txt.", "chunks": 3})
    reply, text, retries = chat_with_log(ollama, [SYSTEM, USER])

    assert reply.message == {"role": "assistant", "content": "Here are the files: a.txt and b.txt."}
    assert len(text) == 3 and "".join(text) == reply.message["content"]
    assert reply.usage.prompt_tokens == prompt_tokens([SYSTEM, USER])
    assert reply.usage.completion_tokens == len("Here are the files: a.txt and b.txt.") // 4
    assert reply.done_reason == "stop"
    assert reply.model == "gemma4"
    assert reply.duration > 0
    assert retries == []
    [sent] = model_server.chat_bodies()
    assert sent["stream"] is True and sent["model"] == "gemma4"
    assert sent["messages"] == [SYSTEM, USER]  # system prompt first, nothing added


def test_ollama_keeps_thinking_apart_from_content(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    model_server.add({"thinking": "The user wants files.", "text": "a.txt"})
    reply, text, _ = chat_with_log(ollama, [USER])
    assert reply.message["thinking"] == "The user wants files."
    assert reply.message["content"] == "a.txt"
    assert "".join(text) == "a.txt"  # thinking is not printed as content


def test_openai_streams_text_with_usage_in_final_chunk(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    model_server.add({"text": "Two files: a.txt and b.txt.", "chunks": 4, "thinking": "hm"})
    reply, text, _ = chat_with_log(openai, [SYSTEM, USER])

    assert reply.message == {
        "role": "assistant",
        "content": "Two files: a.txt and b.txt.",
        "thinking": "hm",
    }
    assert len(text) == 4 and "".join(text) == "Two files: a.txt and b.txt."
    assert reply.usage.prompt_tokens == prompt_tokens([SYSTEM, USER])
    assert reply.usage.completion_tokens == len("Two files: a.txt and b.txt.hm") // 4
    assert reply.done_reason == "stop"
    assert reply.request_id is not None and reply.request_id.startswith("chatcmpl-")
    [sent] = model_server.chat_bodies()
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["messages"] == [SYSTEM, USER]


def test_openai_reads_llamacpp_usage_and_reasoning_from_the_finish_chunk(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    model_server.flavor = "llamacpp"
    model_server.add({"text": "done", "thinking": "think first", "usage": {"completion_tokens": 7}})
    reply = openai.chat([USER])
    assert reply.message["thinking"] == "think first"
    assert reply.usage.completion_tokens == 7
    assert reply.usage.prompt_tokens == prompt_tokens([USER])


@pytest.mark.parametrize("flavor", ["vllm", "llamacpp", "ollama"])
def test_missing_usage_is_unknown_and_a_real_zero_stays_zero(
    model_server: FakeModelServer, ollama: OllamaClient, openai: OpenAIClient, flavor: str
) -> None:
    model_server.flavor = flavor
    zero = {"prompt_tokens": 0, "completion_tokens": 0}
    model_server.add(
        {"text": "a", "omit_usage": True},
        {"text": "b", "omit_usage": True},
        {"text": "c", "usage": zero},
        {"text": "d", "usage": zero},
    )
    assert ollama.chat([USER]).usage == Usage(None, None)
    assert openai.chat([USER]).usage == Usage(None, None)
    assert ollama.chat([USER]).usage == Usage(0, 0)
    assert openai.chat([USER]).usage == Usage(0, 0)


# --- tool calls ------------------------------------------------------------------


def test_ollama_tool_calls_keep_object_arguments_and_server_ids(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    model_server.add(
        {
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "a.txt"}},
                {"name": "shell", "arguments": {"cmd": "ls -l", "timeout": 5}},
            ]
        }
    )
    reply = ollama.chat([USER], tools=[READ_TOOL])

    calls = reply.message["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("read_file", {"path": "a.txt"}),
        ("shell", {"cmd": "ls -l", "timeout": 5}),
    ]
    assert all(re.fullmatch(r"call_[0-9a-f]{8}", c["id"]) for c in calls)
    assert not any("id_synthesized" in c for c in calls)
    assert reply.done_reason == "tool_calls"  # Ollama says "stop"; the turn ended in calls
    assert model_server.chat_bodies()[0]["tools"] == [READ_TOOL]


def test_ollama_synthesizes_missing_ids_and_keeps_bad_arguments_raw(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    model_server.add(
        {
            "omit_ids": True,
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "a.txt"}},
                {"name": "shell", "arguments_raw": '{"cmd": "ls'},
            ],
        }
    )
    first, second = ollama.chat([USER]).message["tool_calls"]
    assert SYNTHETIC_ID.fullmatch(first["id"]) and first["id_synthesized"] is True
    assert SYNTHETIC_ID.fullmatch(second["id"]) and second["id"] != first["id"]
    assert second["arguments"] == {} and second["arguments_raw"] == '{"cmd": "ls'


def test_ollama_sends_tool_history_in_its_own_shape(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    call = {"id": "call_1", "name": "read_file", "arguments": {"path": "a.txt"}}
    history: list[dict[str, Any]] = [
        SYSTEM,
        USER,
        {"role": "assistant", "content": "", "thinking": "read it", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "name": "read_file", "content": "hello"},
    ]
    ollama.chat(history)
    sent = model_server.chat_bodies()[0]["messages"]
    assert sent[0] == SYSTEM
    assert sent[2] == {
        "role": "assistant",
        "content": "",
        "thinking": "read it",
        "tool_calls": [
            {"id": "call_1", "function": {"name": "read_file", "arguments": {"path": "a.txt"}}}
        ],
    }
    assert sent[3] == {
        "role": "tool",
        "content": "hello",
        "tool_name": "read_file",
        "tool_call_id": "call_1",
    }


def test_openai_assembles_argument_fragments_by_index(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    model_server.add(
        {
            "text": "Reading both.",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "a.txt"}, "id": "call_A"},
                {"name": "read_file", "arguments": {"path": "dir/b.txt"}, "id": "call_B"},
            ],
        }
    )
    reply = openai.chat([USER], tools=[READ_TOOL])
    assert reply.message["content"] == "Reading both."
    assert reply.message["tool_calls"] == [
        {"id": "call_A", "name": "read_file", "arguments": {"path": "a.txt"}},
        {"id": "call_B", "name": "read_file", "arguments": {"path": "dir/b.txt"}},
    ]
    assert reply.done_reason == "tool_calls"
    assert model_server.chat_bodies()[0]["tools"] == [READ_TOOL]


def test_openai_separates_parallel_calls_that_share_index_zero(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    model_server.flavor = "ollama"  # ollama#15457: every call at index 0, ids differ
    model_server.add(
        {
            "index_quirk": "same",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "a.txt"}},
                {"name": "shell", "arguments": {"cmd": "ls"}},
            ],
        }
    )
    calls = openai.chat([USER]).message["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("read_file", {"path": "a.txt"}),
        ("shell", {"cmd": "ls"}),
    ]
    assert calls[0]["id"] != calls[1]["id"]


def test_openai_fragments_without_index_or_id_still_assemble(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    model_server.add(
        {
            "index_quirk": "missing",
            "omit_ids": True,
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "a.txt"}},
                {"name": "shell", "arguments": {"cmd": "ls -la /tmp"}},
            ],
        }
    )
    calls = openai.chat([USER]).message["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("read_file", {"path": "a.txt"}),
        ("shell", {"cmd": "ls -la /tmp"}),
    ]
    assert all(SYNTHETIC_ID.fullmatch(c["id"]) and c["id_synthesized"] for c in calls)


def test_openai_keeps_invalid_arguments_raw_and_sends_back_parsed_form(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    model_server.flavor = "llamacpp"
    # llama-4 through litellm: finish_reason "stop" although the turn has tool calls.
    model_server.add(
        {
            "done_reason": "stop",
            "tool_calls": [{"name": "read_file", "arguments_raw": '{"path": "a.tx', "id": "t1"}],
        }
    )
    reply = openai.chat([USER])
    [call] = reply.message["tool_calls"]
    assert call == {
        "id": "t1",
        "name": "read_file",
        "arguments": {},
        "arguments_raw": '{"path": "a.tx',
    }
    assert reply.done_reason == "tool_calls"

    result = {"role": "tool", "tool_call_id": "t1", "name": "read_file", "content": "bad args"}
    openai.chat([USER, reply.message, result])
    sent = model_server.chat_bodies()[1]["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
        ],
    }
    assert sent[2] == {"role": "tool", "content": "bad args", "tool_call_id": "t1"}


# --- retries ---------------------------------------------------------------------


def test_retries_500_and_429_with_identical_requests(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    model_server.add(
        {"error": {"status": 500, "message": "llama runner process has terminated"}},
        {"error": {"status": 429, "message": "too many requests"}},
        {"text": "finally"},
    )
    reply, _, retries = chat_with_log(ollama, [SYSTEM, USER])
    assert reply.message["content"] == "finally"
    assert len(retries) == 2
    assert "HTTP 500" in retries[0] and "runner process" in retries[0]
    assert "HTTP 429" in retries[1]
    first, second, third = model_server.chat_bodies()
    assert first == second == third


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_dropped_stream_is_retried_from_scratch(
    model_server: FakeModelServer, provider: str
) -> None:
    text = "one two three four five six"
    model_server.add({"text": text, "chunks": 3, "drop_after": 2}, {"text": text, "chunks": 3})
    with closing(
        make_client(provider, model_server.url, "gemma4", retry=FAST, timeout=5)
    ) as client:
        reply, fragments, retries = chat_with_log(client, [USER])
    assert reply.message["content"] == text  # the partial first try is not merged in
    assert len(retries) == 1 and "connection" in retries[0]
    assert len(model_server.chat_bodies()) == 2
    assert "".join(fragments).endswith(text)  # the printer saw the restart


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_stream_ending_without_its_final_event_is_retried(
    model_server: FakeModelServer, provider: str
) -> None:
    model_server.add({"text": "cut short", "end_after": 2}, {"text": "complete"})
    with closing(
        make_client(provider, model_server.url, "gemma4", retry=FAST, timeout=5)
    ) as client:
        reply, _, retries = chat_with_log(client, [USER])
    assert reply.message["content"] == "complete"
    assert len(retries) == 1 and "ended before" in retries[0]


def test_gives_up_after_the_configured_attempts(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    model_server.add(*[{"error": {"status": 503, "message": "server busy"}}] * 5)
    retries: list[str] = []
    with pytest.raises(ModelUnavailable) as caught:
        openai.chat([USER], on_retry=retries.append)
    assert caught.value.attempts == 4
    assert "server busy" in caught.value.last_reason
    assert "4 attempts" in str(caught.value) and "\n" not in str(caught.value)
    assert len(retries) == 3
    assert len(model_server.chat_bodies()) == 4 and model_server.pending == 1


def test_honours_retry_after(model_server: FakeModelServer) -> None:
    policy = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.001, max_retry_after=2)
    model_server.add({"error": {"status": 429, "message": "slow down", "retry_after": 1}})
    with OllamaClient(base_url=model_server.url, retry=policy) as client:
        retries: list[str] = []
        started = time.monotonic()
        client.chat([USER], on_retry=retries.append)
    assert time.monotonic() - started >= 1  # Retry-After, not the 1 ms backoff
    assert "in 1.00s" in retries[0]


def test_a_retry_after_longer_than_ags_waits_ends_the_call_at_once(
    model_server: FakeModelServer,
) -> None:
    """Asked to wait an hour, ags asked again three times within 91 s (what the server
    asked not to have) and then gave up anyway; it says so at once now."""
    policy = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.001, max_retry_after=0.3)
    model_server.add(*[{"error": {"status": 429, "message": "slow down", "retry_after": 3600}}] * 4)
    with (
        OllamaClient(base_url=model_server.url, retry=policy) as client,
        pytest.raises(ModelUnavailable) as caught,
    ):
        client.chat([USER])
    assert "failed 1 attempt" in str(caught.value)
    assert "it asks to wait 3,600 s (Retry-After), more than ags waits (0 s)" in str(caught.value)
    assert len(model_server.chat_bodies()) == 1


def test_a_redirect_is_not_followed_and_names_where_it_points(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    elsewhere = "http://198.51.100.7:8000/v1/chat/completions"
    model_server.add({"error": {"status": 307, "body": "", "headers": {"Location": elsewhere}}})
    with pytest.raises(ModelRequestFailed) as caught:
        openai.chat([USER])
    assert f"(HTTP 307): redirected to {elsewhere}; ags follows no redirect" in str(caught.value)
    assert len(model_server.chat_bodies()) == 1


def test_read_timeout_is_retried(model_server: FakeModelServer) -> None:
    model_server.add({"text": "too late", "delay": 0.6}, {"text": "in time"})
    with OllamaClient(base_url=model_server.url, retry=FAST, timeout=0.2) as client:
        retries: list[str] = []
        reply = client.chat([USER], on_retry=retries.append)
    assert reply.message["content"] == "in time"
    assert len(retries) == 1 and "timed out" in retries[0]


def test_connection_refused_ends_in_model_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    retries: list[str] = []
    with (
        OllamaClient(base_url=f"http://127.0.0.1:{port}", retry=FAST) as client,
        pytest.raises(ModelUnavailable, match=f"127.0.0.1:{port} after 4 attempts"),
    ):
        client.chat([USER], on_retry=retries.append)
    assert len(retries) == 3


# --- errors ----------------------------------------------------------------------


def test_ollama_unknown_model_says_how_to_pull_it(model_server: FakeModelServer) -> None:
    with (
        OllamaClient("nope", model_server.url, retry=FAST) as client,
        pytest.raises(ModelNotFound) as caught,
    ):
        client.chat([USER])
    assert str(caught.value) == (
        f"model 'nope' not found on {model_server.url}: pull it with `ollama pull nope`"
    )
    assert len(model_server.chat_bodies()) == 1  # not retried


@pytest.mark.parametrize("flavor", ["vllm", "ollama"])
def test_openai_unknown_model_is_model_not_found(
    model_server: FakeModelServer, flavor: str
) -> None:
    model_server.flavor = flavor
    with (
        OpenAIClient("nope", model_server.url, retry=FAST) as client,
        pytest.raises(ModelNotFound, match="/v1/models"),
    ):
        client.chat([USER])
    assert len(model_server.chat_bodies()) == 1


def test_unusable_request_is_not_retried(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    message = "registry.ollama.ai/library/gemma:2b does not support tools"
    model_server.add({"error": {"status": 400, "message": message}})
    with pytest.raises(ModelRequestFailed, match="does not support tools"):
        ollama.chat([USER], tools=[READ_TOOL])
    assert len(model_server.chat_bodies()) == 1


@pytest.mark.parametrize(
    ("style", "prompt", "window"),
    [
        ("llamacpp", 4390, 4096),
        ("vllm", 4390, 4096),
        ("vllm_new", 4390, 4096),
        ("llamacpp_500", None, None),
        ("ollama", None, None),
    ],
)
def test_openai_context_overflow_in_each_servers_words(
    model_server: FakeModelServer, openai: OpenAIClient, style: str, prompt: Any, window: Any
) -> None:
    model_server.runtime_context = 4096
    model_server.add({"context_overflow": style})
    with pytest.raises(ContextTooLong) as caught:
        openai.chat([USER])
    assert (caught.value.prompt_tokens, caught.value.context_tokens) == (prompt, window)
    assert len(model_server.chat_bodies()) == 1  # a 500 that means overflow is not retried


def test_ollama_context_overflow_and_real_token_counts(model_server: FakeModelServer) -> None:
    model_server.runtime_context = 100
    model_server.reject_over_context = True
    with OllamaClient(base_url=model_server.url, retry=FAST) as client:
        client.chat([{"role": "user", "content": "x" * 400}])
        with pytest.raises(ContextTooLong, match="compact it"):
            client.chat([{"role": "user", "content": "x" * 404}])


def test_mid_stream_errors_map_to_the_matching_error(
    model_server: FakeModelServer, ollama: OllamaClient, openai: OpenAIClient
) -> None:
    model_server.add(
        {"text": "abc", "stream_error": {"message": "input exceeds maximum context length"}},
        {"text": "abc", "stream_error": {"message": "bad grammar", "code": 400}},
        {
            "text": "abc",
            "stream_error": {
                "message": "Context size has been exceeded.",
                "field": True,
                "after": 2,
            },
        },
    )
    with pytest.raises(ContextTooLong):
        ollama.chat([USER])
    with pytest.raises(ModelRequestFailed, match="bad grammar"):
        openai.chat([USER])
    with pytest.raises(ContextTooLong):  # the old llama.cpp "error:" SSE field
        openai.chat([USER])


def test_mid_stream_error_without_a_code_is_retried(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    model_server.add(
        {"text": "abc", "stream_error": {"message": "llama runner process has terminated"}},
        {"text": "recovered"},
    )
    reply, _, retries = chat_with_log(ollama, [USER])
    assert reply.message["content"] == "recovered"
    assert "runner process" in retries[0]


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_garbage_from_the_server_is_a_protocol_error(
    model_server: FakeModelServer, provider: str
) -> None:
    model_server.add({"error": {"status": 200, "body": "<html>hello</html>"}})
    with (
        closing(make_client(provider, model_server.url, "gemma4", retry=FAST)) as client,
        pytest.raises(ModelProtocolError, match="not JSON"),
    ):
        client.chat([USER])
    assert len(model_server.chat_bodies()) == 1


def _verbatim(lines: list[dict[str, Any]], *, openai: bool) -> dict[str, Any]:
    """A scripted 200 reply whose body is ``lines`` as the wire sends them."""
    if openai:
        body = "".join(f"data: {json.dumps(line)}\n\n" for line in lines) + "data: [DONE]\n\n"
        return {"error": {"status": 200, "body": body, "content_type": "text/event-stream"}}
    body = "".join(json.dumps(line) + "\n" for line in lines)
    return {"error": {"status": 200, "body": body, "content_type": "application/x-ndjson"}}


_DONE_LINE = {"model": "gemma4", "message": {"role": "assistant", "content": ""}, "done": True}


@pytest.mark.parametrize(
    ("openai_wire", "lines", "field"),
    [
        (False, [{**_DONE_LINE, "message": {"content": "", "tool_calls": 5}}], "tool_calls"),
        (False, [{**_DONE_LINE, "message": {"content": "", "tool_calls": "x"}}], "tool_calls"),
        (True, [{"choices": 5}], "choices"),
        (True, [{"choices": {"0": {"delta": {"content": "x"}}}}], "choices"),
        (True, [{"choices": [{"index": 0, "delta": {"tool_calls": 1.5}}]}], "tool_calls"),
    ],
)
def test_a_reply_field_of_the_wrong_type_is_a_protocol_error(
    model_server: FakeModelServer, openai_wire: bool, lines: list[dict[str, Any]], field: str
) -> None:
    model_server.add(_verbatim(lines, openai=openai_wire))
    provider = "openai" if openai_wire else "ollama"
    with (
        closing(make_client(provider, model_server.url, "gemma4", retry=FAST)) as client,
        pytest.raises(ModelProtocolError, match=f"{field} (that are )?not (in )?a list"),
    ):
        client.chat([USER], [READ_TOOL])


def test_ollama_skips_what_is_no_tool_call_and_reads_the_rest(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    calls = ["x", 5, None, {"function": 5}, {"function": {"name": "read_file", "arguments": {}}}]
    model_server.add(_verbatim([{**_DONE_LINE, "message": {"tool_calls": calls}}], openai=False))
    reply = ollama.chat([USER], [READ_TOOL])
    assert [c["name"] for c in reply.message["tool_calls"]] == ["", "read_file"]


def test_a_web_page_instead_of_an_event_stream_is_not_retried(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    page = {"status": 200, "body": "<html><body>Login</body></html>", "content_type": "text/html"}
    model_server.add({"error": page})
    with pytest.raises(ModelProtocolError, match="no server-sent events"):
        openai.chat([USER])
    assert len(model_server.chat_bodies()) == 1


# --- what llama-cpp-python's server showed -------------------------------------


def test_tools_go_with_tool_choice_auto(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    """llama-cpp-python ignores tools sent without a tool_choice."""
    model_server.add({"text": "a"}, {"text": "b"})
    openai.chat([USER], [READ_TOOL])
    openai.chat([USER])
    with_tools, without = model_server.chat_bodies()
    assert with_tools["tools"] == [READ_TOOL] and with_tools["tool_choice"] == "auto"
    assert "tools" not in without and "tool_choice" not in without


def test_an_empty_stream_is_asked_again_unstreamed_and_its_real_error_acted_on(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    """llama-cpp-python answers a streamed prompt over its window with 200 and no
    event; only the unstreamed request gets the 400 that says why."""
    model_server.flavor = "llama_cpp_python"
    model_server.add({"context_overflow": True})
    notices: list[str] = []
    with pytest.raises(ContextTooLong, match="window of 32768"):
        openai.chat([USER], on_retry=notices.append)
    streamed, unstreamed = model_server.chat_bodies()
    assert streamed["stream"] is True and unstreamed["stream"] is False
    assert "stream_options" not in unstreamed
    assert notices and "empty event stream" in notices[0]
    assert openai.stream_tools is None  # not a tool call: nothing learnt


def test_tool_calls_a_server_cannot_stream_come_unstreamed_from_then_on(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    model_server.flavor = "llama_cpp_python"
    model_server.function_calling = True
    read = {"name": "read_file", "arguments": {"path": "a.txt"}}
    model_server.add({"tool_calls": [read]}, {"tool_calls": [read]}, {"text": "plain"})
    first = openai.chat([USER], [READ_TOOL])
    second = openai.chat([USER], [READ_TOOL])
    plain = openai.chat([USER])
    assert [c["name"] for c in first.message["tool_calls"]] == ["read_file"]
    assert [c["arguments"] for c in second.message["tool_calls"]] == [{"path": "a.txt"}]
    assert (first.streamed, second.streamed, plain.streamed) == (False, False, True)
    assert [b["stream"] for b in model_server.chat_bodies()] == [True, False, False, True]
    assert openai.stream_tools is False
    assert first.usage.reported and not plain.usage.reported  # counts only unstreamed


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_a_setting_forces_unstreamed_requests_when_tools_are_offered(
    model_server: FakeModelServer, provider: str
) -> None:
    model_server.add({"tool_calls": [{"name": "read_file", "arguments": {}}]}, {"text": "b"})
    with closing(
        make_client(provider, model_server.url, "gemma4", stream_tools=False, retry=FAST)
    ) as client:
        reply = client.chat([USER], [READ_TOOL])
        client.chat([USER])
    assert reply.message["tool_calls"][0]["name"] == "read_file" and not reply.streamed
    assert [b["stream"] for b in model_server.chat_bodies()] == [False, True]


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_the_output_limit_is_sent_in_each_wire_format(
    model_server: FakeModelServer, provider: str
) -> None:
    model_server.add({"text": "a"})
    with closing(
        make_client(provider, model_server.url, "gemma4", max_output_tokens=64, retry=FAST)
    ) as client:
        client.chat([USER])
    body = model_server.chat_bodies()[0]
    assert (body.get("max_tokens") or body["options"]["num_predict"]) == 64


@pytest.mark.parametrize("provider", ["ollama", "openai"])
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("localhost:8000", "did you mean http://localhost:8000"),
        ("127.0.0.1:11434", "did you mean http://127.0.0.1:11434"),
        ("ftp://example.com", "needs http:// or https://"),
        ("http://", "names no host"),
    ],
)
def test_an_unusable_base_url_is_refused_when_the_client_is_made(
    provider: str, url: str, says: str
) -> None:
    with pytest.raises(ModelConfigError, match=re.escape(says)):
        make_client(provider, url, "gemma4")


# --- credentials -----------------------------------------------------------------


def test_api_key_comes_from_the_environment_and_is_sent_as_bearer(
    model_server: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_server.api_key = "sk-test-4242"
    monkeypatch.setenv("AGS_TEST_KEY", "sk-test-4242")
    with OpenAIClient("gemma4", model_server.url, api_key_env="AGS_TEST_KEY", retry=FAST) as client:
        reply = client.chat([USER])
        assert "sk-test-4242" not in repr(client) + repr(
            vars(client) if hasattr(client, "__dict__") else ""
        )
    assert reply.message["content"]
    assert model_server.requests[-1].headers["authorization"] == "Bearer sk-test-4242"


def test_wrong_or_missing_key_is_auth_failed_naming_the_variable(
    model_server: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_server.api_key = "sk-right"
    monkeypatch.delenv("AGS_TEST_KEY", raising=False)
    with OpenAIClient("gemma4", model_server.url, api_key_env="AGS_TEST_KEY", retry=FAST) as client:
        with pytest.raises(AuthFailed, match="set AGS_TEST_KEY"):
            client.chat([USER])
        assert "authorization" not in model_server.requests[-1].headers
        monkeypatch.setenv("AGS_TEST_KEY", "sk-wrong")
        with pytest.raises(AuthFailed, match="HTTP 401"):
            client.chat([USER])
    assert len(model_server.chat_bodies()) == 2  # neither was retried


# --- context length --------------------------------------------------------------


def test_ollama_context_length_prefers_the_allocated_window(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    model_server.context_length = 131072
    model_server.runtime_context = 4096
    assert ollama.context_length() == 131072  # not loaded: the trained maximum from /api/show
    ollama.chat([USER])
    assert ollama.context_length() == 4096  # loaded: what /api/ps says the runner allocated
    with OllamaClient(base_url=model_server.url, options={"num_ctx": 8192}) as client:
        assert client.context_length() == 8192


def test_ollama_context_length_reads_num_ctx_from_the_modelfile(
    model_server: FakeModelServer, ollama: OllamaClient
) -> None:
    model_server.modelfile_num_ctx = 16384
    assert ollama.context_length() == 16384


def test_ollama_context_length_of_an_unknown_model(model_server: FakeModelServer) -> None:
    with OllamaClient("nope", model_server.url) as client, pytest.raises(ModelNotFound):
        client.context_length()


@pytest.mark.parametrize(
    ("flavor", "expected"), [("vllm", 32768), ("llamacpp", 8192), ("ollama", None)]
)
def test_openai_context_length_per_server(
    model_server: FakeModelServer, flavor: str, expected: int | None
) -> None:
    model_server.flavor = flavor
    model_server.context_length = 32768
    model_server.runtime_context = 8192  # llama.cpp: /props n_ctx wins over meta.n_ctx_train
    with OpenAIClient("gemma4", model_server.url + "/v1", retry=FAST) as client:
        assert client.base_url == model_server.url
        assert client.context_length() == expected


# --- configuration ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "url"),
    [
        (None, "http://127.0.0.1:11434"),
        ("", "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("0.0.0.0:12345", "http://127.0.0.1:12345"),
        ("gpu-box", "http://gpu-box:11434"),
        ("gpu-box:8080", "http://gpu-box:8080"),
        (":8080", "http://127.0.0.1:8080"),
        ("http://gpu-box", "http://gpu-box:80"),
        ("https://gpu-box", "https://gpu-box:443"),
        ("https://gpu-box:8443/ollama", "https://gpu-box:8443/ollama"),
        ("[::1]:5000", "http://[::1]:5000"),
        ("::1", "http://[::1]:11434"),
        ('"localhost:11434"', "http://localhost:11434"),
        ("gpu-box:notaport", "http://127.0.0.1:11434"),
        ("gpu-box:\u00b2", "http://127.0.0.1:11434"),  # a digit int() does not take
        ("gpu-box:" + "9" * 5000, "http://127.0.0.1:11434"),  # more digits than int() takes
    ],
)
def test_ollama_host_is_parsed_like_ollama_does(value: str | None, url: str) -> None:
    assert ollama_host_url(value) == url


def test_ollama_client_finds_the_server_through_ollama_host(
    model_server: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{model_server.port}")
    with OllamaClient(retry=FAST) as client:
        assert client.base_url == model_server.url
        assert client.chat([USER]).message["content"]


def test_make_client_checks_its_arguments(model_server: FakeModelServer) -> None:
    client = make_client("Ollama", model_server.url, None)
    assert isinstance(client, OllamaClient) and client.model == "gemma4"
    client.close()
    with pytest.raises(ModelConfigError, match="needs a model name"):
        make_client("openai", model_server.url, None)
    with pytest.raises(ModelConfigError, match="unknown model provider 'anthropic'"):
        make_client("anthropic", None, "x")


# --- the fake server itself --------------------------------------------------------


def test_fake_server_answers_non_streaming_requests_in_both_formats(
    model_server: FakeModelServer,
) -> None:
    call = {"name": "read_file", "arguments": {"path": "a.txt"}, "id": "call_x"}
    model_server.add({"tool_calls": [call]}, {"tool_calls": [call]})
    native = httpx.post(
        model_server.url + "/api/chat",
        json={"model": "gemma4", "messages": [USER], "stream": False},
    ).json()
    assert native["done"] is True and native["done_reason"] == "stop"
    assert native["message"]["tool_calls"][0]["function"]["arguments"] == {"path": "a.txt"}
    assert isinstance(native["total_duration"], int)
    completion = httpx.post(
        model_server.url + "/v1/chat/completions", json={"model": "gemma4", "messages": [USER]}
    ).json()
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    wire_call = completion["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(wire_call["function"]["arguments"]) == {"path": "a.txt"}
    assert httpx.get(model_server.url + "/api/tags").json()["models"][0]["name"] == "gemma4:latest"
    assert "version" in httpx.get(model_server.url + "/api/version").json()


def test_fake_server_runs_as_a_process_from_a_script(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    record = tmp_path / "requests.jsonl"
    script.write_text(
        json.dumps({"flavor": "llamacpp", "replies": [{"text": "from a process"}]}),
        encoding="utf-8",
    )
    with (
        model_server_process(script, record) as url,
        OpenAIClient("any-name", url, retry=FAST) as client,
    ):
        assert client.chat([USER]).message["content"] == "from a process"
        assert client.chat([USER]).message["content"].startswith("This is the fake")
    [first, _] = [json.loads(line) for line in record.read_text().splitlines()]
    assert first["path"] == "/v1/chat/completions" and first["body"]["messages"] == [USER]


# --- replies that do not end ---------------------------------------------------------


@pytest.mark.parametrize("provider", ["ollama", "openai"])
@pytest.mark.parametrize("chunks", [1, 40], ids=["one line", "many events"])
def test_a_reply_past_the_size_limit_is_not_read_further_or_retried(
    model_server: FakeModelServer, provider: str, chunks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endless reply filled memory (678 MB after 11 minutes); a limit far above any
    real reply (256 MiB) ends it, here lowered to 20 KB for a 40 KB reply."""
    monkeypatch.setattr(http_chat, "MAX_REPLY_BYTES", 20_000)
    model_server.add({"text": "word " * 8_000, "chunks": chunks}, {"text": "not asked for"})
    with (
        closing(make_client(provider, model_server.url, "gemma4", retry=FAST, timeout=5)) as c,
        pytest.raises(ModelProtocolError, match="passed 0 MiB and was not read further"),
    ):
        c.chat([USER])
    assert len(model_server.chat_bodies()) == 1 and model_server.pending == 1


def test_reply_lines_end_at_cr_lf_or_crlf_wherever_the_reads_split_them() -> None:
    with OpenAIClient(base_url="http://127.0.0.1:1", model="m") as client:
        reads = [b"data: a\r", b"\ndata: b\r\n\r", b"\n", b"data: c\rdata: d\n", b"\nlast"]
        response = httpx.Response(200, content=iter(reads))
        assert list(client._lines(response)) == [
            "data: a", "data: b", "", "data: c", "data: d", "", "last"
        ]  # fmt: skip


def test_a_server_that_answers_with_errors_is_not_called_unreachable(
    model_server: FakeModelServer, openai: OpenAIClient
) -> None:
    model_server.add(*[{"error": {"status": 500, "message": "boom"}}] * 4)
    with pytest.raises(ModelUnavailable) as caught:
        openai.chat([USER])
    said = str(caught.value)
    assert said.startswith(f"the model server at {model_server.url} failed 4 attempts")
    assert "it answers, so see its log" in said and "reachable" not in said


def test_the_reply_limit_counts_what_a_compressed_reply_decodes_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100 KB of zeros is about 100 bytes gzipped: counted as sent, a compressed reply
    far past the limit would pass it."""
    monkeypatch.setattr(http_chat, "MAX_REPLY_BYTES", 20_000)
    packed = gzip.compress(b"0" * 100_000)
    assert len(packed) < 1_000
    with OpenAIClient(base_url="http://127.0.0.1:1", model="m") as client:
        for read in (client._body, lambda r: list(client._lines(r))):
            response = httpx.Response(
                200, headers={"Content-Encoding": "gzip"}, content=iter([packed])
            )
            with pytest.raises(ModelProtocolError, match="was not read further"):
                read(response)
