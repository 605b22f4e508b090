"""The agent loop end to end: the installed ``ags`` script, a real Docker sandbox,
and a model server on 127.0.0.1 speaking the real wire formats.

The model is the only fake (no LLM runs here); it is scripted per test.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import pytest
from conftest import tree_snapshot
from docker_fixture import owned_project
from model_server import FakeModelServer

from agent.loop import UNKNOWN_OUTCOME, Agent
from agent.messages import CallIdFilter, context_call_ids
from agent.models import make_client
from agent.tools import Toolbox
from objstore import Store
from objstore.fsck import check_store

AGS = str(Path(sys.executable).with_name("ags"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    p.mkdir()
    (p / "README.md").write_text("# demo\n")
    return owned_project(p)  # a person's, so the sandbox (never root) can write it


def env_for(tmp_path: Path, server: FakeModelServer, image: str) -> dict[str, str]:
    env = {
        **os.environ,
        "AGS_STORE": str(tmp_path / "store"),
        "AGS_BASE_URL": server.url,
        "AGS_IMAGE": image,
    }
    env.pop("OLLAMA_HOST", None)
    return env


def ags(
    env: dict[str, str], cwd: Path, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [AGS, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def messages(store_path: Path, sid: str) -> list[dict[str, Any]]:
    with Store.open(store_path) as s:
        return [e.message for e in s.log(sid)][::-1]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def sandboxes_of(project: Path) -> list[Any]:
    client = docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": f"ags.project={project}"})
    finally:
        client.close()


def remove_containers(project: Path) -> None:
    """Containers a killed ags left behind (it cannot remove its own after SIGKILL)."""
    client = docker.from_env()
    try:
        for c in client.containers.list(all=True, filters={"label": f"ags.project={project}"}):
            c.remove(force=True)
    finally:
        client.close()


def wait_for(predicate, timeout: float = 90.0) -> None:
    # generous: under load a run's sandbox start alone has taken more than 30 s
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting")
        time.sleep(0.05)


# -- a working session -----------------------------------------------------------


def test_multi_turn_session_with_tools_that_change_the_project(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    server.add(
        {
            "text": "Writing it.",
            "tool_calls": [call("write_file", path="hello.txt", content="hi\n")],
        },
        {"tool_calls": [call("shell", command="cat hello.txt && echo made > made.txt")]},
        {"text": "Done: hello.txt and made.txt."},
    )
    first = ags(env, project, "run", "make two files", "--yes-tools", "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["reply"] == "Done: hello.txt and made.txt." and out["tool_calls"] == 2
    assert (project / "hello.txt").read_text() == "hi\n"
    assert (project / "made.txt").read_text() == "made\n"
    sid = out["session"]

    server.add({"text": "Still here."})
    second = ags(env, project, "run", "--continue", "anything else?", "--yes-tools")
    assert second.returncode == 0, second.stderr
    assert "Still here." in second.stdout

    roles = [m["role"] for m in messages(tmp_path / "store", sid)]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant",
                     "user", "assistant"]  # fmt: skip
    shell_result = messages(tmp_path / "store", sid)[4]
    assert shell_result["name"] == "shell" and "hi" in shell_result["content"]
    # The model saw the whole conversation, system prompt first and never stored.
    last = server.chat_bodies()[-1]["messages"]
    assert last[0]["role"] == "system"
    assert [m["role"] for m in last[1:]] == roles[:-1]
    assert all(m["role"] != "system" for m in messages(tmp_path / "store", sid))
    with Store.open(tmp_path / "store") as s:
        state = s.state_at(sid)
        assert state["tool_calls"] == {"write_file": 1, "shell": 1}
        assert state["usage"]["prompt_tokens"] > 0 and state["usage"]["completion_tokens"] > 0
        assert s.session(sid).root == str(project)
        assert s.head(project).session == sid  # HEAD follows the chat


def test_mutating_tools_are_refused_without_approval(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    server.add({"tool_calls": [call("write_file", path="x.txt", content="no")]}, {"text": "ok"})
    proc = ags(env, project, "run", "write x", "--json")
    assert proc.returncode == 0, proc.stderr
    assert not (project / "x.txt").exists()
    sid = json.loads(proc.stdout)["session"]
    assert "declined" in messages(tmp_path / "store", sid)[2]["content"]


def test_openai_wire_format_works_too(tmp_path, image, project):
    with FakeModelServer(flavor="vllm", models=("qwen3",)) as server:
        env = env_for(tmp_path, server, image)
        server.add(
            {"tool_calls": [call("list_files", path=".")]},
            {"text": "There is a README."},
        )
        proc = ags(env, project, "run", "what is here?", "--provider", "openai",
                   "--model", "qwen3", "--json")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["reply"] == "There is a README."
        assert server.chat_bodies()[0]["stream"] is True


# -- crashes, interrupts, retries -------------------------------------------------


def start_run(env, project, *args):
    return subprocess.Popen(
        [AGS, "run", *args], env=env, cwd=project, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def last_role(store_path: Path) -> str | None:
    try:
        with Store.open(store_path) as s:
            rows = s.sessions()
            if not rows or rows[0].head is None:
                return None
            return s.blob(s.node(rows[0].head).content).get("role")
    except Exception:
        return None


def test_kill_9_in_the_middle_of_a_tool_then_resume(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    store_path = tmp_path / "store"
    server.add(
        {
            "text": "Sleeping.",
            "tool_calls": [call("shell", command="sleep 60; echo late > late.txt")],
        }
    )
    proc = start_run(env, project, "take a nap", "--yes-tools")
    try:
        wait_for(lambda: last_role(store_path) == "assistant")  # the tool call is running
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert len(sandboxes_of(project)) == 1  # left behind: SIGKILL allows no clean-up
    except BaseException:
        remove_containers(project)
        raise
    with Store.open(store_path) as s:
        sid = s.sessions()[0].id
    before = messages(store_path, sid)
    assert [m["role"] for m in before] == ["user", "assistant"]

    server.add({"text": "I will check the workspace first."})
    resumed = ags(env, project, "run", "--resume", sid, "what happened?", "--json")
    assert resumed.returncode == 0, resumed.stderr
    after = messages(store_path, sid)
    assert after[:2] == before  # nothing lost
    assert after[2]["role"] == "tool" and after[2]["content"] == UNKNOWN_OUTCOME
    assert after[2]["tool_call_id"] == before[1]["tool_calls"][0]["id"]
    assert [m["role"] for m in after[3:]] == ["user", "assistant"]
    assert not (project / "late.txt").exists()  # never replayed
    assert sandboxes_of(project) == []  # the next start removed the orphan, then its own
    with Store.open(store_path) as s:
        assert check_store(s).ok


def session_messages(store_path: Path) -> int:
    """Messages of the newest session so far (0 while there is none)."""
    try:
        with Store.open(store_path) as s:
            rows = s.sessions()
            return rows[0].messages if rows else 0
    except Exception:
        return 0


def test_a_crashed_tool_call_is_answered_even_when_the_server_reuses_its_ids(
    tmp_path, image, project
):
    """Issue 8: a server whose id counter restarts (call_0_0 again) gave both
    turns' calls one id, and recovery, matching results by id across the whole
    context, thought the crashed call was answered."""
    store_path = tmp_path / "store"

    def restarted_server() -> FakeModelServer:
        return FakeModelServer(call_ids="counter")

    with restarted_server() as server:
        env = env_for(tmp_path, server, image)
        server.add(
            {"tool_calls": [call("shell", command="echo proof > proof.txt")]},
            {"text": "Written."},
        )
        first = ags(env, project, "run", "write the proof file", "--yes-tools", "--json")
        assert first.returncode == 0, first.stderr
        sid = json.loads(first.stdout)["session"]
    assert (project / "proof.txt").read_text() == "proof\n"

    with restarted_server() as server:
        env = env_for(tmp_path, server, image)
        long_job = call("shell", command="sleep 60; echo late > late.txt")
        server.add({"text": "Starting.", "tool_calls": [long_job]})
        proc = start_run(env, project, "--resume", sid, "start a long job", "--yes-tools")
        try:
            wait_for(lambda: session_messages(store_path) == 6)  # the long call is running
            time.sleep(0.5)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            remove_containers(project)
        if proc.stdout is not None:
            proc.stdout.close()
            proc.stderr.close()

    with restarted_server() as server:
        env = env_for(tmp_path, server, image)
        server.add({"text": "The long job was cut short; I will check."})
        third = ags(env, project, "run", "--resume", sid, "what happened?", "--json")
        assert third.returncode == 0, third.stderr
        sent = server.chat_bodies()[0]["messages"]

    stored = messages(store_path, sid)
    assert [m["role"] for m in stored] == [
        "user", "assistant", "tool", "assistant",
        "user", "assistant", "tool",  # the crashed call, answered on resume
        "user", "assistant",
    ]  # fmt: skip
    crashed, unknown = stored[5], stored[6]
    assert unknown["content"] == UNKNOWN_OUTCOME
    assert unknown["tool_call_id"] == crashed["tool_calls"][0]["id"]
    ids = [c["id"] for m in stored for c in m.get("tool_calls", [])]
    assert len(set(ids)) == len(ids) == 2  # unique within the session ...
    assert [c.get("server_id", c["id"]) for m in stored for c in m.get("tool_calls", [])] == [
        "call_0_0", "call_0_0"
    ]  # ... and what the server said is kept  # fmt: skip
    # The model was told, in order: the call, its unknown outcome, then the question.
    roles = [m["role"] for m in sent[1:]]
    assert roles == [m["role"] for m in stored[:-1]]
    asked, told = sent[6], sent[7]  # sent[0] is the system prompt
    assert told["role"] == "tool" and told["tool_call_id"] == asked["tool_calls"][0]["id"]
    assert not (project / "late.txt").exists()


@pytest.fixture
def agent_on(tmp_path, project):
    """An Agent in this process on a new session, over ``server`` with ``provider``;
    tools that need no sandbox only (list_files, read_file)."""
    made: list[Agent] = []

    def make(server: FakeModelServer, provider: str, store: Store) -> Agent:
        client = make_client(provider, server.url, "gemma4")
        sid = store.new_session(root=project)
        agent = Agent(store, sid, client, Toolbox(project, None, {}))
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close()
        agent.client.close()


def assert_results_follow_their_calls(history: list[dict[str, Any]]) -> None:
    for i, message in enumerate(history):
        if message["role"] == "tool":
            j = i - 1
            while history[j]["role"] == "tool":
                j -= 1
            assert message["tool_call_id"] in {c["id"] for c in history[j]["tool_calls"]}


@pytest.mark.parametrize("provider", ["ollama", "openai"])
@pytest.mark.parametrize(
    "quirk",
    [
        {"omit_ids": True},  # old Ollama: no id at all
        {"empty_ids": True},  # "id": ""
        "repeat",  # the same ids in every turn, and twice in one reply
    ],
)
def test_tool_call_ids_are_unique_whatever_the_server_sends(
    tmp_path, project, agent_on, provider, quirk
):
    with FakeModelServer() as server, Store.open(tmp_path / "store") as store:
        agent = agent_on(server, provider, store)
        for turn in range(2):
            calls = [call("list_files", path="."), call("read_file", path="README.md")]
            if quirk == "repeat":
                calls = [{**c, "id": "call_1"} for c in calls]
                reply: dict[str, Any] = {"tool_calls": calls}
            else:
                reply = {"tool_calls": calls, **quirk}
            server.add(reply, {"text": f"done {turn}"})
            result = agent.turn(f"look {turn}")
            assert result.stopped is None and result.tool_calls == 2
        stored = [e.message for e in store.log(agent.sid)][::-1]
        sent = server.chat_bodies()[-1]["messages"]
    calls = [c for m in stored for c in m.get("tool_calls", [])]
    ids = [c["id"] for c in calls]
    assert len(ids) == 4 and all(ids) and len(set(ids)) == 4
    if quirk == "repeat":
        assert [c["server_id"] for c in calls[1:]] == ["call_1"] * 3
        assert calls[0]["id"] == "call_1" and "server_id" not in calls[0]
    else:
        assert all(c["id_synthesized"] and "server_id" not in c for c in calls)
    assert_results_follow_their_calls(stored)
    # What went back to the server is what was stored: the same unique ids.
    sent_calls = [c["id"] for m in sent for c in m.get("tool_calls", [])]
    assert sent_calls == ids
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ids
    assert [m["content"] for m in stored if m["role"] == "tool"][1].startswith("# demo")


def test_an_id_compacted_away_is_still_not_reused(tmp_path, project, agent_on):
    """A server that restarts its counter after a compaction sends call_0_0 again;
    the first call_0_0 is no longer in the context, but it is in the session."""
    with FakeModelServer() as server, Store.open(tmp_path / "store") as store:
        agent = agent_on(server, "ollama", store)
        reused = {**call("list_files", path="."), "id": "call_0_0"}
        server.add({"tool_calls": [reused]}, {"text": "one file"})
        agent.turn("what is here?")
        server.add({"text": "nothing else"})
        agent.turn("anything else?")
        server.add({"text": "they listed the files"})  # the summary of the first turn
        assert agent.compact()
        assert "call_0_0" not in context_call_ids(store.context(agent.sid))
        server.add({"tool_calls": [reused]}, {"text": "still one file"})
        agent.turn("and now?")
        resumed = Agent(store, None, agent.client, agent.toolbox, base=store.node_id(agent.sid),
                        create=lambda: store.fork(agent.sid))  # fmt: skip
        ids = [c["id"] for e in store.log(agent.sid) for c in e.message.get("tool_calls", [])]
    assert ids[1] == "call_0_0" and ids[0] != "call_0_0"  # newest first
    second = next(e.message for e in store.log(agent.sid) if e.message.get("tool_calls"))
    assert second["tool_calls"][0]["server_id"] == "call_0_0"
    assert "call_0_0" in resumed._compacted  # read back from the compaction node


def test_the_compacted_ids_filter_is_the_one_format_md_describes() -> None:
    ids = ["call_0_0", "call__0_list_files_cmpl-4d2c", "chatcmpl-tool-9f"]
    kept = CallIdFilter()
    for call_id in ids:
        kept.add(call_id)
    text = kept.hex()
    number = int(text, 16)
    assert len(text) == 1024 and text == text.lower()
    for call_id in ids:
        digest = hashlib.blake2b(call_id.encode(), digest_size=16).digest()
        for j in range(4):
            assert number >> (int.from_bytes(digest[4 * j : 4 * j + 4], "big") % 4096) & 1
    assert bin(number).count("1") <= 12
    again = CallIdFilter.from_hex(text)
    assert all(i in again for i in ids) and "call_0_1" not in again
    assert CallIdFilter.from_hex("not a filter").bits == 0


def test_an_open_call_inside_the_context_is_answered_in_the_request(tmp_path, project, agent_on):
    """A session stored before results were matched by position can hold a call
    with no result followed by more turns; a server must still get a result."""
    with FakeModelServer(flavor="vllm") as server, Store.open(tmp_path / "store") as store:
        agent = agent_on(server, "openai", store)
        open_call = {"id": "call_0_0", "name": "shell", "arguments": {"command": "sleep 60"}}
        for message in (
            {"role": "user", "content": "start a long job"},
            {"role": "assistant", "content": "", "tool_calls": [open_call]},
            {"role": "user", "content": "what happened?"},
            {"role": "assistant", "content": "no idea"},
        ):
            store.append(agent.sid, message)
        assert agent.recover() == 0  # not the last batch: an append cannot answer it
        server.add({"text": "ok"})
        agent.turn("and now?")
        sent = server.chat_bodies()[0]["messages"]
    assert [m["role"] for m in sent] == [
        "system", "user", "assistant", "tool", "user", "assistant", "user"
    ]  # fmt: skip
    assert sent[3]["tool_call_id"] == "call_0_0" and sent[3]["content"] == UNKNOWN_OUTCOME


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["ctrl-c", "hangup"])
def test_ctrl_c_during_a_tool_keeps_everything_and_resumes_cleanly(
    tmp_path, server, image, project, signum
):
    """SIGHUP (the terminal closed) too: it killed ags and left its sandbox running."""
    env = env_for(tmp_path, server, image)
    store_path = tmp_path / "store"
    server.add({"tool_calls": [call("shell", command="sleep 60"), call("shell", command="true")]})
    proc = start_run(env, project, "nap", "--yes-tools")
    wait_for(lambda: last_role(store_path) == "assistant")
    time.sleep(0.5)
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 130, proc.stderr.read()
    assert sandboxes_of(project) == []
    with Store.open(store_path) as s:
        sid = s.sessions()[0].id
    results = [m for m in messages(store_path, sid) if m["role"] == "tool"]
    assert "Interrupted by the user" in results[0]["content"]
    assert "Not run" in results[1]["content"]
    server.add({"text": "fine"})
    resumed = ags(env, project, "run", "--continue", "go on")
    assert resumed.returncode == 0, resumed.stderr
    assert "outcome" not in resumed.stderr  # nothing was left unanswered
    assert not any(m.get("content") == UNKNOWN_OUTCOME for m in messages(store_path, sid))


def test_a_dropped_stream_is_retried_counted_and_not_duplicated(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    server.add(
        {"text": "hello there world", "chunks": 3, "drop_after": 1},
        {"text": "hello there world", "chunks": 3},
    )
    proc = ags(env, project, "run", "hi", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["reply"] == "hello there world" and out["retries"] == 1
    assistant = [
        m for m in messages(tmp_path / "store", out["session"]) if m["role"] == "assistant"
    ]
    assert [m["content"] for m in assistant] == ["hello there world"]
    bodies = server.chat_bodies()
    assert len(bodies) == 2 and bodies[0] == bodies[1]  # the retry asked the same thing
    server.add(
        {"text": "hello there world", "chunks": 3, "drop_after": 1},
        {"text": "hello there world", "chunks": 3},
    )
    plain = ags(env, project, "run", "hi again")
    assert plain.returncode == 0, plain.stderr
    cut, answer = plain.stdout.splitlines()  # the part cut off ends its own line
    assert answer == "hello there world" and "hello there world".startswith(cut), plain.stdout
    assert "the answer above was cut off; it starts over below" in plain.stderr


def test_a_deleted_checked_out_session_does_not_stop_the_next_run(tmp_path, server, image, project):
    """Once the session HEAD named was deleted, every run in the project failed
    ("HEAD names session ..., which no longer exists"), a new session or another one."""
    env = env_for(tmp_path, server, image)
    first = json.loads(ags(env, project, "run", "hi", "--json").stdout)["session"]
    other = json.loads(ags(env, project, "run", "hi again", "--json").stdout)["session"]
    assert ags(env, project, "checkout", first).returncode == 0
    assert ags(env, project, "delete", first, "--yes").returncode == 0
    new = ags(env, project, "run", "and now?", "--json")
    assert new.returncode == 0, new.stderr
    assert ags(env, project, "delete", json.loads(new.stdout)["session"], "--yes").returncode == 0
    resumed = ags(env, project, "run", "--resume", other, "go on", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(ags(env, project, "status", "--json").stdout)["head"]["session"] == other


def test_a_model_that_is_not_there_is_a_clear_error(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    proc = ags(env, project, "run", "hi", "--model", "nope")
    assert proc.returncode == 1
    assert proc.stderr.startswith("ags: ") and "nope" in proc.stderr and "not found" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- compaction ----------------------------------------------------------------------


def test_automatic_compaction_then_resume(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    store_path = tmp_path / "store"
    words = "lorem ipsum dolor sit amet " * 40  # ~1,000 characters a message
    budget = "3000"
    sid = None
    compacted_at = None
    for turn in range(8):
        server.add({"text": f"answer {turn}: {words}"})
        args = ["run", f"question {turn}: {words}", "--max-context-tokens", budget, "--json"]
        if sid:
            args[1:1] = ["--resume", sid]
        proc = ags(env, project, *args)
        assert proc.returncode == 0, proc.stderr
        sid = json.loads(proc.stdout)["session"]
        with Store.open(store_path) as s:
            if any(e.node.is_compaction for e in s.log(sid)):
                compacted_at = turn
                break
        # the summary request takes the next reply in the queue: give it a short one
        server.add({"text": f"summary after turn {turn}"})
    assert compacted_at is not None, "no compaction happened"
    with Store.open(store_path) as s:
        log = list(s.log(sid))
        context = s.context(sid)
        users = [e.message["content"] for e in log if e.message.get("role") == "user"]
        assert all(f"question {t}: " in "".join(users) for t in range(compacted_at + 1))
        assert context[0]["content"].startswith("Summary of the conversation so far")
        assert context[1]["content"].startswith(f"question {compacted_at}")
        state = s.state_at(sid)
    # The summary call's tokens count too.
    total_completion = sum(e.node.meta.get("usage", {}).get("completion_tokens", 0) for e in log)
    assert state["usage"]["completion_tokens"] == total_completion
    server.add({"text": "resumed after compaction"})
    proc = ags(env, project, "run", "--resume", sid, "go on", "--max-context-tokens", budget)
    assert proc.returncode == 0, proc.stderr
    sent = server.chat_bodies()[-1]["messages"]
    assert sent[0]["role"] == "system" and sent[1]["content"].startswith("Summary of")


def test_a_summary_that_does_not_shrink_changes_nothing_and_the_loop_stops(
    tmp_path, server, image, project
):
    env = env_for(tmp_path, server, image)
    store_path = tmp_path / "store"
    words = "lorem ipsum dolor sit amet " * 40
    server.add({"text": "first"})
    proc = ags(env, project, "run", f"one {words}", "--json")
    sid = json.loads(proc.stdout)["session"]
    server.add({"text": "second"})
    ags(env, project, "run", "--resume", sid, f"two {words}")
    before = messages(store_path, sid)
    # The smallest budget ags accepts (the system prompt and the tool definitions
    # take most of it) leaves room for one turn, not three.
    refused = ags(env, project, "run", "--resume", sid, "x", "--max-context-tokens", "256")
    found = re.search(r"--max-context-tokens (\d+)\)", refused.stderr)
    assert found, refused.stderr
    least = int(found.group(1))
    server.add({"text": words * 10})  # the "summary": longer than what it summarises
    proc = ags(env, project, "run", "--resume", sid, f"three {words}",
               "--max-context-tokens", str(least + 100))  # fmt: skip
    assert proc.returncode == 1
    assert "did not shrink" in proc.stderr and "even after compaction" in proc.stderr
    assert messages(store_path, sid) == before  # not even the question: nothing to trip over
    with Store.open(store_path) as s:
        assert not any(e.node.is_compaction for e in s.log(sid))


# -- forks, locks, archive, project --------------------------------------------------


def test_fork_in_the_middle_and_continue_both_branches(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    store_path = tmp_path / "store"
    sid = None
    for turn in range(3):
        server.add({"text": f"answer {turn}"})
        args = ["run", f"question {turn}", "--json"] + (["--resume", sid] if sid else [])
        sid = json.loads(ags(env, project, *args).stdout)["session"]
    server.add({"text": "branch answer"})
    forked = json.loads(ags(env, project, "run", "--resume", f"{sid}~2", "branch", "--json").stdout)
    assert forked["how"] == "forked" and forked["session"] != sid
    server.add({"text": "main answer"})
    main = json.loads(ags(env, project, "run", "--resume", sid, "main", "--json").stdout)
    assert main["session"] == sid
    branch = [m["content"] for m in messages(store_path, forked["session"])]
    trunk = [m["content"] for m in messages(store_path, sid)]
    assert branch == trunk[:4] + ["branch", "branch answer"]
    assert trunk[-2:] == ["main", "main answer"] and len(trunk) == 8


def test_a_second_chat_on_an_open_session_is_refused(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    server.add({"text": "hi"})
    sid = json.loads(ags(env, project, "run", "hello", "--json").stdout)["session"]
    chat = subprocess.Popen(
        [AGS, "chat", "--resume", sid], env=env, cwd=project, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        banner = chat.stderr.readline()
        assert "ags chat: session" in banner
        second = ags(env, project, "run", "--resume", sid, "me too")
        assert second.returncode == 1
        assert f"process {chat.pid}" in second.stderr and second.stderr.count("\n") == 1
        chat.stdin.write("\\title renamed\n\\info\n\\exit\n")
        chat.stdin.flush()
        assert chat.wait(timeout=30) == 0
        assert "title: renamed" in chat.stdout.read()
    finally:
        if chat.poll() is None:
            chat.kill()
            remove_containers(project)


def test_an_archived_session_cannot_be_resumed(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    server.add({"text": "hi"})
    sid = json.loads(ags(env, project, "run", "hello", "--json").stdout)["session"]
    assert ags(env, project, "archive", sid).returncode == 0
    before = tree_snapshot(tmp_path / "store")
    proc = ags(env, project, "run", "--resume", sid, "again")
    assert proc.returncode == 1 and "archived" in proc.stderr and "unarchive" in proc.stderr
    assert tree_snapshot(tmp_path / "store") == before


def test_resume_checks_the_project_root(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    server.add({"text": "hi"})
    sid = json.loads(ags(env, project, "run", "hello", "--json").stdout)["session"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = ags(env, elsewhere, "run", "--resume", sid, "again")
    assert proc.returncode == 1 and str(project) in proc.stderr and "--project" in proc.stderr
    server.add({"text": "ok"})
    proc = ags(env, elsewhere, "run", "--resume", sid, "again", "--project", str(project))
    assert proc.returncode == 0, proc.stderr


def test_without_docker_chat_says_so_and_management_still_works(tmp_path, server, project):
    env = {**env_for(tmp_path, server, "none"), "DOCKER_HOST": "unix:///nonexistent.sock"}
    proc = ags(env, project, "run", "hello")
    assert proc.returncode == 1 and "no Docker engine" in proc.stderr
    assert not (tmp_path / "store" / "refs" / "sessions").exists() or not list(
        (tmp_path / "store" / "refs" / "sessions").iterdir()
    )
    with Store.open(tmp_path / "store") as s:
        sid = s.new_session(title="kept")
    for args in (["sessions"], ["info", sid], ["fsck"], ["du"]):
        assert ags(env, project, *args).returncode == 0


def test_chat_backslash_commands(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    store_path = tmp_path / "store"
    server.add(
        {"text": "hi there " + "and a long story " * 100},
        {"text": "second answer"},
        {"text": "they said hello twice"},  # the summary \compact asks for
    )
    script = "\n".join([
        "hello", "\\title greetings", "\\info", "\\sessions", "\\log", "\\fork",
        "and again", "\\compact the greetings", "\\rewind 1", "\\help", "\\bogus", "\\exit",
    ]) + "\n"  # fmt: skip
    proc = subprocess.run(
        [AGS, "chat"], env=env, cwd=project, input=script, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out, err = proc.stdout, proc.stderr
    assert "hi there" in out and "second answer" in out
    assert "title: greetings" in out and "tokens used:" in out
    assert "\\compact [focus]" in out  # \help
    assert "unknown command \\bogus" in err
    with Store.open(store_path) as s:
        rows = s.sessions()
        main = next(r for r in rows if r.title == "greetings")
        fork = next(r for r in rows if r.id != main.id)
        assert f"forked: {fork.id}" in out
        assert fork.messages == 2  # forked after the first answer
        log = list(s.log(main.id))
        # \rewind 1 went back past the compaction node to the last answer
        assert log[0].message["content"] == "second answer"
        assert any(e.node.is_compaction for e in s.log(f"{main.id}@{{1}}"))
        compaction = next(e for e in s.log(f"{main.id}@{{1}}") if e.node.is_compaction)
        assert compaction.node.meta["focus"] == "the greetings"
    assert "Focus on: the greetings" in server.chat_bodies()[2]["messages"][-1]["content"]


def test_a_server_that_says_the_context_is_too_long_gets_a_compacted_one(
    tmp_path, server, image, project
):
    env = env_for(tmp_path, server, image)
    words = "lorem ipsum dolor sit amet " * 40
    server.add({"text": f"first answer {words}"})
    sid = json.loads(ags(env, project, "run", f"first {words}", "--json").stdout)["session"]
    server.add(
        {"context_overflow": "vllm"},  # the budget ags knows is wrong: the server refuses
        {"text": "they asked about lorem ipsum"},  # the summary
        {"text": "answered after compacting"},
    )
    proc = ags(env, project, "run", "--resume", sid, "second question", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["reply"] == "answered after compacting"
    retried = server.chat_bodies()[-1]["messages"]
    assert retried[1]["content"].startswith("Summary of the conversation so far")
    assert retried[2]["content"] == "second question"
    with Store.open(tmp_path / "store") as s:
        # the question and its answer come after the compaction that made room for them
        assert [e.node.type for e in s.log(sid)][:3] == ["message", "message", "compaction"]


def test_ctrl_c_while_waiting_for_the_model_keeps_the_question(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    store_path = tmp_path / "store"
    server.add({"text": "too late", "delay": 30})
    proc = start_run(env, project, "a slow question")
    wait_for(lambda: len(server.chat_bodies()) == 1)  # the model is "thinking"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130, proc.stderr.read()
    with Store.open(store_path) as s:
        sid = s.sessions()[0].id
    assert [m["content"] for m in messages(store_path, sid)] == ["a slow question"]
    server.add({"text": "answered"})
    resumed = ags(env, project, "run", "--continue", "again")
    assert resumed.returncode == 0, resumed.stderr
    assert [m["role"] for m in messages(store_path, sid)] == ["user", "user", "assistant"]


# -- a failed turn, a cut-off reply, budgets, usage (issue 8) ---------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_turn_session(tmp_path: Path, server: FakeModelServer, image: str, project: Path) -> str:
    server.add({"text": "first answer"})
    proc = ags(env_for(tmp_path, server, image), project, "run", "first question", "--json")
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["session"])


@pytest.mark.parametrize("failure", ["server down", "bad base URL", "context overflow"])
def test_a_run_that_fails_before_the_model_answers_writes_nothing(
    tmp_path, server, image, project, failure
):
    store_path = tmp_path / "store"
    sid = one_turn_session(tmp_path, server, image, project)
    env = env_for(tmp_path, server, image)
    if failure == "server down":
        env["AGS_BASE_URL"] = f"http://127.0.0.1:{free_port()}"
    elif failure == "bad base URL":
        env["AGS_BASE_URL"] = server.url.removeprefix("http://")
    else:
        # the first question of a new session is already too long: nothing to compact
        server.add({"context_overflow": "vllm"}, {"context_overflow": "vllm"})
    before = tree_snapshot(store_path)
    for args in (["run", "a new session"], ["run", "--resume", sid, "go on"]):
        proc = ags(env, project, *args)
        assert proc.returncode == 1, proc.stderr
        last = proc.stderr.splitlines()[-1]
        assert last.startswith("ags: ") and "Traceback" not in proc.stderr, proc.stderr
        assert tree_snapshot(store_path) == before  # no session, no question, no HEAD move
    if failure == "bad base URL":
        assert "did you mean http://127.0.0.1:" in proc.stderr
    # and the session goes on as if the failed turns had not been tried
    server.add({"text": "second answer"})
    proc = ags(env_for(tmp_path, server, image), project, "run", "--resume", sid, "again")
    assert proc.returncode == 0, proc.stderr
    sent = server.chat_bodies()[-1]["messages"]
    assert [m["content"] for m in sent[1:]] == ["first question", "first answer", "again"]


def test_a_cut_off_tool_call_is_not_run(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    cut = {"name": "write_file", "arguments_raw": '{"path": "cut.txt", "content": "hal'}
    server.add({"tool_calls": [cut], "done_reason": "length"})
    proc = ags(env, project, "run", "write it", "--yes-tools", "--json")
    assert proc.returncode == 3, proc.stderr  # stopped early
    out = json.loads(proc.stdout)
    assert out["stopped"] == "cut off" and out["done_reason"] == "length"
    assert "cut off by its output limit" in proc.stderr and "1 tool call(s)" in proc.stderr
    assert not (project / "cut.txt").exists()
    stored = messages(tmp_path / "store", out["session"])
    assert [m["role"] for m in stored] == ["user", "assistant", "tool"]
    assert stored[2]["content"].startswith("[ags] Not run: the reply was cut off")
    assert len(server.chat_bodies()) == 1  # and the model was not asked again


def test_a_cut_off_answer_is_reported(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    server.add({"text": "The three steps are: first, open", "done_reason": "length"})
    proc = ags(env, project, "run", "explain")
    assert proc.returncode == 3
    assert proc.stdout.startswith("The three steps are: first, open")
    assert "cut off by its output limit" in proc.stderr and "incomplete" in proc.stderr


def test_a_budget_the_fixed_prompt_fills_is_refused_up_front(tmp_path, server, image, project):
    sid = one_turn_session(tmp_path, server, image, project)
    before = tree_snapshot(tmp_path / "store")
    env = env_for(tmp_path, server, image)
    asked = len(server.chat_bodies())
    proc = ags(env, project, "run", "--resume", sid, "hi", "--max-context-tokens", "300")
    assert proc.returncode == 1
    assert "the system prompt and the tool definitions alone take about" in proc.stderr
    least = int(proc.stderr.split("--max-context-tokens ")[-1].split(")")[0])
    # a question that cannot fit whatever is summarised: refused before any summary call
    big = "word " * (4 * least)
    proc = ags(env, project, "run", "--resume", sid, big, "--max-context-tokens", str(least))
    assert proc.returncode == 1 and "compaction cannot make that fit" in proc.stderr
    assert len(server.chat_bodies()) == asked  # no model call at all
    assert tree_snapshot(tmp_path / "store") == before


def test_the_servers_counts_calibrate_the_context_size(tmp_path, project, agent_on):
    """Dense text (digits) takes about twice the tokens of the 4-characters guess;
    where the server counts, compaction comes when the real count says so."""
    digits = "3141592653 " * 300  # 3,300 characters: ~825 tokens by the guess
    with FakeModelServer() as server, Store.open(tmp_path / "store") as store:
        agent = agent_on(server, "ollama", store)
        agent.max_context_tokens = 4000
        guess = agent.context_tokens()
        server.add({"text": "noted", "usage": {"prompt_tokens": 3300, "completion_tokens": 2}})
        agent.turn(digits)
        assert agent.context_tokens() >= 3300 + 2
        assert agent.tokens.chars_per_token < 2.5  # calibrated on the count
        assert store.state_at(agent.sid)["usage"]["chars_per_token"] < 2.5  # and kept for resume
        server.add({"text": "summary of the digits"}, {"text": "ok"})
        agent.turn("and now?")  # over 80% of 4,000 by the count: compacted first
        log = list(store.log(agent.sid))
    assert guess < 1200  # the 4-characters guess: no compaction before the count came
    assert any(e.node.is_compaction for e in log)


@pytest.mark.parametrize(
    ("flavor", "reply", "says"),
    [
        ("llama_cpp_python", {"text": "hi"}, "not reported by the server (1 model call; about"),
        ("vllm", {"text": "hi", "usage": {"prompt_tokens": 0, "completion_tokens": 0}},
         "0 in, 0 out"),
    ],
)  # fmt: skip
def test_usage_not_reported_is_unknown_not_zero(tmp_path, image, project, flavor, reply, says):
    with FakeModelServer(flavor=flavor) as server:
        env = env_for(tmp_path, server, image)
        server.add(reply)
        proc = ags(env, project, "run", "hi", "--provider", "openai", "--model", "gemma4",
                   "--json")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    sid = json.loads(proc.stdout)["session"]
    with Store.open(tmp_path / "store") as s:
        meta = next(s.log(sid)).node.meta
    info = ags(env, project, "info", sid)
    assert f"tokens:      {says}" in info.stdout
    as_json = json.loads(ags(env, project, "info", sid, "--json").stdout)["usage"]
    if flavor == "vllm":
        assert meta["usage"] == {"prompt_tokens": 0, "completion_tokens": 0}
        assert "usage_estimate" not in meta and as_json["unreported_calls"] == 0
    else:
        assert meta["usage"] == {"prompt_tokens": None, "completion_tokens": None}
        assert meta["usage_estimate"]["prompt_tokens"] > 0
        assert as_json["unreported_calls"] == as_json["calls"] == 1


def test_an_empty_stream_for_an_overflow_leads_to_compaction(tmp_path, image, project):
    """llama-cpp-python: 200 and no event for a prompt over its window."""
    words = "lorem ipsum dolor sit amet " * 40
    with FakeModelServer(flavor="llama_cpp_python", runtime_context=600) as server:
        server.reject_over_context = True
        env = env_for(tmp_path, server, image)
        openai = ["--provider", "openai", "--model", "smollm2"]
        server.add({"text": "first answer"})
        first = ags(env, project, "run", f"first {words}", *openai, "--json")
        assert first.returncode == 0, first.stderr
        sid = json.loads(first.stdout)["session"]
        server.add({"text": "they said lorem ipsum"}, {"text": "answered after compacting"})
        second = ags(env, project, "run", "--resume", sid, f"second {words}", *openai, "--json")
        assert second.returncode == 0, second.stderr
        bodies = server.chat_bodies()[1:]
    assert json.loads(second.stdout)["reply"] == "answered after compacting"
    assert "empty event stream" in second.stderr and "compacted" in second.stderr
    assert [b["stream"] for b in bodies] == [True, False, True, True]  # ask, ask again, sum, ask
    with Store.open(tmp_path / "store") as s:
        assert [e.node.type for e in s.log(sid)][:3] == ["message", "message", "compaction"]


def test_tool_calls_from_a_server_that_cannot_stream_them(tmp_path, image, project):
    with FakeModelServer(flavor="llama_cpp_python", function_calling=True) as server:
        env = env_for(tmp_path, server, image)
        server.add({"tool_calls": [call("list_files", path=".")]}, {"text": "a README"})
        proc = ags(env, project, "run", "what is here?", "--provider", "openai",
                   "--model", "smollm2", "--json")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        bodies = server.chat_bodies()
    assert [b["stream"] for b in bodies] == [True, False, False]  # learnt after the first
    assert all(b["tool_choice"] == "auto" for b in bodies)
    stored = messages(tmp_path / "store", json.loads(proc.stdout)["session"])
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert "README.md" in stored[2]["content"]
    assert json.loads(proc.stdout)["usage"]["unreported_calls"] == 0  # unstreamed: counted


def test_chat_with_piped_input_writes_only_answers_to_stdout(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    server.add({"text": "first"}, {"text": "second"})
    proc = subprocess.run(
        [AGS, "chat"], env=env, cwd=project, input="one\ntwo\n", capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "first\nsecond\n"


def test_a_bad_base_url_does_not_even_make_a_store(tmp_path, server, image, project):
    env = {**env_for(tmp_path, server, image), "AGS_BASE_URL": "localhost:11434"}
    for command in ("run", "chat"):
        proc = subprocess.run(
            [AGS, command, *(["hi"] if command == "run" else [])], env=env, cwd=project,
            capture_output=True, text=True, timeout=60, input="hi\n",
        )  # fmt: skip
        assert proc.returncode == 1
        assert proc.stderr == (
            "ags: unusable model server URL 'localhost:11434': it needs http:// or https:// "
            "(did you mean http://localhost:11434?)\n"
        )
        assert not (tmp_path / "store").exists()
