"""A context read takes a session's nodes a run at a time (``BlockReader.message_run``):
from one parse of the part of an array-layout block that holds them in order, with no
Node made for each. It must give exactly the message blobs a walk node by node gives,
take nothing ``node_from_value`` would refuse or read otherwise, and let every other
node (a fork, a compaction, files, other sessions' nodes between them, the live pack)
go to the node-by-node read.

The stores are real, sealed on close into block packs (FORMAT.md 5.5).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from objstore import CorruptObject, Store, block_reader
from objstore.nodes import node_from_value
from objstore.objects import object_id
from objstore.pack_format import array_table, encode_array_block
from objstore.walk import context_blobs


def message(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 else "assistant", "content": f"message {i} " * 6}


def blobs_both_ways(store: Store, spec: str) -> tuple[list[str], list[str], int]:
    """The context's blobs read node by node and with runs, and how many nodes the read
    with runs still read one by one."""
    head = store.node_id(spec)
    by_node = context_blobs(head, block_reader.BlockReader(store.objects).node)
    reader = block_reader.BlockReader(store.objects)
    alone = []

    def node(oid: str) -> Any:
        alone.append(oid)
        return reader.node(oid)

    with_runs = context_blobs(head, node, reader.message_run)
    return by_node, with_runs, len(alone)


def test_a_long_session_is_walked_a_block_at_a_time(tmp_path: Path) -> None:
    """Its span nodes and the plain nodes after the last of them: every one taken in
    runs, none read alone, the same blobs, and the same context."""
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for i in range(1000):
            s.append(sid, message(i))
    with Store.open(tmp_path / "s") as s:
        by_node, with_runs, alone = blobs_both_ways(s, sid)
        assert with_runs == by_node and len(by_node) == 1000
        assert alone == 0  # 31 span nodes and 8 plain ones, in a few blocks
        assert s.context(sid) == [message(i) for i in range(1000)]


def test_forks_compactions_files_and_sessions_written_side_by_side_read_the_same(
    tmp_path: Path,
) -> None:
    """Two sessions appended in turn by one handle (their nodes interleave in the same
    blocks), a fork from the middle of one continued apart, a compaction, and nodes
    that changed files: every head's context is the one a walk node by node gives."""
    with Store.open(tmp_path / "s") as s:
        a, b = s.new_session(), s.new_session()
        for i in range(300):
            s.append(a, message(i))
            s.append(b, message(1000 + i), files={"f.txt": (None, b"%d" % i)} if i % 7 else None)
        fork = s.fork(f"{a}~75")
        for i in range(100):
            s.append(fork, message(2000 + i))
            s.append(a, message(3000 + i))
        s.compact(b, "so far", keep=3)
        for i in range(80):
            s.append(b, message(4000 + i))
    with Store.open(tmp_path / "s") as s:
        for spec in (a, b, fork, f"{a}~40", f"{fork}~100", f"{b}~79", f"{b}~81"):
            by_node, with_runs, _ = blobs_both_ways(s, spec)
            assert with_runs == by_node, spec
        assert len(s.context(a)) == 400 and len(s.context(fork)) == 325


def test_the_newest_nodes_beside_a_live_writer_are_read_one_by_one(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for i in range(200):
            s.append(sid, message(i))
    with Store.open(tmp_path / "s") as writer:
        for i in range(200, 270):
            writer.append(sid, message(i))
        with Store.open(tmp_path / "s") as reader:
            by_node, with_runs, _ = blobs_both_ways(reader, sid)
            assert with_runs == by_node and len(by_node) == 270
            assert reader.context(sid) == [message(i) for i in range(270)]


def span_node(after: str | None, blobs: list[str], count: int, **changes: Any) -> bytes:
    value: dict[str, Any] = {
        "message": blobs[-1],
        "messages": count,
        "meta": {"time": "t"},
        "parent": "0" * 64,
        "span": {"after": after, "messages": blobs},
        "state": None,
        "type": "message",
    }
    value.update(changes)
    return orjson.dumps(
        {k: v for k, v in value.items() if v is not _GONE}, option=orjson.OPT_SORT_KEYS
    )


_GONE = object()
ODD: list[dict[str, Any]] = [
    {"state": _GONE},
    {"meta": _GONE},
    {"parent": _GONE},
    {"message": _GONE},
    {"messages": "3"},
    {"messages": 3.0},
    {"messages": True},
    {"span": None},
    {"span": []},
    {"span": {"messages": ["a" * 64]}},
    {"span": {"after": None, "messages": "ab"}},
    {"span": {"after": None, "messages": {"a": 1}}},
    {"type": "compaction", "summary": "a" * 64, "kept": []},
    {"type": "other"},
    {"files": {"a.txt": {"after": "b" * 64}}},
]


@pytest.mark.parametrize("odd", range(len(ODD) + 1))
@pytest.mark.parametrize("at", [0, 3, 6])
def test_a_run_takes_only_what_node_from_value_reads_and_as_it_reads_it(odd: int, at: int) -> None:
    """A block of seven span nodes chained in order, one of them changed: the run from
    the newest takes a prefix of what a walk node by node through ``node_from_value``
    takes, with the same blobs and the same next id, and stops at the changed node
    wherever ``node_from_value`` would refuse it or read it otherwise."""
    bodies: list[tuple[str, bytes]] = []
    after = None
    for k in range(7):
        blobs = [f"{k:02d}{j:062x}" for j in range(4)]
        changes = ODD[odd] if odd < len(ODD) and k == at else {}
        body = span_node(after, blobs, 4 * (k + 1), **changes)
        oid = object_id("node", body)
        bodies.append((oid, body))
        after = oid
    content = encode_array_block(b"node", bodies)
    block = block_reader._ArrayBlock(content, array_table(content), True)

    expected: list[str] = []
    oid: str | None = bodies[-1][0]
    lookup = dict(bodies)
    while oid in lookup:
        try:
            node = node_from_value(oid, orjson.loads(lookup[oid]))
        except CorruptObject:
            break
        if node.is_compaction:
            break
        expected += reversed(node.span.messages) if node.span else [node.content]
        oid = node.span.after if node.span else node.parent

    run = block.message_run(bodies[-1][0], 6)
    taken, next_id = run if run is not None else ([], bodies[-1][0])
    assert taken == expected[: len(taken)]
    if odd == len(ODD):  # nothing changed: the whole block, and then the start
        assert (taken, next_id) == (expected, None)
    else:  # the nodes newer than the changed one, and then the changed one, read alone
        assert (taken, next_id) == (expected[: 4 * (6 - at)], bodies[at][0])
