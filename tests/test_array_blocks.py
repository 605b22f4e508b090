"""Blocks in the array layout (FORMAT.md 5.5): a block of blobs or of nodes that reads
exactly holds its bodies as one JSON array, which a context read parses at once; and
in the MessagePack layout, where a block of blobs holds their values as one
MessagePack array (store version 6 writes blobs so, nodes in the array layout).

The layouts must read the same: every store written before store version 5 is in the
entry layout, and a store of version 5 or 6 holds several until a merge rewrites it.
The stores here are real, sealed on close; a layout is forced by writing through the
entry layout's encoder, as an ags of version 4 did, and the tests that read blocks of
blobs run with them in each layout (``blob_layout``).
"""

from __future__ import annotations

import os
import random
import struct
import time
from pathlib import Path
from typing import Any

import blake3
import pytest

import objstore.block_reader
import objstore.object_store
import objstore.pack_format
import objstore.packs
from objstore import ObjectError, Store, canonical
from objstore.fsck import check_store
from objstore.objects import object_id
from objstore.pack_format import (
    ARRAY_HEAD,
    ARRAY_MARK,
    CLAIM,
    PACKED_MARK,
    RECORD_HEAD,
    array_separators,
    array_size,
    array_table,
    block_claim,
    block_piece,
    encode_array_block,
    encode_block,
    encode_claim,
    encode_packed_block,
    is_array_block,
    iter_block,
    packed_size,
    packed_values,
)
from objstore.packs import decompress_block, rebuild_index

BIG = {"role": "tool", "content": "n", "values": [2**64, -(2**63) - 1, 1.5e300]}
AGAIN = {"role": "user", "content": "go on"}


def history() -> list[dict[str, Any]]:
    """Messages long enough for several blocks, one repeated far apart, one holding
    integers beyond 64 bits (its block stays in the entry layout)."""
    long = [{"role": "user", "content": f"{i} " + "x" * 1500} for i in range(200)]
    return [AGAIN, *long[:120], BIG, AGAIN, *long[120:], AGAIN]


def write_session(path: Path, messages: list[dict[str, Any]]) -> str:
    with Store.open(path) as s:
        sid = s.new_session()
        for i, message in enumerate(messages):
            s.append(sid, message, state={"step": i // 50})
            if i == 150:
                s.compact(sid, "the story so far", keep=3)
    return sid


@pytest.fixture(params=["messagepack", "json"])
def blob_layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Blocks of blobs in the MessagePack layout, as ags writes them, or in the array
    layout, as store version 5 wrote them (and version 6 writes a block holding a body
    that is not canonical JSON)."""
    if request.param == "json":
        monkeypatch.setattr(objstore.packs, "packed_values", lambda *a: None)
    return str(request.param)


def entry_layout_payload(
    objects_in: dict[str, bytes], known_exact: Any = ()
) -> tuple[bytes, bytes]:
    """``block_payload`` as store version 4 wrote it: every block in the entry layout."""
    content = encode_block(objects_in.items())
    exact = all(
        p.startswith((b"blob\0", b"node\0")) and objstore.packs.read_exactly(p[5:])
        for p in objects_in.values()
    )
    frame = objstore.packs._block_compressor().compress(content)
    return content, encode_claim(frame, int(exact))


def blob_id(value: Any) -> str:
    return object_id("blob", canonical.dumps(value))


def blocks(path: Path) -> list[tuple[int, bytes, bytes]]:
    """(record offset, payload, content) of every block of every pack of a store."""
    out = []
    for pack in sorted((path / "objects" / "pack").glob("*.pack")):
        data, at = pack.read_bytes(), 8
        while at < len(data):
            _type, _raw, length = RECORD_HEAD.unpack_from(data, at)
            payload = data[at + RECORD_HEAD.size : at + RECORD_HEAD.size + length]
            out.append((at, payload, decompress_block(payload)))
            at += RECORD_HEAD.size + length
    return out


def test_both_layouts_give_the_same_context_log_and_fsck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blob_layout: str
) -> None:
    messages = history()
    new = write_session(tmp_path / "new", messages)
    layouts = {is_array_block(content) for _, _, content in blocks(tmp_path / "new")}
    assert layouts == {True, False}  # the block holding BIG, and the file-less rest
    with monkeypatch.context() as m:
        m.setattr(objstore.packs, "block_payload", entry_layout_payload)
        old = write_session(tmp_path / "old", messages)
    assert not any(is_array_block(c) for _, _, c in blocks(tmp_path / "old"))
    with Store.open(tmp_path / "new") as a, Store.open(tmp_path / "old") as b:
        assert new != old
        for spec in ("", "~1", "~60", "~120"):
            context = a.context(new + spec)
            assert context == b.context(old + spec)
        assert a.context(new)[0] == {"content": "the story so far", "role": "user"}
        context = a.context(f"{new}~60")  # before the compaction: AGAIN twice
        places = [i for i, message in enumerate(context) if message == AGAIN]
        assert len(places) == 2 and context[places[0]] is not context[places[1]]
        assert [e.message for e in a.log(new)] == [e.message for e in b.log(old)]
        assert a.context(f"{new}~60")[:5] == b.context(f"{old}~60")[:5]
        assert check_store(a).ok and check_store(b).ok


def test_a_merge_writes_entry_layout_blocks_again_in_the_array_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blob_layout: str
) -> None:
    path = tmp_path / "s"
    messages = history()
    with monkeypatch.context() as m:
        m.setattr(objstore.packs, "block_payload", entry_layout_payload)
        sid = write_session(path, messages)
    with Store.open(path) as s:
        before = s.context(sid)
        for i in range(9):  # more than 8 packs: the seal of the last one merges them
            with Store.open(path) as w:
                w.append(sid, {"role": "user", "content": f"later {i}"})
    assert len(list((path / "objects" / "pack").glob("*.pack"))) < 10
    assert any(is_array_block(c) for _, _, c in blocks(path))
    with Store.open(path) as s:
        assert s.context(f"{sid}~9") == before
        assert check_store(s).ok


def only_pack(path: Path) -> Path:
    (pack,) = (path / "objects" / "pack").glob("*.pack")
    return pack


def rewrite_block(pack: Path, start: int, content: bytes, flags: int) -> None:
    """Put ``content`` in the block record at ``start``, with a checksum to match: not
    damage, a second writer."""
    data = pack.read_bytes()
    _type, _raw, length = RECORD_HEAD.unpack_from(data, start)
    payload = encode_claim(objstore.packs._block_compressor().compress(content), flags)
    head = RECORD_HEAD.pack(_type, blake3.blake3(payload).digest(), len(payload))
    end = start + RECORD_HEAD.size + length
    pack.write_bytes(data[:start] + head + payload + data[end:])
    pack.with_suffix(".idx").unlink()  # and its index, as that writer would write it
    rebuild_index(pack, pack.parent.parent.parent / "tmp")


FORGED = [
    ("json", "separator", "block at offset"),  # the array is not where the table says
    ("json", "lengths", "block at offset"),
    ("json", "kind", "does not hash to its id"),  # the kind is part of what an id hashes
    ("json", "count", "names missing"),  # an index built from its pack cannot list them
    ("messagepack", "separator", "block at offset"),  # the array's head: 0xdc, not 0xdd
    ("messagepack", "lengths", "is not the body its block's table gives"),
    ("messagepack", "values", "is not the body its block's table gives"),
    ("messagepack", "kind", "names missing"),  # MessagePack blocks hold blobs only
    ("messagepack", "count", "names missing"),
]


@pytest.mark.parametrize(("layout", "change", "named"), FORGED)
def test_an_array_block_that_is_not_what_its_table_says_is_named_and_reads_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, change: str, named: str
) -> None:
    """A block written again (checksum and all) whose array is not where its table says,
    or whose table does not add up: fsck names it, and a context read gives the
    messages written, each read alone through the index and hashed, or an error."""
    path = tmp_path / "s"
    messages = [{"role": "user", "content": f"message {i} " * 20} for i in range(40)]
    with monkeypatch.context() as m:
        if layout == "json":
            m.setattr(objstore.packs, "packed_values", lambda *a: None)
        with Store.open(path) as s:
            sid = s.new_session()
            for message in messages:
                s.append(sid, message)
    pack = only_pack(path)
    ((start, payload, content),) = [
        b for b in blocks(path) if is_array_block(b[2]) and array_table(b[2]).kind == b"blob\0"
    ]
    table = array_table(content)
    assert table.packed == (layout == "messagepack")
    changed = bytearray(content)
    n = len(table.lengths)
    first = ARRAY_HEAD.size + 32 * n  # the body lengths; then, if packed, the value lengths
    if change == "separator" and layout == "json":
        changed[table.starts()[5] - 1] = ord(" ")  # JSON still, another array
    elif change == "separator":
        changed[table.start] = 0xDC  # array 16: MessagePack still, another array
    elif change == "lengths":
        struct.pack_into("<II", changed, first, table.lengths[0] + 1, table.lengths[1] - 1)
    elif change == "values":
        one, two = table.value_lengths[:2]
        struct.pack_into("<II", changed, first + 4 * n, one + 1, two - 1)
    elif change == "kind":
        changed[32:37] = b"node\0"
    else:
        struct.pack_into("<I", changed, 37, n + 1)
    rewrite_block(pack, start, bytes(changed), block_claim(payload))
    with Store.open(path) as s:
        try:
            context = s.context(sid)
        except ObjectError:
            assert change in ("kind", "count")  # a node is no blob; a table that does not
        else:  # fit leaves the block's objects unindexed: missing, not different
            assert context == messages
        problems = [str(p) for p in check_store(s).problems]
    assert any(named in p for p in problems), problems


def test_the_array_layout_round_trips_and_is_refused_when_it_does_not_add_up() -> None:
    bodies = [("ab" * 32, b'{"a":1}'), ("cd" * 32, b"[2]"), ("ef" * 32, b'"x"')]
    content = encode_array_block(b"blob", bodies)
    assert content.startswith(ARRAY_MARK + b"blob\0" + (3).to_bytes(4, "little"))
    assert content.endswith(b'[{"a":1},[2],"x"]')
    table = array_table(content)
    assert table.hex_ids() == [oid for oid, _ in bodies] and array_separators(content, table)
    pieces = [(oid, block_piece(content, at, n)) for oid, at, n in iter_block(content)]
    assert pieces == [(oid, b"blob\0" + body) for oid, body in bodies]
    for cut in (10, 50, len(content) - 1):
        with pytest.raises(ValueError):
            array_table(content[:cut])
    with pytest.raises(ValueError):
        array_table(content + b" ")
    with pytest.raises(ValueError):
        array_table(content[:32] + b"file\0" + content[37:])
    with pytest.raises(ValueError):
        encode_array_block(b"file", bodies)
    with pytest.raises(ValueError):
        encode_array_block(b"blob", [])
    assert not array_separators(content.replace(b"],", b"] "), table)
    assert CLAIM.size == 16  # the claim follows the frame in either layout


def test_the_messagepack_layout_round_trips_exactly_and_is_refused_when_it_does_not_add_up() -> (
    None
):
    bodies = [b'{"a":1}', b"[2.5,-3]", b'"\xc3\xa9"']  # a float: the json module's canonical form
    oids = [object_id("blob", body) for body in bodies]
    values = packed_values(bodies, [True, False, True])
    assert values == [
        b"\x81\xa1a\x01",
        b"\x92\xcb" + struct.pack(">d", 2.5) + b"\xfd",  # MessagePack's float 64, then -3
        b"\xa2\xc3\xa9",
    ]
    content = encode_packed_block(oids, bodies, values)
    n = len(bodies)
    assert content == b"".join(
        [
            PACKED_MARK, b"blob\0", struct.pack("<I", n), *(bytes.fromhex(o) for o in oids),
            struct.pack("<3I", *map(len, bodies)), struct.pack("<3I", *map(len, values)),
            b"\xdd" + struct.pack(">I", n), *values,
        ]
    )  # fmt: skip
    assert len(content) == packed_size(values)
    assert array_size(bodies) == len(encode_array_block(b"blob", zip(oids, bodies, strict=True)))
    table = array_table(content)
    assert table.packed and array_separators(content, table)
    assert table.bodies(content) == bodies and table.values(content) == [{"a": 1}, [2.5, -3], "é"]
    pieces = [(oid, block_piece(content, at, size)) for oid, at, size in iter_block(content)]
    assert pieces == [(oid, b"blob\0" + body) for oid, body in zip(oids, bodies, strict=True)]
    for cut in (10, 50, len(content) - 1):
        with pytest.raises(ValueError):
            array_table(content[:cut])
    with pytest.raises(ValueError):
        array_table(content + b"\x00")
    with pytest.raises(ValueError):
        array_table(content[:32] + b"node\0" + content[37:])  # blobs only
    assert not array_separators(content.replace(b"\xdd", b"\xdc", 1), table)


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1}',  # white space: not canonical
        b'{"b":1,"a":2}',  # keys out of order
        b"1e+16",  # orjson would write 1e16: the json module's form is canonical, and this is it
        b'"\\u00e9"',  # an escape the canonical form does not use
    ],
)
def test_a_body_that_is_not_its_values_canonical_json_keeps_the_array_layout(body: bytes) -> None:
    canonical_body = canonical.dumps(objstore.pack_format.orjson.loads(body))
    values = packed_values([body], [False])
    assert (values is None) == (canonical_body != body)


def test_a_block_of_floats_is_written_in_the_array_layout(tmp_path: Path) -> None:
    """A float such as 0.5 takes 9 bytes as MessagePack: a block of many is bigger so, and
    is written in the array layout, whose size the bound of FORMAT.md 5.5 holds."""
    floats = [{"role": "tool", "content": "", "xs": [0.5] * 200} for _ in range(20)]
    words = [{"role": "user", "content": f"{i} " + "w" * 300} for i in range(20)]
    # A few floats that orjson spells otherwise than the canonical form (1e16 for
    # 1e+16): read, and checked by fsck, from the canonical form all the same.
    few = [{**m, "n": [1e16, 2.5e-7, i / 3]} if i % 5 == 0 else m for i, m in enumerate(words)]
    cases = (
        ("floats", floats, ARRAY_MARK),
        ("words", words, PACKED_MARK),
        ("few", few, PACKED_MARK),
    )
    for name, messages, mark in cases:
        with Store.open(tmp_path / name) as s:
            sid = s.new_session()
            for message in messages:
                s.append(sid, message)
        blob_marks = {
            c[:32] for _, _, c in blocks(tmp_path / name)
            if is_array_block(c) and array_table(c).kind == b"blob\0"
        }  # fmt: skip
        assert blob_marks == {mark}
        with Store.open(tmp_path / name) as s:
            assert s.context(sid) == messages and check_store(s).ok
            assert [e.message for e in s.log(sid)] == messages[::-1]  # each object alone


def test_a_context_whose_blocks_come_in_order_reads_as_one_read_by_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blob_layout: str
) -> None:
    """Blocks that hold the context's next messages in order are taken as parsed; the
    repeated messages (first, adjacent, from blocks back, last) still get a value of
    their own at each place, and the context is the one the read by id gives."""
    long = [{"role": "user", "content": f"{i} " + "y" * 1500} for i in range(300)]
    messages = [AGAIN, *long[:100], long[5], long[5], AGAIN, *long[100:], long[250], AGAIN]
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for message in messages:
            s.append(sid, message)
    arrays = [c for _, _, c in blocks(tmp_path / "s") if is_array_block(c)]
    blob_blocks = [c for c in arrays if array_table(c).kind == b"blob\0"]
    assert len(blob_blocks) >= 3
    taken = []
    take_in_order = objstore.block_reader._Fill.take_in_order

    def counted(fill: Any, content: bytes, table: Any) -> bool:
        taken.append(take_in_order(fill, content, table))
        return taken[-1]

    with Store.open(tmp_path / "s") as s:
        with monkeypatch.context() as m:
            m.setattr(objstore.block_reader._Fill, "take_in_order", counted)
            context = s.context(sid)
        assert taken == [True] * len(blob_blocks)  # every block, in order
        with monkeypatch.context() as m:
            m.setattr(objstore.block_reader._Fill, "take_in_order", lambda *a: False)
            by_id = s.context(sid)
    assert context == messages == by_id
    for message in (AGAIN, long[5], long[250]):
        places = [i for i, m in enumerate(messages) if m == message]
        assert len({id(context[i]) for i in places}) == len(places) > 1
    context[6]["content"] = "changed"  # long[5] at its first place
    assert context[101] == context[102] == long[5]  # copies, not the same dict


def test_a_context_with_no_repeat_is_read_in_order_without_counting_its_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blob_layout: str
) -> None:
    """Its ids are taken to be distinct while every block is the next: no set of them
    is made (``_count_repeats``), and the context is the one the read by id gives. A
    context with a repeat counts them once, at the first block that is not next."""
    long = [{"role": "user", "content": f"{i} " + "v" * 1500} for i in range(300)]
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for message in long:
            s.append(sid, message)
        other = s.new_session()
        for message in [*long[:150], long[7], *long[150:]]:
            s.append(other, message)
    counted: list[int] = []
    count_repeats = objstore.block_reader._Fill._count_repeats

    def counting(fill: Any, done: int) -> bool:
        counted.append(done)
        return count_repeats(fill, done)

    with Store.open(tmp_path / "s") as s:
        with monkeypatch.context() as m:
            m.setattr(objstore.block_reader._Fill, "_count_repeats", counting)
            assert s.context(sid) == long
            assert counted == []
            context = s.context(other)
            assert len(counted) == 1  # once, at the block that holds the repeat
        with monkeypatch.context() as m:
            m.setattr(objstore.block_reader._Fill, "take_in_order", lambda *a: False)
            assert s.context(other) == context == [*long[:150], long[7], *long[150:]]
    assert context[7] is not context[150]


def test_a_blob_two_blocks_hold_gets_a_value_at_each_place(
    tmp_path: Path, blob_layout: str
) -> None:
    """A message written again as a fresh copy (its only copy was sealed more than
    FRESHEN_AFTER ago) is in two blocks: read in order, each of its places takes the
    value of its own block, and a repeat after them, which no block holds again, sends
    the read by id (the places taken so far hold an id twice): the same context."""
    long = [{"role": "user", "content": f"{i} " + "w" * 1500} for i in range(260)]
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for message in long[:130]:
            s.append(sid, message)
    old = time.time() - 2 * objstore.object_store.FRESHEN_AFTER
    for path in (tmp_path / "s" / "objects" / "pack").iterdir():
        os.utime(path, (old, old))
    # long[4] freshened, in the middle of a block; long[200] deduplicated
    newer = [*long[130:140], long[4], *long[140:], long[200]]
    with Store.open(tmp_path / "s") as s:
        for message in newer:
            s.append(sid, message)
    holding = [
        c for _, _, c in blocks(tmp_path / "s")
        if is_array_block(c) and bytes.fromhex(blob_id(long[4])) in array_table(c).ids
    ]  # fmt: skip
    assert len(holding) == 2
    with Store.open(tmp_path / "s") as s:
        context = s.context(sid)
    assert context == long[:130] + newer
    assert context[4] is not context[140] and context[201] is not context[-1]


@pytest.mark.parametrize("seed", range(40))
def test_the_places_of_repeated_ids_are_found_across_windows(seed: int) -> None:
    """``_repeated_places`` against the plain definition, for contexts short and long,
    without repeats, with runs of them, and ending in them."""
    rng = random.Random(seed)
    pool = [f"{i:064x}" for i in range(rng.choice([1, 3, 50, 400]))]
    n = rng.choice([0, 1, 63, 64, 65, 200, 700])
    # A repeat is an equal str, a new object or the same one, as ids read from nodes are.
    oids = [(rng.choice(pool) + "x")[:-1] if rng.random() < 0.15 else rng.choice(pool)
            if rng.random() < 0.2 else f"{rng.getrandbits(256):064x}"
            for _ in range(n)]  # fmt: skip
    seen: set[str] = set()
    expected = []
    for i, oid in enumerate(oids):
        if oid in seen:
            expected.append(i)
        seen.add(oid)
    firsts = list(dict.fromkeys(oids))
    assert objstore.block_reader._repeated_places(oids, firsts) == expected


def test_a_context_read_in_order_then_beside_a_live_writer(
    tmp_path: Path, blob_layout: str
) -> None:
    """Its older messages come from sealed blocks in order, its newest (one repeated)
    from the pack another handle is still writing."""
    long = [{"role": "user", "content": f"{i} " + "z" * 1500} for i in range(250)]
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for message in long[:200]:
            s.append(sid, message)
    newer = [*long[200:], long[3], AGAIN, AGAIN]
    with Store.open(tmp_path / "s") as writer:
        for message in newer:
            writer.append(sid, message)
        with Store.open(tmp_path / "s") as reader:
            context = reader.context(sid)
            assert context == long[:200] + newer
            assert context[-1] is not context[-2] and context[3] is not context[-3]
