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

from agent.messages import unanswered_calls, with_unique_call_ids
from agent.ollama import ollama_wire_message
from agent.openai_compat import openai_wire_message
from cli.main import cli
from objstore import AgsError, Store


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
