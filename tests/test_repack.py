"""Packs do not pile up: small ones are merged, and nothing is lost doing it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import store_with_damaged_message

from objstore import CorruptObject, Store
from objstore.repack import MAX_PACKS, packs_to_merge


def pack_names(path: Path) -> set[str]:
    return {p.name for p in (path / "objects" / "pack").glob("*.pack")}


def test_policy_merges_small_packs_and_leaves_big_ones():
    assert packs_to_merge([10] * MAX_PACKS) == []
    small_then_big = [1] * MAX_PACKS + [1000]
    assert sorted(packs_to_merge(small_then_big)) == list(range(MAX_PACKS))
    growing = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert len(packs_to_merge(growing)) >= 2  # always makes progress when over the limit


def test_many_writers_leave_few_packs_and_every_message(tmp_path):
    path = tmp_path / "store"
    sessions = []
    for run in range(30):  # thirty processes' worth of handles, each writing its own pack
        with Store.open(path) as s:
            sid = s.new_session(title=f"run {run}")
            for i in range(5):
                s.append(sid, {"role": "user", "content": f"run {run} message {i}"})
            s.append(sid, {"role": "user", "content": "the same words every run"})
            sessions.append(sid)
        assert len(pack_names(path)) <= MAX_PACKS + 1
    with Store.open(path) as s:
        for run, sid in enumerate(sessions):
            context = s.context(sid)
            assert [m["content"] for m in context[:5]] == [
                f"run {run} message {i}" for i in range(5)
            ]
        ids = list(s.objects.ids())
        for oid in ids:
            s.objects.get(oid)
        assert len(ids) == len(set(ids))  # merged packs hold each object once
    assert not list((path / "tmp").iterdir())


def test_a_reader_keeps_reading_while_another_process_repacks(tmp_path):
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": "first"})
    reader = Store.open(path)
    before = reader.context(sid)  # the reader has the first pack mapped
    code = (
        "import sys\nfrom objstore import Store\n"
        "for i in range(12):\n"
        "    with Store.open(sys.argv[1]) as s:\n"
        "        s.append(sys.argv[2], {'role': 'user', 'content': str(i)})\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path), sid], check=True, timeout=120)
    assert len(pack_names(path)) <= MAX_PACKS + 1
    assert reader.context(f"{sid}~12") == before  # old objects, through old mappings
    assert [m["content"] for m in reader.context(sid)][-1] == "11"  # new ones, found anew
    reader.close()


def test_a_damaged_object_is_kept_through_a_repack(tmp_path):
    path = tmp_path / "store"
    _, blob, pack = store_with_damaged_message(path, "will be damaged " * 20)
    for i in range(MAX_PACKS + 1):
        with Store.open(path) as s:
            s.append(s.new_session(), {"role": "user", "content": str(i)})
    assert pack.name not in pack_names(path)  # the damaged pack was merged away
    with Store.open(path) as s, pytest.raises(CorruptObject, match=blob):
        s.objects.get(blob)  # still there, still reported: not dropped, not hidden


def test_leftovers_of_crashes_are_removed_and_fresh_files_kept(tmp_path):
    import os
    import time

    path = tmp_path / "store"
    with Store.open(path) as s:
        s.append(s.new_session(), {"role": "user", "content": "x"})
    pack_dir = path / "objects" / "pack"
    orphan = pack_dir / "pack-0123456789abcdef0123456789abcdef.idx"
    orphan.write_bytes(b"left by a repack that died between its two unlinks")
    old_tmp, fresh_tmp = path / "tmp" / "4242-0000000000000000", path / "tmp" / "4243-1"
    old_tmp.write_bytes(b"a ref file a writer never renamed")
    fresh_tmp.write_bytes(b"a ref file being written right now")
    hours_ago = time.time() - 7200
    os.utime(old_tmp, (hours_ago, hours_ago))
    with Store.open(path) as s:
        s.objects.repack()
        assert not orphan.exists()
        assert not old_tmp.exists()
        assert fresh_tmp.exists()
        assert len(list(pack_dir.glob("*.idx"))) == len(list(pack_dir.glob("*.pack"))) == 1
