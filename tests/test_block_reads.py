"""Reading a context in bulk (objstore/block_reader.py): a block is checked whole by its
checksum (FORMAT.md 5.5), and still no read returns content that differs from what
was written.

The stores are real, sealed on close into block packs; the damage is done to the
files on disk, the way a disk or a careless hand would.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import blake3
import pytest
from conftest import store_with_damaged_message

import objstore.packs
import objstore.store
import objstore.walk
from objstore import CorruptObject, DamagedPack, InvalidName, ObjectError, Store, block_reader
from objstore.canonical import dumps
from objstore.fsck import check_store
from objstore.limits import MAX_DEPTH, parse_json, parse_json_many
from objstore.nodes import parse_node
from objstore.objects import object_id
from objstore.pack_format import (
    BLOCK_IDX_ENTRY,
    CLAIM,
    ENTRIES_AT,
    RECORD_HEAD,
    TYPE_BLOCK,
    WITHIN_LIMITS,
    block_claim,
    block_piece,
    encode_claim,
    is_array_block,
    iter_block,
    parse_index,
)
from objstore.packs import decompress_block, encode_block_pack, verified_block_pack


def messages(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 else "assistant", "content": f"message {i} " * 8}
            for i in range(n)]  # fmt: skip


def sealed_session(path: Path, n: int) -> str:
    with Store.open(path) as s:
        sid = s.new_session()
        for message in messages(n):
            s.append(sid, message)
    return sid


def only_pack(path: Path) -> Path:
    (pack,) = (path / "objects" / "pack").glob("*.pack")
    return pack


def block_records(pack: Path) -> list[tuple[int, int]]:
    """(offset of the record, offset after it) of each record of a block pack."""
    data, at, records = pack.read_bytes(), 8, []
    while at < len(data):
        _type, _id, length = RECORD_HEAD.unpack_from(data, at)
        records.append((at, at + RECORD_HEAD.size + length))
        at += RECORD_HEAD.size + length
    return records


def test_a_long_context_reads_back_exactly_from_several_blocks(tmp_path: Path) -> None:
    sid = sealed_session(tmp_path / "s", 600)
    assert len(block_records(only_pack(tmp_path / "s"))) >= 3  # the walk crosses blocks
    with Store.open(tmp_path / "s") as s:
        assert s.context(sid) == messages(600)
        assert s.context(f"{sid}~100") == messages(500)


def test_a_context_longer_than_the_blocks_a_reader_keeps_reads_back_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(block_reader, "MAX_BLOCKS", 1)
    sid = sealed_session(tmp_path / "s", 600)
    with Store.open(tmp_path / "s") as s:
        assert s.context(sid) == messages(600)


def test_a_sealed_pack_keeps_chain_nodes_other_nodes_and_the_rest_in_blocks_apart(
    tmp_path: Path,
) -> None:
    """What a context read walks (nodes with a span, compactions), the other nodes, and
    the messages and states sit in blocks of their own (FORMAT.md 5.5), so a context
    read decodes no node it skips; merged packs keep them apart too."""
    path = tmp_path / "s"
    with Store.open(path) as s:
        sid = s.new_session()
        for i, message in enumerate(messages(100)):
            s.append(sid, message, state={"step": i})
            if i == 60:
                s.compact(sid, "so far", keep=2)
    for merged in (False, True):
        if merged:
            for i in range(9):  # more than 8 packs: the next repack merges them
                with Store.open(path) as s:
                    s.append(sid, {"role": "user", "content": f"one more {i}"})
        with Store.open(path) as s:
            if merged:  # sealing the last one merged them (FORMAT.md 5.4)
                assert len(s.objects.sealed_packs()) < 10
            classes = []
            for pack in s.objects.sealed_packs():
                for _record, content, members in pack.blocks():
                    assert content is not None
                    found = set()
                    for oid, at, length in members:
                        kind, body = block_piece(content, at, length).split(b"\0", 1)
                        node = parse_node(oid, body) if kind == b"node" else None
                        if node is None:
                            found.add("not a node")
                        elif node.span is not None or node.is_compaction:
                            found.add("chain")
                        else:
                            found.add("other node")
                    classes.append(found)
        assert all(len(found) == 1 for found in classes), classes
        assert {c for found in classes for c in found} == {"chain", "other node", "not a node"}
        with Store.open(path) as s:
            last = {"role": "user", "content": "one more 8"} if merged else messages(100)[-1]
            assert s.context(sid)[-1] == last


def test_every_flipped_byte_of_a_block_is_an_error_or_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flipped bit anywhere in a block record (its checksum, its length, its zstd
    frame, its claim), of any block (the nodes' and the messages'), never gives a
    context that differs from the one written."""
    monkeypatch.setattr(objstore.store, "SPAN_EVERY", 4)  # span nodes in a short session
    path = tmp_path / "s"
    sid = sealed_session(path, 22)  # its head walks two plain nodes to a span
    pack = only_pack(path)
    good = pack.read_bytes()
    records = block_records(pack)
    assert len(records) == 3  # the span nodes, the other nodes, the messages
    for start, end in records:
        errors = 0
        for at in range(start, end):
            damaged = bytearray(good)
            damaged[at] ^= 0x10
            pack.write_bytes(damaged)
            try:
                with Store.open(path) as s:
                    context = s.context(sid)
            except ObjectError:
                errors += 1
                continue
            assert context == messages(22), f"byte {at} flipped gave another context"
        # None is returned; many are seen. Frames carry no content checksum (FORMAT.md
        # 5.5): once the block fails its checksum each object the read takes is found
        # by the index and hashed, so a flip in what it does not take (the plain nodes
        # its walk skips, an array block's table of ids) changes nothing.
        assert errors > (end - start) // 5, (start, errors)
    pack.write_bytes(good)


def shift_index_entries(index: Path, which: set[bytes] | None, by: int) -> None:
    """Move where the index says objects sit in their blocks (all, or those in ``which``)."""
    data = bytearray(index.read_bytes())
    for i in range(parse_index(data).entries):
        at = ENTRIES_AT + i * BLOCK_IDX_ENTRY.size
        raw, off, inner, length = BLOCK_IDX_ENTRY.unpack_from(data, at)
        if which is None or raw in which:
            BLOCK_IDX_ENTRY.pack_into(data, at, raw, off, max(0, inner + by), length)
    index.write_bytes(data)  # its checksum is now wrong too: fsck's to name


@pytest.mark.parametrize("shift", [-41, 1, 40])
def test_an_index_that_points_into_the_wrong_place_is_not_believed(
    tmp_path: Path, shift: int
) -> None:
    """The index is derived data: where it sends a reader is checked against the entry
    heads the block itself holds, so a damaged entry gives an error or the right
    object, never another one."""
    path = tmp_path / "s"
    sid = sealed_session(path, 5)
    with Store.open(path) as s:
        first = s.node(s.node_id(f"{sid}~4")).content
    index = only_pack(path).with_suffix(".idx")
    good = index.read_bytes()
    shift_index_entries(index, {bytes.fromhex(first)}, shift)
    with Store.open(path) as s:
        assert s.context(sid) == messages(5)  # the block lists it by its own ids
    index.write_bytes(good)
    shift_index_entries(index, None, shift)
    with Store.open(path) as s:
        assert s.context(sid) == messages(5)  # each block lists its own objects
        with pytest.raises(CorruptObject):
            list(s.log(sid))  # one object at a time: what the index points at, hashed


def test_a_block_rewritten_with_a_matching_checksum_is_named_by_fsck_and_object_reads(
    tmp_path: Path,
) -> None:
    """What a bulk read trusts is the block's checksum; a block written again with
    damaged content and a checksum to match is found by fsck and by reading the
    object alone (``log``, ``show``), which hash every object against its id."""
    path = tmp_path / "s"
    sid, blob, _ = store_with_damaged_message(path, "precious " * 40)
    with Store.open(path) as s:
        with pytest.raises(CorruptObject, match=blob):
            list(s.log(sid))
        problems = [str(p) for p in check_store(s).problems]
    assert any(blob in p and "does not hash to its id" in p for p in problems)


def test_an_integer_beyond_64_bits_comes_back_exactly(tmp_path: Path) -> None:
    big = {"role": "tool", "content": "n", "values": [2**64, -(2**63) - 1, 2**70, 1.5e300]}
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for message in [*messages(20), big, *messages(3)]:
            s.append(sid, message)
    with Store.open(tmp_path / "s") as s:
        context = s.context(sid)
    assert context[20] == big and type(context[20]["values"][0]) is int


def test_a_blob_nested_too_deeply_is_refused_by_a_context_read(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, messages(1)[0])
        node = json.loads(s.raw_object(s.node_id(sid))[1])
        deep: Any = "leaf"
        for _ in range(MAX_DEPTH + 1):
            deep = [deep]
        node["message"] = s.put_raw("blob", json.dumps(deep, separators=(",", ":")).encode())
        s.tag("deep", s.put_raw("node", dumps(node)))
    with Store.open(path) as s, pytest.raises(CorruptObject, match="nested deeper"):
        s.context("tags/deep")


@pytest.mark.parametrize("link", ["nope", "ZZ" * 32, "AB" * 32])
def test_a_node_naming_no_object_id_is_a_clear_error_for_a_context_read(
    tmp_path: Path, link: str
) -> None:
    path = tmp_path / "s"
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, messages(1)[0])
        node = json.loads(s.raw_object(s.node_id(sid))[1])
        s.tag("odd", s.put_raw("node", dumps(dict(node, message=link))))
    with Store.open(path) as s, pytest.raises(InvalidName, match="not an object id"):
        s.context("tags/odd")


@pytest.mark.parametrize(
    "texts",
    [
        [b'{"a":1}', b'"x"', b"[]", b"18446744073709551616", b'{"n":[-9223372036854775809]}'],
        [b"1e300", b'{"f":9.3e18}', b"[" * MAX_DEPTH + b"]" * MAX_DEPTH],
    ],
)
def test_parsing_many_texts_gives_what_parsing_each_gives(texts: list[bytes]) -> None:
    assert parse_json_many(texts) == [parse_json(t) for t in texts]
    assert [type(v) for v in parse_json_many(texts)] == [type(parse_json(t)) for t in texts]


def test_parsing_many_texts_refuses_what_parsing_each_refuses() -> None:
    too_deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    for texts in ([b"{}", too_deep], [b"{}", b"{nope"]):
        with pytest.raises(ValueError):
            parse_json_many(texts)


BIG = {"role": "tool", "content": "n", "values": [2**64, -(2**63) - 1, 2**70, 1.5e300]}


def blocks_of(pack: Path) -> list[tuple[int, int, bytes]]:
    """(offset of the record, its claim, its content) of each block of a block pack."""
    data = pack.read_bytes()
    out = []
    for start, end in block_records(pack):
        payload = data[start + RECORD_HEAD.size : end]
        out.append((start, block_claim(payload), decompress_block(payload)))
    return out


def kinds_in(content: bytes) -> set[bytes]:
    return {block_piece(content, at, n)[:4] for _, at, n in iter_block(content)}


def test_blocks_of_json_claim_to_read_exactly_unless_an_object_needs_the_walk(
    tmp_path: Path,
) -> None:
    """The writer claims WITHIN_LIMITS (FORMAT.md 5.5) for a block whose every object it
    read exactly with orjson alone, and for no other: the block holding a number
    beyond 64 bits, or holding files, claims nothing, and that number comes back
    exactly, while the blocks around it are read without a walk."""
    long = [{"role": "user", "content": f"{i} " + "x" * 2000} for i in range(150)]
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for message in [*long, BIG, *messages(3)]:
            s.append(sid, message)
        s.append(sid, {"role": "tool", "content": "ok"}, files={"a.py": (None, b"print(1)\n")})
    claims = {}
    for _, claim, content in blocks_of(only_pack(tmp_path / "s")):
        holds_big = b"18446744073709551616" in content
        claims[(frozenset(kinds_in(content)), holds_big)] = claim
    assert claims == {
        (frozenset({b"node"}), False): WITHIN_LIMITS,  # the span nodes, then the others
        (frozenset({b"blob"}), False): WITHIN_LIMITS,  # the first 128 KiB of messages
        (frozenset({b"blob"}), True): 0,
        (frozenset({b"file"}), False): 0,
    }
    with Store.open(tmp_path / "s") as s:
        context = s.context(sid)
    assert context[:-1] == [*long, BIG, *messages(3)]
    assert type(context[150]["values"][0]) is int


def test_a_message_of_megabytes_is_written_plainly_in_a_block_of_its_own(
    tmp_path: Path,
) -> None:
    """Over LARGE_CONTENT, the entry layout and no claim (FORMAT.md 5.5): checking a
    claim and writing the MessagePack layout held about five copies of the message (a
    75 MB tool output took the seal past 450 MB of memory)."""
    huge = {"role": "tool", "content": "a line of output\n" * 70_000}  # 1.2 MB
    around = messages(6)
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for message in [*around[:3], huge, *around[3:]]:
            s.append(sid, message)
    blob_blocks = [
        (claim, content) for _, claim, content in blocks_of(only_pack(tmp_path / "s"))
        if kinds_in(content) == {b"blob"}
    ]  # fmt: skip
    plain = [(claim, c) for claim, c in blob_blocks if b"a line of output" in c]
    assert len(plain) == 1 and len(blob_blocks) == 3  # before it, it, after it
    claim, content = plain[0]
    assert claim == 0 and not is_array_block(content) and len(list(iter_block(content))) == 1
    assert all(claim == WITHIN_LIMITS for claim, c in blob_blocks if c is not content)
    with Store.open(tmp_path / "s") as s:
        assert s.context(sid) == [*around[:3], huge, *around[3:]]
        assert check_store(s).ok


def test_a_false_claim_is_named_by_fsck_and_reads_of_one_object_stay_exact(
    tmp_path: Path,
) -> None:
    """A claim is covered by the block's checksum, so damage cannot make one; a block
    written again with a false claim and a checksum to match (another writer, not
    damage) is believed by a context read, which reads the number as orjson does,
    and named by fsck; a read of the message alone walks it as always."""
    path = tmp_path / "s"
    with Store.open(path) as s:
        sid = s.new_session()
        for message in [*messages(3), BIG]:
            s.append(sid, message)
        blob = s.node(s.node_id(sid)).content
    pack = only_pack(path)
    data = bytearray(pack.read_bytes())
    ((start, _, _content),) = [b for b in blocks_of(pack) if kinds_in(b[2]) == {b"blob"}]
    head = RECORD_HEAD.unpack_from(data, start)
    payload = bytes(data[start + RECORD_HEAD.size : start + RECORD_HEAD.size + head[2]])
    assert block_claim(payload) == 0
    claimed = encode_claim(payload[: -CLAIM.size], WITHIN_LIMITS)  # the same length
    RECORD_HEAD.pack_into(data, start, head[0], blake3.blake3(claimed).digest(), len(claimed))
    data[start + RECORD_HEAD.size : start + RECORD_HEAD.size + len(claimed)] = claimed
    pack.write_bytes(data)
    with Store.open(path) as s:
        assert type(s.context(sid)[3]["values"][0]) is float  # what the claim says
        assert s.blob(blob) == BIG and type(s.blob(blob)["values"][0]) is int
        problems = [str(p) for p in check_store(s).problems]
    assert any("claims that each of its objects reads exactly" in p for p in problems)


def test_blocks_written_before_claims_read_as_they_did(tmp_path: Path) -> None:
    """A store whose block packs an ags before this layout wrote (nodes and messages in
    one block, no claim: tests/fixtures/unclaimed_blocks) reads the same context,
    walked, passes fsck, and takes new writes, whose blocks claim."""
    fixture = Path(__file__).parent / "fixtures" / "unclaimed_blocks"
    path = tmp_path / "s"
    shutil.copytree(fixture / "store", path)
    for dirpath, _dirs, files in os.walk(path):  # as ags made it: git keeps no modes
        os.chmod(dirpath, 0o700)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o600)
    expected = json.loads((fixture / "expected.json").read_text())
    sid = expected["session"]
    (old_pack,) = (path / "objects" / "pack").glob("*.pack")
    assert [(claim, kinds_in(c)) for _, claim, c in blocks_of(old_pack)] == [
        (0, {b"blob", b"node"})
    ]
    with Store.open(path) as s:
        context = s.context(sid)
        assert context == expected["context"] and type(context[7]["values"][0]) is int
        assert check_store(s).ok
        for message in messages(100):  # spans of 32 after its spans of 16
            s.append(sid, message)
    with Store.open(path) as s:
        assert s.context(sid) == [*expected["context"], *messages(100)]
        spans = [len(n.span.messages) for n in s.walk(sid) if n.span is not None]
        assert spans == [32, 32, 32, 16, 16]  # counted on from the last old one
        assert check_store(s).ok
    (new_pack,) = set((path / "objects" / "pack").glob("*.pack")) - {old_pack}
    assert {claim for _, claim, _ in blocks_of(new_pack)} == {WITHIN_LIMITS}


def test_a_pack_from_elsewhere_whose_block_claims_falsely_is_refused() -> None:
    """A fetch keeps the records of a remote pack as they are, claims included, so it
    checks each claim as it checks each id: a false one refuses the pack."""
    big = dumps(BIG)
    contents = [(object_id("blob", big), b"blob\0" + big)]
    pack, index = encode_block_pack(contents)
    verified_block_pack(pack, index, "sent")  # as ags writes it: no claim for that
    data = bytearray(pack)
    _type, _raw, length = RECORD_HEAD.unpack_from(data, 8)
    payload = bytes(data[8 + RECORD_HEAD.size : 8 + RECORD_HEAD.size + length])
    assert block_claim(payload) == 0
    claimed = encode_claim(payload[: -CLAIM.size], WITHIN_LIMITS)
    RECORD_HEAD.pack_into(data, 8, TYPE_BLOCK, blake3.blake3(claimed).digest(), len(claimed))
    data[8 + RECORD_HEAD.size :] = claimed
    with pytest.raises(DamagedPack, match="claims that each of its objects reads exactly"):
        verified_block_pack(bytes(data), index, "sent")


def test_a_message_a_context_holds_twice_comes_back_as_two_values(tmp_path: Path) -> None:
    """A context read takes every blob a block holds when it decodes it, and lets the
    block go: a message repeated in blocks apart, claimed or walked, still gives each
    of its places a value of its own, equal to what was written."""
    long = [{"role": "user", "content": f"{i} " + "x" * 2000} for i in range(150)]
    again = {"role": "user", "content": "go on"}
    history = [*long[:10], again, *long[10:100], again, BIG, *long[100:], BIG, again]
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for message in history:
            s.append(sid, message)
    assert len(blocks_of(only_pack(tmp_path / "s"))) >= 4  # the repeats sit blocks apart
    with Store.open(tmp_path / "s") as s:
        context = s.context(sid)
    assert context == history
    places = [i for i, m in enumerate(history) if m == again]
    assert len({id(context[i]) for i in places}) == len(places)
    assert context[102] is not context[-2] and type(context[-2]["values"][0]) is int


def test_a_context_read_parses_claimed_nodes_as_one_read_of_each_does(tmp_path: Path) -> None:
    """The span nodes a context read walks are parsed by orjson alone where their block
    claims WITHIN_LIMITS (FORMAT.md 5.5), and give the nodes ``Store.node`` gives."""
    sid = sealed_session(tmp_path / "s", 300)
    with Store.open(tmp_path / "s") as s:
        reader = block_reader.BlockReader(s.objects)
        walked = list(objstore.walk.walk(s.node_id(sid), reader.node, spans=True))
        assert len([n for n in walked if n.span is not None]) == 300 // 32
        assert walked == [s.node(n.id) for n in walked]


def test_a_damaged_block_in_a_long_context_gives_the_error_its_first_message_gives(
    tmp_path: Path,
) -> None:
    """A block of messages that fails its checksum is read object by object, each
    verified: the context read fails with the error that reading the first of its
    messages that the damage reached alone gives, as it did when the reader kept the
    blocks it decoded."""
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for i in range(200):
            s.append(sid, {"role": "user", "content": f"{i} " + "x" * 2000})
    pack = only_pack(tmp_path / "s")
    blob_records = [(start, content) for start, _, content in blocks_of(pack)
                    if kinds_in(content) == {b"blob"}]  # fmt: skip
    assert len(blob_records) >= 3
    start, content = blob_records[1]
    in_block = {oid for oid, _, _ in iter_block(content)}
    good = pack.read_bytes()
    with Store.open(tmp_path / "s") as s:
        blobs = [n.content for n in reversed(list(s.walk(sid)))]
    length = RECORD_HEAD.unpack_from(good, start)[2] - CLAIM.size
    for at in range(200, length, 50):  # inside the zstd frame, until it hits a message
        data = bytearray(good)
        data[start + RECORD_HEAD.size + at] ^= 0x01
        pack.write_bytes(data)
        with Store.open(tmp_path / "s") as s:
            failing = []
            for oid in (oid for oid in blobs if oid in in_block):
                try:
                    s.blob(oid)
                except CorruptObject as e:
                    failing.append((oid, str(e)))
                    break
            if not failing:  # the flip changed no message (the block's table of ids)
                assert s.context(sid)[-1] == {"role": "user", "content": "199 " + "x" * 2000}
                continue
            with pytest.raises(CorruptObject) as read:
                s.context(sid)
        first, alone = failing[0]
        assert str(read.value) == alone and first in alone
        return
    pytest.fail("no flip reached a message")


@pytest.mark.parametrize("cut", [1, 2000, -5])
def test_a_block_that_does_not_divide_into_entries_is_read_object_by_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    """Content that passed its checksum but does not divide into whole entries (cut
    short, or with bytes after its last entry: only a wrong writer makes it) gives a
    context read nothing: each of its messages, repeated ones too, is read alone and
    verified, and the context is the one written."""
    again = {"role": "user", "content": "go on"}
    history = [again, BIG, *messages(40), again, BIG, again]
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        for message in history:
            s.append(sid, message)
    checked_block = objstore.packs.SealedPack.checked_block

    def undivided(self: objstore.packs.SealedPack, off: int) -> tuple[bytes, int] | None:
        checked = checked_block(self, off)
        if checked is None or b"blob\0" not in checked[0]:
            return checked
        content, flags = checked
        return (content[:-cut] if cut > 0 else content + b"\0" * -cut), flags

    monkeypatch.setattr(objstore.packs.SealedPack, "checked_block", undivided)
    with Store.open(tmp_path / "s") as s:
        context = s.context(sid)
    assert context == history
    assert type(context[1]["values"][0]) is int and context[1] is not context[43]


def test_a_message_link_to_a_node_is_named_by_a_context_read(tmp_path: Path) -> None:
    """A node whose message is a node, not a blob, in a block the read decodes for the
    messages around it: the read names it, as a read of it alone would."""
    path = tmp_path / "s"
    with Store.open(path) as s:
        sid = s.new_session()
        for message in messages(40):
            s.append(sid, message)
        head = s.node_id(sid)
        other = s.node_id(f"{sid}~3")
        node = json.loads(s.raw_object(head)[1])
        s.tag("odd", s.put_raw("node", dumps(dict(node, message=other))))
    with Store.open(path) as s, pytest.raises(CorruptObject, match=f"{other}.*expected a blob"):
        s.context("tags/odd")
