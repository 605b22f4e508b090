"""The pack and index layouts byte for byte as docs/FORMAT.md (5.1, 5.3) writes them."""

from __future__ import annotations

import blake3
import pytest

from objstore.errors import DamagedIndex
from objstore.pack_format import (
    PACK_MAGIC,
    TYPE_OBJECT,
    TYPE_REF,
    Record,
    block_members,
    encode_block,
    encode_index,
    encode_record,
    iter_block,
    iter_records,
    parse_index,
    scan_buffer,
)

A = bytes.fromhex("ab" * 32)
B = bytes.fromhex("01" + "cd" * 31)


def test_the_pack_header_is_agspack_and_version_1() -> None:
    assert b"AGSPACK" + bytes([1]) == PACK_MAGIC


def test_a_record_is_type_id_little_endian_length_payload() -> None:
    assert encode_record(TYPE_OBJECT, A, b"xyz") == b"\x01" + A + b"\x03\x00\x00\x00" + b"xyz"
    assert encode_record(TYPE_REF, B, b"") == b"\x02" + B + b"\x00\x00\x00\x00"


def test_records_are_read_back_with_their_payload_offsets_until_a_torn_or_unknown_one() -> None:
    data = encode_record(TYPE_OBJECT, A, b"one") + encode_record(TYPE_REF, B, b"two!")
    base = len(PACK_MAGIC)
    assert list(iter_records(data, base)) == [
        Record(TYPE_OBJECT, A, (base + 37, 3)),
        Record(TYPE_REF, B, (base + 37 + 3 + 37, 4)),
    ]
    torn = data + encode_record(TYPE_OBJECT, A, b"cut short")[:-1]
    assert len(list(iter_records(torn, base))) == 2
    unknown = data + encode_record(3, A, b"") + encode_record(TYPE_OBJECT, B, b"")
    assert len(list(iter_records(unknown, base))) == 2
    scan = scan_buffer(torn, base)
    assert scan.objects == {A.hex(): (base + 37, 3)}
    assert scan.refs == [(B, (base + 77, 4))]
    assert scan.end == base + len(data)


def test_the_index_is_header_fanout_sorted_entries_and_a_blake3_checksum() -> None:
    index = encode_index([(A.hex(), (8, 100)), (B.hex(), (145, 7))], pack_length=152)
    head = b"AGSIDX\x01\x00" + (152).to_bytes(8, "little") + (2).to_bytes(4, "little")
    fanout = [0] + [1] * (0xAB - 1) + [2] * (256 - 0xAB)  # ids start with 0x01 and 0xab
    entries = (
        B + (145).to_bytes(8, "little") + (7).to_bytes(4, "little")
        + A + (8).to_bytes(8, "little") + (100).to_bytes(4, "little")
    )  # fmt: skip
    body = head + b"".join(n.to_bytes(4, "little") for n in fanout) + entries
    assert index == body + blake3.blake3(body).digest()
    parsed = parse_index(index)
    assert (parsed.pack_length, parsed.entries) == (152, 2)
    assert parsed.fanout[0x01] == 0 and parsed.fanout[0x02] == 1 and parsed.fanout[256] == 2


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda b: b[:40], "truncated"),
        (lambda b: b"AGSIDX\x09" + b[7:], "unknown format"),
        (lambda b: b + b"\x00", "wrong length"),
        (lambda b: b[:20] + (9).to_bytes(4, "little") + b[24:], "fanout"),
    ],
)
def test_a_damaged_index_is_refused_saying_what_is_wrong(damage: object, why: str) -> None:
    index = encode_index([(A.hex(), (8, 100)), (B.hex(), (145, 7))], pack_length=152)
    with pytest.raises(DamagedIndex, match=why):
        parse_index(damage(index))  # type: ignore[operator]


def test_a_block_lists_by_id_what_iterating_it_finds() -> None:
    content = encode_block([("ab" * 32, b"blob\0[1]"), ("01" + "cd" * 31, b"node\0{}")])
    members = block_members(content)
    assert members == {oid: (content, at, n) for oid, at, n in iter_block(content)}
    assert members["ab" * 32] == (content, 36, 8)
    assert content[36 : 36 + 8] == b"blob\0[1]"


@pytest.mark.parametrize("cut", [1, 20, 36 + 7, 36 + 8 + 30])
def test_a_block_cut_anywhere_is_refused_when_listed(cut: int) -> None:
    content = encode_block([("ab" * 32, b"blob\0[1]"), ("01" + "cd" * 31, b"node\0{}")])
    with pytest.raises(ValueError, match="cut|past the end"):
        block_members(content[:cut])
    with pytest.raises(ValueError):
        list(iter_block(content[:cut]))
