"""Messages of any JSON shape, read back by every command that shows a session.

The store takes any JSON object as a message (``Store.append``, ``ags import`` of an
export document); the agent writes one shape (agent/messages.py), but whatever reads a
stored message must not fail on another. Before, a ``role`` that was an object made
``ags info`` fail with TypeError, and ``tool_calls`` that were a number did the same to
``ags export --format md`` and to resuming the session with a model (its wire form)."""

from __future__ import annotations

import json
import random
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from json_mutations import mutated
from model_server import FakeModelServer

from agent.http_chat import RetryPolicy
from agent.messages import unanswered_calls, with_unique_call_ids
from agent.ollama import OllamaClient, ollama_wire_message
from agent.openai_compat import OpenAIClient, openai_wire_message
from cli.main import cli
from objstore import AgsError, Store

FAST = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.01, max_retry_after=0.05)


def _good() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "List files"},
        {
            "role": "assistant",
            "content": "",
            "thinking": "hmm",
            "tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": "hello\n```x```"},
        {"role": "assistant", "content": "# Done\n\n| a | b |\n|---|---|\n| 1 | 2 |"},
    ]


def _session(store_path: Path, messages: list[dict[str, Any]]) -> str:
    with Store.open(store_path) as store:
        sid = store.new_session(title="odd")
        for message in messages:
            with suppress(AgsError):  # a value the store refuses (too deep): not stored
                store.append(sid, message)
    return sid


def _read_everything(store_path: Path, sid: str) -> None:
    """Every command that shows the session, and its messages as each model wire
    takes them: each does its job or says why in one line, never a traceback."""
    out = store_path.parent
    commands = [
        ["log", sid], ["log", sid, "--context"], ["log", sid, "--oneline"], ["show", sid],
        ["show", f"{sid}~1"], ["info", sid], ["diff", f"{sid}~2", sid], ["search", "hello"],
        ["export", sid, "--format", "md", "-o", str(out / "e.md")],
        ["export", sid, "--format", "html", "-o", str(out / "e.html")],
        ["export", sid, "-o", str(out / "e.json")],
    ]  # fmt: skip
    for command in commands:
        result = CliRunner().invoke(cli, ["--store", str(store_path), *command])
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            command,
            result.output,
        )
    with Store.open(store_path) as store:
        context = store.context(sid)
    unanswered_calls(context)
    taken: set[str] = set()
    for message in context:
        json.dumps(openai_wire_message(with_unique_call_ids(message, taken)))
        json.dumps(ollama_wire_message(message))


@pytest.mark.parametrize(
    "odd",
    [
        {"role": {"name": "user"}, "content": "a role that is an object"},
        {"role": ["assistant"], "content": "a role that is a list"},
        {"role": "assistant", "content": "", "tool_calls": 5},
        {"role": "assistant", "content": "", "tool_calls": "read_file"},
        {"role": "assistant", "content": "", "tool_calls": [5, None, "x", {"name": "r"}]},
        {"role": "assistant", "content": {"text": "content that is an object"}},
    ],
)
def test_a_message_of_another_shape_reads_everywhere(tmp_path: Path, odd: dict[str, Any]) -> None:
    messages = _good()
    messages.insert(3, odd)
    _read_everything(tmp_path / "s", _session(tmp_path / "s", messages))


@pytest.mark.parametrize("seed", range(40))
def test_messages_mutated_at_random_read_everywhere(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    messages = [mutated(rng, m) if rng.random() < 0.6 else m for m in _good()]
    messages = [m if isinstance(m, dict) else {"role": "user", "content": m} for m in messages]
    _read_everything(tmp_path / "s", _session(tmp_path / "s", messages))


# A stored context of shapes ags does not write itself: OpenAI content parts, Anthropic
# blocks, an object, a number, a call in OpenAI's shape (arguments as JSON text).
ODD_CONTEXT: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
    {"role": "user", "content": [{"type": "text", "text": "read"}, {"type": "tool_use"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
            },
            {"id": "c2", "name": "read_file", "arguments": "not JSON"},
        ],
    },  # fmt: skip
    {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": {"text": "hello"}},
    {"role": "tool", "tool_call_id": "c2", "name": "read_file", "content": 42},
    {"role": "user", "content": {"no": "text"}},
]


@pytest.mark.parametrize("wire", ["ollama", "openai"])
def test_a_context_of_other_shapes_is_sent_as_the_server_takes_it(
    tmp_path: Path, wire: str
) -> None:
    """Resumed, a stored message of another shape goes as text (or as content parts, to
    an OpenAI server): Ollama refused the whole request ("cannot unmarshal array")."""
    sid = _session(tmp_path / "s", ODD_CONTEXT)
    with Store.open(tmp_path / "s") as store:
        context = store.context(sid)
    with FakeModelServer() as server:
        server.add({"text": "ok"})
        if wire == "ollama":
            client: Any = OllamaClient(base_url=server.url, retry=FAST, timeout=5)
        else:
            client = OpenAIClient("gemma4", server.url, retry=FAST, timeout=5)
        with client:
            assert client.chat(context).message["content"] == "ok"
        [sent] = server.chat_bodies()
    contents = [m["content"] for m in sent["messages"]]
    if wire == "ollama":
        assert contents[:2] == ["You are terse.", "read"]
    else:  # parts as stored where OpenAI's wire takes them
        assert contents[:2] == [ODD_CONTEXT[0]["content"], "read"]
    assert contents[2:] == ["", "hello", "42", '{"no": "text"}']
    calls = sent["messages"][2]["tool_calls"]
    arguments = [c["function"]["arguments"] for c in calls]
    if wire == "openai":
        arguments = [json.loads(a) for a in arguments]
    assert [c["function"]["name"] for c in calls] == ["read_file", "read_file"]
    assert arguments == [{"path": "a.txt"}, {}]
