"""The live index beside a pack being written (FORMAT.md 5.6): a reader opening the
store takes the records it lists instead of scanning the pack, reads only what it
needs of the pack, and a live index that is damaged, stale, torn or of another
pack costs a scan, never a wrong head or a wrong object."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import count_preads, live_pack, records_end

from objstore import Store
from objstore.live_index import BODY_HEAD, ENTRY_HEAD, LIVE_MAGIC, encode_entry, parse

APPENDS = 300  # about 900 records: three entries, and a tail past the last


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def write_session(writer: Store, n: int = APPENDS) -> tuple[str, list[str]]:
    sid = writer.new_session()
    heads = [writer.append(sid, user(f"m{i}")) for i in range(n)]
    return sid, heads


def check_reader(path: Path, sid: str, heads: list[str], writer: Store) -> None:
    """A new handle sees the newest head and the whole context, and goes on seeing
    what the writer appends."""
    with Store.open(path) as reader:
        assert reader.session(sid).head == heads[-1]
        assert [m["content"] for m in reader.context(sid)] == [f"m{i}" for i in range(len(heads))]
        more = writer.append(sid, user("more"))
        reader.objects.refresh()
        assert reader.session(sid).head == more
        assert reader.context(sid)[-1] == user("more")
        assert reader.node(heads[0]).messages == 1  # the oldest object, read too
    heads.append(more)


def test_a_writer_keeps_a_live_index_and_removes_it_when_it_seals(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as writer:
        write_session(writer)
        pack = live_pack(path)
        listed = parse(pack.with_suffix(".live").read_bytes(), 8, records_end(pack.read_bytes()))
        assert len(listed) >= 3
        # every record of the stretches listed, objects and ref updates: 3 per append
        records = sum(len(s.object_ids) + len(s.ref_starts) for s in listed)
        assert records <= 3 * APPENDS < records + 256
    assert not list((path / "objects" / "pack").glob("*.live"))


def test_a_reader_reads_only_the_tail_and_what_it_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as writer:
        sid = writer.new_session()
        for i in range(APPENDS):
            writer.append(sid, user(f"m{i} " + "x" * 500))
        size = records_end(live_pack(path).read_bytes())
        read = count_preads(monkeypatch)
        with Store.open(path) as reader:
            opened = sum(read)
            assert reader.session(sid).head is not None
            assert reader.blob(reader.node(reader.session(sid).head or "").content)
        monkeypatch.undo()
        # the listed records are not read to open the store, nor all read to take
        # the newest message: a scan would have read the whole pack
        assert opened < size / 2, (opened, size)
        assert sum(read) < size / 2, (sum(read), size)


def flip_in_an_entry(data: bytes) -> bytes:
    out = bytearray(data)
    out[len(LIVE_MAGIC) + ENTRY_HEAD.size + BODY_HEAD.size + 5] ^= 0x40  # an id
    return bytes(out)


def cut_mid_entry(data: bytes) -> bytes:
    return data[: len(data) - 17]


def garbage(data: bytes) -> bytes:
    return os.urandom(len(data))


def lie_about_the_last_record(data: bytes) -> bytes:
    """Entries re-encoded, checksums and all, with each entry's last object record
    moved: a live index that checks but does not fit the pack."""
    out = [LIVE_MAGIC]
    for stretch in parse(data, 8, 1 << 40):
        starts = list(stretch.object_starts)
        starts[-1] += 1
        objects = list(zip(stretch.object_ids, starts, strict=True))
        out.append(encode_entry(stretch.end, objects, stretch.ref_starts))
    return b"".join(out)


def past_the_end(data: bytes) -> bytes:
    return data + encode_entry(1 << 40, [(b"\x01" * 32, 1 << 39)], [])


@pytest.mark.parametrize(
    "damage",
    [
        flip_in_an_entry,
        cut_mid_entry,
        garbage,
        lie_about_the_last_record,
        past_the_end,
        lambda data: b"",
    ],
    ids=["flipped", "cut", "garbage", "lying", "past-end", "empty"],
)
def test_a_damaged_live_index_never_gives_a_wrong_head_or_object(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as writer:
        sid, heads = write_session(writer)
        index = live_pack(path).with_suffix(".live")
        index.write_bytes(damage(index.read_bytes()))  # in place: the writer goes on
        check_reader(path, sid, heads, writer)
        for _ in range(200):  # the writer's next entries after the damage
            heads.append(writer.append(sid, user(f"m{len(heads)}")))
        with Store.open(path) as reader:
            assert reader.session(sid).head == heads[-1]
            assert len(reader.context(sid)) == len(heads)


def test_an_entry_whose_last_record_is_not_where_it_ends_is_not_taken(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as writer:
        # appends until an entry ends where the pack does: the index lists the whole
        # pack, and its last entry ends with the session's newest update
        sid, heads = writer.new_session(), []
        for i in range(1000):
            heads.append(writer.append(sid, user(f"m{i}")))
            pack = live_pack(path)
            index = pack.with_suffix(".live")
            if index.exists():
                entries = parse(index.read_bytes(), 8, records_end(pack.read_bytes()))
                if entries and entries[-1].end == records_end(pack.read_bytes()):
                    break
        assert entries[-1].end == records_end(pack.read_bytes())
        # the last entry again, checksum and all, without that update
        last = entries[-1]
        objects = list(zip(last.object_ids, last.object_starts, strict=True))
        lying = encode_entry(last.end, objects, last.ref_starts[:-1])
        data = index.read_bytes()
        true = encode_entry(last.end, objects, last.ref_starts)
        assert data.endswith(true)
        index.write_bytes(data[: len(data) - len(true)] + lying)
        assert len(parse(index.read_bytes(), 8, records_end(pack.read_bytes()))) == len(entries)
        check_reader(path, sid, heads, writer)


def test_another_packs_live_index_is_not_taken(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as one, Store.open(path) as two:
        sid, heads = write_session(one)
        other, _ = write_session(two, APPENDS + 30)
        packs = sorted(
            (p for p in (path / "objects" / "pack").glob("*.pack")
             if not p.with_suffix(".idx").exists()),
            key=lambda p: records_end(p.read_bytes()),
        )  # fmt: skip
        # the bigger pack's index over the smaller: entries that check, of the wrong pack
        packs[0].with_suffix(".live").write_bytes(packs[1].with_suffix(".live").read_bytes())
        check_reader(path, sid, heads, one)
        with Store.open(path) as reader:
            assert reader.session(other).messages == APPENDS + 30


WRITER = """
import sys, time
from objstore import Store
store = Store.open(sys.argv[1])
sid = store.new_session()
for i in range(300):
    store.append(sid, {"role": "user", "content": f"m{i}"})
print(sid, flush=True)
time.sleep(60)
"""


def test_a_dead_writers_live_index_goes_with_its_recovery(tmp_path: Path) -> None:
    path = tmp_path / "store"
    Store.open(path).close()
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(WRITER))
    child = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE)
    assert child.stdout is not None
    sid = child.stdout.readline().decode().strip()
    assert list((path / "objects" / "pack").glob("*.live"))
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with Store.open(path) as store:
        assert not list((path / "objects" / "pack").glob("*.live"))
        assert len(store.context(sid)) == 300


def test_a_live_index_left_without_its_pack_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as writer:
        write_session(writer)
        index = live_pack(path).with_suffix(".live")
        left = index.with_name("pack-" + "0" * 32 + ".live")
        left.write_bytes(index.read_bytes())
    with Store.open(path) as store:
        store.objects.repack()  # its clean-up runs with the repack lock
    assert not left.exists()
