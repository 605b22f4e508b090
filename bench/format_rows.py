"""The rows of store format 2's targets: bytes on disk, resuming a long uncompacted
session, reading beside a live writer, and appends from eight threads at once."""

from __future__ import annotations

import multiprocessing
import os
import statistics
import threading
import time
from pathlib import Path

from objstore import Store

from .conversations import Conversation, Message, Project, summary_text
from .jsonl_store import JsonlStore
from .live_writer import write_and_hold, write_compacted
from .measure import disk_bytes, paired_medians
from .peers import PEERS, peer_values, run_peer
from .report import Row
from .scenarios import BenchmarkError, Outcome, Sizes, _append_all, _check_same


def session_bytes(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Bytes on disk of one session written by durable appends, the handle closed."""
    messages = Conversation(project, seed=1).take(sizes.appends)  # durable_appends' messages
    with Store.open(base / "ags") as store:
        _append_all(store, store.new_session(title="bytes"), messages)
    with JsonlStore(base / "jsonl") as jsonl:
        _append_all(jsonl, jsonl.new_session(title="bytes"), messages)
    ags_b, jsonl_b = disk_bytes(base / "ags"), disk_bytes(base / "jsonl")
    n = len(messages)
    results = {peer: run_peer(peer, "appends", messages, base, key="seed-1") for peer in PEERS}
    cells, problems = peer_values(results, lambda r: r.bytes)
    row = Row("session_bytes", f"one {n:,}-msg session, disk", "B", ags_b, jsonl_b,
              "ags <= 0.40x JSONL", ags_b <= 0.40 * jsonl_b, cells)  # fmt: skip
    note = (
        f"bytes: {n:,} messages appended durably to one session, the store closed; "
        "st_blocks*512 of the whole store directory (marker, refs, reflog, packs, "
        "indexes, directories) against the JSONL file and its directory; the peers: "
        "their directory after the same appends (LangGraph keeps the whole message "
        "list in every checkpoint)" + "".join(f"; {p}" for p in problems)
    )
    return Outcome([row], note)


def resume_uncompacted(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Open + context of a long session that was never compacted, from a new handle."""
    messages = Conversation(project, seed=12).take(sizes.fork_source)
    with Store.open(base / "ags") as store:
        sid = store.new_session()
        _append_all(store, sid, messages)
    with JsonlStore(base / "jsonl") as jsonl:
        jid = jsonl.new_session()
        _append_all(jsonl, jid, messages)

    def ags() -> object:
        with Store.open(base / "ags") as store:
            return store.context(sid)

    _check_same("uncompacted context", ags(), JsonlStore(base / "jsonl").context(jid))
    ags_s, jsonl_s = paired_medians(
        ags, lambda: JsonlStore(base / "jsonl").context(jid), sizes.resume_runs
    )
    n = len(messages)
    results = {
        peer: run_peer(peer, "resume", messages, base, key="seed-12", runs=sizes.resume_runs)
        for peer in PEERS
    }
    cells, problems = peer_values(results, lambda r: r.seconds if r.count == n else None)
    row = Row("resume_uncompacted", f"resume {n:,} msgs, never compacted", "s", ags_s, jsonl_s,
              "ags <= JSONL/2", ags_s <= jsonl_s / 2, cells)  # fmt: skip
    note = (
        f"resume uncompacted: {n:,} messages appended durably, then a new Store and "
        f"context() against reading and parsing the JSONL file; median of {sizes.resume_runs}; "
        "zettcode: read(id).active() on a new SessionPersistenceMixin; LangGraph: "
        "get_state through a new connection (its session written as one checkpoint: "
        "what a resume reads is the last one either way)" + "".join(f"; {p}" for p in problems)
    )
    return Outcome([row], note)


def live_reader(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Open + context of a long compacted session while its writer runs, against the
    same session in a store whose writer has closed, the two read in turns."""
    total = sizes.resume_messages + sizes.resume_messages // 30
    messages = Conversation(project, seed=13).take(total)
    live_path, closed_path = base / "ags", base / "ags-closed"
    with Store.open(live_path) as store:
        live_sid = store.new_session()
    with Store.open(closed_path) as store:  # the same session, written and closed
        closed_sid = store.new_session()
        write_compacted(store, closed_sid, messages)

    def read_live() -> object:
        with Store.open(live_path) as store:
            return store.context(live_sid)

    def read_closed() -> object:
        with Store.open(closed_path) as store:
            return store.context(closed_sid)

    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    args = (str(live_path), live_sid, messages, ready, stop)
    writer = ctx.Process(target=write_and_hold, args=args)
    writer.start()
    try:
        if not ready.wait(600):
            raise BenchmarkError("the live writer did not finish its session")
        _check_same("context beside a live writer", read_live(), read_closed())  # warm-ups
        # In turns: one of this machine's two vCPUs runs at times 1.7x slower than
        # the other, for seconds, and a process may be on either.
        live, closed = paired_medians(read_live, read_closed, sizes.resume_runs)
    finally:
        stop.set()
        writer.join(60)
    with JsonlStore(base / "jsonl") as jsonl:
        jid = jsonl.new_session()
        for i, message in enumerate(messages, 1):
            jsonl.append(jid, message)
            if i % 500 == 0:
                jsonl.compact(jid, summary_text(seed=i), 4)
    closed_again, jsonl_s = paired_medians(
        read_closed, lambda: JsonlStore(base / "jsonl").context(jid), sizes.resume_runs
    )
    rows = [
        Row("live_reader", f"open + context beside its live writer ({total:,} msgs)", "s",
            live, jsonl_s, "live <= 1.5x closed", live <= 1.5 * closed),
        Row("closed_reader", f"open + context, writer closed ({total:,} msgs)", "s",
            closed_again, jsonl_s, "report only", None),
    ]  # fmt: skip
    note = (
        f"live reader: a session of {total:,} messages compacted every 500, written by "
        "a process that keeps its handle open; a new Store and context() while that "
        "writer runs, in turns with the same read of the same session in a store whose "
        f"writer closed (median of {sizes.resume_runs} each: live/closed {live / closed:.2f}x); "
        "JSONL: the same file read and parsed, in turns with the closed read"
    )
    return Outcome(rows, note)


def threaded_appends(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Eight threads appending durably to eight sessions through one Store, run
    ``sizes.thread_runs`` times, each into new stores, ags and JSONL in turns: one run
    lasts about a second, and this machine's speed changes from one second to the
    next, so the row gives the medians."""
    per_thread = max(sizes.thread_appends // 8, 10)
    batches = [Conversation(project, seed=20 + t).take(per_thread) for t in range(8)]
    n = 8 * per_thread
    ags_rates: list[float] = []
    jsonl_rates: list[float] = []
    for run in range(sizes.thread_runs):
        ags_rates.append(n / _ags_threads(base / f"ags-{run}", batches))
        jsonl_rates.append(n / _jsonl_threads(base / f"jsonl-{run}", batches))
    ags_rate, jsonl_rate = statistics.median(ags_rates), statistics.median(jsonl_rates)
    row = Row("threads_8", f"durable appends, 8 threads x 8 sessions ({n:,} msgs)", "msg/s",
              ags_rate, jsonl_rate, "ags >= 8,000/s", ags_rate >= 8000)  # fmt: skip
    runs = ", ".join(f"{rate:,.0f}" for rate in sorted(ags_rates))
    note = (
        f"threads: 8 threads, each appending {per_thread:,} messages to its own session "
        "through one shared Store (each append durable when it returns), timed until the "
        "store has closed (ags seals the packs the appends wrote, the last of them at the "
        f"close); JSONL: 8 files, a write and an fsync per message; {os.cpu_count()} cores; "
        f"median of {sizes.thread_runs} runs in turns with JSONL, each into new stores "
        f"(ags: {runs}/s)"
    )
    return Outcome([row], note)


def _ags_threads(root: Path, batches: list[list[Message]]) -> float:
    """Seconds for a thread per batch to append it to a session of its own, through one
    new Store at ``root``, and for the Store to close: the seals of the packs the
    appends filled run beside them, and the last pack's at the close, so a run that
    ended just before a seal would look faster than the appends are. Every append is
    then checked to be there."""
    store = Store.open(root)
    try:
        sids = [store.new_session(title=f"thread {t}") for t in range(len(batches))]
        start = time.perf_counter()
        _threads(lambda t: _append_all(store, sids[t], batches[t]))
    finally:
        store.close()
    seconds = time.perf_counter() - start
    with Store.open(root) as store:
        counts = [store.session(sid).messages for sid in sids]
        if counts != [len(batch) for batch in batches]:
            raise BenchmarkError("a thread's appends are missing")
    return seconds


def _jsonl_threads(root: Path, batches: list[list[Message]]) -> float:
    """``_ags_threads`` for JSONL files."""
    jsonl = JsonlStore(root)
    try:
        jids = [jsonl.new_session() for _ in batches]
        start = time.perf_counter()
        _threads(lambda t: _append_all(jsonl, jids[t], batches[t]))
    finally:
        jsonl.close()
    return time.perf_counter() - start


def _threads(work: object) -> None:
    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]  # type: ignore[arg-type]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
