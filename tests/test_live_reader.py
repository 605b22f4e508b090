"""A reader beside a live writer: the writer's unsealed pack is read once per look
(its records noted, its bytes kept), not once per object, and the reader still
sees the newest journaled head and only objects that verify."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import count_preads

from objstore import CorruptObject, Store


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_a_context_beside_a_live_writer_reads_its_pack_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as writer:
        sid = writer.new_session()
        for i in range(60):
            writer.append(sid, user(f"m{i}"))
        with Store.open(path) as reader:
            calls = count_preads(monkeypatch)
            context = reader.context(sid)
            assert [m["content"] for m in context] == [f"m{i}" for i in range(60)]
            # 60 messages and 60 nodes in the unsealed pack: each read from what the
            # look at the pack kept, not by a read of the file of its own
            assert len(calls) < 10, calls
            monkeypatch.undo()
            # the writer goes on: the next look scans only what it added, and the
            # reader sees the new head and the new messages
            heads = [writer.append(sid, user(f"n{i}")) for i in range(5)]
            reader.objects.refresh()
            assert reader.session(sid).head == heads[-1]
            assert [m["content"] for m in reader.context(sid)][-6:] == ["m59"] + [
                f"n{i}" for i in range(5)
            ]


def test_a_flipped_byte_in_a_live_pack_is_found_by_a_new_reader(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as writer:
        sid = writer.new_session()
        writer.append(sid, user("a" * 2000))
        (pack,) = [p for p in (path / "objects" / "pack").glob("*.pack")
                   if not p.with_suffix(".idx").exists()]  # fmt: skip
        data = bytearray(pack.read_bytes())
        at = data.find(b"\x28\xb5\x2f\xfd")  # the first zstd frame: the message
        assert at > 0
        data[at + 20] ^= 0x01
        with open(pack, "r+b") as f:
            f.write(data)
        with Store.open(path) as reader, pytest.raises(CorruptObject):
            reader.context(sid)
