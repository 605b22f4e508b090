"""The scenarios: the same agent work done with ags and with JSONL files, measured.

Each scenario gets an empty directory, builds both stores in it from the same
generated messages, checks that both give the same answer, and returns its
rows and a note saying what exactly was measured.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.importers import import_sessions
from objstore import SearchIndex, SessionInfo, Store

from .claude_code_files import write_projects
from .conversations import Conversation, Message, Project, summary_text
from .jsonl_store import JsonlStore
from .measure import disk_bytes, paired_medians, timed
from .peers import peer_values, run_peer
from .report import Row
from .web_pages import page_rows


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each scenario does."""

    appends: int = 2000
    thread_appends: int = 8000
    thread_runs: int = 5
    resume_messages: int = 6000
    compact_every: int = 500
    compact_keep: int = 4
    resume_runs: int = 11
    fork_source: int = 3000
    fork_runs: int = 15
    tree_messages: int = 600
    tree_forks: int = 30
    fork_appends: int = 30
    listed_sessions: int = 10000
    listing_runs: int = 5
    searched_sessions: int = 1000
    search_runs: int = 7
    imported_files: int = 1000
    imported_messages: int = 100_000
    synced_sessions: int = 1000
    synced_messages: int = 100_000


DEFAULT_SIZES = Sizes()
QUICK_SIZES = Sizes(
    appends=200,
    thread_appends=400,
    thread_runs=1,
    resume_messages=600,
    compact_every=100,
    resume_runs=3,
    fork_source=300,
    fork_runs=5,
    tree_messages=60,
    tree_forks=5,
    fork_appends=5,
    listed_sessions=50,
    listing_runs=2,
    searched_sessions=30,
    search_runs=2,
    imported_files=30,
    imported_messages=1500,
    synced_sessions=20,
    synced_messages=400,
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one scenario measured, and a note on how."""

    rows: list[Row]
    note: str


Scenario = Callable[[Path, Sizes, Project], Outcome]


class SessionWriter(Protocol):
    """What both stores offer a writing agent (``Store`` and ``JsonlStore``)."""

    def append(self, sid: str, message: Message, /) -> object: ...

    def compact(self, sid: str, summary: str, keep: int, /) -> object: ...


class BenchmarkError(Exception):
    """The two stores disagreed: the comparison would be meaningless."""


# -- 1. durable appends ----------------------------------------------------------


def durable_appends(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Messages per second when every append is durable before the next one."""
    messages = Conversation(project, seed=1).take(sizes.appends)
    with Store.open(base / "ags") as store:
        sid = store.new_session(title="appends")
        ags_s, _ = timed(lambda: _append_all(store, sid, messages))
    with JsonlStore(base / "jsonl") as jsonl:
        jid = jsonl.new_session(title="appends")
        jsonl_s, _ = timed(lambda: _append_all(jsonl, jid, messages))
    n = len(messages)
    ags_rate = n / ags_s
    lang = run_peer("langgraph", "appends", messages, base, key="seed-1")
    cells, problems = peer_values({"langgraph": lang}, lambda r: r.count / r.seconds)
    row = Row(
        "append_rate",
        f"durable appends ({n:,} msgs)",
        "msg/s",
        ags_rate,
        n / jsonl_s,
        "ags >= 2,000/s",
        ags_rate >= 2000,
        cells,
    )
    note = (
        f"appends: {n:,} messages to one session; ags.append returns durable, "
        "JSONL writes a line and fsyncs its open file; LangGraph: one SqliteSaver "
        "checkpoint per message (update_state on a MessagesState graph), durable "
        "by SQLite's defaults; zettcode: a dash, its appends are flushed, never fsynced"
        + "".join(f"; {p}" for p in problems)
    )
    return Outcome([row], note)


def _append_all(store: SessionWriter, sid: str, messages: Sequence[Message]) -> None:
    for message in messages:
        store.append(sid, message)


# -- 2. resume ---------------------------------------------------------------------


def resume_compacted(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Time to get a long, often compacted session's active context from a new handle.

    The session is compacted after every ``compact_every`` messages, the last
    one included. A resume can come at any point of that cycle, so three are
    measured: right after the last compaction, halfway to the next, and just
    before it (the largest context). JSONL reads its file up to the same point.
    """
    messages = Conversation(project, seed=2).take(sizes.resume_messages)
    ags_path, jsonl_path = base / "ags", base / "jsonl"
    with Store.open(ags_path) as store:
        sid = store.new_session(title="long session")
        compactions = _write_compacted(store, sid, messages, sizes)
    with JsonlStore(jsonl_path) as jsonl:
        jid = jsonl.new_session(title="long session")
        _write_compacted(jsonl, jid, messages, sizes)
    half = sizes.compact_every // 2
    with Store.open(ags_path) as store:  # resume points as a user names them: node ids
        mid, before = store.node_id(f"{sid}~{half + 1}"), store.node_id(f"{sid}~1")
    points = [  # (label, ags spec, JSONL messages read, compaction line included)
        ("after a compaction", sid, len(messages), True),
        ("mid-cycle", mid, len(messages) - half, False),
        ("before a compaction", before, len(messages), False),
    ]
    rows: list[Row] = []
    sizes_seen: list[str] = []
    for label, spec, upto, with_compaction in points:
        share = 10 if with_compaction else 5  # right after a compaction: a tenth (issue 11)
        context = _ags_context(ags_path, spec)
        expected = JsonlStore(jsonl_path).context(jid, upto, with_compaction)
        _check_same(f"resumed context {label}", context, expected)
        ags_s, jsonl_s = paired_medians(
            lambda spec=spec: _ags_context(ags_path, spec),
            lambda upto=upto, wc=with_compaction: JsonlStore(jsonl_path).context(jid, upto, wc),
            sizes.resume_runs,
        )
        rows.append(
            Row(
                f"resume_{label.split()[0]}",
                f"resume {len(messages):,} msgs, {label}",
                "s",
                ags_s,
                jsonl_s,
                f"ags <= JSONL/{share}",
                ags_s <= jsonl_s / share,
            )
        )
        sizes_seen.append(f"{len(context)} {label}")
    note = (
        f"resume: {len(messages):,} messages, {compactions} compactions (one after every "
        f"{sizes.compact_every}, keep {sizes.compact_keep}); context sizes: "
        f"{', '.join(sizes_seen)}; ags opens a new Store and calls context(spec), JSONL "
        f"reads and parses its file up to the same point; median of {sizes.resume_runs}, "
        "page cache warm"
    )
    return Outcome(rows, note)


def _write_compacted(
    store: SessionWriter, sid: str, messages: Sequence[Message], sizes: Sizes
) -> int:
    """Append ``messages``, compacting after every ``compact_every``; return how many
    compactions were written."""
    compactions = 0
    for i, message in enumerate(messages, 1):
        store.append(sid, message)
        if i % sizes.compact_every == 0:
            store.compact(sid, summary_text(seed=i), sizes.compact_keep)
            compactions += 1
    return compactions


def _ags_context(path: Path, spec: str) -> list[Message]:
    with Store.open(path) as store:
        return store.context(spec)


# -- 3. fork -----------------------------------------------------------------------


def fork_long_session(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Time and disk space to fork a long session at its head."""
    messages = Conversation(project, seed=3).take(sizes.fork_source)
    ags_path, jsonl_path = base / "ags", base / "jsonl"
    with Store.open(ags_path) as store:
        sid = store.new_session(title="fork source")
        with store.batch():
            _append_all(store, sid, messages)
    with Store.open(ags_path) as store:
        ags_s, ags_b = _fork_costs(lambda: store.fork(sid), ags_path, sizes.fork_runs)
        ags_forked = store.context(store.fork(sid))
    with JsonlStore(jsonl_path) as jsonl:
        jid = jsonl.new_session(title="fork source")
        jsonl.append_many(jid, messages)
        jsonl_s, jsonl_b = _fork_costs(lambda: jsonl.fork(jid), jsonl_path, sizes.fork_runs)
        jsonl_forked = jsonl.context(jsonl.fork(jid))
    _check_same("context of a fork", ags_forked, jsonl_forked)
    n = len(messages)
    rows = [
        Row(
            "fork_time",
            f"fork {n:,}-msg session",
            "s",
            ags_s,
            jsonl_s,
            "ags <= 2 ms",
            ags_s <= 2e-3,
        ),
        Row(
            "fork_bytes",
            f"fork {n:,}-msg session, disk",
            "B",
            ags_b,
            jsonl_b,
            "ags <= 4 KB",
            ags_b <= 4096,
        ),
    ]
    note = (
        f"fork: {sizes.fork_runs} forks at the head of a {n:,}-message session, each "
        "durable; medians of time and of the st_blocks*512 added to the store directory"
    )
    return Outcome(rows, note)


def _fork_costs(fork_once: Callable[[], str], root: Path, runs: int) -> tuple[float, float]:
    """Median seconds and median bytes added on disk of ``runs`` forks."""
    seconds: list[float] = []
    added: list[int] = []
    for _ in range(runs):
        before = disk_bytes(root)
        elapsed, _ = timed(fork_once)
        seconds.append(elapsed)
        added.append(disk_bytes(root) - before)
    return statistics.median(seconds), statistics.median(added)


# -- 4. a tree of forks -------------------------------------------------------------


def fork_tree(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Disk space of one session and many forks of it, each continued with new messages."""
    trunk = Conversation(project, seed=4).take(sizes.tree_messages)
    branches = [
        Conversation(project, seed=100 + i).take(sizes.fork_appends)
        for i in range(sizes.tree_forks)
    ]
    n, forks = len(trunk), sizes.tree_forks
    points = [round((i + 1) * n / (forks + 1)) for i in range(forks)]
    ags_path, jsonl_path = base / "ags", base / "jsonl"
    with Store.open(ags_path) as store:
        sid = store.new_session(title="trunk")
        _append_all(store, sid, trunk)
        for point, branch in zip(points, branches, strict=True):
            fid = store.fork(f"{sid}~{n - point}" if point < n else sid)
            _append_all(store, fid, branch)
        last_ags = store.context(fid)
    with JsonlStore(jsonl_path) as jsonl:
        jid = jsonl.new_session(title="trunk")
        _append_all(jsonl, jid, trunk)
        for point, branch in zip(points, branches, strict=True):
            fjid = jsonl.fork(jid, at=point)
            _append_all(jsonl, fjid, branch)
        last_jsonl = jsonl.context(fjid)
    _check_same("context of the last fork", last_ags, last_jsonl)
    ags_b, jsonl_b = disk_bytes(ags_path), disk_bytes(jsonl_path)
    row = Row(
        "tree_bytes",
        f"{n}-msg session + {forks} forks, disk",
        "B",
        ags_b,
        jsonl_b,
        "ags <= JSONL/5",
        ags_b <= jsonl_b / 5,
    )
    note = (
        f"fork tree: {n} messages, {forks} forks taken evenly from message {points[0]} "
        f"to {points[-1]}, each then given {sizes.fork_appends} new messages; "
        "st_blocks*512 over the whole store directory after closing"
    )
    return Outcome([row], note)


# -- 5. listing ---------------------------------------------------------------------


def list_sessions(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Time to list many sessions with their titles and message counts."""
    conversation, rng = Conversation(project, seed=5), random.Random(5)
    sessions = [
        (f"session {i}", conversation.take(rng.randint(5, 20)))
        for i in range(sizes.listed_sessions)
    ]
    ags_path, jsonl_path = base / "ags", base / "jsonl"
    with Store.open(ags_path) as store, store.batch():
        for title, messages in sessions:
            sid = store.new_session(title=title)
            _append_all(store, sid, messages)
            store.release(sid)  # one open lock file per session would add up
    with JsonlStore(jsonl_path) as jsonl:
        for title, messages in sessions:
            jsonl.append_many(jsonl.new_session(title=title), messages)
    listed = _ags_sessions(ags_path)
    _check_same(
        "listed message counts",
        sorted(s.messages for s in listed),
        sorted(s.messages for s in JsonlStore(jsonl_path).sessions()),
    )
    ags_s, jsonl_s = paired_medians(
        lambda: _ags_sessions(ags_path),
        lambda: JsonlStore(jsonl_path).sessions(),
        sizes.listing_runs,
    )
    n = len(sessions)
    row = Row("listing", f"list {n:,} sessions", "s", ags_s, jsonl_s, "report only", None)
    note = (
        f"listing: {n:,} sessions of 5-20 messages; ags opens a new Store and calls "
        "sessions(), JSONL reads every file for its title and message count and sorts "
        f"by mtime; median of {sizes.listing_runs}"
    )
    return Outcome([row], note)


# -- 6. search ----------------------------------------------------------------------


def search_sessions(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Time to find which sessions mention an identifier: ``ags search`` against
    ``grep -rlF`` over the JSONL files, the way people search agent logs today."""
    conversation, rng = Conversation(project, seed=6), random.Random(6)
    sessions = [conversation.take(rng.randint(10, 30)) for _ in range(sizes.searched_sessions)]
    ags_path, jsonl_path = base / "ags", base / "jsonl"
    with Store.open(ags_path) as store, store.batch():
        for messages in sessions:
            sid = store.new_session()
            _append_all(store, sid, messages)
            store.release(sid)
    with JsonlStore(jsonl_path) as jsonl:
        for messages in sessions:
            jsonl.append_many(jsonl.new_session(), messages)
    word = _rare_identifier(sessions[len(sessions) // 2])

    def ags_search() -> int:
        with Store.open(ags_path) as store, SearchIndex(store) as index:
            return len({hit.session for hit in index.search(word, limit=1_000_000)})

    def grep() -> int:
        found = subprocess.run(
            ["grep", "-rlF", word, str(jsonl_path)], capture_output=True, text=True
        )
        return len(found.stdout.split())

    first_s, first_count = timed(ags_search)  # builds the index
    _check_same(f"sessions mentioning {word!r}", first_count, grep())
    ags_s, grep_s = paired_medians(ags_search, grep, sizes.search_runs)
    n = len(sessions)
    rows = [
        Row("search_cold", f"search {n:,} sessions, first time", "s", first_s, grep_s,
            "report only", None),
        Row("search", f"search {n:,} sessions", "s", ags_s, grep_s, "ags <= grep", ags_s <= grep_s),
    ]  # fmt: skip
    note = (
        f"search: {n:,} sessions of 10-30 messages; which sessions mention {word!r} "
        f"({first_count} do). ags opens the store and its index, refreshes it and queries "
        "(the first time builds the index from the objects); grep -rlF runs over the "
        f"JSONL files as a process; median of {sizes.search_runs}"
    )
    return Outcome(rows, note)


def _rare_identifier(messages: list[Message]) -> str:
    """An identifier the generator made up for this session (so few others hold it)."""
    for message in messages:
        text = message.get("content") or ""
        if isinstance(text, str) and text.startswith("Let me look at "):
            return text.split()[4]
    raise BenchmarkError("no identifier to search for")


def _ags_sessions(path: Path) -> list[SessionInfo]:
    with Store.open(path) as store:
        return store.sessions()


def _check_same(what: str, ags: object, jsonl: object) -> None:
    if ags != jsonl:
        raise BenchmarkError(f"ags and JSONL disagree on the {what}")


# -- 7. importing Claude Code transcripts ----------------------------------------------


def import_claude_code(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """``ags import --from claude-code`` over generated transcripts: the time, the time
    of a second run (nothing changed), and the store's size against the files'."""
    source = base / "projects"
    written = write_projects(source, project, files=sizes.imported_files,
                             messages=sizes.imported_messages)  # fmt: skip
    ags_path = base / "ags"

    def parse_all() -> int:
        """The floor any importer pays: read every file and parse every line."""
        lines = 0
        for path in source.rglob("*.jsonl"):
            with path.open("rb") as f:
                for line in f:
                    json.loads(line)
                    lines += 1
        return lines

    with Store.open(ags_path) as store:
        ags_s, rows = timed(lambda: import_sessions(store, "claude-code", [source]))
    if any(r.status != "created" for r in rows):
        raise BenchmarkError("not every generated file was imported")
    with Store.open(ags_path) as store:
        again_s, again = timed(lambda: import_sessions(store, "claude-code", [source]))
    if any(r.status != "unchanged" for r in again):
        raise BenchmarkError("a second import changed something")
    parse_s, _ = timed(parse_all)
    forks = sum(1 for r in rows if r.forked_from)
    store_bytes, source_bytes = disk_bytes(ags_path), disk_bytes(source)
    n, m = written.files, written.messages
    rows_out = [
        Row("import_time", f"import {n:,} Claude Code files ({m:,} msgs)", "s", ags_s,
            parse_s, "report only", None),
        Row("reimport_time", f"import again, {n:,} files unchanged", "s", again_s, parse_s,
            "ags <= JSONL/10", again_s <= parse_s / 10),
        Row("import_bytes", f"{n:,} imported sessions, disk", "B", store_bytes, source_bytes,
            "ags <= JSONL", store_bytes <= source_bytes),
    ]  # fmt: skip
    note = (
        f"import: {n:,} generated Claude Code 2.x files ({m:,} messages counting the "
        f"history that {forks} resumed files repeat) in 20 project folders; the JSONL "
        "column is the time to read and json-parse every line (the floor for any "
        "importer) and the files' size; a second import finds every file unchanged"
    )
    return Outcome(rows_out, note)


# -- 8. the session browser ---------------------------------------------------------


def web_pages(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Server time of ``ags serve``'s list page and of a long transcript page."""
    rows = page_rows(base, sizes.listed_sessions, sizes.fork_source, sizes.listing_runs, project)
    note = (
        f"web: the whole app (guard, store, templates) under uvicorn on loopback, median "
        f"of {sizes.listing_runs} GETs read to the end: the first list page (50 rows) over "
        f"{sizes.listed_sessions + 1:,} sessions, and the full transcript page of a "
        f"{sizes.fork_source:,}-message session (Markdown, highlighting, tool calls paired), "
        "its first view once, then again; JSONL: reading every file for title and count, "
        "and reading and parsing the one file"
    )
    return Outcome(rows, note)


def push_and_clone(base: Path, sizes: Sizes, project: Project) -> Outcome:
    """Push and clone many sessions through a directory remote, and push one message."""
    from .sync_rows import sync_rows

    rows, note = sync_rows(base, sizes.synced_sessions, sizes.synced_messages, project)
    return Outcome(rows, note)


def _format_rows() -> tuple[Scenario, ...]:
    from .format_rows import live_reader, resume_uncompacted, session_bytes, threaded_appends

    return (session_bytes, resume_uncompacted, live_reader, threaded_appends)


SCENARIOS: tuple[Scenario, ...] = (
    durable_appends,
    resume_compacted,
    fork_long_session,
    fork_tree,
    list_sessions,
    search_sessions,
    import_claude_code,
    web_pages,
    *_format_rows(),
    push_and_clone,
)
