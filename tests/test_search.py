"""Full-text search (objstore/search.py): what it finds, in which sessions, and that
the index is a cache: refreshed incrementally, rebuilt from the objects at will."""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import store_with_damaged_message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from objstore import AgsError, InvalidInput, Store
from objstore import search as search_module
from objstore.search import (
    INDEX_PATH,
    SCHEMA_VERSION,
    SearchHit,
    SearchIndex,
    SearchIndexBusy,
    fts_query,
    searchable_text,
)

EVERYTHING = 10**6  # a limit no test reaches


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "store") as s:
        yield s


@pytest.fixture
def index(store: Store) -> Iterator[SearchIndex]:
    with SearchIndex.open(store) as ix:
        yield ix


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def said(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def found(index: SearchIndex, query: str, **options: object) -> set[tuple[str, str]]:
    """(session, node) of every hit."""
    hits = index.search(query, limit=EVERYTHING, **options)  # type: ignore[arg-type]
    return {(h.session, h.node) for h in hits}


def whole_history(store: Store, include_archived: bool = True) -> set[tuple[str, str]]:
    """(session, node) for every node on every session's parent chain: what a search
    matching every message must return."""
    return {
        (s.id, entry.id)
        for s in store.sessions(include_archived=include_archived)
        if s.head
        for entry in store.log(s.id)
    }


# -- what is found ---------------------------------------------------------------


def test_finds_history_that_compaction_took_out_of_the_context(
    store: Store, index: SearchIndex
) -> None:
    sid = store.new_session()
    first = store.append(sid, user("the flamingo test fails on CI"))
    store.append(sid, said("fixed: the fixture leaked a socket"))
    summary = store.compact(sid, "We fixed a leaking pelican fixture.", keep=0)
    store.append(sid, user("next task"))
    assert "flamingo" not in repr(store.context(sid))

    [hit] = index.search("flamingo")
    assert (hit.session, hit.node, hit.role, hit.is_summary) == (sid, first, "user", False)
    [hit] = index.search("pelican")
    assert (hit.session, hit.node, hit.is_summary) == (sid, summary, True)


def test_indexes_tool_calls_tool_results_and_content_parts(
    store: Store, index: SearchIndex
) -> None:
    sid = store.new_session()
    openai_call = store.append(
        sid,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "grep_repository", "arguments": '{"pattern": "walrus"}'},
                }
            ],
        },
    )
    result = store.append(
        sid, {"role": "tool", "tool_call_id": "call_1", "content": "found a narwhal"}
    )
    ollama_call = store.append(
        sid,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "read_file", "arguments": {"path": "otter.txt"}}}],
        },
    )
    parts = store.append(
        sid,
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at this heron"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,cormorant"}},
            ],
        },
    )
    anthropic = store.append(
        sid,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls"}}],
        },
    )
    expected = {
        "grep_repository": openai_call,
        "walrus": openai_call,
        "narwhal": result,
        "otter": ollama_call,
        "read_file": ollama_call,
        "heron": parts,
        "bash": anthropic,
        "ls": anthropic,
    }
    for word, node in expected.items():
        assert found(index, word) == {(sid, node)}, word
    assert index.search("cormorant") == []  # image data is not text


def test_searchable_text_takes_only_text() -> None:
    assert searchable_text({"role": "user", "content": "hi", "tool_call_id": "call_9"}) == "hi"
    assert searchable_text({"content": "a\x00b\x02c\x03d"}) == "a b c d"
    assert searchable_text(["not", {"a": "message"}]) == "not"
    assert searchable_text(None) == ""


def test_snippet_shows_the_match_and_where_it_is(store: Store, index: SearchIndex) -> None:
    sid = store.new_session()
    filler = " ".join(f"word{i}" for i in range(200))
    store.append(sid, user(f"{filler}\n\nthe kingfisher\tis here {filler}"))
    [hit] = index.search("kingfisher")
    assert "kingfisher" in hit.snippet and len(hit.snippet) < 200
    assert "\n" not in hit.snippet and "\t" not in hit.snippet
    assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
    [(start, end)] = hit.matches
    assert hit.snippet[start:end] == "kingfisher"
    assert "[kingfisher]" in hit.marked()
    assert hit.time == store.node(hit.node).meta["time"]


def test_hits_are_newest_first(store: Store, index: SearchIndex) -> None:
    sid = store.new_session()
    nodes = [store.append(sid, user(f"swallow number {i}")) for i in range(5)]
    assert [h.node for h in index.search("swallow")] == nodes[::-1]
    assert [h.node for h in index.search("swallow", limit=2)] == nodes[:2:-1]


# -- forks, rewinds, deletes, archives -------------------------------------------------


def test_a_fork_shares_history_and_each_session_that_reaches_a_hit_is_named(
    store: Store, index: SearchIndex
) -> None:
    a = store.new_session()
    shared = store.append(a, user("shared albatross"))
    only_a = store.append(a, said("kestrel, after the fork point"))
    index.refresh()
    b = store.fork(f"{a}~1")
    only_b = store.append(b, said("osprey, in the fork only"))

    stats = index.refresh()
    assert (stats.updated, stats.nodes, stats.texts) == (1, 1, 1)  # the shared node is not redone
    assert found(index, "albatross") == {(a, shared), (b, shared)}
    assert found(index, "kestrel") == {(a, only_a)}
    assert found(index, "osprey") == {(b, only_b)}


def test_a_fork_costs_only_its_new_nodes(store: Store, index: SearchIndex) -> None:
    a = store.new_session()
    for i in range(40):
        store.append(a, user(f"message {i}"))
    assert index.refresh().nodes == 40
    fork = store.fork(f"{a}~10")
    store.append(fork, user("a new one"))
    store.append(fork, user("message 3"))  # a text the index has: no new text
    stats = index.refresh()
    assert (stats.updated, stats.nodes, stats.texts) == (1, 2, 1)
    assert len(found(index, "message")) == 40 + 30 + 1  # a; the fork: 30 shared, 1 new


def test_refresh_with_nothing_changed_does_nothing(store: Store, index: SearchIndex) -> None:
    for n in range(3):
        store.append(store.new_session(), user(f"hello {n}"))
    store.new_session()  # empty
    first = index.refresh()
    assert (first.sessions, first.updated, first.nodes) == (4, 4, 3)
    again = index.refresh()
    assert (again.sessions, again.updated, again.removed, again.nodes) == (4, 0, 0, 0)


def test_rewind_drops_hits_beyond_the_new_head_and_undoing_it_brings_them_back(
    store: Store, index: SearchIndex
) -> None:
    a = store.new_session()
    heron = store.append(a, user("heron"))
    egret = store.append(a, user("egret"))
    store.append(a, user("ibis"))
    assert found(index, "egret") == {(a, egret)}

    store.rewind(a, f"{a}~2")
    assert index.search("egret") == [] and index.search("ibis") == []
    assert found(index, "heron") == {(a, heron)}

    store.rewind(a, f"{a}@{{1}}")
    assert found(index, "egret") == {(a, egret)}

    store.rewind(a, f"{a}~2")
    stork = store.append(a, user("stork"))
    assert found(index, "stork") == {(a, stork)}
    assert index.search("egret") == [] and index.search("ibis") == []


def test_delete_drops_the_session_hits_but_not_a_fork_sharing_them(
    store: Store, index: SearchIndex
) -> None:
    a = store.new_session()
    shared = store.append(a, user("puffin"))
    store.append(a, user("guillemot"))
    b = store.fork(f"{a}~1")
    assert found(index, "puffin") == {(a, shared), (b, shared)}

    store.delete(a)
    assert found(index, "puffin") == {(b, shared)}
    assert index.search("guillemot") == []
    assert index.refresh().removed == 0  # already done by the search


def test_archived_sessions_are_searched_only_when_asked(store: Store, index: SearchIndex) -> None:
    a = store.new_session()
    node = store.append(a, user("lapwing"))
    store.archive(a)
    assert index.search("lapwing") == []
    assert found(index, "lapwing", include_archived=True) == {(a, node)}
    assert found(index, "lapwing", session=a) == {(a, node)}  # named: searched
    store.unarchive(a)
    assert found(index, "lapwing") == {(a, node)}


def test_role_filter(store: Store, index: SearchIndex) -> None:
    sid = store.new_session()
    asked = store.append(sid, user("gannet question"))
    answered = store.append(sid, said("gannet answer"))
    tool = store.append(sid, {"role": "tool", "tool_call_id": "c", "content": "gannet output"})
    summary = store.compact(sid, "gannet summary")  # stored with role "user"
    assert found(index, "gannet", role="user") == {(sid, asked)}
    assert found(index, "gannet", role="assistant") == {(sid, answered)}
    assert found(index, "gannet", role="tool") == {(sid, tool)}
    assert found(index, "gannet", role="summary") == {(sid, summary)}
    assert found(index, "gannet", role="system") == set()
    assert len(found(index, "gannet")) == 4


def test_session_filter(store: Store, index: SearchIndex) -> None:
    a, b = store.new_session(), store.new_session()
    in_a = store.append(a, user("dunlin"))
    in_b = store.append(b, user("dunlin"))
    assert found(index, "dunlin", session=a) == {(a, in_a)}
    assert found(index, "dunlin", session=b) == {(b, in_b)}
    assert found(index, "dunlin", session="0" * 32) == set()


# -- the query language ----------------------------------------------------------


def test_words_must_all_match_and_phrases_match_in_order(store: Store, index: SearchIndex) -> None:
    sid = store.new_session()
    node = store.append(sid, user("the quick brown fox"))
    assert found(index, "fox quick") == {(sid, node)}
    assert found(index, "fox zebra") == set()
    assert found(index, '"quick brown"') == {(sid, node)}
    assert found(index, '"brown quick"') == set()
    assert found(index, "qui*") == {(sid, node)}
    assert found(index, "QUICK") == {(sid, node)}


@pytest.mark.parametrize(
    ("query", "matches"),
    [
        ("rock AND roll", True),  # "and" is in the text: AND is a word
        ("rock OR banana", False),  # "or" and "banana" are not: no OR
        ("rock NOT roll", False),
        ("-rock", True),  # no NOT either
        ("NEAR(rock roll", False),  # "near(rock" is the phrase "near rock"
        ("NEAR(here", True),  # and this is "near here"
        ("NEAR(rock roll, 2)", False),  # "2" is not in the text
        ('"rock and', True),  # an unclosed quote runs to the end
        ('rock "" roll', True),
        ("^rock", True),
        ("text:rock", False),  # no column filter: "text" is a word
        ("{text}: rock", False),
        ("(rock)", True),
        ("rock*", True),
        ("*", False),
        ("rock + roll", True),
        ("'rock'", True),
        ("rock\\", True),
        ("rock\x00roll", True),
        ("rock \ud800", True),  # a lone surrogate is read as "?", which is no word
    ],
)
def test_fts_operators_typed_by_a_user_are_text(
    store: Store, index: SearchIndex, query: str, matches: bool
) -> None:
    sid = store.new_session()
    node = store.append(sid, user("rock and roll near here"))
    assert found(index, query) == ({(sid, node)} if matches else set())


@pytest.mark.parametrize("query", ["", "   ", "\t\n", '""', '"'])
def test_an_empty_query_is_invalid_input(index: SearchIndex, query: str) -> None:
    with pytest.raises(InvalidInput):
        index.search(query)


def test_a_limit_below_one_is_invalid_input(index: SearchIndex) -> None:
    with pytest.raises(InvalidInput):
        index.search("x", limit=0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query=st.text(max_size=60))
def test_no_query_makes_an_sqlite_error(
    tmp_path_factory: pytest.TempPathFactory, query: str
) -> None:
    with Store.open(tmp_path_factory.getbasetemp() / "fuzz-store") as store:
        if not store.sessions():
            sid = store.new_session()
            store.append(sid, user('AND OR NOT NEAR ( ) " * - ^ : + { } rock and roll'))
        with SearchIndex.open(store) as index:
            try:
                fts_query(query)
            except InvalidInput:
                with pytest.raises(InvalidInput):
                    index.search(query)
            else:
                assert isinstance(index.search(query), list)


# -- the index is a cache ----------------------------------------------------------------


def random_history(store: Store, index: SearchIndex, seed: int, steps: int = 80) -> None:
    """Appends, compactions, forks, rewinds, archives and deletes, in a random order,
    with refreshes between; after each refresh, every node of every session's chain
    must be found, in that session and no other."""
    rng = random.Random(seed)
    sessions = [store.new_session()]
    for step in range(steps):
        live = [s.id for s in store.sessions(include_archived=True)]
        sid = rng.choice(live) if live else store.new_session()
        head = store.session(sid).head
        action = rng.random()
        if store.session(sid).archived:
            store.unarchive(sid)
        elif action < 0.55 or head is None:
            store.append(sid, user(f"common step{step} word{rng.randrange(20)}"))
        elif action < 0.62:
            store.compact(sid, f"common summary{step}", keep=rng.randrange(3))
        elif action < 0.75:
            sessions.append(store.fork(f"{sid}~{rng.randrange(store.session(sid).messages)}"))
        elif action < 0.85:
            depth = len(list(store.log(sid)))
            store.rewind(sid, f"{sid}~{rng.randrange(depth)}")
        elif action < 0.9:
            store.archive(sid)
        elif action < 0.95:
            store.delete(sid)
        else:
            with contextlib.suppress(AgsError):  # no earlier head, or an empty one
                store.rewind(sid, f"{sid}@{{1}}")
        if rng.random() < 0.4:
            index.refresh()
            assert found(index, "common", include_archived=True) == whole_history(store)


@pytest.mark.parametrize("seed", range(6))
def test_incremental_refreshes_match_the_history_and_a_rebuild(
    store: Store, index: SearchIndex, seed: int
) -> None:
    random_history(store, index, seed)
    queries = ["common", "word3", "summary*", '"common step1"', "nothing"]
    incremental = {
        q: set(index.search(q, limit=EVERYTHING, include_archived=True)) for q in queries
    }
    assert incremental["common"] and {h.session for h in incremental["common"]} >= {
        s.id for s in store.sessions(include_archived=True) if s.head
    }
    assert {(h.session, h.node) for h in incremental["common"]} == whole_history(store)

    index.rebuild()
    rebuilt = {q: set(index.search(q, limit=EVERYTHING, include_archived=True)) for q in queries}
    assert rebuilt == incremental

    index.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.path / INDEX_PATH}{suffix}").unlink(missing_ok=True)
    with SearchIndex.open(store) as fresh:
        anew = {q: set(fresh.search(q, limit=EVERYTHING, include_archived=True)) for q in queries}
    assert anew == incremental


def test_pruning_leaves_nothing_no_session_reaches(store: Store, index: SearchIndex) -> None:
    a = store.new_session()
    for i in range(10):
        store.append(a, user(f"tern {i}"))
    b = store.fork(f"{a}~5")
    store.append(b, user("only in b"))
    index.refresh()
    store.rewind(a, f"{a}~8")
    store.delete(b)
    index.refresh()
    db = sqlite3.connect(store.path / INDEX_PATH)
    db.create_function("ags_unzstd", 1, lambda data: "")
    counts = [db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("nodes", "blobs")]
    assert counts == [2, 2]
    assert db.execute("SELECT count(*) FROM texts WHERE texts MATCH 'tern'").fetchone()[0] == 2
    db.close()


def test_a_deleted_index_file_is_rebuilt(store: Store) -> None:
    sid = store.new_session()
    node = store.append(sid, user("plover"))
    with SearchIndex.open(store) as index:
        index.refresh()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.path / INDEX_PATH}{suffix}").unlink(missing_ok=True)
    with SearchIndex.open(store) as index:
        assert found(index, "plover") == {(sid, node)}


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zeroed pages", "damaged tables"])
def test_a_corrupt_index_file_is_rebuilt(store: Store, damage: str) -> None:
    sids = [store.new_session() for _ in range(30)]
    nodes = {(sid, store.append(sid, user(f"sandpiper {'x' * 3000} {sid}"))) for sid in sids}
    with SearchIndex.open(store) as index:
        index.refresh()
        index._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    path = store.path / INDEX_PATH
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 1000)
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 3])
    elif damage == "zeroed pages":
        path.write_bytes(data[:4096] + bytes(len(data) - 4096))
    else:  # found only by a query, after the file opened fine
        db = sqlite3.connect(path)
        pages = db.execute(
            "SELECT pageno FROM dbstat WHERE name IN ('nodes', 'blobs', 'texts_data')"
        ).fetchall()
        size = db.execute("PRAGMA page_size").fetchone()[0]
        db.close()
        damaged = bytearray(data)
        for (page,) in pages:
            damaged[(page - 1) * size : page * size] = b"\xff" * size
        path.write_bytes(bytes(damaged))
    with SearchIndex.open(store) as index:
        assert found(index, "sandpiper") == nodes


def test_an_index_of_another_schema_version_is_rebuilt(store: Store) -> None:
    sid = store.new_session()
    node = store.append(sid, user("curlew"))
    with SearchIndex.open(store) as index:
        index.refresh()
    db = sqlite3.connect(store.path / INDEX_PATH)
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION + 1),))
    db.execute("DELETE FROM reach")  # what an old index might hold: nothing usable
    db.commit()
    db.close()
    with SearchIndex.open(store) as index:
        assert found(index, "curlew") == {(sid, node)}


def test_a_session_with_a_damaged_object_is_left_out_and_reported(tmp_path: Path) -> None:
    damaged, _, _ = store_with_damaged_message(tmp_path / "store", "avocet")
    with Store.open(tmp_path / "store") as store, SearchIndex.open(store) as index:
        healthy = store.new_session()
        node = store.append(healthy, user("avocet, again"))  # another blob
        stats = index.refresh()
        assert [sid for sid, _ in stats.failed] == [damaged]
        assert "corrupt" in stats.failed[0][1]
        assert found(index, "avocet") == {(healthy, node)}
        assert index.refresh().failed == stats.failed  # still reported, not walked again
        assert index.refresh().updated == 0


def test_a_busy_index_is_an_ags_error(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store.append(store.new_session(), user("snipe"))
    with SearchIndex.open(store):
        pass
    monkeypatch.setattr(search_module, "BUSY_TIMEOUT_S", 0.05)
    holder = sqlite3.connect(store.path / INDEX_PATH, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with SearchIndex.open(store) as index, pytest.raises(SearchIndexBusy):
            index.refresh()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


REFRESHER = textwrap.dedent(
    """
    import sys
    from objstore import Store
    from objstore.search import SearchIndex
    with Store.open(sys.argv[1]) as store, SearchIndex.open(store) as index:
        (index.rebuild if sys.argv[2] == "rebuild" else index.refresh)()
        assert len(index.search("common", limit=10**6, include_archived=True)) > 0
    """
)


def test_concurrent_refreshes_from_several_processes(store: Store) -> None:
    with store.batch():
        for i in range(150):
            sid = store.new_session()
            for j in range(6):
                store.append(sid, user(f"common session{i} message{j}"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REFRESHER, str(store.path), how],
            stderr=subprocess.PIPE,
            text=True,
        )
        for how in ("refresh", "refresh", "rebuild", "refresh")
    ]
    with SearchIndex.open(store) as index:
        for _ in range(5):
            index.search("common")  # this process refreshes too, meanwhile
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        db = sqlite3.connect(store.path / INDEX_PATH)
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        db.close()
        assert index.refresh().updated == 0
        assert found(index, "common") == whole_history(store)


def test_search_hit_is_a_frozen_value() -> None:
    hit = SearchHit("s", "n", "user", "a b", "t", False, ((2, 3),))
    with pytest.raises(AttributeError):
        hit.snippet = "x"  # type: ignore[misc]
    assert hit.marked("<", ">") == "a <b>"


def test_a_quiet_store_is_refreshed_with_one_stat_and_a_change_is_still_seen(
    store, index, monkeypatch
):
    sid = store.new_session()
    with Store.open(store.path) as writer:  # closed: its pack sealed, the ref file written
        writer.append(sid, user("first words"))
    index.refresh()
    refs = store.path / "refs" / "sessions"
    old = refs.stat().st_mtime - 3600
    os.utime(refs, (old, old))  # as if nothing had changed for an hour
    index.refresh()  # trusts the directory's stamp from now on

    def no_listing(*args, **kwargs):
        raise AssertionError("the refs were read although none changed")

    with monkeypatch.context() as m:
        m.setattr(store, "sessions", no_listing)
        assert index.refresh().sessions == 1
        assert found(index, "first")
    with Store.open(store.path) as writer:
        # A live writer's appends are in its pack's journal, not in ref files (FORMAT.md
        # 9): the directory's stamp does not move, and the search still sees them.
        writer.append(sid, user("second words"))
        os.utime(refs, (old, old))
        assert {n for _s, n in found(index, "second")} == {writer.node_id(sid)}
    assert {n for _s, n in found(index, "second")} == {store.node_id(sid)}


# -- a first build in batches -----------------------------------------------------

BUILDER_KILLED_AFTER_TWO_COMMITS = textwrap.dedent(
    """
    import sys, time
    from objstore import Store, search
    from objstore.search import SearchIndex
    search.BATCH_NODES = 40  # a commit every few sessions
    commits = 0
    plain = search._Transaction.commit_and_begin
    def commit_and_begin(self):
        global commits
        plain(self)
        commits += 1
        if commits == 2:
            print("committed", flush=True)
            time.sleep(600)  # the test kills the process here
    search._Transaction.commit_and_begin = commit_and_begin
    with Store.open(sys.argv[1]) as store, SearchIndex.open(store) as index:
        index.refresh()
    """
)


def test_a_first_build_killed_halfway_keeps_what_it_committed_and_the_next_finishes(
    store: Store,
) -> None:
    with store.batch():
        for i in range(30):
            sid = store.new_session()
            for j in range(10):
                store.append(sid, user(f"common session{i} message{j}"))
    proc = subprocess.Popen(
        [sys.executable, "-c", BUILDER_KILLED_AFTER_TWO_COMMITS, str(store.path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "committed\n", proc.stderr
    finally:
        proc.kill()  # SIGKILL: no rollback, no close
        proc.wait()
    db = sqlite3.connect(store.path / INDEX_PATH)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    (kept,) = db.execute("SELECT count(*) FROM sessions").fetchone()
    db.close()
    assert 0 < kept < 30  # two batches of whole sessions, not the whole build
    with SearchIndex.open(store) as index:
        stats = index.refresh()
        assert stats.updated == 30 - kept  # resumed: what was committed is not redone
        assert found(index, "common") == whole_history(store)
        assert found(index, "message7") == {
            (s.id, entry.id)
            for s in store.sessions()
            for entry in store.log(s.id)
            if entry.message["content"].endswith("message7")
        }


def test_refreshes_in_many_batches_find_what_one_transaction_finds(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(search_module, "BATCH_NODES", 3)  # rewinds and deletes mid-refresh
    with SearchIndex.open(store) as batched:
        random_history(store, batched, seed=7, steps=60)
        in_batches = found(batched, "common", include_archived=True)
    monkeypatch.setattr(search_module, "BATCH_NODES", 10**9)
    (store.path / INDEX_PATH).unlink()
    with SearchIndex.open(store) as whole:
        assert found(whole, "common", include_archived=True) == in_batches
    assert in_batches == whole_history(store)


def test_a_refresh_does_not_put_back_a_head_another_process_indexed_between_its_commits(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    with store.batch():
        for i in range(6):
            sid = store.new_session()
            for j in range(5):
                store.append(sid, user(f"common s{i} m{j}"))
    last = store.sessions()[-1].id  # the session the refresh below comes to last
    monkeypatch.setattr(search_module, "BATCH_NODES", 5)
    plain = search_module._Transaction.commit_and_begin
    meanwhile: list[str] = []

    def commit_and_begin(self: search_module._Transaction) -> None:
        if meanwhile:
            return plain(self)
        self._db.execute("COMMIT")
        # Between this refresh's commits: the session moves on, and another
        # refresh indexes it at its new head.
        store.append(last, user("fresh words"))
        meanwhile.append(store.node_id(last))
        with SearchIndex.open(store) as other:
            other.refresh()
        self._db.execute("BEGIN IMMEDIATE")

    monkeypatch.setattr(search_module._Transaction, "commit_and_begin", commit_and_begin)
    with SearchIndex.open(store) as index:
        index.refresh()
        assert meanwhile
        assert found(index, "fresh", refresh=False) == {(last, meanwhile[0])}
