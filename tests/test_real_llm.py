"""The agent against a real LLM server: llama-cpp-python with SmolLM2-135M
(tests/llm_server.py), the installed ``ags`` and a real Docker sandbox.

Only what does not depend on the tiny model's wisdom is checked: what is
stored, what is counted, what the server makes of ags's requests (its wire
format, its context overflow, its tool calls). Replies are capped with
--max-output-tokens to keep each call to seconds, so an answer may end cut
off (exit 3); that is the server's real ``length``, and a test that does not
check it accepts it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import tree_snapshot
from llm_server import (  # noqa: F401  (the *_fixture names provide the fixtures)
    MODEL,
    llm_server,
    plain_llm_fixture,
    stop,
    tools_llm_fixture,
)

from agent.tools import TOOLS
from objstore import Store

AGS = str(Path(sys.executable).with_name("ags"))
FINISHED_OR_CUT_OFF = (0, 3)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    p.mkdir()
    (p / "README.md").write_text("# demo\n")
    return p


def ags(
    tmp_path: Path, image: str, project: Path, url: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGS_STORE": str(tmp_path / "store"), "AGS_IMAGE": image}
    env.pop("OPENAI_BASE_URL", None)
    command = [AGS, *args]
    if args[0] == "run":
        command += ["--provider", "openai", "--model", MODEL, "--base-url", url]
    return subprocess.run(
        command, env=env, cwd=project, capture_output=True, text=True, timeout=600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def stored(tmp_path: Path, sid: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(message, node meta) of every node of the session, oldest first."""
    with Store.open(tmp_path / "store") as s:
        return [(e.message, e.node.meta) for e in s.log(sid)][::-1]


def only_session(tmp_path: Path) -> str:
    with Store.open(tmp_path / "store") as s:
        (row,) = s.sessions()
        return row.id


def notes(subject: str, sentence: str, count: int) -> str:
    """Dense, repetitive text: about 13 tokens a sentence for SmolLM2."""
    return f"Here are my notes about the {subject}. " + " ".join(
        sentence.format(i) for i in range(1, count + 1)
    )


def test_a_streamed_answer_is_stored_whole_then_a_resumed_turn(tmp_path, image, project, plain_llm):
    first = ags(tmp_path, image, project, plain_llm, "run", "Say hello to the garden.",
                "--max-output-tokens", "40")  # fmt: skip
    assert first.returncode in FINISHED_OR_CUT_OFF, first.stderr
    sid = only_session(tmp_path)
    [(question, _), (answer, meta)] = stored(tmp_path, sid)
    assert question == {"role": "user", "content": "Say hello to the garden."}
    # What streamed to stdout is what was stored, whole.
    assert answer["content"] and first.stdout == answer["content"] + "\n"
    assert meta["streamed"] is True and meta["done_reason"] in ("stop", "length")
    # This server sends no usage in a stream: unknown, not zero, with an estimate beside it.
    assert meta["usage"] == {"prompt_tokens": None, "completion_tokens": None}
    assert meta["usage_estimate"]["prompt_tokens"] > 0
    info = ags(tmp_path, image, project, plain_llm, "info", sid)
    assert "tokens:      not reported by the server (1 model call; about" in info.stdout

    second = ags(tmp_path, image, project, plain_llm, "run", "--resume", sid,
                 "And now say goodbye.", "--max-output-tokens", "40", "--json")  # fmt: skip
    assert second.returncode in FINISHED_OR_CUT_OFF, second.stderr
    out = json.loads(second.stdout)
    assert out["session"] == sid and out["how"] == "resumed"
    after = stored(tmp_path, sid)
    assert [m["role"] for m, _ in after] == ["user", "assistant", "user", "assistant"]
    assert after[:2] == [(question, _), (answer, meta)]
    assert after[3][0]["content"] == out["reply"]
    assert out["usage"]["calls"] == out["usage"]["unreported_calls"] == 2


def test_a_reply_cut_off_by_the_output_limit_is_reported(tmp_path, image, project, plain_llm):
    proc = ags(tmp_path, image, project, plain_llm, "run", "Tell me a long story.",
               "--max-output-tokens", "1", "--json")  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["stopped"] == "cut off"
    assert "cut off by its output limit" in proc.stderr
    [_, (answer, meta)] = stored(tmp_path, only_session(tmp_path))
    assert meta["done_reason"] == "length" and answer["content"]


def test_the_servers_context_overflow_leads_to_compaction_through_the_real_model(
    tmp_path, image, project, plain_llm
):
    """The window is 512 tokens: two turns of notes do not fit. Streamed, the
    server answers the overflow with an empty 200; unstreamed, with its 400."""
    garden = notes("garden", "The tomato bed number {} gets water every morning.", 10)
    orchard = notes("orchard", "The apple tree in row {} was pruned in March.", 20)
    first = ags(tmp_path, image, project, plain_llm, "run", garden, "--max-output-tokens", "24")
    assert first.returncode in FINISHED_OR_CUT_OFF, first.stderr
    sid = only_session(tmp_path)
    second = ags(tmp_path, image, project, plain_llm, "run", "--resume", sid, orchard,
                 "--max-output-tokens", "24", "--json")  # fmt: skip
    assert second.returncode in FINISHED_OR_CUT_OFF, second.stderr
    assert "empty event stream; asking again unstreamed" in second.stderr
    assert "compacted: about" in second.stderr
    with Store.open(tmp_path / "store") as s:
        kinds = [e.node.type for e in s.log(sid)][::-1]
        context = s.context(sid)
        history = [e.message for e in s.log(sid)][::-1]
    assert kinds == ["message", "message", "compaction", "message", "message"]
    assert context[0]["content"].startswith("Summary of the conversation so far")
    assert context[1] == {"role": "user", "content": orchard}
    assert history[0]["content"] == garden  # nothing is lost from the transcript
    assert json.loads(second.stdout)["usage"]["calls"] == 3  # answer, summary, answer


def test_a_tool_calling_turn(tmp_path, image, project, tools_llm):
    """chatml-function-calling calls tools with tool_choice set, and only unstreamed."""
    proc = ags(tmp_path, image, project, tools_llm, "run",
               "Use the list_files tool to list the files in the project.",
               "--max-steps", "2", "--max-output-tokens", "64", "--json")  # fmt: skip
    assert proc.returncode in FINISHED_OR_CUT_OFF, proc.stderr
    assert "empty event stream; asking again unstreamed" in proc.stderr
    out = json.loads(proc.stdout)
    history = stored(tmp_path, out["session"])
    (ask, meta) = history[1]
    calls = ask["tool_calls"]
    assert calls and all(c["name"] in TOOLS and c["id"] for c in calls)
    assert meta["streamed"] is False  # the tool call came unstreamed ...
    assert meta["usage"]["prompt_tokens"] > 500  # ... with real counts: the tools are in it
    results = [m for m, _ in history[2 : 2 + len(calls)]]
    assert [r["role"] for r in results] == ["tool"] * len(calls)
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in calls]
    assert out["usage"]["unreported_calls"] == 0 and out["usage"]["calls"] == out["model_calls"]


def test_a_server_that_went_down_changes_nothing(tmp_path, image, project):
    log = tmp_path / "llm.log"
    with llm_server(log, n_ctx=512) as server:
        url = server.url
        first = ags(tmp_path, image, project, url, "run", "Hello.", "--max-output-tokens", "8")
        assert first.returncode in FINISHED_OR_CUT_OFF, first.stderr
        sid = only_session(tmp_path)
        stop(server.process, signal.SIGKILL)  # the server crashes
        before = tree_snapshot(tmp_path / "store")
        proc = ags(tmp_path, image, project, url, "run", "--resume", sid, "Are you there?")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith(f"ags: no reply from the model server at {url}")
    assert tree_snapshot(tmp_path / "store") == before
