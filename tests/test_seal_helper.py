"""The block packs of seals beside the appends, written by a helper process
(objstore/seal_helper.py): the same store as a seal in the thread, a failed or
killed helper costing no seal, and no helper left behind by a handle, closed or
killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from killed_child import children_of, until_gone

from objstore import Store, object_store
from objstore.fsck import check_store
from objstore.seal_helper import SealHelper, SealHelperFailed


def append_many(store: Store, sid: str, n: int, start: int = 0) -> list[str]:
    return [
        store.append(sid, {"role": "user", "content": f"m{i} " + "x" * (i % 300)})
        for i in range(start, start + n)
    ]


def append_until_helped(store: Store, sid: str, seals: int, merges: int = 0) -> list[str]:
    """Append until the helper has written ``seals`` block packs for seals and
    ``merges`` for merges. The appends do not wait for a seal (the full pack grows
    meanwhile), and the helper's first seal waits for its interpreter to start."""
    heads: list[str] = []
    helper = store.objects._helper
    deadline = time.monotonic() + 60
    while helper.sealed < seals or helper.merged < merges:
        assert time.monotonic() < deadline, "the helper did not do it"
        heads += append_many(store, sid, 10, start=len(heads))
    return heads


def helpers_of(store: Path) -> list[int]:
    """The pids of the running seal helpers of the store at ``store``."""
    wanted = str(store / "objects" / "pack").encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if wanted in argv and any(b"seal_helper" in arg for arg in argv):
            found.append(int(entry.name))
    return found


def test_seals_and_merges_beside_the_appends_are_written_by_the_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(object_store, "MAX_PACK_BYTES", 4096)  # a seal every few appends
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
        heads = append_until_helped(store, sid, 5, merges=2)  # packs merged beside them
        helpers = helpers_of(path)
        assert len(helpers) == 1
    until_gone(helpers)  # the helper ends with its handle
    with Store.open(path) as store:
        assert [entry.id for entry in store.log(sid)][::-1] == heads
        assert len(store.context(sid)) == len(heads)
        report = check_store(store)
        assert report.ok, report


def test_a_helper_killed_between_seals_costs_no_seal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seal after it runs in the thread, and so does every later one."""
    monkeypatch.setattr(object_store, "MAX_PACK_BYTES", 4096)
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
        heads = append_until_helped(store, sid, 2)
        helper = store.objects._helper
        (pid,) = helpers_of(path)
        os.kill(pid, signal.SIGKILL)
        # A seal under way may have had the helper's answer before the kill landed
        # (CI saw one more seal counted just after): its count is the helper's too.
        seal = store.objects._seal
        while seal is not None and not seal.done:
            time.sleep(0.01)
        sealed_by_it = helper.sealed
        before = set((path / "objects" / "pack").glob("*.idx"))
        heads += append_many(store, sid, 300, start=len(heads))
        assert helper.sealed == sealed_by_it and not helper.usable
        assert set((path / "objects" / "pack").glob("*.idx")) - before  # sealed in the thread
    with Store.open(path) as store:
        assert [entry.id for entry in store.log(sid)][::-1] == heads
        report = check_store(store)
        assert report.ok, report


def test_a_helper_that_fails_is_not_asked_again(tmp_path: Path) -> None:
    helper = SealHelper(tmp_path, tmp_path)
    with pytest.raises(SealHelperFailed, match="FileNotFoundError"):
        helper.seal(tmp_path / "no-such.pack", 100)
    assert not helper.usable and not helpers_of(tmp_path.parent / tmp_path.name)
    with pytest.raises(SealHelperFailed):
        helper.seal(tmp_path / "no-such.pack", 100)
    helper.close()


def test_the_helper_refuses_a_pack_whose_object_does_not_verify(tmp_path: Path) -> None:
    """Then the thread seals it, from the copies the handle holds (one read back from
    the file would be the damaged one)."""
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session()
        store.append(sid, {"role": "user", "content": "a needle in the pack"})
        (live,) = (path / "objects" / "pack").glob("*.pack")
        size = store.objects._writer.size  # type: ignore[union-attr]
        data = live.read_bytes()
        at = data.index(b"needle")
        with open(live, "r+b") as f:
            f.seek(at)
            f.write(b"N")
        helper = SealHelper(path / "objects" / "pack", path / "tmp")
        with pytest.raises(SealHelperFailed, match="CorruptObject"):
            helper.seal(live, size)
        helper.close()
        assert {p.stem for p in (path / "objects" / "pack").iterdir()} == {live.stem}
    with Store.open(path) as store:  # sealed at the close from the handle's good copy
        assert store.context(sid) == [{"role": "user", "content": "a needle in the pack"}]
        report = check_store(store)
        assert report.ok, report


KILLED = r"""
import sys
from objstore import Store, object_store
object_store.MAX_PACK_BYTES = 4096
store = Store.open(sys.argv[1])
sid = store.new_session()
i = 0
while True:
    store.append(sid, {"role": "user", "content": f"m{i} " + "x" * (i % 300)})
    i += 1
    if store.objects._helper.sealed >= 3:
        print("helping", flush=True)
        sys.stdin.readline()
"""


def test_a_helper_ends_when_its_process_is_killed(tmp_path: Path) -> None:
    path = tmp_path / "store"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "helping\n", (
            child.stderr.read() if child.stderr else ""
        )
        assert helpers_of(path)
    finally:
        helpers = children_of(child.pid)
        child.kill()
        child.wait(30)
    assert helpers
    until_gone(helpers)
    with Store.open(path) as store:
        report = check_store(store)
        assert report.ok, report
        (session,) = store.sessions()
        assert session.messages > 0


WATCHED = r"""
import os, sys, time
from pathlib import Path
from objstore.seal_helper import SealHelper
helper = SealHelper(Path(sys.argv[1]), Path(sys.argv[1]))
helper.start()
keeper = os.fork()
if keeper == 0:  # holds the helper's input open: only its watch can end it now
    time.sleep(120)
    os._exit(0)
print(helper._process.pid, keeper, flush=True)
time.sleep(120)
"""


def test_a_helper_ends_when_its_process_dies_even_if_its_input_stays_open(tmp_path: Path) -> None:
    """The helper watches the process that started it: a process that forked, then
    was killed, leaves the helper's input open in its child, and the helper must
    not wait for its end (it may as well be in the middle of a seal)."""
    child = subprocess.Popen(
        [sys.executable, "-c", WATCHED, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    helper, keeper = map(int, child.stdout.readline().split())
    try:
        child.kill()  # at once: the helper may not even have started its loop
        child.wait(30)
        until_gone([helper])
        assert os.path.exists(f"/proc/{keeper}")  # its input was still open
    finally:
        os.kill(keeper, signal.SIGKILL)
        until_gone([keeper])
