"""The block pack a ``BlockPackWriter`` writes (FORMAT.md 5.5, 5.3), however its objects
are given: all at once by a seal, or one at a time, asking first, by a merge."""

from __future__ import annotations

import random
from pathlib import Path

import orjson

from objstore import objects
from objstore.packs import BlockPackWriter, encode_block_pack


def _contents(n: int) -> list[tuple[str, bytes, bool]]:
    """``(id, kind + NUL + body, exact)`` of blobs, nodes and files, in a mixed order,
    enough for several blocks of each group."""
    rng = random.Random(7)
    made = []
    for i in range(n):
        words = " ".join(rng.choice(["read", "the", "file", "again", f"w{i}"]) for _ in range(200))
        if i % 7 == 3:
            content = objects.content_of("file", words.encode())
        elif i % 3 == 1:
            node = {"kept": 2, "parent": None, "span": {"after": i}, "text": words}
            content = objects.content_of("node", orjson.dumps(node, option=orjson.OPT_SORT_KEYS))
        else:
            content = objects.content_of("blob", orjson.dumps({"content": words, "role": "user"}))
        made.append((objects.content_id(content), content, i % 5 != 0))
    return made


def _written(tmp_path: Path, name: str, fill: object) -> tuple[bytes, bytes, BlockPackWriter]:
    pack_dir, tmp_dir = tmp_path / name, tmp_path / f"{name}-tmp"
    pack_dir.mkdir()
    tmp_dir.mkdir()
    writer = BlockPackWriter(pack_dir, tmp_dir)
    fill(writer)  # type: ignore[operator]
    writer.seal()
    return writer.path.read_bytes(), writer.path.with_suffix(".idx").read_bytes(), writer


def test_a_seal_writes_the_bytes_of_objects_added_one_at_a_time_and_of_a_push(
    tmp_path: Path,
) -> None:
    contents = _contents(900)

    def all_at_once(writer: BlockPackWriter) -> None:
        writer.add_new(contents)

    def one_at_a_time(writer: BlockPackWriter) -> None:
        for oid, content, exact in contents:
            writer.add_content(oid, content, exact=exact)
            writer.add_content(oid, content)  # a second time: added once

    sealed = _written(tmp_path, "sealed", all_at_once)
    merged = _written(tmp_path, "merged", one_at_a_time)
    assert sealed[:2] == merged[:2]
    assert sealed[:2] == encode_block_pack((oid, c) for oid, c, _ in contents)
    assert len(sealed[0]) < sum(len(c) for _, c, _ in contents) / 2  # in blocks, compressed


def test_a_writer_given_objects_at_once_knows_each_when_asked_later(tmp_path: Path) -> None:
    """A seal never asks whether an object was added; when a later caller does, every
    object added before is found, and one that was not is not."""
    contents = _contents(1200)
    pack_dir = tmp_path / "packs"
    pack_dir.mkdir()
    writer = BlockPackWriter(pack_dir, tmp_path)
    writer.add_new(contents[:1000])
    assert sum(map(len, writer._buckets)) > 0  # some written in blocks, some pending
    assert all(oid in writer for oid, _, _ in contents[:1000])
    assert not any(oid in writer for oid, _, _ in contents[1000:])
    writer.add_new(contents[1000:])  # known from here on as they are written
    assert all(oid in writer for oid, _, _ in contents)
    missing = objects.content_id(objects.content_of("blob", b'"never added"'))
    assert missing not in writer
    writer.abandon()
