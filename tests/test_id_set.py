"""IdSet (objstore/id_set.py): the set of ids gc's mark and du keep for a whole store,
and that the mark it fills reaches what the plain set of strings reaches."""

from __future__ import annotations

import os
import random
import tracemalloc
from pathlib import Path

import pytest

from objstore import Store
from objstore.id_set import MARK_KEY_BYTES, IdSet
from objstore.reach import reach_into, reachable, scanning


def random_ids(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(32) for _ in range(n)]


@pytest.mark.parametrize("key_bytes", [32, MARK_KEY_BYTES, 8])
def test_holds_what_was_added_through_every_growth(key_bytes: int) -> None:
    ids = random_ids(20_000, seed=key_bytes)
    ids_set = IdSet(key_bytes=key_bytes)  # starts at 1,024 slots: grows five times
    assert all(ids_set.add(oid) for oid in ids)
    assert not any(ids_set.add(oid) for oid in ids[:100])
    assert len(ids_set) == len(ids)
    assert all(oid in ids_set and oid.hex() in ids_set for oid in ids)
    assert not any(oid in ids_set for oid in random_ids(2_000, seed=99))


def test_whole_ids_tell_apart_ids_that_share_a_long_prefix() -> None:
    shared = os.urandom(24)
    a, b = shared + bytes(8), shared + b"\x01" * 8
    ids = IdSet()
    ids.add(a)
    assert b not in ids and ids.add(b) and len(ids) == 2


def test_a_mark_tells_apart_ids_that_differ_in_their_sixteenth_byte() -> None:
    shared = os.urandom(15)
    a, b = shared + b"\x00" + os.urandom(16), shared + b"\x01" + os.urandom(16)
    ids = IdSet(key_bytes=MARK_KEY_BYTES)
    ids.add(a)
    assert b not in ids and ids.add(b) and len(ids) == 2


def test_ids_whose_slot_is_the_last_wrap_around_to_the_first() -> None:
    slots = 1024  # an empty set's table
    ids = [(slots - 1).to_bytes(8, "little") + os.urandom(24) for _ in range(20)]
    table = IdSet(key_bytes=MARK_KEY_BYTES, columns=1)
    for n, oid in enumerate(ids):
        table.set(oid, n)
    assert [table.get(oid, 0) for oid in ids] == list(range(20))
    assert os.urandom(32) not in table


def test_a_mark_of_a_store_takes_about_23_bytes_an_id() -> None:
    """16 bytes of each id in a table at most 70% full and no larger: 1.8 million ids
    in 41 MB, where whole ids in a table of a power of two took 134 MB."""
    tracemalloc.start()
    try:
        ids = IdSet(100_000, key_bytes=MARK_KEY_BYTES)
        size = tracemalloc.get_traced_memory()[0]
        for oid in random_ids(100_000, seed=5):
            ids.add(oid)
        assert tracemalloc.get_traced_memory()[0] - size < 100_000  # it did not grow
    finally:
        tracemalloc.stop()
    assert size <= 100_000 / 0.7 * MARK_KEY_BYTES + 10_000


def test_columns_move_with_their_ids_when_the_table_grows() -> None:
    ids = random_ids(5_000, seed=3)
    table = IdSet(columns=2)
    for n, oid in enumerate(ids):
        table.set(oid.hex(), n, -n)
    assert [(table.get(oid, 0), table.get(oid, 1)) for oid in ids] == [
        (n, -n) for n in range(len(ids))
    ]
    assert table.get(os.urandom(32), 0) is None


def test_the_all_zero_id_is_an_id_like_any_other() -> None:
    zero = bytes(32)
    ids = IdSet(columns=1)
    assert zero not in ids and ids.get(zero, 0) is None
    ids.set(zero, 7)
    assert zero in ids and ids.get(zero, 0) == 7 and len(ids) == 1
    assert not ids.add(zero.hex())


def test_what_is_not_an_id_is_in_no_set_even_after_it_is_added() -> None:
    ids = IdSet()
    assert "HEAD" not in ids and "ab" not in ids and 5 not in ids
    assert ids.add("zz" * 32) and ids.add("zz" * 32)  # names no object: never "seen"
    assert "zz" * 32 not in ids and len(ids) == 0
    with pytest.raises(ValueError, match="not an object id"):
        ids.set("ab", 1)


def test_a_mark_goes_past_a_node_whose_link_is_no_id(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        sid = store.new_session()
        store.append(sid, {"role": "user", "content": "kept"})
        head = store.session(sid).head
        assert head is not None
        # A node that hashes right but names no object as its state: the mark goes on.
        body = store.objects.get(head)[1]
        assert b'"state":null' in body
        bad = store.objects.put("node", body.replace(b'"state":null', b'"state":"not-an-id"'))
        marked = reach_into(IdSet(), [bad, head], store.node)
        assert bad in marked and head in marked and "not-an-id" not in marked


def test_a_mark_into_an_id_set_reaches_what_a_set_of_strings_reaches(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        first = store.new_session()
        for i in range(40):
            store.append(first, {"role": "user", "content": f"message {i}"})
        fork = store.fork(f"{first}~10")
        store.append(fork, {"role": "assistant", "content": "on the fork"})
        store.compact(first, "summary", keep=3)
        store.new_session()  # empty: reaches nothing
        roots = store.roots()
        expected = reachable(roots, store.node)
        marked = reach_into(IdSet(), iter(roots), scanning(store.node, store.release_pages))
        assert len(marked) == len(expected)
        assert all(oid in marked for oid in expected)
        everything = {oid for oid in store.objects.ids()}
        assert not any(oid in marked for oid in everything - expected)
