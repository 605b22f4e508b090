"""Packs do not pile up: small ones are merged, and nothing is lost doing it."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import store_with_damaged_message

from objstore import CorruptObject, Store
from objstore import packs as packs_module
from objstore.repack import MAX_PACKS, packs_to_merge


def pack_names(path: Path) -> set[str]:
    return {p.name for p in (path / "objects" / "pack").glob("*.pack")}


def test_policy_merges_small_packs_and_leaves_big_ones():
    assert packs_to_merge([10] * MAX_PACKS) == []
    small_then_big = [1] * MAX_PACKS + [1000]
    assert sorted(packs_to_merge(small_then_big)) == list(range(MAX_PACKS))
    growing = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert len(packs_to_merge(growing)) >= 2  # always makes progress when over the limit


def test_policy_merges_same_sized_packs_above_a_trickle_of_tiny_ones():
    """What a long soak showed: tiny packs keep arriving (handles that wrote little)
    while same-sized ones pile up above them; they must be merged too."""
    sizes = [5, 5] + [4000] * 20 + [1_000_000]
    assert sorted(packs_to_merge(sizes)) == list(range(22))
    after = [5 * 2 + 4000 * 20, 1_000_000, 3, 4] + [6] * 6  # the next round
    merged = sorted(packs_to_merge(after))
    assert 1 not in merged and set(range(2, 10)) <= set(merged)


def test_packs_stay_few_when_many_arrive_between_repacks():
    """Sizes like a 2-minute soak's (handles that reopen every 300 appends), ten
    new packs for every repack that gets the lock (gc holds it while it marks)."""
    rng = random.Random(5)
    sizes = [16_875_673, 5_095_930, 1_018_335]
    for _round in range(200):
        sizes += [rng.choice([8_019, 51_146, 149_738, 227_228, 262_024]) for _ in range(10)]
        chosen = set(packs_to_merge(sizes))
        if chosen:
            merged = sum(sizes[i] for i in chosen)
            sizes = [s for i, s in enumerate(sizes) if i not in chosen] + [merged]
        assert len(sizes) <= MAX_PACKS + 10


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


def test_gc_lets_repacks_run_while_it_marks(tmp_path):
    from objstore import collect_garbage
    from objstore.files import FileLock

    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": "kept"})
    free_while_marking = []

    def progress(phase: str, done: int, total: int) -> None:
        if phase == "mark" and done == 0:
            lock = FileLock(path / "locks" / "repack")
            free_while_marking.append(lock.acquire(blocking=False))
            lock.release()

    with Store.open(path) as s:
        collect_garbage(s, grace=600, progress=progress)
        assert s.context(sid) == [{"role": "user", "content": "kept"}]
    assert free_while_marking == [True]


def _store_of_many_packs(path: Path, packs: int, messages: int) -> None:
    for run in range(packs):  # each handle seals a block pack of its own
        with Store.open(path) as s, s.batch():
            sid = s.new_session(title=f"run {run}")
            for i in range(messages):
                s.append(sid, {"role": "user", "content": f"run {run} message {i} " + "x" * 200})


@pytest.mark.parametrize("small_write", [1000, packs_module.SMALL_WRITE])
def test_a_merge_holds_far_less_than_its_objects_and_writes_the_exact_index(
    tmp_path, monkeypatch, small_write
):
    """A merge reads every object of the packs it merges: what it keeps of each must be
    a few dozen bytes, not Python tuples and strings (gc of a 1.6M-object store peaked
    at 1.4 GB), except the set of ids a merge of at most SMALL_WRITE objects keeps
    (bounded by SMALL_WRITE). Its index, written in pieces, is the one its records give."""
    import tracemalloc

    from objstore.packs import verified_block_pack

    monkeypatch.setattr(packs_module, "SMALL_WRITE", small_write)
    path = tmp_path / "store"
    _store_of_many_packs(path, 3, 4000)
    with Store.open(path) as s:
        packs = s.objects.sealed_packs()
        objects = sum(pack.count for pack in packs)
        tracemalloc.start()
        try:
            merged = s.objects._merge(packs)
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    pack, index = merged.path.read_bytes(), merged.path.with_suffix(".idx").read_bytes()
    assert objects > 20_000
    if objects > small_write:
        # About 60 bytes an object, and a few blocks; the dict-based merge took 500.
        assert peak < 120 * objects + 2_000_000, f"{peak / objects:.0f} bytes an object"
    else:  # the set of ids: about 250 bytes an object more
        assert peak < 400 * objects + 2_000_000, f"{peak / objects:.0f} bytes an object"
    blocks = verified_block_pack(pack, index, merged.path.name)  # raises if the index differs
    assert sum(len(members) for _record, members in blocks) == objects


def test_a_merge_copies_the_blocks_after_a_record_it_cannot_walk_past(tmp_path):
    """The merge walks a pack's records to find its blocks; a damaged record header
    stops that walk, and the blocks after it are found through the index."""
    path = tmp_path / "store"
    _store_of_many_packs(path, 1, 3000)
    with Store.open(path) as s:
        pack = max(s.objects.sealed_packs(), key=lambda p: p.count)  # of many blocks
        offsets = sorted({pack.in_block(oid)[0] for oid in pack.ids()})  # type: ignore[index]
        pack_path = pack.path
        sid = s.sessions()[0].id
    assert len(offsets) > 3
    data = bytearray(pack_path.read_bytes())
    data[offsets[1] - 37] = 0x7F  # the type byte of the second block's record: unknown
    pack_path.write_bytes(bytes(data))
    with Store.open(path) as s:
        (damaged,) = [p for p in s.objects.sealed_packs() if p.path == pack_path]
        s.objects._replace_packs([damaged], s.objects._merge([damaged]))
    assert pack_path.name not in pack_names(path)  # merged away
    with Store.open(path) as s:
        assert len(s.context(sid)) == 3000  # every message, the later blocks' too
