"""The Store API: round trips, forks, compaction, specs, metadata, bad input."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from conftest import store_with_damaged_message, tree_snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from objstore import (
    AmbiguousSpec,
    CorruptObject,
    InvalidInput,
    InvalidName,
    ObjectMissing,
    RefConflict,
    SessionArchived,
    SpecError,
    Store,
    StoreFormatError,
    UnknownSpec,
)


@pytest.fixture
def store(tmp_path: Path):
    with Store.open(tmp_path / "store") as s:
        yield s


def message_objects(store: Store) -> set[str]:
    """Ids of every object the store holds, deduplicated."""
    return set(store.objects.ids())


# -- round trips ---------------------------------------------------------------

json_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)),  # no lone surrogates
    max_size=40,
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(json_text, children, max_size=4)
    ),
    max_leaves=12,
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"]), "content": json_text},
    optional={
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": json_text,
                    "function": st.fixed_dictionaries(
                        {"name": json_text, "arguments": json_values | json_text}
                    ),
                }
            ),
            max_size=3,
        ),
        "tool_call_id": json_text,
        "name": json_text,
        "extra": json_values,
    },
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=st.lists(messages, min_size=1, max_size=6), state=json_values)
def test_messages_and_state_come_back_exactly(tmp_path_factory, batch, state):
    path = tmp_path_factory.mktemp("rt") / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        for m in batch:
            s.append(sid, m, state={"v": state})
    with Store.open(path) as s:  # a new handle reads from disk, not from a cache
        assert s.context(sid) == batch
        assert [e.message for e in s.log(sid)] == batch[::-1]
        assert s.state_at(sid) == {"v": state}


def test_odd_unicode_round_trips(store):
    text = "line\u2028sep\u2029para \U0001f600 \U00010348 \u0000nul é"
    m = {"role": "user", "content": text, "k\u2028": ["\U0001f9ea"]}
    sid = store.new_session(title="t\u2028itle \U0001f600")
    store.append(sid, m)
    assert store.context(sid) == [m]
    assert store.session(sid).title == "t\u2028itle \U0001f600"


def test_equal_content_is_stored_once(store):
    a = store.new_session()
    b = store.new_session()
    m = {"role": "user", "content": "same words " * 50}
    store.append(a, m, state={"todo": []})
    before = message_objects(store)
    # A meta of its own: within one millisecond b's node would be a's, stored once too.
    store.append(b, m, state={"todo": []}, meta={"by": "b"})
    new = message_objects(store) - before
    assert len(new) == 1  # only b's node: the message and the state blobs already exist


def test_unchanged_state_is_not_rewritten(store):
    sid = store.new_session()
    store.append(sid, {"role": "user", "content": "1"}, state={"n": 1})
    before = message_objects(store)
    store.append(sid, {"role": "user", "content": "2"})  # no state: the old one stays
    assert len(message_objects(store) - before) == 2  # message blob + node
    assert store.state_at(sid) == {"n": 1}
    assert store.node(store.node_id(sid)).state == store.node(store.node_id(sid + "~1")).state


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "user", "content": float("nan")},
        {"role": "user", "content": ("a", "tuple")},
        {"role": "user", 1: "int key"},
        {"role": "user", "content": "lone \ud800 surrogate"},
        {"role": "user", "content": b"bytes"},
        ["not", "a", "dict"],
    ],
)
def test_values_json_would_change_are_refused_and_change_nothing(tmp_path, bad):
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": "ok"})
    before = tree_snapshot(path)
    good = {"role": "user", "content": "fine"}
    with Store.open(path) as s:
        with pytest.raises(InvalidInput):
            s.append(sid, bad)
        if isinstance(bad, dict):
            with pytest.raises(InvalidInput):
                s.append(sid, good, state=bad)  # a good message with a bad state: nothing
            with pytest.raises(InvalidInput):
                s.append(sid, good, meta=bad)
            with pytest.raises(InvalidInput):
                s.compact(sid, bad)
            with pytest.raises(InvalidInput):
                s.compact(sid, "fine", state=bad)
    assert tree_snapshot(path) == before


# -- forks -----------------------------------------------------------------------


def test_fork_shares_history_and_adds_no_message_object(store):
    sid = store.new_session(title="main")
    for i in range(20):
        store.append(sid, {"role": "user", "content": f"m{i}"})
    before = message_objects(store)
    fork = store.fork(f"{sid}~5", title="side")
    assert message_objects(store) == before
    assert store.context(fork) == [{"role": "user", "content": f"m{i}"} for i in range(15)]
    info = store.session(fork)
    assert info.messages == 15
    assert info.forked_from == {"session": sid, "node": store.node_id(f"{sid}~5")}
    store.append(fork, {"role": "user", "content": "branch"})
    store.append(sid, {"role": "user", "content": "trunk"})
    assert store.context(fork)[-1]["content"] == "branch"
    assert store.context(sid)[-1]["content"] == "trunk"
    assert len(store.context(sid)) == 21


def test_fork_of_a_tag_and_of_a_plain_node(store):
    sid = store.new_session()
    ids = [store.append(sid, {"role": "user", "content": str(i)}) for i in range(4)]
    store.tag("checkpoint", ids[1])
    fork = store.fork("tags/checkpoint")
    assert len(store.context(fork)) == 2
    fork2 = store.fork(ids[2][:10])
    assert store.session(fork2).forked_from == {"session": None, "node": ids[2]}
    assert len(store.context(fork2)) == 3


# -- compaction --------------------------------------------------------------------


def test_compaction_context_is_summary_kept_and_later(store):
    sid = store.new_session()
    msgs = [{"role": "user", "content": f"m{i}"} for i in range(10)]
    for m in msgs:
        store.append(sid, m)
    store.compact(sid, "summary one", keep=3)
    assert store.context(sid) == [{"role": "user", "content": "summary one"}, *msgs[7:]]
    later = [{"role": "assistant", "content": f"a{i}"} for i in range(4)]
    for m in later:
        store.append(sid, m)
    summary2 = {"role": "system", "content": "summary two", "meta": {"x": 1}}
    store.compact(sid, summary2, keep=2)
    assert store.context(sid) == [summary2, *later[2:]]
    store.append(sid, {"role": "user", "content": "after"})
    assert store.context(sid) == [summary2, *later[2:], {"role": "user", "content": "after"}]
    # The transcript keeps everything, compaction events included, newest first.
    log = list(store.log(sid))
    assert [e.node.type for e in log].count("compaction") == 2
    assert [e.message for e in log if e.node.type == "message"][::-1] == [
        *msgs,
        *later,
        {"role": "user", "content": "after"},
    ]
    assert store.session(sid).messages == 15


def test_compaction_keep_can_reach_into_previous_kept(store):
    sid = store.new_session()
    for i in range(6):
        store.append(sid, {"role": "user", "content": str(i)})
    store.compact(sid, "s1", keep=2)  # context: s1, 4, 5
    store.append(sid, {"role": "user", "content": "6"})
    store.compact(sid, "s2", keep=3)  # the kept 4 and 5 stay kept, with 6
    assert [m["content"] for m in store.context(sid)] == ["s2", "4", "5", "6"]


def test_context_is_read_in_proportion_to_context(store, monkeypatch):
    sid = store.new_session()
    for i in range(300):
        store.append(sid, {"role": "user", "content": str(i)})
    store.compact(sid, "sum", keep=2)
    for i in range(5):
        store.append(sid, {"role": "user", "content": f"n{i}"})
    reads = []
    original = store.objects.get
    monkeypatch.setattr(store.objects, "get", lambda oid: reads.append(oid) or original(oid))
    assert len(store.context(sid)) == 8
    assert len(reads) < 30  # not ~600: the walk stops at the compaction node


def test_compacting_an_empty_session_is_refused(store):
    sid = store.new_session()
    with pytest.raises(InvalidInput):
        store.compact(sid, "nothing")


# -- specs ---------------------------------------------------------------------------


def test_specs(store, tmp_path):
    sid = store.new_session()
    ids = [store.append(sid, {"role": "user", "content": str(i)}) for i in range(5)]
    assert store.node_id(sid) == ids[-1]
    assert store.node_id(f"sessions/{sid}") == ids[-1]
    assert store.node_id(f"sessions/{sid[:8]}~2") == ids[2]
    assert store.node_id(f"{sid[:8]}~~") == ids[2]
    assert store.node_id(ids[1][:12]) == ids[1]
    assert store.node_id(ids[1]) == ids[1]
    with pytest.raises(UnknownSpec, match="moved only 0 times"):
        store.node_id(f"{sid}@{{1}}")  # appends are not reflog moves (FORMAT.md 7)
    store.rewind(sid, f"{sid}~1")
    store.rewind(sid, f"{sid}~1")
    assert store.node_id(f"{sid}@{{1}}") == ids[3]
    assert store.node_id(f"{sid}@{{2}}~1") == ids[3]
    store.rewind(sid, f"{sid}@{{2}}")
    store.tag("t/one", ids[0])
    assert store.node_id("tags/t/one") == ids[0]
    assert store.node_id("t/one") == ids[0]
    store.checkout(sid, root=tmp_path)
    assert store.target("HEAD", root=tmp_path).session == sid
    sub = tmp_path / "sub"
    sub.mkdir()
    assert store.target("HEAD~1", root=sub).node == ids[3]  # found from a subdirectory
    store.checkout(f"{sid}~2", root=tmp_path)
    assert store.target("HEAD", root=tmp_path) == store.target(ids[2])
    assert store.target("HEAD@{1}", root=tmp_path).node == ids[-1]
    with pytest.raises(UnknownSpec):
        store.node_id(f"{sid}~9")
    with pytest.raises(UnknownSpec):
        store.node_id("nosuchtag")
    with pytest.raises(SpecError):
        store.node_id(f"{sid}~1@{{1}}")


def test_ambiguous_prefix_lists_candidates(store):
    sid = store.new_session()
    with store.batch():
        # 1,500 node ids among 65,536 four-digit prefixes: some share one, but for
        # odds of about 1 in 10^7.
        for i in range(1500):
            store.append(sid, {"role": "user", "content": str(i)})
    seen: dict[str, str] = {}
    shared = []
    for entry in store.log(sid):
        if entry.id[:4] in seen:
            shared.append((seen[entry.id[:4]], entry.id))
        seen[entry.id[:4]] = entry.id
    assert shared
    first, second = shared[0]
    with pytest.raises(AmbiguousSpec) as err:
        store.node_id(first[:4])
    assert f"node {first}" in err.value.candidates
    assert f"node {second}" in err.value.candidates
    assert first in str(err.value)


def test_rewind_and_undo_through_the_reflog(store):
    sid = store.new_session()
    ids = [store.append(sid, {"role": "user", "content": str(i)}) for i in range(6)]
    store.rewind(sid, f"{sid}~3")
    assert store.node_id(sid) == ids[2]
    assert store.session(sid).messages == 3
    store.rewind(sid, f"{sid}@{{1}}")
    assert store.node_id(sid) == ids[5]
    assert [line.reason for line in store.reflog(sid)][:2] == [
        f"rewind to {sid}@{{1}}",
        f"rewind to {sid}~3",
    ]
    other = store.new_session()
    store.append(other, {"role": "user", "content": "elsewhere"})
    with pytest.raises(InvalidInput):
        store.rewind(sid, other)


# -- metadata, archive, delete ------------------------------------------------------------


def test_sessions_listing_and_metadata(store):
    a = store.new_session(title="first", root="/src/a", model="gemma4")
    b = store.new_session(title="second")
    time.sleep(0.002)  # times have millisecond resolution
    store.append(a, {"role": "user", "content": "hi"})
    rows = store.sessions()
    assert [r.id for r in rows] == [a, b]  # most recently updated first
    assert rows[0].messages == 1 and rows[0].root == "/src/a" and rows[0].model == "gemma4"
    store.set_title(b, "renamed")
    assert store.session(b).title == "renamed"
    store.archive(b)
    assert [r.id for r in store.sessions()] == [a]
    assert {r.id for r in store.sessions(include_archived=True)} == {a, b}
    with pytest.raises(SessionArchived):
        store.append(b, {"role": "user", "content": "no"})
    store.unarchive(b)
    store.append(b, {"role": "user", "content": "yes"})
    store.release(b)
    store.delete(b)
    assert [r.id for r in store.sessions(include_archived=True)] == [a]
    with pytest.raises(UnknownSpec):
        store.session(b)
    assert store.reflog(f"sessions/{a}") == []  # an append writes no reflog line
    assert [e.reason for e in store.reflog(f"sessions/{b}")] == [
        "delete", "unarchive", "archive", "title"
    ]  # fmt: skip


def test_a_change_of_metadata_to_what_it_is_writes_and_logs_nothing(store):
    """Unarchiving a session that was not archived added an "unarchive" reflog line."""
    sid = store.new_session(title="same")
    store.append(sid, {"role": "user", "content": "1"})
    ref = store.path / "refs" / "sessions" / sid
    before = (ref.read_bytes(), store.reflog(sid))
    store.unarchive(sid)
    store.set_title(sid, "same")
    assert (ref.read_bytes(), store.reflog(sid)) == before
    store.set_title(sid, "other")
    assert [e.reason for e in store.reflog(sid)][0] == "title"


def test_tags_do_not_move_unless_forced(store):
    sid = store.new_session()
    n1 = store.append(sid, {"role": "user", "content": "1"})
    n2 = store.append(sid, {"role": "user", "content": "2"})
    store.tag("v1", n1)
    store.tag("v1", n1)  # same target: fine
    with pytest.raises(RefConflict):
        store.tag("v1", n2)
    store.tag("v1", n2, force=True)
    assert store.tags() == {"v1": n2}
    assert store.node_id("v1@{1}") == n1  # a forced move is in the tag's reflog
    store.delete_tag("v1")
    assert store.tags() == {}
    with pytest.raises(UnknownSpec):
        store.delete_tag("v1")


def test_batch_writes_everything_at_the_end(tmp_path):
    path = tmp_path / "store"
    with Store.open(path) as s:
        with s.batch():
            sids = [s.new_session(title=f"s{i}") for i in range(20)]
            for sid in sids:
                for j in range(5):
                    s.append(sid, {"role": "user", "content": f"{sid}-{j}"})
                assert len(s.context(sid)) == 5  # visible inside the batch
        with pytest.raises(RuntimeError), s.batch():
            dropped = s.new_session(title="dropped")
            raise RuntimeError("abort")
    with Store.open(path) as s:
        assert len(s.sessions()) == 20
        assert all(r.messages == 5 for r in s.sessions())
        with pytest.raises(UnknownSpec):
            s.session(dropped)


# -- corruption and hostile names -------------------------------------------------------


def test_a_corrupt_object_is_reported_by_id(tmp_path):
    path = tmp_path / "store"
    sid, message_id, _ = store_with_damaged_message(path, "precious " * 40)
    # A read of the object itself hashes it (a context checks its block's checksum,
    # which this damage matches: tests/test_block_reads.py).
    with Store.open(path) as s, pytest.raises(CorruptObject) as err:
        s.blob(message_id)
    assert message_id in str(err.value)


def test_a_corrupt_loose_object_is_reported(store):
    oid = store.objects.put("blob", b'"loose"', pack=False)
    Path(store.objects.loose_path(oid)).write_bytes(b"\x01garbage")
    with pytest.raises(CorruptObject) as err:
        store.objects.get(oid)
    assert oid in str(err.value)


@pytest.mark.parametrize("name", ["HEAD", "cafe", "0123abcd", "sessions/x", "tags/x", "HEAD/x"])
def test_a_tag_its_name_would_not_find_is_refused(store, name):
    """Each was made, and its name then found the session of HEAD, an id prefix, or
    nothing: only tags/NAME reached it."""
    sid = store.new_session()
    node = store.append(sid, {"role": "user", "content": "1"})
    with pytest.raises(InvalidName, match=f"tag {name} would not be found by its name"):
        store.tag(name, node)
    assert store.tags() == {}


def test_a_tag_and_a_folder_of_tags_of_one_name_are_refused_and_leave_nothing(store):
    """A tag is a file named by its name, so ``a`` and ``a/b`` cannot both be. Before,
    the second raised "Not a directory" naming a file in tmp/, which stayed there,
    and a deleted ``x/y`` left the folder ``x`` that kept tag ``x`` from being made."""
    sid = store.new_session()
    node = store.append(sid, {"role": "user", "content": "1"})
    store.tag("a", node)
    with pytest.raises(RefConflict, match="tag a/b cannot be made: tag a exists"):
        store.tag("a/b", node)
    store.tag("x/y/z", node)
    with pytest.raises(RefConflict, match="tag x cannot be made: tag x/y/z exists"):
        store.tag("x", node)
    assert os.listdir(store.path / "tmp") == []
    store.delete_tag("x/y/z")
    assert sorted(os.listdir(store.path / "refs" / "tags")) == ["a"]
    # The reflog of the deleted tag is kept (logs/tags/x/y/z), which x's would replace.
    with pytest.raises(RefConflict, match="reflogs of deleted tags inside x/ are kept"):
        store.tag("x", node)
    store.expire_reflogs("9999-01-01T00:00:00.000Z")
    store.tag("x", node)
    assert store.tags() == {"a": node, "x": node}


@pytest.mark.parametrize(
    "name",
    ["../escape", "/etc/passwd", "a\0b", "x/../../y", ".hidden", "a/./b", "ok/", "", "a..b/../c"],
)
def test_hostile_tag_names_are_refused(store, tmp_path, name):
    sid = store.new_session()
    store.append(sid, {"role": "user", "content": "x"})
    with pytest.raises((InvalidName, SpecError)):
        store.tag(name, sid)
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize(
    "spec",
    ["../../etc", "sessions/../../x", "sessions/" + "0" * 31 + "/", "tags/../x", "a\0b", "/abs"],
)
def test_hostile_specs_are_refused(store, spec):
    with pytest.raises((InvalidName, SpecError, UnknownSpec)):
        store.node_id(spec)


@pytest.mark.parametrize("oid", ["../" + "0" * 61, "0" * 63, "A" * 64, "0" * 63 + "\0", "/" * 64])
def test_hostile_object_ids_are_refused(store, oid):
    with pytest.raises(InvalidName):
        store.objects.get(oid)


def test_hostile_ref_names_are_refused_by_the_ref_store(store):
    for name in ["sessions/../../x", "HEAD", "HEAD/../x", "tags//x", "refs/x", "sessions/ab\0"]:
        with pytest.raises(InvalidName):
            store.refs.compare_and_swap(name, None, "0" * 64, "test")


def test_missing_object(store):
    with pytest.raises(ObjectMissing):
        store.objects.get("0" * 64)


# -- opening -------------------------------------------------------------------------------


def test_open_refuses_what_is_not_a_store(tmp_path):
    (tmp_path / "notastore").mkdir()
    (tmp_path / "notastore" / "file.txt").write_text("mine")
    with pytest.raises(StoreFormatError):
        Store.open(tmp_path / "notastore")
    (tmp_path / "plainfile").write_text("x")
    with pytest.raises(StoreFormatError):
        Store.open(tmp_path / "plainfile")


def test_open_refuses_a_newer_format(tmp_path):
    path = tmp_path / "store"
    Store.open(path).close()
    (path / "ags-store.json").write_text('{"format":"ags-store","version":99}\n')
    with pytest.raises(StoreFormatError, match="99"):
        Store.open(path)


def test_default_location_comes_from_ags_store(tmp_path, monkeypatch):
    monkeypatch.setenv("AGS_STORE", str(tmp_path / "envstore"))
    with Store.open() as s:
        assert s.path == tmp_path / "envstore"
    assert (tmp_path / "envstore" / "ags-store.json").exists()


def test_archiving_twice_keeps_the_first_time(store):
    sid = store.new_session()
    store.archive(sid)
    first = store.session(sid).archived_at
    time.sleep(0.002)
    store.archive(sid)
    assert store.session(sid).archived_at == first


def test_the_writer_itself_can_archive_and_then_cannot_append(store):
    sid = store.new_session()
    store.append(sid, {"role": "user", "content": "1"})  # this handle now holds the writer lock
    store.archive(sid)
    with pytest.raises(SessionArchived):
        store.append(sid, {"role": "user", "content": "2"})
    assert store.session(sid).messages == 1


def test_checkout_attaches_to_sessions_and_detaches_at_nodes(store, tmp_path, monkeypatch):
    sid = store.new_session()
    ids = [store.append(sid, {"role": "user", "content": str(i)}) for i in range(3)]
    assert store.head(root=tmp_path) is None
    store.checkout(sid[:6], root=tmp_path)
    assert store.head(root=tmp_path).session == sid
    store.append(sid, {"role": "user", "content": "3"})
    assert store.head(root=tmp_path).node == store.node_id(sid)  # attached: follows the session
    store.checkout(f"{sid}~2", root=tmp_path)
    assert store.head(root=tmp_path) == store.target(ids[1])  # detached: no session
    assert store.head(root=tmp_path).session is None
    store.tag("here", ids[0])
    store.checkout("here", root=tmp_path)
    assert store.head(root=tmp_path).node == ids[0]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="does not name a session"):
        store.session_id("HEAD")  # detached HEAD names no session
    store.checkout(sid)  # no root given: the project the current directory is in
    assert store.session_id("HEAD") == sid


def test_a_batch_can_write_more_sessions_than_the_process_has_file_handles(tmp_path):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        with Store.open(tmp_path / "store") as s:
            with s.batch():
                for i in range(400):
                    sid = s.new_session()
                    s.append(sid, {"role": "user", "content": str(i)})
            assert len(s.sessions()) == 400
            for row in s.sessions()[:300]:  # and appends outside a batch, releasing as we go
                s.append(row.id, {"role": "user", "content": "more"})
                s.release(row.id)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_processes_creating_one_store_at_once_all_succeed(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "new-store"
    code = (
        "import sys; from objstore import Store\n"
        "s = Store.open(sys.argv[1]); s.append(s.new_session(), {'role': 'user', 'content': 'x'})"
        "; s.close()"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)]) for _ in range(6)]
    assert [p.wait(timeout=60) for p in procs] == [0] * 6
    with Store.open(path) as s:
        assert len(s.sessions()) == 6


def naive_context(store: Store, node_id: str | None) -> list:
    """The context by the definition in FORMAT.md, walking every parent (no spans)."""
    chain = []
    while node_id is not None:
        node = store.node(node_id)
        if node.is_compaction:
            kept = [store.blob(store.node(k).content) for k in node.kept]
            return [store.blob(node.content), *kept, *chain[::-1]]
        chain.append(store.blob(node.content))
        node_id = node.parent
    return chain[::-1]


@pytest.mark.parametrize("seed", range(6))
def test_context_with_spans_matches_the_definition(tmp_path, monkeypatch, seed):
    import random

    import objstore.store

    monkeypatch.setattr(objstore.store, "SPAN_EVERY", 3)  # spans everywhere
    rng = random.Random(seed)
    path = tmp_path / "store"
    s = Store.open(path)
    sessions = [s.new_session()]
    for step in range(250):
        sid = rng.choice(sessions)
        roll = rng.random()
        if roll < 0.7:
            s.append(sid, {"role": "user", "content": f"{step}"})
        elif roll < 0.8 and s.session(sid).messages:
            s.compact(sid, f"summary {step}", keep=rng.randrange(0, 6))
        elif roll < 0.9 and s.session(sid).head:
            back = rng.randrange(0, 8)
            with contextlib.suppress(UnknownSpec):
                sessions.append(s.fork(f"{sid}~{back}"))
        elif roll < 0.95 and s.session(sid).head:
            with contextlib.suppress(UnknownSpec):
                s.rewind(sid, f"{sid}~{rng.randrange(1, 5)}")
        else:  # a new handle: writers rebuild what they remember from disk
            s.close()
            s = Store.open(path)
    for sid in sessions:
        head = s.session(sid).head
        assert s.context(sid) == naive_context(s, head)
        for back in range(1, 6):
            try:
                node = s.node_id(f"{sid}~{back}")
            except UnknownSpec:
                break
            assert s.context(node) == naive_context(s, node)
    spans = sum(1 for sid in sessions for e in s.log(sid) if e.node.span is not None)
    assert spans > 10  # the walk above really went through spans
    s.close()


def test_a_failed_pack_write_leaves_nothing_half_written(store, monkeypatch):
    import objstore.packs

    sid = store.new_session()
    store.append(sid, {"role": "user", "content": "before"})
    real_write = os.pwrite
    calls = {"n": 0}

    def disk_full_after_some_bytes(fd, data, offset):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:7], offset)  # a short write, then a full disk
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(objstore.packs.os, "pwrite", disk_full_after_some_bytes)
    with pytest.raises(OSError):
        store.append(sid, {"role": "user", "content": "lost to a full disk"})
    monkeypatch.undo()
    store.append(sid, {"role": "user", "content": "after"})
    assert [m["content"] for m in store.context(sid)] == ["before", "after"]
    for oid in store.objects.ids():
        store.objects.get(oid)
