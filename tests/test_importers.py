"""Importing Claude Code, Codex CLI and Gemini CLI session files (agent/importers).

The fixtures under tests/fixtures/ are written by hand in the shapes those
tools write (see docs/IMPORT.md); tests copy them to a temporary folder, change
them the way the tools do (append, rewind, resume into a new file) and import
again into a real store.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import as_user_without_overrides, tree_snapshot

from agent.importers import import_sessions, records
from agent.importers.records import LINE_DEPTH
from agent.openai_compat import openai_wire_message
from cli.main import cli
from objstore import InvalidInput, Store
from objstore.packs import MAX_KEPT_CONTENT

FIXTURES = Path(__file__).with_name("fixtures")
APP = "-home-ana-app/11111111-1111-4111-8111-111111111111.jsonl"
WEB = "-home-ana-web/22222222-2222-4222-8222-222222222222.jsonl"
AGENT = "-home-ana-web/22222222-2222-4222-8222-222222222222/subagents/agent-a7f3c1d2.jsonl"
CODEX = "sessions/2025/10/29/rollout-2025-10-29T00-59-38-019a2d7a-41c4-78b1-b7cc-a45d62a89cd5.jsonl"
GEMINI_LOG = "tmp/5eb97eaffa8e5484/chats/session-2026-06-10T10-00-9a1b2c3d.jsonl"
OLD_AGENT = "-home-ana-web/agent-e9d04b11.jsonl"  # 2.0.x: beside the session, not under it


@pytest.fixture
def claude(tmp_path: Path) -> Path:
    dst = tmp_path / "claude"
    shutil.copytree(FIXTURES / "claude-code", dst)
    return dst


def by_identity(store: Store) -> dict[str, Any]:
    return {(s.imported or {}).get("identity"): s for s in store.sessions(include_archived=True)}


def check_openai_shape(messages: list[dict[str, Any]], *, open_tail: bool = True) -> None:
    """What an OpenAI-style server insists on: string content, every tool message
    answering a call of the assistant message just before it, every call answered
    before the conversation goes on (calls still running at the very end aside)."""
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        wire = openai_wire_message(m)
        json.dumps(wire)
        assert isinstance(wire["content"], str), m
        assert m["role"] in ("system", "user", "assistant", "tool"), m
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, f"message {i} answers no open call"
            open_calls.discard(m["tool_call_id"])
            continue
        assert not open_calls, f"message {i} comes before calls {open_calls} are answered"
        if m["role"] == "assistant":
            open_calls = {c["id"] for c in m.get("tool_calls", [])}
    assert open_tail or not open_calls


# -- Claude Code --------------------------------------------------------------------------


def test_claude_code_session_maps_to_common_messages(tmp_path: Path, claude: Path) -> None:
    with Store.open(tmp_path / "store") as s:
        rows = import_sessions(s, "claude-code", [claude])
        names = [Path(r.source).name for r in rows]
        assert sorted(names[:2]) == [Path(APP).name, Path(WEB).name]
        # A subagent's file comes after its parent's.
        assert sorted(names[2:]) == [Path(AGENT).name, Path(OLD_AGENT).name]
        assert all(r.status == "created" for r in rows)
        web = by_identity(s)["claude-code:22222222-2222-4222-8222-222222222222"]
        assert web.title == "routes and config"  # the custom-title record
        assert web.root == "/home/ana/web"
        assert web.model == "claude-opus-4-5-20251101"
        assert web.created == "2025-11-20T09:00:00.000Z"  # the first record's time
        msgs = s.context(web.id)
        # Four records of one API message (thinking, text, two tool uses) are one message.
        assistant = msgs[1]
        assert assistant["role"] == "assistant"
        assert assistant["content"] == "I'll read both at once."
        assert assistant["thinking"] == "Two independent reads."
        assert [c["id"] for c in assistant["tool_calls"]] == ["toolu_A", "toolu_B"]
        assert assistant["tool_calls"][1]["arguments"]["subagent_type"] == "general-purpose"
        assert len(assistant["source"]["records"]) == 4
        assert [m["role"] for m in msgs] == [
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "user",
        ]
        assert msgs[2]["name"] == "Read" and msgs[2]["tool_call_id"] == "toolu_A"
        assert msgs[2]["content"].endswith("def index(): ...\ufffd")  # a lone surrogate, escaped
        assert "caf\ufffd latin-1" in msgs[5]["content"]  # a byte that is not UTF-8
        # The source record is kept verbatim, metadata and all.
        assert msgs[2]["source"]["records"][0]["toolUseResult"]["file"]["numLines"] == 3
        # The progress record off the message path rides with the next message.
        assert msgs[2]["source"]["extra"][0]["type"] == "progress"
        assert "extra" not in msgs[1]["source"]
        node = s.node(s.node_id(f"{web.id}~4"))
        assert node.meta["usage"] == {"prompt_tokens": 12010, "completion_tokens": 95}
        assert node.meta["model"] == "claude-opus-4-5-20251101"
        assert node.meta["time"] == "2025-11-20T09:00:03.200Z"
        check_openai_shape(msgs)
    row = next(r for r in rows if r.session == web.id)
    assert any("not UTF-8" in p for p in row.problems)


def test_claude_code_torn_last_line_and_unknown_records(tmp_path: Path, claude: Path) -> None:
    with Store.open(tmp_path / "store") as s:
        row = import_sessions(s, "claude-code", [claude / APP])[0]
        assert row.status == "created"
        assert any("torn last line" in p for p in row.problems)
        assert row.unknown_records == 1
        info = s.session(row.session)
        assert info.title == "Fix the failing parser test"  # the summary whose leaf is here
        texts = [e.message.get("content") for e in s.log(row.session)]
        assert not any("and now the" in (t or "") for t in texts)
        kept = [x for e in s.log(row.session) for x in e.message["source"].get("extra", [])]
        assert {"future-record-kind", "file-history-snapshot"} <= {x.get("type") for x in kept}


def test_claude_code_compaction_becomes_a_compaction_node(tmp_path: Path, claude: Path) -> None:
    with Store.open(tmp_path / "store") as s:
        sid = import_sessions(s, "claude-code", [claude / APP])[0].session
        assert sid is not None
        log = list(s.log(sid))
        compactions = [e for e in log if e.node.is_compaction]
        assert len(compactions) == 1
        summary = compactions[0].message
        assert summary["content"].startswith("This session is being continued")
        assert [r.get("subtype") for r in summary["source"]["records"]][0] == "compact_boundary"
        assert compactions[0].node.meta["pre_tokens"] == 15116
        context = s.context(sid)
        assert context[0]["content"] == summary["content"]
        assert [m["content"] for m in context[1:]][0] == "Go on and fix it."
        assert len(log) == 8  # the whole transcript stays: nothing before the summary is lost
    result = CliRunner().invoke(
        cli, ["--store", str(tmp_path / "store"), "log", "--context", sid[:8]]
    )
    assert result.exit_code == 0
    assert "This session is being continued" in result.output
    assert "The parser test fails" not in result.output


def test_claude_code_sidechains_are_linked_sessions(tmp_path: Path, claude: Path) -> None:
    with Store.open(tmp_path / "store") as s:
        rows = import_sessions(s, "claude-code", [claude])
        rows.sort(key=lambda r: r.source)
        sessions = by_identity(s)
        app = sessions["claude-code:11111111-1111-4111-8111-111111111111"]
        side = sessions[
            "claude-code:11111111-1111-4111-8111-111111111111:sidechain:"
            "b1000000-0000-4000-8000-000000000001"
        ]
        assert rows[0].linked == [side.id]
        parent = side.imported["parent"]
        assert parent["session"] == app.id and parent["tool_call_id"] == "toolu_02"
        call_message = s.blob(s.node(parent["node"]).content)
        assert call_message["tool_calls"][0]["name"] == "Task"
        assert [m["role"] for m in s.context(side.id)] == ["user", "assistant"]
        # The main line holds no sidechain message.
        assert all(
            not r.get("isSidechain") for e in s.log(app.id) for r in e.message["source"]["records"]
        )
        web = sessions["claude-code:22222222-2222-4222-8222-222222222222"]
        agent = sessions["claude-code:agent:a7f3c1d2"]
        assert agent.imported["parent"]["session"] == web.id
        assert agent.imported["parent"]["tool_call_id"] == "toolu_B"
        assert agent.model == "claude-haiku-4-5-20251001"
        check_openai_shape(s.context(agent.id))
        # No Task call started the older agent file's run: it hangs off the import point.
        old = sessions["claude-code:agent:e9d04b11"]
        assert old.imported["parent"] == {
            "session": web.id,
            "node": web.imported["head"],
            "tool_call_id": None,
        }
        assert old.title == "subagent: Warmup"


def test_second_import_writes_nothing(tmp_path: Path, claude: Path) -> None:
    store = tmp_path / "store"
    with Store.open(store) as s:
        import_sessions(s, "claude-code", [claude])
    before = tree_snapshot(store)
    with Store.open(store) as s:
        rows = import_sessions(s, "claude-code", [claude])
    assert [r.status for r in rows] == ["unchanged"] * 4
    assert tree_snapshot(store) == before


def test_grown_file_moves_the_same_session_forward(tmp_path: Path, claude: Path) -> None:
    path = claude / APP
    with Store.open(tmp_path / "store") as s:
        first = import_sessions(s, "claude-code", [path])[0]
        data = path.read_bytes()
        torn = data[data.rindex(b"\n") + 1 :]
        line = torn + b' fix the linter too"},"uuid":"a1000000-0000-4000-8000-000000000010",'
        line += b'"timestamp":"2025-06-02T18:51:00.000Z",'
        line += b'"sessionId":"11111111-1111-4111-8111-111111111111"}\n'
        with path.open("ab") as f:  # the agent finishes the torn line and goes on
            f.write(line[len(torn) :])
        second = import_sessions(s, "claude-code", [path])[0]
        assert second.status == "updated"
        assert second.session == first.session
        assert second.messages == first.messages + 1
        assert second.problems == []
        assert s.context(second.session)[-1]["content"] == "and now the fix the linter too"
        third = import_sessions(s, "claude-code", [path])[0]
        assert third.status == "unchanged"


def test_an_assistant_turn_split_across_imports_is_continued_not_rewritten(
    tmp_path: Path, claude: Path
) -> None:
    path = claude / WEB
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:4]))  # cut after two of the turn's four records
    with Store.open(tmp_path / "store") as s:
        first = import_sessions(s, "claude-code", [path])[0]
        head = s.session(first.session).head
        path.write_bytes(b"".join(lines))
        second = import_sessions(s, "claude-code", [path])[0]
        assert second.status == "updated" and second.session == first.session
        assert head in {e.id for e in s.log(second.session)}
        check_openai_shape(s.context(second.session))


def test_changed_past_is_imported_as_a_fork(tmp_path: Path, claude: Path) -> None:
    path = claude / APP
    with Store.open(tmp_path / "store") as s:
        old = import_sessions(s, "claude-code", [path])[0]
        old_head = s.session(old.session).head
        text = path.read_text("utf-8", errors="replace")
        path.write_text(text.replace("Go on and fix it.", "Explain it instead."), "utf-8")
        new = import_sessions(s, "claude-code", [path])[0]
        assert new.status == "created"
        assert new.session != old.session
        assert new.forked_from == old.session
        assert s.session(old.session).head == old_head  # the old session is untouched
        info = s.session(new.session)
        assert info.forked_from is not None and info.forked_from["session"] == old.session
        assert [m["content"] for m in s.context(new.session)][1] == "Explain it instead."
        shared = {e.id for e in s.log(old.session)} & {e.id for e in s.log(new.session)}
        assert len(shared) == 6  # up to and including the compaction
        again = import_sessions(s, "claude-code", [path])[0]
        assert again.status == "unchanged" and again.session == new.session


def test_a_rewind_in_claude_code_forks(tmp_path: Path, claude: Path) -> None:
    path = claude / WEB
    with Store.open(tmp_path / "store") as s:
        old = import_sessions(s, "claude-code", [path])[0]
        rewind = {
            "parentUuid": "c2000000-0000-4000-8000-000000000001", "isSidechain": False,
            "type": "assistant", "uuid": "c2000000-0000-4000-8000-0000000000aa",
            "sessionId": "22222222-2222-4222-8222-222222222222",
            "timestamp": "2025-11-20T09:05:00.000Z",
            "message": {"id": "msg_02Z", "role": "assistant", "model": "claude-opus-4-5-20251101",
                        "content": [{"type": "text", "text": "Let me answer from memory."}]},
        }  # fmt: skip
        with path.open("a") as f:
            f.write(json.dumps(rewind) + "\n")
        new = import_sessions(s, "claude-code", [path])[0]
        assert new.status == "created" and new.forked_from == old.session
        assert [m["role"] for m in s.context(new.session)] == ["user", "assistant"]
        assert s.context(new.session)[1]["content"] == "Let me answer from memory."
        # The abandoned branch is kept with the new message, verbatim.
        extra = s.context(new.session)[1]["source"]["extra"]
        assert any(r.get("uuid") == "c2000000-0000-4000-8000-000000000009" for r in extra)


def test_resumed_file_shares_the_history_it_copied(tmp_path: Path, claude: Path) -> None:
    """Claude Code's --resume writes a new file that repeats the old records under
    a new sessionId; ags stores that history once and links the two sessions."""
    old_sid = "11111111-1111-4111-8111-111111111111"
    new_sid = "33333333-3333-4333-8333-333333333333"
    lines = (claude / APP).read_text("utf-8").splitlines(keepends=True)[:-1]  # not the torn line
    copied = [line.replace(old_sid, new_sid) for line in lines]
    follow = {
        "parentUuid": "a1000000-0000-4000-8000-000000000009", "isSidechain": False,
        "type": "user", "uuid": "e3000000-0000-4000-8000-000000000001", "sessionId": new_sid,
        "timestamp": "2025-06-03T08:00:00.000Z", "cwd": "/home/ana/app",
        "message": {"role": "user", "content": "Next day: add a test for it."},
    }  # fmt: skip
    resumed = claude / "-home-ana-app" / f"{new_sid}.jsonl"
    (claude / APP).write_text("".join(lines), "utf-8")
    with Store.open(tmp_path / "store") as s:
        a = import_sessions(s, "claude-code", [claude / APP])[0]
        resumed.write_text("".join(copied) + json.dumps(follow) + "\n", "utf-8")
        b = import_sessions(s, "claude-code", [claude / "-home-ana-app"])
        row = next(r for r in b if r.source == str(resumed))
        assert row.status == "created" and row.forked_from == a.session
        assert s.session(row.session).forked_from == {
            "session": a.session,
            "node": s.session(a.session).head,
        }
        assert row.messages == a.messages + 1
        assert s.context(row.session)[-1]["content"] == "Next day: add a test for it."


def test_work_continued_in_ags_is_kept_when_the_source_grows(tmp_path: Path, claude: Path) -> None:
    path = claude / WEB
    with Store.open(tmp_path / "store") as s:
        first = import_sessions(s, "claude-code", [path])[0]
        sid = first.session
        assert sid is not None
        mine = s.append(sid, {"role": "assistant", "content": "continued with a local model"})
        s.release(sid)
        extra = {
            "parentUuid": "c2000000-0000-4000-8000-000000000010", "type": "assistant",
            "uuid": "c2000000-0000-4000-8000-000000000011", "isSidechain": False,
            "sessionId": "22222222-2222-4222-8222-222222222222",
            "timestamp": "2025-11-20T09:02:00.000Z",
            "message": {"id": "msg_02C", "role": "assistant", "content": "Done, debug is off."},
        }  # fmt: skip
        with path.open("a") as f:
            f.write(json.dumps(extra) + "\n")
        row = import_sessions(s, "claude-code", [path])[0]
        assert row.status == "created" and row.forked_from == sid
        assert s.session(sid).head == mine  # what was done in ags stays where it was
        assert s.context(row.session)[-1]["content"] == "Done, debug is off."


def test_huge_tool_output_and_memory_bounded_by_the_largest_record(tmp_path: Path) -> None:
    folder = tmp_path / "claude" / "-big"
    folder.mkdir(parents=True)
    path = folder / "44444444-4444-4444-8444-444444444444.jsonl"
    chunk = "x" * 40_000
    with path.open("w") as f:
        parent = None
        for i in range(1499):  # about 30 MB: half the records hold 40 KB
            uuid = f"f4000000-0000-4000-8000-{i:012d}"
            if i % 2 == 0:
                rec: dict[str, Any] = {
                    "type": "assistant", "message": {"id": f"m{i}", "role": "assistant",
                    "content": [{"type": "tool_use", "id": f"t{i}", "name": "Bash",
                                 "input": {"command": "cat big"}}]},
                }  # fmt: skip
            else:
                rec = {
                    "type": "user",
                    "message": {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": f"t{i - 1}", "content": chunk}
                        ],
                    },
                }
            rec.update(uuid=uuid, parentUuid=parent, timestamp="2025-01-01T00:00:00.000Z")
            f.write(json.dumps(rec) + "\n")
            parent = uuid
        huge = {"type": "user", "uuid": "f4000000-0000-4000-8000-999999999999",
                "parentUuid": parent, "timestamp": "2025-01-01T00:00:01.000Z",
                "message": {"role": "user", "content": [{"type": "tool_result",
                            "tool_use_id": "t1498", "content": "y" * 1_000_000}]}}  # fmt: skip
        f.write(json.dumps(huge) + "\n")
    size = path.stat().st_size
    with Store.open(tmp_path / "store") as s:
        tracemalloc.start()
        row = import_sessions(s, "claude-code", [path])[0]
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert row.status == "created", row.problems
        assert row.messages == 1500
        assert len(s.context(row.session)[-1]["content"]) == 1_000_000
    assert size > 30_000_000
    # A record is held in a few forms at once (its line, the parsed value, the message,
    # its canonical bytes), so a few times the largest; the file's size does not count.
    # A pack sealed while the import runs adds the content kept of its objects and of
    # the next pack's (MAX_KEPT_CONTENT each, at most): a seal falls in this file since
    # live packs take small objects raw (20.1 MB); before, 14.3 MB here, where files of
    # 37 and 46 MB, with a seal, took 19.8 and 20.3.
    limit = 12 * 1_000_000 + 3_000_000 + 2 * MAX_KEPT_CONTENT
    assert peak < limit, f"peak {peak} for a file of {size}"


# -- Codex CLI ------------------------------------------------------------------------------


def test_codex_rollout_maps_items_and_compaction(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as s:
        rows = import_sessions(s, "codex", [FIXTURES / "codex"])
        assert [r.status for r in rows] == ["created", "created"]
        new = by_identity(s)["codex:019a2d7a-41c4-78b1-b7cc-a45d62a89cd5"]
        assert new.root == "/home/ana/tool" and new.model == "gpt-5.1-codex"
        assert new.title == "Add a --verbose flag to the CLI"
        log = [e for e in s.log(new.id)][::-1]
        first_turn = [e.message for e in log[:6]]
        assert first_turn[2]["thinking"] == "**Finding the argument parser**"
        assert first_turn[2]["tool_calls"][0]["arguments"]["command"][2] == "rg -n argparse"
        assert first_turn[3] | {"source": None} == {
            "role": "tool", "tool_call_id": "call_Ab12", "name": "shell",
            "content": "cli.py:3:import argparse\n", "source": None,
        }  # fmt: skip
        assert first_turn[4]["tool_calls"][0]["arguments"]["input"].startswith("*** Begin Patch")
        assert log[7].node.is_compaction
        context = s.context(new.id)
        assert context[0]["content"].startswith("**Progress**")
        # A call the user interrupted gets an explicit result before the user speaks.
        assert context[-2]["synthesized"] is True and context[-2]["tool_call_id"] == "call_Ef56"
        check_openai_shape(context)
        row = next(r for r in rows if "019a2d7a" in r.source)
        assert row.unknown_records == 1  # ghost_commit


def test_codex_legacy_rollout(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as s:
        rows = import_sessions(s, "codex", [FIXTURES / "codex"])
        old = by_identity(s)["codex:5f0b7c1e-7d1a-4c7e-9a51-3c2b1f0a9e88"]
        msgs = s.context(old.id)
        assert [m["role"] for m in msgs] == ["user", "assistant", "tool"]
        assert msgs[2]["content"] == "test:\n\tpytest -q\n"
        assert old.created == "2025-05-07T10:11:12.345Z"
        check_openai_shape(msgs, open_tail=False)
    # The last turn asked for a shell call that has no result yet: it waits.
    row = next(r for r in rows if "5f0b7c1e" in r.source)
    assert any("waits for its tool results" in p for p in row.problems)


# -- Gemini CLI -----------------------------------------------------------------------------


def test_gemini_chat_and_checkpoint(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as s:
        rows = import_sessions(s, "gemini", [FIXTURES / "gemini"])
        assert [r.status for r in rows] == ["created"] * 3  # a chat, a log, a checkpoint
        chat = by_identity(s)["gemini:477739d0-1b78-4aa7-9116-02d08c952344"]
        msgs = s.context(chat.id)
        assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
        assert msgs[1]["thinking"] == "Searching: A grep over the tree will do."
        assert msgs[2]["content"].startswith("Found 2 matches:")
        assert msgs[3]["source"]["extra"][0]["type"] == "info"
        assert chat.model == "gemini-2.5-pro"
        check_openai_shape(msgs)
        row = next(r for r in rows if r.session == chat.id)
        assert row.unknown_records == 1
        point = next(i for k, i in by_identity(s).items() if k and "checkpoint" in k)
        cp = s.context(point.id)
        assert [m["role"] for m in cp] == ["user", "assistant", "tool", "assistant"]
        assert cp[2]["tool_call_id"] == cp[1]["tool_calls"][0]["id"]  # answered by name
        check_openai_shape(cp, open_tail=False)


def test_a_gemini_checkpoint_is_dated_by_its_file(tmp_path: Path) -> None:
    """A checkpoint holds no times: its session was created and updated in 1970."""
    src = tmp_path / "g"
    shutil.copytree(FIXTURES / "gemini" / "tmp" / "8876362f5a5f00ff", src)
    path = src / "checkpoint-before-refactor.json"
    saved = 1_764_000_000.25  # 2025-11-24T16:00:00.250Z
    os.utime(path, (saved, saved))
    with Store.open(tmp_path / "store") as s:
        row = import_sessions(s, "gemini", [path])[0]
        info = s.session(str(row.session))
        assert info.created == info.updated == "2025-11-24T16:00:00.250Z"
        assert all(s.node(n.id).meta["time"] == info.updated for n in s.log(info.id))


def test_gemini_message_changed_in_place_forks(tmp_path: Path) -> None:
    src = tmp_path / "g" / "chats"
    shutil.copytree(FIXTURES / "gemini" / "tmp" / "8876362f5a5f00ff" / "chats", src)
    path = next(src.glob("session-*.json"))
    with Store.open(tmp_path / "store") as s:
        old = import_sessions(s, "gemini", [path])[0]
        doc = json.loads(path.read_text())
        doc["messages"][3]["content"] = "Only src/a.py."
        path.write_text(json.dumps(doc))
        new = import_sessions(s, "gemini", [path])[0]
        assert new.status == "created" and new.forked_from == old.session
        doc["messages"].append({"id": "x6", "type": "user", "content": "thanks",
                                "timestamp": "2025-12-03T06:39:00.000Z"})  # fmt: skip
        path.write_text(json.dumps(doc))
        grown = import_sessions(s, "gemini", [path])[0]
        assert grown.status == "updated" and grown.session == new.session


# -- the command line -------------------------------------------------------------------------


def test_cli_import_json_keys_dry_run_and_exit_codes(tmp_path: Path, claude: Path) -> None:
    store = str(tmp_path / "store")
    runner = CliRunner()
    dry = runner.invoke(cli, ["--store", store, "import", "--from", "claude-code", str(claude),
                              "--dry-run", "--json"])  # fmt: skip
    assert dry.exit_code == 0, dry.output
    rows = json.loads(dry.stdout)
    assert {"source", "session", "status", "messages", "problems"} <= set(rows[0])
    assert [r["status"] for r in rows] == ["created"] * 4
    assert sorted(r["messages"] for r in rows) == [2, 4, 6, 7]
    assert not Path(store).exists()  # a dry run makes no store either
    with Store.open(store) as s:
        assert s.sessions() == []
    real = runner.invoke(cli, ["--store", store, "import", "--from", "claude-code", str(claude),
                               "--json"])  # fmt: skip
    assert real.exit_code == 0
    assert sorted(r["messages"] for r in json.loads(real.stdout)) == [2, 4, 6, 7]
    again = runner.invoke(cli, ["--store", store, "import", "--from", "claude-code", str(claude)])
    assert again.exit_code == 0
    assert again.output.splitlines()[-1] == ("4 files: 0 created, 0 updated, 4 unchanged, 0 failed")
    bad = tmp_path / "bad" / "rollout-2025-01-01T00-00-00-x.jsonl"
    bad.parent.mkdir()
    bad.write_bytes(b"")
    failed = runner.invoke(cli, ["--store", store, "import", "--from", "codex", str(bad.parent),
                                 "--json"])  # fmt: skip
    assert failed.exit_code == 1
    row = json.loads(failed.stdout)[0]
    assert row["status"] == "failed" and row["session"] is None and row["problems"]
    missing = runner.invoke(cli, ["--store", store, "import", "--from", "codex", "/no/such"])
    assert missing.exit_code == 1 and "no such file" in missing.output
    elsewhere = tmp_path / "new-store"
    args = ["--store", str(elsewhere), "import", "--from", "codex", "/no/such"]
    missing = runner.invoke(cli, args)
    assert missing.stderr == "ags: no such file or folder: /no/such\n"
    assert not elsewhere.exists()  # not made for an import that cannot start


def test_cli_import_default_folder_from_environment(
    tmp_path: Path, claude: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    shutil.move(str(claude), config / "projects")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    result = CliRunner().invoke(
        cli, ["--store", str(tmp_path / "store"), "import", "--from", "claude-code", "--json"]
    )
    assert result.exit_code == 0
    assert len(json.loads(result.stdout)) == 4


def test_same_size_and_time_is_not_read_again(tmp_path: Path, claude: Path) -> None:
    import os

    path = claude / WEB
    with Store.open(tmp_path / "store") as s:
        first = import_sessions(s, "claude-code", [path])[0]
        st = path.stat()
        path.write_bytes(b"\0" * st.st_size)  # unreadable as JSONL, same size and time
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        again = import_sessions(s, "claude-code", [path])[0]
        assert again.status == "unchanged" and again.session == first.session
        assert again.problems == []


def test_chat_resume_of_an_imported_session_sends_valid_messages(
    tmp_path: Path, claude: Path
) -> None:
    """``ags run --resume`` on imported Claude Code and Codex sessions, against an
    OpenAI-style server: the request holds the imported history in wire form."""
    import os
    import subprocess
    import sys

    from docker_fixture import require_docker
    from model_server import FakeModelServer

    image = require_docker()
    project = tmp_path / "project"
    project.mkdir()
    store = tmp_path / "store"
    with Store.open(store) as s:
        import_sessions(s, "claude-code", [claude / WEB])
        import_sessions(s, "codex", [FIXTURES / "codex"])
        sids = [i.id for i in s.sessions()]
    ags = str(Path(sys.executable).with_name("ags"))
    for sid in sids:
        with FakeModelServer(flavor="vllm", models=("qwen3",)) as server:
            server.add({"text": "Carrying on."})
            env = {**os.environ, "AGS_STORE": str(store), "AGS_BASE_URL": server.url,
                   "AGS_IMAGE": image}  # fmt: skip
            proc = subprocess.run(
                [ags, "run", "go on", "--resume", sid, "--provider", "openai", "--model",
                 "qwen3", "--project", str(project), "--json"],
                env=env, cwd=project, capture_output=True, text=True, timeout=120,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            sent = server.chat_bodies()[0]["messages"]
        assert all("source" not in m for m in sent)
        assert sent[-1] == {"role": "user", "content": "go on"}
        answered: set[str] = set()
        for m in sent:
            if m["role"] == "assistant":
                answered = {c["id"] for c in m.get("tool_calls", [])}
            elif m["role"] == "tool":
                assert m["tool_call_id"] in answered
        with Store.open(store) as s:
            assert s.context(sid)[-1]["content"] == "Carrying on."


def test_records_the_store_cannot_hold_as_they_are(tmp_path: Path, claude: Path) -> None:
    """A number no double holds, nesting too deep to parse: reported, not fatal."""
    path = claude / WEB
    deep = (
        '{"type":"user","uuid":"c2000000-0000-4000-8000-0000000000d1",'
        + ('"parentUuid":"c2000000-0000-4000-8000-000000000010","deep":' + "[" * 5000 + "]" * 5000)
        + ',"message":{"role":"user","content":"deep"}}\n'
    )
    big = {
        "type": "user", "uuid": "c2000000-0000-4000-8000-0000000000d2",
        "parentUuid": "c2000000-0000-4000-8000-000000000010", "timestamp": "2025-11-20T09:03:00Z",
        "message": {"role": "user", "content": "a big number"}, "n": 0,
    }  # fmt: skip
    with path.open("a") as f:
        f.write(deep)
        f.write(json.dumps(big).replace('"n": 0', '"n": 1e400') + "\n")
    with Store.open(tmp_path / "store") as s:
        row = import_sessions(s, "claude-code", [path])[0]
        assert row.status == "created"
        assert any("nested too deeply" in p for p in row.problems)
        last = s.context(row.session)[-1]
        assert last["content"] == "a big number"
        assert last["source"]["records"][0]["n"] == "1e400"
        kept = last["source"]["extra"]
        assert kept[0]["text"].startswith('{"type":"user"')  # the deep line, as text


@pytest.mark.parametrize("tool", ["claude-code", "codex", "gemini"])
def test_missing_fields_and_wrong_types_are_never_fatal(tmp_path: Path, tool: str) -> None:
    """Hand-made files with every field missing, null or of the wrong type."""
    with Store.open(tmp_path / "store") as s:
        rows = import_sessions(s, tool, [FIXTURES / "malformed" / tool])
        assert rows and all(r.status == "created" for r in rows), rows
        for row in rows:
            assert row.session is not None
            check_openai_shape(s.context(row.session))


def test_gemini_jsonl_log_and_an_answer_still_running(tmp_path: Path) -> None:
    """Gemini CLI 0.58+: an append-only log where a message is written again as it
    changes; an answer whose tool call still runs waits for the next import."""
    src = FIXTURES / "gemini" / "tmp" / "5eb97eaffa8e5484" / "chats"
    path = tmp_path / "chats" / "session-2026-06-10T10-00-9a1b2c3d.jsonl"
    path.parent.mkdir()
    lines = next(src.glob("*.jsonl")).read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:4]))  # the shell call is still executing
    with Store.open(tmp_path / "store") as s:
        first = import_sessions(s, "gemini", [path])[0]
        assert first.status == "created" and first.messages == 2
        info = s.session(first.session)
        assert info.title == "Run the unit tests"  # not the injected <session_context>
        path.write_bytes(b"".join(lines))
        second = import_sessions(s, "gemini", [path])[0]
        assert second.status == "updated" and second.session == first.session
        msgs = s.context(second.session)
        assert [m["role"] for m in msgs] == ["user", "user", "assistant", "tool", "assistant"]
        assert msgs[3]["content"] == "12 passing (1s)"
        assert msgs[2]["source"]["records"][0]["tokens"]["total"] == 5163  # the last version
        check_openai_shape(msgs, open_tail=False)


def test_a_title_arriving_later_is_taken_unless_renamed_in_ags(
    tmp_path: Path, claude: Path
) -> None:
    path = claude / WEB
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:10]))  # before the custom-title record
    with Store.open(tmp_path / "store") as s:
        row = import_sessions(s, "claude-code", [path])[0]
        assert s.session(row.session).title == "List the routes and check the config"
        path.write_bytes(b"".join(lines[:11]))  # only the title record is new
        import_sessions(s, "claude-code", [path])
        assert s.session(row.session).title == "routes and config"
        s.set_title(row.session, "mine")
        retitle = {"type": "custom-title", "customTitle": "renamed in Claude Code"}
        path.write_bytes(b"".join(lines) + json.dumps(retitle).encode() + b"\n")
        again = import_sessions(s, "claude-code", [path])[0]
        assert again.status == "updated"
        assert s.session(row.session).title == "mine"


@pytest.mark.parametrize(
    ("tool", "name"),
    [("claude-code", APP), ("claude-code", WEB), ("codex", CODEX), ("gemini", GEMINI_LOG)],
)  # fmt: skip
def test_importing_at_every_point_of_a_growing_file(tmp_path: Path, tool: str, name: str) -> None:
    """Import the first k lines, then the whole file, for every k: the session only
    ever moves forward, and it holds what importing the whole file at once gives."""
    src = FIXTURES / tool / name
    lines = src.read_bytes().splitlines(keepends=True)
    with Store.open(tmp_path / "once") as s:
        whole = import_sessions(s, tool, [src])[0]
        assert whole.session is not None
        expected = [
            (m["role"], m["content"]) for m in s.context(whole.session) if not m.get("synthesized")
        ]
    for k in range(1, len(lines)):
        path = tmp_path / f"cut{k}" / Path(name).name
        path.parent.mkdir()
        path.write_bytes(b"".join(lines[:k]))
        with Store.open(tmp_path / f"store{k}") as s:
            first = import_sessions(s, tool, [path])[0]
            path.write_bytes(b"".join(lines))
            second = import_sessions(s, tool, [path])[0]
            assert second.session == first.session or first.session is None, k
            assert second.forked_from is None, k
            context = s.context(second.session)
            check_openai_shape(context)
            got = [(m["role"], m["content"]) for m in context if not m.get("synthesized")]
            # An assistant turn cut by the first import is continued as a second message.
            joined: list[tuple[str, str]] = []
            for role, text in got:
                if joined and role == joined[-1][0] == "assistant":
                    joined[-1] = (role, "\n".join(t for t in (joined[-1][1], text) if t))
                else:
                    joined.append((role, text))
            assert joined == [e for e in expected], k


def test_another_tools_file_fails_and_a_file_with_no_conversation_is_skipped(
    tmp_path: Path, claude: Path
) -> None:
    snapshots = claude / "-home-ana-app" / "66666666-6666-4666-8666-666666666666.jsonl"
    snapshots.write_text(
        '{"type":"file-history-snapshot","messageId":"m","snapshot":{},"isSnapshotUpdate":false}\n'
    )
    with Store.open(tmp_path / "store") as s:
        row = import_sessions(s, "claude-code", [snapshots])[0]
        assert (row.status, row.session, row.problems) == (
            "unchanged",
            None,
            ["no conversation in this file yet"],
        )
        wrong = import_sessions(s, "codex", [claude / APP])[0]
        assert wrong.status == "failed" and "not a Codex rollout" in wrong.problems[0]
        other = import_sessions(s, "claude-code", [FIXTURES / "codex" / CODEX])[0]
        assert other.status == "failed"
        assert s.sessions() == []


def test_a_message_the_store_refuses_is_kept_as_a_stub(tmp_path: Path) -> None:
    """A record that parses but nests too deeply for the store to encode: the
    message is stored as a stub that says why, and the row reports it."""
    stubs = []
    # Past the store's limit, up to what a record may nest (its own object is a level).
    for depth in (101, LINE_DEPTH - 1, LINE_DEPTH):
        path = tmp_path / "src" / f"{depth}" / "77777777-7777-4777-8777-777777777777.jsonl"
        path.parent.mkdir(parents=True)
        deep = "[" * depth + "]" * depth
        path.write_text(
            '{"type":"user","uuid":"u1","parentUuid":null,"timestamp":"2025-01-01T00:00:00Z",'
            f'"message":{{"role":"user","content":"{"word " * 2000}"}},"deep":{deep}}}\n'
        )
        with Store.open(tmp_path / f"store{depth}") as s:
            row = import_sessions(s, "claude-code", [path])[0]
            if depth == LINE_DEPTH:  # deeper than a record may nest: kept as text, and
                # a file whose only record is so holds none of Claude Code's
                assert row.status == "failed" and "holds no Claude Code records" in row.problems[0]
            elif any("kept a stub" in p for p in row.problems):
                assert row.status == "created" and row.messages == 1
                stubs.append(s.context(row.session)[0])
    assert len(stubs) == 2, "a depth did not make the store refuse the message"
    stub = stubs[0]
    assert stub["role"] == "user" and stub["source"]["omitted"] == "nested too deeply"
    assert stub["content"].startswith("word word") and stub["content"].endswith(
        "[cut: the message was too large to store]"
    )
    assert stub["source"]["through"] == 1


def claude_chain(path: Path, count: int) -> bytes:
    """A Claude Code file at ``path`` of ``count`` records, user and assistant in turn,
    each the parent of the next; its bytes."""
    sid = path.stem
    path.parent.mkdir(parents=True, exist_ok=True)
    lines, parent = [], None
    for i in range(count):
        uuid = f"c{i:07d}-0000-4000-8000-000000000000"
        role = "user" if i % 2 == 0 else "assistant"
        reply = [{"type": "text", "text": f"reply {i}"}]
        content: Any = f"message {i}" if role == "user" else reply
        message = {"role": role, "content": content, **({"id": f"m{i}"} if i % 2 else {})}
        record = {"type": role, "uuid": uuid, "parentUuid": parent, "sessionId": sid}
        record |= {"timestamp": "2025-06-02T18:51:00.000Z", "message": message}
        lines.append(json.dumps(record))
        parent = uuid
    whole = ("\n".join(lines) + "\n").encode()
    path.write_bytes(whole)
    return whole


def test_an_older_copy_of_a_session_file_elsewhere_is_the_same_session(tmp_path: Path) -> None:
    """A copied folder (a backup) holds the session as it was; the original grows. The
    copy is all in the session already: before, the second run made it a fork, the
    identity's newest claimant, which the original's next records would go to."""
    name = "44444444-4444-4444-8444-444444444444.jsonl"
    live, backup = tmp_path / "claude" / "-home-ana-p" / name, tmp_path / "backup" / name
    claude_chain(live, 6)
    backup.parent.mkdir()
    backup.write_bytes(live.read_bytes())
    with Store.open(tmp_path / "store") as s:
        first = import_sessions(s, "claude-code", [live, backup])
        claude_chain(live, 10)
        runs = [import_sessions(s, "claude-code", [live, backup]) for _ in range(3)]
        said = [{Path(r.source).parent.name: r.status for r in rows} for rows in runs]
        assert said[0] == {"-home-ana-p": "updated", "backup": "unchanged"}, runs[0]
        for later, rows in zip(said[1:], runs[1:], strict=True):
            assert later == {"-home-ana-p": "unchanged", "backup": "unchanged"}, rows
        (info,) = s.sessions()
        assert info.id == first[0].session and info.messages == 10
        assert (info.imported or {})["path"] == str(live)


def test_a_damaged_line_that_breaks_the_chain_is_said_to_hide_what_came_before(
    tmp_path: Path,
) -> None:
    """The path back from the last record stops at the damage: the messages before it
    are kept as extra records only. That was silent; the session looked whole."""
    path = tmp_path / "claude" / "-home-ana-x" / "55555555-5555-4555-8555-555555555555.jsonl"
    lines = claude_chain(path, 10).split(b"\n")
    lines[4] = lines[4][:50]  # line 5, cut
    path.write_bytes(b"\n".join(lines))
    with Store.open(tmp_path / "store") as s:
        (row,) = import_sessions(s, "claude-code", [path])
    assert row.messages == 5
    assert (
        "line 6: its parent record c0000004-0000-4000-8000-000000000000 is not in the file, "
        "so the conversation starts there; 4 earlier messages are kept only as extra records"
    ) in row.problems


def test_a_file_cut_short_while_it_is_imported_is_refused_then_imported_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut to half between the two passes (as a rotation or a rewrite would), then
    put back: the import that met it fails that file and keeps nothing of it; before,
    it stored the first part under the digest of the whole, and every later import
    called the session complete."""
    path = tmp_path / "claude" / "-home-ana-big" / "33333333-3333-4333-8333-333333333333.jsonl"
    whole = claude_chain(path, 300)
    real_read = records.LineReader.read
    reads = [0]

    def read_then_cut(reader: records.LineReader, entry: records.Entry) -> records.Record:
        reads[0] += 1
        if reads[0] == 100:
            path.write_bytes(whole[: len(whole) // 2])  # (written again below)
        return real_read(reader, entry)

    monkeypatch.setattr(records.LineReader, "read", read_then_cut)
    with Store.open(tmp_path / "store") as s:
        (row,) = import_sessions(s, "claude-code", [path])
        assert row.status == "failed", row
        assert "changed while it was imported" in row.problems[0]
        assert s.sessions() == []
        monkeypatch.setattr(records.LineReader, "read", real_read)
        path.write_bytes(whole)
        (row,) = import_sessions(s, "claude-code", [path])
        assert (row.status, row.messages) == ("created", 300), row
        assert len(s.context(row.session)) == 300


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_among_the_files_is_refused_not_read(
    tmp_path: Path, claude: Path, kind: str
) -> None:
    """Read, a FIFO waits for a writer forever and /dev/zero never ends (the import
    hung, its memory growing); given by name, one was passed over as "0 files"."""
    odd = claude / "-home-ana-app" / "44444444-4444-4444-8444-444444444444.jsonl"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to("/dev/zero")
    store = str(tmp_path / "store")
    for target in (claude, odd):
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", "--store", store, "import", "--from",
             "claude-code", str(target), "--json"],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        rows = {r["source"]: r for r in json.loads(done.stdout)}
        assert rows[str(odd)]["status"] == "failed"
        assert rows[str(odd)]["problems"] == [f"{odd} is not a regular file"]
    odd.unlink()
    with Store.open(store) as s, Store.open(tmp_path / "clean") as clean:
        import_sessions(clean, "claude-code", [claude])
        assert len(s.sessions()) == len(clean.sessions())  # every other file imported


def test_a_folder_that_cannot_be_searched_is_named(tmp_path: Path, claude: Path) -> None:
    hidden = claude / "-home-ana-web"
    store = tmp_path / "store"
    Store.open(store).close()
    os.chmod(hidden, 0)
    try:
        done = as_user_without_overrides(
            [sys.executable, "-m", "cli.main", "--store", str(store), "import", "--from",
             "claude-code", str(claude), "--json"]
        )  # fmt: skip
    finally:
        os.chmod(hidden, 0o700)
    assert done.returncode == 1, done.stderr
    rows = {r["source"]: r for r in json.loads(done.stdout)}
    assert rows[str(hidden)]["status"] == "failed"
    assert rows[str(hidden)]["problems"] == ["cannot search it: Permission denied"]
    assert sum(r["status"] == "created" for r in rows.values()) == 1  # -home-ana-app's


def test_a_tool_folder_that_does_not_exist_is_said_and_makes_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "nowhere"))
    store = tmp_path / "store"
    result = CliRunner().invoke(cli, ["--store", str(store), "import", "--from", "claude-code"])
    assert result.exit_code == 1
    assert result.stderr == (
        f"ags: no claude-code sessions here: {tmp_path / 'nowhere' / 'projects'} does not "
        "exist (give a PATH)\n"
    )
    assert not store.exists()


def test_a_file_name_with_terminal_controls_is_shown_escaped(tmp_path: Path, claude: Path) -> None:
    evil = claude / "-home-ana-app" / "x\n\x1b[2J\x1b]0;pwned\x07.jsonl"
    shutil.copy(claude / APP, evil)
    result = CliRunner().invoke(
        cli, ["--store", str(tmp_path / "store"), "import", "--from", "claude-code", str(evil)]
    )
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    row = result.stdout.splitlines()[0]  # one line, however the name breaks lines
    assert row.startswith("created") and row.endswith(".jsonl") and "pwned" in row, row


def test_two_imports_at_once_make_one_session(tmp_path: Path) -> None:
    """Each took the file for new and made a session of it: two copies of one
    conversation. One import of a store at a time now; the second waits."""
    path = tmp_path / "claude" / "-home-ana-big" / "66666666-6666-4666-8666-666666666666.jsonl"
    claude_chain(path, 8_000)
    store = str(tmp_path / "store")
    Store.open(store).close()
    args = [sys.executable, "-m", "cli.main", "--store", store, "import", "--from", "claude-code"]
    runs = [
        subprocess.Popen([*args, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    for run in runs:
        _out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    with Store.open(store) as s:
        assert [info.messages for info in s.sessions()] == [8_000]


def test_token_counts_that_are_none_are_taken_as_zero(tmp_path: Path) -> None:
    path = tmp_path / "claude" / "-home-ana-x" / "77777777-7777-4777-8777-777777777777.jsonl"
    records = [json.loads(line) for line in claude_chain(path, 2).splitlines()]
    records[1]["message"]["usage"] = {"input_tokens": -9, "output_tokens": 2 * 10**40 + 1}
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with Store.open(tmp_path / "store") as s:
        (row,) = import_sessions(s, "claude-code", [path])
        head = s.node(s.session(row.session).head)
        assert head.meta["usage"] == {"prompt_tokens": 0, "completion_tokens": 0}


def test_a_lone_surrogate_is_replaced_and_said(tmp_path: Path) -> None:
    path = tmp_path / "claude" / "-home-ana-x" / "88888888-8888-4888-8888-888888888888.jsonl"
    whole = claude_chain(path, 2).decode()
    path.write_text(whole.replace("message 0", "message \\ud800 0 \\ud83d\\ude00", 1))
    with Store.open(tmp_path / "store") as s:
        (row,) = import_sessions(s, "claude-code", [path])
        assert row.problems == ["line 1: lone surrogate escapes replaced by U+FFFD"]
        assert s.context(row.session)[0]["content"] == "message \ufffd 0 \U0001f600"


def test_a_gemini_log_with_no_message_yet_makes_no_session(tmp_path: Path) -> None:
    """A snapshot that empties the messages made a session of none, "(untitled)"."""
    path = tmp_path / "gemini" / "tmp" / "abc" / "chats" / "session-2026-06-10T10-00-0f0f0f0f.jsonl"
    path.parent.mkdir(parents=True)
    head = {"sessionId": "0f0f0f0f", "projectHash": "abc", "startTime": "2026-06-10T10:00:00Z"}
    path.write_text(json.dumps(head) + "\n" + json.dumps({"$set": {"messages": []}}) + "\n")
    with Store.open(tmp_path / "store") as s:
        (row,) = import_sessions(s, "gemini", [path])
        assert (row.session, row.problems) == (None, ["no conversation in this file yet"])
        assert s.sessions() == []


def test_a_codex_rollout_whose_meta_line_is_damaged_is_said_so(tmp_path: Path) -> None:
    path = tmp_path / "rollout-2025-10-29T00-59-38-x.jsonl"
    lines = (FIXTURES / "codex" / CODEX).read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([lines[0][:40], *lines[1:]]))
    with Store.open(tmp_path / "store") as s:
        (row,) = import_sessions(s, "codex", [path])
    assert row.status == "failed"
    assert row.problems == [
        f"{path} is not a Codex rollout (its first line, where the session_meta line goes, "
        "is not a JSON object)"
    ]


def test_sidechain_records_whose_parents_loop_are_kept_and_said(tmp_path: Path) -> None:
    """No leaf, so no sidechain session: the records went nowhere, without a word."""
    path = tmp_path / "claude" / "-home-ana-x" / "99999999-9999-4999-8999-999999999999.jsonl"
    records = [json.loads(line) for line in claude_chain(path, 2).splitlines()]
    for uuid, parent in (("s1", "s2"), ("s2", "s1")):  # before the answer, which keeps them
        looped = {**records[0], "uuid": uuid, "parentUuid": parent, "isSidechain": True}
        records.insert(1, looped)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with Store.open(tmp_path / "store") as s:
        (row,) = import_sessions(s, "claude-code", [path])
        assert row.problems == [
            "2 sidechain records are on no chain that ends (their parents loop): "
            "kept as extra records"
        ]
        kept = json.dumps([e.message for e in s.log(row.session)])
        assert '"uuid": "s1"' in kept and '"uuid": "s2"' in kept


def test_only_the_jobs_named_are_run_one_at_a_time(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as s:
        with s.one_at_a_time("import"):
            assert (tmp_path / "store" / "locks" / "import").exists()
        with pytest.raises(InvalidInput, match="no job 'repack'"), s.one_at_a_time("repack"):
            pass
