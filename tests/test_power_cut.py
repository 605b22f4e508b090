"""Power cuts, for real: record every write, rename and fsync of a run, rebuild the
disk a power cut would leave at many points of it, and open the store from each.

A child process runs a workload with ``fs_recorder.Recorder`` installed: a
store created from nothing, appends, compactions, forks, a title, a delete, an
import, handles that seal packs until a repack merges them, two handles of
one process sharing an object while one of them is in a batch, a session
that a second handle goes on writing from the head in the first one's
journal, eight threads appending through one handle (their appends
share fsyncs; an fsync is recorded as it starts, so a write made while it
runs is not taken as covered by it, and as it returns, so nothing it covers
is durable before then: an append acknowledged while its fsync still ran
is caught), and four threads whose packs fill every
few appends and are sealed in the background while the appends go on, some
relying on a state another thread wrote into the pack being sealed. It marks
each acknowledged step in the same record. Then, for each point (before every
sync starts and returns, rename and unlink, and after every
acknowledgement), ``PowerCut``
builds the disk states of a cut there: only fsynced data survives, and each
name change not yet made durable by a directory fsync happened or not
(none, all, random subsets; and XFS-style zeros where unsynced data was).

Every state must open; fsck must find nothing; every acknowledged step must
be there; and the store must take a new append.

``AGS_POWER_CUT_POINTS`` sets how many points are tried (default 120, chosen
evenly with the ones right after acknowledgements first; ``all`` for every one).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from fs_recorder import DiskState, PowerCut

from objstore import Store, UnknownSpec
from objstore.fsck import check_store
from objstore.pack_format import BLOCK_PACK_MAGIC, PACK_MAGIC

HERE = Path(__file__).parent
VARIANTS = ("none", "all", "some", "some", "all-zeros")

WORKLOAD = """
import sys
from pathlib import Path
from fs_recorder import Recorder

store_path, record = Path(sys.argv[1]), Path(sys.argv[2])
rec = Recorder(store_path)
rec.install()
from objstore import Store
from objstore.exchange import export_session, import_document
from objstore.gc import collect_garbage

def append(store, sid, content, **kw):
    nid = store.append(sid, {"role": "user", "content": content}, **kw)
    rec.mark("append", sid, nid, content)
    return nid

s = Store.open(store_path)
a = s.new_session(title="a")
rec.mark("session", a)
for i in range(20):
    append(s, a, f"a{i}", state={"i": i} if i % 3 else None)
nid = s.compact(a, "summary of a", keep=2)
rec.mark("append", a, nid, None)
fork = s.fork(f"{a}~3")
rec.mark("fork", fork, s.node_id(fork))
append(s, fork, "forked 1")
s.set_title(a, "renamed")
rec.mark("title", a, "renamed")
doomed = s.new_session(title="doomed")
append(s, doomed, "doomed 1")
rec.mark("deleting", doomed)  # from here on it may be gone
s.delete(doomed)
rec.mark("deleted", doomed)
s.close()
rec.mark("closed")

for h in range(10):  # a sealed pack per handle: the tenth close merges them
    with Store.open(store_path) as t:
        append(t, a if h % 2 else fork, f"handle {h}")
rec.mark("repacked")

one, two = Store.open(store_path), Store.open(store_path)
b = one.new_session(title="b")
c = one.new_session(title="c")
rec.mark("session", b)
rec.mark("session", c)
with one.batch():
    one.append(b, {"role": "user", "content": "said twice"})  # in one's pack, not synced
    two.objects.refresh()  # two sees one's pack and the object in it
    said = append(two, c, "said twice")
    assert two.node(said).content not in two.objects._writer.index, "two made its own copy"
    append(two, c, "after it")
two.close()
one.close()
one, two = Store.open(store_path), Store.open(store_path)
append(one, a, "one before two")  # a's head only in one's journal
one.release(a)
append(two, a, "two after one")  # two goes on from it, in its own journal
one.close()  # one's seal writes a's file, behind two's journal
append(two, a, "two again")
two.close()

with Store.open(store_path) as s:
    old = s.new_session(title="old")
    append(s, old, "old 1")
    s.archive(old)
    s.tag("kept", a)
    s.checkout(fork, root=str(store_path.parent))
    rec.mark("deleting", old)
    collect_garbage(s, archived_older_than=0, grace=600)  # drops it and its reflog
    rec.mark("deleted", old)
    done = import_document(s, export_session(s, a), new_session=True)
    rec.mark("session", done.session)
    rec.mark("append", done.session, done.head, None)
    append(s, a, "last")

import threading
with Store.open(store_path) as s:  # eight threads, one handle: appends share fsyncs
    many = [s.new_session(title=f"thread {t}") for t in range(8)]
    for sid in many:
        rec.mark("session", sid)
    def work(t):
        for i in range(4):
            append(s, many[t], f"thread {t} {i}")
    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()

from objstore import object_store
object_store.MAX_PACK_BYTES = 2048  # packs sealed in the background as the appends go on
with Store.open(store_path) as s:  # states shared by the threads: found in a pack being sealed
    sealing = [s.new_session(title=f"sealing {t}") for t in range(4)]
    for sid in sealing:
        rec.mark("session", sid)
    def work(t):
        for i in range(12):
            append(s, sealing[t], f"sealing {t} {i} " + "x" * 150, state={"shared": i})
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
rec.uninstall()
rec.dump(record)
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> PowerCut:
    base = tmp_path_factory.mktemp("recorded")
    store_path, record = base / "store", base / "ops.pickle"
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run(
        [sys.executable, "-c", WORKLOAD, str(store_path), str(record)], check=True, env=env
    )
    return PowerCut.load(record, store_path)


def chosen_points(cut: PowerCut) -> list[int]:
    points = cut.points()
    wanted = os.environ.get("AGS_POWER_CUT_POINTS", "120")
    if wanted == "all" or len(points) <= int(wanted):
        return points
    after_marks = [i for i in points if i and cut.ops[i - 1][0] == "mark"]
    rest = [i for i in points if i not in set(after_marks)]
    room = max(int(wanted) - len(after_marks), 0)
    step = len(rest) / room if room else len(rest) + 1
    return sorted(set(after_marks) | {rest[int(k * step)] for k in range(room)})


def on_chain(store: Store, sid: str, node: str) -> bool:
    at = store.session(sid).head
    while at is not None:
        if at == node:
            return True
        at = store.node(at).parent
    return False


def check_acknowledged(store: Store, marks: list[tuple[Any, ...]]) -> None:
    deleted = {m[1] for m in marks if m[0] == "deleting"}
    for mark in marks:
        kind = mark[0]
        if kind in ("session", "append", "fork") and mark[1] not in deleted:
            store.session(mark[1])  # UnknownSpec if the session was lost
        if kind in ("append", "fork") and mark[1] not in deleted:
            sid, node = mark[1], mark[2]
            assert on_chain(store, sid, node), f"acknowledged {mark} is not in {sid}"
            if kind == "append" and mark[3] is not None:
                assert store.blob(store.node(node).content)["content"] == mark[3]
        elif kind == "title":
            assert store.session(mark[1]).title == mark[2]
        elif kind == "deleted":
            with pytest.raises(UnknownSpec):
                store.session(mark[1])


def check_state(cut: PowerCut, state: DiskState, where: Path, probe: bool) -> None:
    for path, data in state.files.items():  # a pack is never visible before its header
        if "/objects/pack/" in path and path.endswith(".pack"):
            assert data[: len(PACK_MAGIC)] in (PACK_MAGIC, BLOCK_PACK_MAGIC), (
                f"{path} has no header"
            )
    root = cut.materialize(state, where)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a power cut must not look like damage
        with Store.open(root) as store:
            report = check_store(store)
            assert report.problems == [], report.problems
            check_acknowledged(store, state.marks)
            sessions = [m[1] for m in state.marks if m[0] == "session"]
            if probe and sessions:
                store.append(sessions[0], {"role": "user", "content": "after the power cut"})
        if probe:
            with Store.open(root) as store:
                assert check_store(store).problems == []
                check_acknowledged(store, state.marks)


def test_the_record_covers_the_workload(recorded: PowerCut) -> None:
    kinds = {op[0] for op in recorded.ops}
    assert {"link", "write", "fsync", "fsync_dir", "rename", "unlink", "mkdir", "mark"} <= kinds
    marks = [op[1] for op in recorded.ops if op[0] == "mark"]
    assert marks.count("append") >= 35 and "repacked" in marks
    assert len(recorded.points()) > 300


def test_every_power_cut_leaves_a_store_that_opens_and_keeps_what_it_acknowledged(
    recorded: PowerCut, tmp_path: Path
) -> None:
    rng = random.Random(9)
    points = chosen_points(recorded)
    tried = 0
    for n, point in enumerate(points):
        for v, state in enumerate(recorded.states(point, VARIANTS, rng)):
            where = tmp_path / f"cut-{point}-{v}"
            try:
                check_state(recorded, state, where, probe=(n + v) % 4 == 0)
            except BaseException as e:
                op = recorded.ops[point] if point < len(recorded.ops) else ("end",)
                raise AssertionError(
                    f"power cut before op {point} {op[:3]!r}, variant {VARIANTS[v]} "
                    f"({state.pending} name changes pending): {e!r}"
                ) from e
            shutil.rmtree(where)
            tried += 1
    assert tried >= min(len(points), 100) * len(VARIANTS)
