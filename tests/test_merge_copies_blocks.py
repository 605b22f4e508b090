"""A merge copies a full block as it is, claim included, when its record verifies
and the merged pack holds none of its objects (FORMAT.md 5.4); any other block is
taken apart and its objects written again, each checked against its id."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from objstore import Store, repack
from objstore.fsck import check_store
from objstore.merging import COPIED_WHOLE_BYTES
from objstore.packs import verified_block_pack


def _sessions(path: Path, runs: int, messages: int, text: str = "run") -> None:
    for run in range(runs):  # each handle seals a block pack of its own
        with Store.open(path) as s, s.batch():
            sid = s.new_session(title=f"{text} {run}")
            for i in range(messages):
                s.append(sid, {"role": "user", "content": f"{text} {run} message {i} " + "x" * 300})


def _full_blocks(path: Path) -> list[bytes]:
    """The records of the full blocks of the store's sealed packs."""
    with Store.open(path) as s:
        return [
            record
            for pack in s.objects.sealed_packs()
            for record, content, _members in pack.blocks()
            if content is not None and len(content) >= COPIED_WHOLE_BYTES
        ]


def _repacked(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Merge every sealed pack of the store into one; that pack's path."""
    monkeypatch.setattr(repack, "MAX_PACKS", 1)
    with Store.open(path) as s:
        before = len(s.objects.sealed_packs())
        assert before > 1
        assert s.repack() == before
        (pack,) = s.objects.sealed_packs()
        return pack.path


def _contexts(path: Path) -> dict[str, list[str]]:
    with Store.open(path) as s:
        return {
            info.title or "": [m["content"] for m in s.context(info.id)] for info in s.sessions()
        }


def _fsck_ok(path: Path) -> bool:
    with Store.open(path) as s:
        return check_store(s).ok


def _entries(pack_path: Path) -> list[str]:
    blocks = verified_block_pack(
        pack_path.read_bytes(), pack_path.with_suffix(".idx").read_bytes(), pack_path.name
    )
    return [oid for _record, members in blocks for oid, _inner, _length in members]


def test_full_blocks_are_copied_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    _sessions(path, 3, 1500)
    full, contexts = _full_blocks(path), _contexts(path)
    assert len(full) >= 6
    merged = _repacked(path, monkeypatch)
    data = merged.read_bytes()
    assert all(record in data for record in full)  # claim and all
    assert _contexts(path) == contexts
    ids = _entries(merged)
    assert len(ids) == len(set(ids))
    assert _fsck_ok(path)


def test_a_full_block_whose_record_fails_is_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full block whose claim was changed on disk still decompresses, and each of
    its objects still hashes to its id: only its record's id says it is not what its
    writer wrote. The merge writes its objects again, with a claim of its own."""
    path = tmp_path / "store"
    _sessions(path, 3, 1500)
    contexts = _contexts(path)
    with Store.open(path) as s:
        pack = max(s.objects.sealed_packs(), key=lambda p: p.count)
        pack_path, record = pack.path, _full_blocks(path)[0]
    data = bytearray(pack_path.read_bytes())
    at = data.find(record)
    if at < 0:  # the first full block is in another pack
        pack_path = next(
            p for p in pack_path.parent.glob("*.pack") if p.read_bytes().find(record) >= 0
        )
        data = bytearray(pack_path.read_bytes())
        at = data.find(record)
    flags = at + len(record) - 8  # the claim: magic, size, flags, length (FORMAT.md 5.5)
    assert data[flags] == 1  # WITHIN_LIMITS
    data[flags] = 0
    damaged = bytes(data[at : at + len(record)])
    pack_path.write_bytes(bytes(data))
    merged = _repacked(path, monkeypatch)
    assert damaged not in merged.read_bytes()
    assert _contexts(path) == contexts
    assert _fsck_ok(path)


def test_a_block_whose_objects_another_pack_gave_is_not_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two packs holding the same objects (two stores' packs put in one): each object is
    written once, so the second pack's full blocks are taken apart, not copied."""
    path, other = tmp_path / "store", tmp_path / "other"
    _sessions(path, 1, 1500, text="same")
    _sessions(other, 1, 1500, text="same")
    for pack in (other / "objects" / "pack").glob("pack-*"):
        shutil.copy(pack, path / "objects" / "pack" / pack.name)
    contexts = _contexts(path)
    merged = _repacked(path, monkeypatch)
    ids = _entries(merged)
    assert len(ids) == len(set(ids))
    assert _contexts(path) == contexts
    assert _fsck_ok(path)
