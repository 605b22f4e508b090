"""Drive a peer store inside the peers' own virtual environment (bench/peers.py).

Run as a script by that environment's Python, never imported by ags: it needs
only the peer packages and the standard library. It reads one job (JSON) on
stdin and prints one result (JSON) on stdout:

    {"peer": "zettcode" | "langgraph", "workload": "appends" | "resume",
     "dir": PATH, "messages": [...], "runs": N, "budget_s": SECONDS}

* ``appends``: a new store in ``dir``, the messages appended one by one to one
  session the way the peer stores a message; result ``{"seconds", "bytes",
  "count"}`` (``bytes``: st_blocks * 512 of ``dir``), or ``{"gave_up": why}``
  when ``budget_s`` ran out first.
* ``resume``: the messages stored as one session (in one write where the peer
  allows it: what a resume reads does not depend on how it was written), then
  the median time of ``runs`` fresh opens that read the session's context;
  result ``{"seconds", "count"}``.

zettcode: ``SessionPersistenceMixin`` (``zettcode.engine.storage.store``), one
JSONL line per message, flushed, never fsynced; resume is ``read(id).active()``
on a new instance. LangGraph: a ``MessagesState`` graph compiled with
``SqliteSaver``; one checkpoint per message is ``update_state`` with that
message; resume is ``get_state`` through a new connection. SQLite's defaults
(rollback journal, ``synchronous=FULL``) make each checkpoint durable.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import statistics
import sys
import time
from typing import Any


def disk_bytes(root: str) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


# -- zettcode ---------------------------------------------------------------------


def zett_messages(messages: list[dict[str, Any]]) -> list[Any]:
    from zett_agent.messages import (
        AssistantMessage,
        SystemMessage,
        ToolCall,
        ToolMessage,
        UserMessage,
    )

    names: dict[str, str] = {}
    out: list[Any] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "user":
            out.append(UserMessage(content=content))
        elif role == "system":
            out.append(SystemMessage(content=content, include_in_messages=True))
        elif role == "assistant":
            calls = []
            for call in m.get("tool_calls") or []:
                names[call["id"]] = call["function"]["name"]
                arguments = json.loads(call["function"]["arguments"] or "{}")
                calls.append(ToolCall(call["id"], call["function"]["name"], arguments))
            out.append(AssistantMessage(content=content, tool_calls=tuple(calls)))
        elif role == "tool":
            call_id = m["tool_call_id"]
            out.append(
                ToolMessage(tool_call_id=call_id, name=names.get(call_id, "tool"), content=content)
            )
        else:
            raise ValueError(f"no zettcode message for role {role!r}")
    return out


def zett_store(root: str) -> Any:
    from zettcode.engine.storage.store import SessionPersistenceMixin

    return SessionPersistenceMixin(
        root=os.path.join(root, "sessions"), workspace=os.path.join(root, "ws")
    )


def zett_write(root: str, messages: list[Any], deadline: float) -> int:
    os.makedirs(os.path.join(root, "ws"), exist_ok=True)
    store = zett_store(root)

    async def write() -> int:
        for n, message in enumerate(messages):
            if time.perf_counter() > deadline:
                return n
            await store.append("bench-session", "bench-request", message)
        return len(messages)

    return asyncio.run(write())


def zett_resume(root: str) -> int:
    _checkpoint, lines = zett_store(root).read("bench-session").active()
    return sum(len(line.message) for line in lines)


# -- LangGraph --------------------------------------------------------------------

THREAD = {"configurable": {"thread_id": "bench-session"}}


def lang_graph(path: str) -> tuple[Any, sqlite3.Connection]:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import START, MessagesState, StateGraph

    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {})
    graph.add_edge(START, "agent")
    conn = sqlite3.connect(path, check_same_thread=False)
    return graph.compile(checkpointer=SqliteSaver(conn)), conn


def lang_write(root: str, messages: list[dict[str, Any]], deadline: float, one_write: bool) -> int:
    os.makedirs(root, exist_ok=True)
    graph, conn = lang_graph(os.path.join(root, "checkpoints.sqlite"))
    try:
        if one_write:
            graph.update_state(THREAD, {"messages": messages})
            return len(messages)
        for n, message in enumerate(messages):
            if time.perf_counter() > deadline:
                return n
            graph.update_state(THREAD, {"messages": [message]})
        return len(messages)
    finally:
        conn.close()


def lang_resume(root: str) -> int:
    graph, conn = lang_graph(os.path.join(root, "checkpoints.sqlite"))
    try:
        return len(graph.get_state(THREAD).values["messages"])
    finally:
        conn.close()


# -- the job ----------------------------------------------------------------------


def run(job: dict[str, Any]) -> dict[str, Any]:
    peer, root, messages = job["peer"], job["dir"], job["messages"]
    budget = float(job.get("budget_s", 300))
    if peer == "zettcode":
        converted = zett_messages(messages)

        def write(deadline: float) -> int:
            return zett_write(root, converted, deadline)

        resume = zett_resume
    else:

        def write(deadline: float) -> int:
            return lang_write(root, messages, deadline, one_write=job["workload"] == "resume")

        resume = lang_resume
    start = time.perf_counter()
    done = write(start + budget if job["workload"] == "appends" else float("inf"))
    seconds = time.perf_counter() - start
    if done < len(messages):
        return {"gave_up": f"{done:,} of {len(messages):,} messages in {budget:.0f} s, "
                f"{disk_bytes(root) / 1e6:,.0f} MB on disk by then"}  # fmt: skip
    if job["workload"] == "appends":
        return {"seconds": seconds, "bytes": disk_bytes(root), "count": done}
    times, count = [], 0
    for _ in range(int(job.get("runs", 5))):
        start = time.perf_counter()
        count = resume(root)
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "count": count}


def main() -> int:
    job = json.load(sys.stdin)
    try:
        result = run(job)
    except Exception as e:  # a peer that fails is reported, not fatal to the bench
        result = {"gave_up": f"{type(e).__name__}: {e}"[:300]}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
