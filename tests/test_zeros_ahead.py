"""The zeros a writer keeps ahead of the records of its pack (FORMAT.md 5.1): written
and synced before any record lands on them, never past MAX_PACK_BYTES, read by
nobody as data; and the records of one write become visible all at once, when
their first type byte is written last, so that a reader never takes a record
whose bytes are not all there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import live_pack, records_end

from objstore import Store, packs
from objstore.fsck import check_store
from objstore.pack_format import PACK_MAGIC
from objstore.packs import MAX_PACK_BYTES, ZEROS_AHEAD


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_a_pack_keeps_zeros_ahead_of_its_records_up_to_the_size_it_is_sealed_at(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
        store.append(sid, user("the first"))
        data = live_pack(path).read_bytes()
        end = records_end(data)
        assert len(data) - end >= ZEROS_AHEAD - 4096  # written with the header
        assert data[end:] == bytes(len(data) - end)
        seen_zeros_move = False
        for i in range(3000):  # about 2.5 packs of these
            store.append(sid, user(f"message {i} " + "x" * 300))
            pack = store.objects._writer.path  # the one a background seal is not sealing
            data = pack.read_bytes()
            end = records_end(data)
            assert data[end:] == bytes(len(data) - end), "only zeros after the records"
            assert len(data) <= max(end, MAX_PACK_BYTES), "no zeros past the sealing size"
            if end < MAX_PACK_BYTES:
                assert len(data) > end, "zeros ahead until the pack is full"
            seen_zeros_move |= len(data) > ZEROS_AHEAD + len(PACK_MAGIC)
        assert seen_zeros_move, "the zeros were moved ahead as the records passed them"
        assert len(store.context(sid)) == 3001
        assert check_store(store).ok


def test_a_reader_sees_no_record_of_a_write_until_its_first_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as writer, Store.open(path) as reader:
        sid = writer.new_session()
        before = writer.append(sid, user("acknowledged"))
        reader.objects.refresh()
        assert reader.session(sid).head == before
        real_pwrite = os.pwrite
        looks: list[str | None] = []

        def look_before_the_first_byte(fd: int, data: bytes, offset: int) -> int:
            if len(data) == 1:  # the records are in the file, all but this byte
                pack = live_pack(path).read_bytes()
                assert pack[offset] == 0 and len(pack) > offset + 1000
                reader.objects.refresh()  # a reader that looks just then
                looks.append(reader.session(sid).head)
                with Store.open(path) as fresh:  # and one that opens the store then
                    looks.append(fresh.session(sid).head)
                    assert fresh.context(sid) == [user("acknowledged")]
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(packs.os, "pwrite", look_before_the_first_byte)
        after = writer.append(sid, user("the next " + "y" * 3000))
        monkeypatch.undo()
        assert looks == [before, before]
        reader.objects.refresh()
        assert reader.session(sid).head == after
        assert reader.context(sid)[-1] == user("the next " + "y" * 3000)


KILLED_BEFORE_THE_FIRST_BYTE = """
import json, os, signal, sys
from objstore import Store, packs
store = Store.open(sys.argv[1])
sid = store.new_session()
acked = [store.append(sid, {"role": "user", "content": f"m{i}"}) for i in range(20)]
print(json.dumps([sid, acked]), flush=True)
real = os.pwrite
def kill_before_the_first_byte(fd, data, offset):
    if len(data) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(fd, data, offset)
packs.os.pwrite = kill_before_the_first_byte
store.append(sid, {"role": "user", "content": "never acknowledged " + "z" * 2000})
"""


def test_a_writer_killed_between_the_records_and_their_first_byte_lost_only_them(
    tmp_path: Path,
) -> None:
    """kill -9 after the records of an append are in the file with a zero type byte:
    recovery ends the pack before them (5.2), and the acknowledged appends are all
    there."""
    path = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_THE_FIRST_BYTE, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    sid, acked = json.loads(child.stdout)
    data = live_pack(path).read_bytes()
    end = records_end(data)
    assert data[end] == 0 and any(data[end + 1 : end + 33]), "records with a zero first byte"
    with Store.open(path) as store:
        assert [e.id for e in store.log(sid)][::-1] == acked
        assert store.context(sid)[-1] == user("m19")
        store.append(sid, user("goes on"))
        assert check_store(store).ok


KILLED_IDLE = """
import os, signal, sys
from objstore import Store
store = Store.open(sys.argv[1])
sid = store.new_session()
for i in range(5):
    store.append(sid, {"role": "user", "content": f"m{i}"})
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_recovery_cuts_the_zeros_ahead_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "store"
    child = subprocess.run([sys.executable, "-c", KILLED_IDLE, str(path)], check=False)
    assert child.returncode == -signal.SIGKILL
    pack = live_pack(path)
    data = pack.read_bytes()
    end = records_end(data)
    assert len(data) > end, "zeros ahead when the writer died"
    with Store.open(path) as store:  # recovers the pack
        assert pack.with_suffix(".idx").exists()
        assert pack.read_bytes() == data[:end]
        (sid,) = store.sessions()
        assert len(store.context(sid.id)) == 5
