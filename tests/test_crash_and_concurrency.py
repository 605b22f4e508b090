"""Crashes and concurrency, with real processes: no mocks.

Every test runs small Python child processes (``sys.executable`` importing
objstore) against a store in ``tmp_path``: racing compare-and-swaps, a
second writer refused by name, ``kill -9`` in the middle of appends and
compactions, the on-disk state a power loss could leave behind, writers on
different sessions at once, and readers that open the store while a writer
appends. Children report over stdout, one flushed line per acknowledged step;
what the parent has read is what was acknowledged.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import records_end

from objstore import SessionBusy, Store, UnknownSpec
from objstore.locks import WriterLock

LINE_TIMEOUT = 30.0  # seconds a child may stay silent before the test fails

PRELUDE = """\
import json, os, sys, time, traceback
from pathlib import Path
from objstore import RefConflict, SessionBusy, Store

def wait_for(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"gave up waiting for {path}")
        time.sleep(0.0005)

def say(*parts):
    print(*parts, flush=True)
"""


class Child:
    """A Python child process; a thread reads its stdout lines into a queue."""

    def __init__(self, workdir: Path, name: str, code: str, args: list[str]) -> None:
        script = workdir / f"{name}.py"
        script.write_text(PRELUDE + textwrap.dedent(code))
        self.stderr_path = workdir / f"{name}.stderr"
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), *args],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self.pid = self.proc.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._pump = threading.Thread(target=self._read_stdout, daemon=True)
        self._pump.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put(raw)
        self._lines.put(None)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def line(self, timeout: float = LINE_TIMEOUT) -> str:
        """The next complete line; fail if the child dies or stays silent."""
        try:
            raw = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise AssertionError(
                f"child {self.pid} silent for {timeout}s:\n{self.stderr()}"
            ) from None
        if raw is None or not raw.endswith("\n"):
            self.proc.wait(timeout=LINE_TIMEOUT)
            raise AssertionError(
                f"child {self.pid} exited ({self.proc.returncode}) early:\n{self.stderr()}"
            )
        return raw[:-1]

    def kill(self) -> None:
        """SIGKILL, and wait until the kernel has reaped it (its locks are gone then)."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=LINE_TIMEOUT)

    def rest(self) -> list[str]:
        """After the child is gone: every further complete line it wrote (a torn one is dropped)."""
        self._pump.join(timeout=LINE_TIMEOUT)
        out = []
        while True:
            raw = self._lines.get_nowait()
            if raw is None:
                return out
            if raw.endswith("\n"):
                out.append(raw[:-1])

    def finish(self, timeout: float = LINE_TIMEOUT) -> list[str]:
        """Wait for a clean exit; return the lines not read yet."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"child {self.pid} did not finish in {timeout}s") from None
        assert rc == 0, f"child {self.pid} failed ({rc}):\n{self.stderr()}"
        return self.rest()


Spawn = Callable[..., Child]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start children; any still alive at the end of the test are killed."""
    children: list[Child] = []
    workdir = tmp_path / "children"
    workdir.mkdir()

    def start(code: str, *args: object) -> Child:
        child = Child(workdir, f"child{len(children)}", code, [str(a) for a in args])
        children.append(child)
        return child

    yield start
    for child in children:
        if child.proc.poll() is None:
            child.kill()


def release(path: Path, content: str = "") -> None:
    """Create ``path`` atomically: the barrier the children are waiting on."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(content)
    os.rename(tmp, path)


def unsealed_packs(store_path: Path) -> list[Path]:
    return sorted(
        p
        for p in (store_path / "objects" / "pack").glob("*.pack")
        if not p.with_suffix(".idx").exists()
    )


def raw_reflog(store_path: Path, sid: str) -> list[dict[str, object]]:
    data = (store_path / "logs" / "sessions" / sid).read_bytes()
    return [json.loads(line) for line in data.split(b"\n") if line]


def ref_body(store_path: Path, sid: str) -> dict[str, object]:
    return json.loads((store_path / "refs" / "sessions" / sid).read_bytes())


def verify_every_object(store: Store) -> int:
    """Read (and so verify against its id) every object the store holds; return how many."""
    ids = set(store.objects.ids())
    for oid in ids:
        kind, _body = store.objects.get(oid)
        assert kind in ("blob", "node")
    return len(ids)


def check_moves(store: Store, sid: str, head: str | None, moves: int) -> None:
    """A session created empty and then only appended to: its head is ``head``, its
    generation counts the ``moves``, and its reflog is empty (an append writes no
    line: the parent chain is its history, FORMAT.md 7)."""
    assert store.session(sid).head == head
    record = store.read_ref(f"sessions/{sid}")
    assert record is not None and record.generation == moves + 1
    assert store.reflog(sid) == []


def check_transcript(store: Store, sid: str) -> list[str]:
    """Walk the whole log: contiguous messages m0..mN, every link readable.
    Return the node ids oldest first."""
    entries = list(store.log(sid))[::-1]
    expected_i = 0
    for entry in entries:
        node = entry.node
        if node.state:
            store.blob(node.state)
        for kept in node.kept:
            store.node(kept)
        if node.is_compaction:
            assert entry.message["content"].startswith("summary up to m")
        else:
            assert entry.message["content"] == f"m{expected_i}"
            expected_i += 1
            assert node.messages == expected_i
    if entries:
        info = store.session(sid)
        assert info.head == entries[-1].id
        assert info.messages == expected_i
    return [e.id for e in entries]


# -- 1. compare-and-swap races -------------------------------------------------

CAS_RACER = """
store_path, sid, go_dir, targets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
store = Store.open(store_path)
say("ready")
for round_no, target in enumerate(targets):
    go = os.path.join(go_dir, f"go-{round_no}")
    wait_for(go)
    expected = Path(go).read_text()
    try:
        store.refs.compare_and_swap(f"sessions/{sid}", expected=expected, target=target,
                                    reason="race")
    except RefConflict:
        say(round_no, "conflict", target)
    else:
        say(round_no, "won", target)
store.close()
"""


def test_compare_and_swap_race_has_exactly_one_winner(tmp_path: Path, spawn: Spawn) -> None:
    racers, rounds = 8, 4
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session(title="race")
        head = store.append(sid, {"role": "user", "content": "m0"})
        pool = store.new_session(title="targets")
        targets = [
            store.append(pool, {"role": "user", "content": f"t{i}"}) for i in range(racers * rounds)
        ]
    go_dir = tmp_path / "go"
    go_dir.mkdir()
    children = [
        spawn(CAS_RACER, path, sid, go_dir, ",".join(targets[r::racers])) for r in range(racers)
    ]
    for child in children:
        assert child.line() == "ready"

    gen_before = ref_body(path, sid)["generation"]
    meta_before = ref_body(path, sid)["meta"]
    for round_no in range(rounds):
        release(go_dir / f"go-{round_no}", head)
        results = [child.line().split() for child in children]
        assert all(r[0] == str(round_no) for r in results)
        winners = [r[2] for r in results if r[1] == "won"]
        assert len(winners) == 1, f"round {round_no}: {results}"
        assert sum(r[1] == "conflict" for r in results) == racers - 1
        body = ref_body(path, sid)
        assert body["target"] == winners[0]
        assert body["generation"] == gen_before + round_no + 1
        assert body["meta"] == meta_before  # a CAS keeps the rest of the body
        with Store.open(path) as store:
            races = [line for line in store.reflog(sid) if line.reason == "race"]
            assert len(races) == round_no + 1
            assert (races[0].old, races[0].new) == (head, winners[0])
            assert store.session(sid).head == winners[0]
        raw_races = [e for e in raw_reflog(path, sid) if e["reason"] == "race"]
        assert len(raw_races) == round_no + 1  # no loser left a line behind either
        head = winners[0]
    for child in children:
        child.finish()


# -- 2. one writer per session ----------------------------------------------------

LOCK_HOLDER = """
store_path, sid, how = sys.argv[1], sys.argv[2], sys.argv[3]
store = Store.open(store_path)
if how == "lock":
    store.lock(sid)
else:
    store.append(sid, {"role": "assistant", "content": "from the child"})
say("holding", os.getpid())
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["lock", "append"])
def test_second_writer_is_refused_until_the_holder_dies(
    tmp_path: Path, spawn: Spawn, how: str
) -> None:
    path = tmp_path / "store"
    store = Store.open(path)
    try:
        sid = store.new_session()
        store.append(sid, {"role": "user", "content": "first"})
        store.release(sid)

        child = spawn(LOCK_HOLDER, path, sid, how)
        assert child.line() == f"holding {child.pid}"
        with pytest.raises(SessionBusy) as busy:
            store.append(sid, {"role": "user", "content": "refused"})
        assert busy.value.pid == child.pid
        assert str(child.pid) in str(busy.value)
        assert busy.value.session == sid
        for change in (store.archive, store.delete):  # nor may anyone cut the writer off
            with pytest.raises(SessionBusy):
                change(sid)

        child.kill()  # a crash releases the lock: nothing stale to clean up
        store.append(sid, {"role": "user", "content": "after the crash"})
        expected = ["first", "from the child", "after the crash"]
        if how == "lock":
            expected.remove("from the child")
        assert [m["content"] for m in store.context(sid)] == expected
    finally:
        store.close()
    with Store.open(path) as fresh:
        assert [m["content"] for m in fresh.context(sid)] == expected
        assert not unsealed_packs(path)
        verify_every_object(fresh)


def test_two_handles_in_one_process_exclude_each_other(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as first, Store.open(path) as second:
        sid = first.new_session()
        first.append(sid, {"role": "user", "content": "one"})
        with pytest.raises(SessionBusy) as busy:
            second.append(sid, {"role": "user", "content": "two"})
        assert busy.value.pid == os.getpid()
        with pytest.raises(SessionBusy):
            second.lock(sid)
        first.release(sid)
        second.append(sid, {"role": "user", "content": "two"})
        with pytest.raises(SessionBusy):
            first.append(sid, {"role": "user", "content": "three"})
        assert [m["content"] for m in first.context(sid)] == ["one", "two"]


# -- 3. kill -9 in the middle of appends and compactions --------------------------

APPENDER = """
store_path, sid, compact_every = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = Store.open(store_path)
for i in range(100_000):
    nid = store.append(sid, {"role": "user", "content": f"m{i}"},
                       state={"step": i, "notes": "x" * (i % 37)})
    say("A", i, nid)
    if compact_every and i % compact_every == compact_every - 1:
        cid = store.compact(sid, f"summary up to m{i}", keep=2, state={"compacted": i})
        say("C", i, cid)
"""


@pytest.mark.parametrize(
    ("kill_after", "compact_every", "extra_delay"),
    [
        (150, 0, 0.0),  # plain appends, killed while a line is in flight
        (300, 7, 0.0013),
        (420, 3, 0.0029),
        (250, 1, 0.0007),  # a compaction after every message: often killed inside one
    ],
)
def test_kill_9_loses_no_acknowledged_append(
    tmp_path: Path, spawn: Spawn, kill_after: int, compact_every: int, extra_delay: float
) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session(title="crash")
    child = spawn(APPENDER, path, sid, compact_every)
    acked: list[str] = []
    for _ in range(kill_after):
        acked.append(child.line())
    if extra_delay:
        time.sleep(extra_delay)
    child.kill()
    acked += child.rest()
    acked_ids = [line.split()[2] for line in acked]
    assert len(acked_ids) >= kill_after

    crashed = unsealed_packs(path)
    assert len(crashed) == 1, "the killed writer's pack should be left unsealed"
    # Appends write no ref file (FORMAT.md 9): every acknowledged head is in the
    # crashed pack's journal only, and recovery must write it.
    assert ref_body(path, sid)["target"] is None

    with Store.open(path) as store:
        assert crashed[0].with_suffix(".idx").exists(), "opening must recover the pack"
        assert not unsealed_packs(path)
        ids = check_transcript(store, sid)
        assert ids[: len(acked_ids)] == acked_ids
        assert len(ids) - len(acked_ids) in (0, 1)  # at most one unacknowledged step
        check_moves(store, sid, ids[-1], len(ids))

        context = store.context(sid)
        last = store.node(ids[-1])
        compactions = [nid for nid in ids if store.node(nid).is_compaction]
        if compactions:
            since = ids[ids.index(compactions[-1]) + 1 :]
            summary = store.node(compactions[-1])
            assert context[0] == store.blob(summary.content)
            assert len(context) == 1 + len(summary.kept) + len(since)
        else:
            assert len(context) == len(ids)
        if not last.is_compaction:
            assert context[-1] == store.blob(last.content)

        assert verify_every_object(store) > 0
        # the crash released the writer lock, and the session goes on from its head
        store.append(sid, {"role": "user", "content": "after"})
        assert store.context(sid)[-1] == {"role": "user", "content": "after"}
    with Store.open(path) as store:
        assert not unsealed_packs(path)
        assert store.session(sid).messages == store.node(ids[-1]).messages + 1
        verify_every_object(store)


# -- 4. power loss: journaled ref updates restore lost ref files and reflog lines ---

SNAPSHOT_AT = 10
APPENDS = 40

POWER_LOSS_WRITER = """
store_path, sid, snap_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
snap_at, count = int(sys.argv[4]), int(sys.argv[5])
ref = Path(store_path, "refs", "sessions", sid)
log = Path(store_path, "logs", "sessions", sid)
store = Store.open(store_path)
for i in range(count):
    nid = store.append(sid, {"role": "user", "content": f"m{i}"}, state={"step": i})
    if i + 1 == snap_at:
        # what the disk held durably at this point, before the journaled appends
        (snap_dir / "ref").write_bytes(ref.read_bytes())
        (snap_dir / "log-size").write_text(str(log.stat().st_size if log.exists() else 0))
    say("A", i, nid)
say("done")
time.sleep(60)
"""


def start_power_loss_writer(
    tmp_path: Path, spawn: Spawn, title: str
) -> tuple[Path, str, Path, Child]:
    """A new session, and a child appending to it that snapshots its ref on the way."""
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session(title=title)
    snap = tmp_path / "snap"
    snap.mkdir()
    return path, sid, snap, spawn(POWER_LOSS_WRITER, path, sid, snap, SNAPSHOT_AT, APPENDS)


def acked_then_killed(child: Child) -> list[str]:
    """The node ids the child acknowledged; then SIGKILL, leaving its pack unsealed."""
    acked = [child.line().split()[2] for _ in range(APPENDS)]
    assert child.line() == "done"
    child.kill()
    return acked


@pytest.mark.parametrize(
    "loss",
    [
        "older_ref_and_reflog",  # the renames and reflog appends after the snapshot are lost
        "empty_ref_and_older_reflog",  # XFS-style: the renamed file lost its data
        "older_ref_full_reflog",  # the reflog reached the disk, the ref file did not
        "older_ref_torn_pack_tail",  # and zeros after the pack's last record
        "current_ref_older_reflog",  # the ref file reached the disk, the reflog lines did not
        "older_ref_torn_reflog_line",  # half of the next reflog line reached the disk
    ],
)
def test_power_loss_restores_refs_and_reflog_from_the_pack(
    tmp_path: Path, spawn: Spawn, loss: str
) -> None:
    path, sid, snap, child = start_power_loss_writer(tmp_path, spawn, "power")
    acked = acked_then_killed(child)
    (crashed,) = unsealed_packs(path)

    ref_path = path / "refs" / "sessions" / sid
    log_path = path / "logs" / "sessions" / sid
    old_ref = (snap / "ref").read_bytes()
    old_log_size = int((snap / "log-size").read_text())
    # An append writes no ref file (FORMAT.md 9): until the pack is sealed the file
    # holds what the session's creation wrote, and the pack's journal the head.
    assert json.loads(old_ref)["target"] is None
    assert ref_body(path, sid)["generation"] == 1
    if loss.startswith("older_ref"):
        ref_path.write_bytes(old_ref)
    if loss.startswith("empty_ref"):
        ref_path.write_bytes(b"")
    # Appends write no reflog line now (FORMAT.md 7): the cases that cut the reflog
    # leave it as it is, and replay must not make one.
    assert old_log_size == 0 and not log_path.exists()
    if loss == "older_ref_torn_pack_tail":
        # A record cut short where the next would start (over the zeros its writer
        # keeps ahead, FORMAT.md 5.1): a head whose payload does not verify.
        good_end = records_end(crashed.read_bytes())
        with open(crashed, "r+b") as f:
            f.seek(good_end)
            f.write(b"\x01" + bytes(32) + (100).to_bytes(4, "little") + b"torn")
        torn_tail = crashed.read_bytes()[good_end:]

    with Store.open(path) as store:
        assert crashed.with_suffix(".idx").exists()
        assert store.session(sid).head == acked[-1]
        assert store.session(sid).messages == APPENDS
        assert check_transcript(store, sid) == acked
        check_moves(store, sid, acked[-1], APPENDS)
        assert [node.id for node in store.walk(sid)] == acked[::-1]
        assert store.node_id(f"{sid}~1") == acked[-2]
        verify_every_object(store)
    body = ref_body(path, sid)
    assert body["generation"] == APPENDS + 1
    assert not log_path.exists(), "appends write no reflog line, and recovery adds none"
    if loss == "older_ref_torn_pack_tail":
        indexed_length = int.from_bytes(crashed.with_suffix(".idx").read_bytes()[8:16], "little")
        assert indexed_length == good_end, "the torn tail is left out of the index"
        assert crashed.read_bytes()[indexed_length:] == torn_tail, "and left as it was"

    with Store.open(path) as store:  # and the session goes on from there
        store.append(sid, {"role": "user", "content": f"m{APPENDS}"})
        check_moves(store, sid, store.session(sid).head, APPENDS + 1)
        assert len(check_transcript(store, sid)) == APPENDS + 1
    assert ref_body(path, sid)["generation"] == APPENDS + 2


@pytest.mark.parametrize("deleter", ["handle_opened_before_the_crash", "new_handle"])
def test_power_loss_recovery_does_not_resurrect_a_deleted_session(
    tmp_path: Path, spawn: Spawn, deleter: str
) -> None:
    path, sid, snap, child = start_power_loss_writer(tmp_path, spawn, "doomed")
    early = Store.open(path)  # sees the writer's pack as in use: it does not recover it
    try:
        acked = acked_then_killed(child)
        (crashed,) = unsealed_packs(path)
        if deleter == "handle_opened_before_the_crash":
            early.delete(sid)
            assert unsealed_packs(path) == [crashed], "the crashed pack is still unrecovered"
        else:
            # the state a power loss left, then a fresh handle (which recovers) deletes
            (path / "refs" / "sessions" / sid).write_bytes((snap / "ref").read_bytes())
            with Store.open(path) as other:
                assert other.session(sid).head == acked[-1]
                other.delete(sid)
    finally:
        early.close()

    for _ in range(2):  # recovery on the first open, nothing to do on the second
        with Store.open(path) as store:
            assert crashed.with_suffix(".idx").exists()
            assert not (path / "refs" / "sessions" / sid).exists()
            assert sid not in [s.id for s in store.sessions(include_archived=True)]
            with pytest.raises(UnknownSpec):
                store.session(sid)
            last = store.refs.reflog(f"sessions/{sid}")[-1]  # the reflog outlives the ref
            assert (last.reason, last.old, last.new) == ("delete", acked[-1], None)
            assert last.gen == APPENDS + 2
            # the history stays reachable through the reflog until gc
            assert store.node(acked[-1]).messages == APPENDS
            verify_every_object(store)


# -- 5. writers on different sessions at once --------------------------------------

PARALLEL_WRITER = """
store_path, sid, go, writer = sys.argv[1:5]
count = int(sys.argv[5])
store = Store.open(store_path)
say("ready")
wait_for(go)
store.append(sid, {"role": "system", "content": "shared prompt"})  # one blob, many writers
for i in range(count - 1):
    store.append(sid, {"role": "user", "content": f"w{writer}-{i}"}, state={"i": i})
store.close()
say("done")
"""


def test_writers_on_different_sessions_run_at_once(tmp_path: Path, spawn: Spawn) -> None:
    writers, count = 4, 200
    path = tmp_path / "store"
    with Store.open(path) as store:
        sids = [store.new_session(title=f"writer {w}") for w in range(writers)]
    go = tmp_path / "go"
    children = [spawn(PARALLEL_WRITER, path, sids[w], go, w, count) for w in range(writers)]
    for child in children:
        assert child.line() == "ready"
    release(go)
    for child in children:
        assert child.line() == "done"
        child.finish()

    with Store.open(path) as store:
        assert not unsealed_packs(path)
        listed = {s.id: s.messages for s in store.sessions()}
        assert listed == {sid: count for sid in sids}
        for w, sid in enumerate(sids):
            contents = [m["content"] for m in store.context(sid)]
            assert contents == ["shared prompt"] + [f"w{w}-{i}" for i in range(count - 1)]
            assert store.state_at(sid) == {"i": count - 2}
            check_moves(store, sid, store.session(sid).head, count)
        assert verify_every_object(store) >= writers * (2 * count - 1)


# -- 6. readers while a writer appends -----------------------------------------------

STEADY_WRITER = """
store_path, sid, go, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = Store.open(store_path)
wait_for(go)
for i in range(count):
    store.append(sid, {"role": "user", "content": f"m{i}"}, state={"step": i})
    if i % 50 == 49:
        store.compact(sid, f"summary up to m{i}", keep=2)
    if i % 100 == 0:
        say("at", i)
    time.sleep(0.0005)
store.close()  # seals the pack under the readers' feet
say("done")
"""

READER = """
store_path, sid, stop = sys.argv[1], sys.argv[2], sys.argv[3]
reads = 0
seen = -1
counts = set()
while True:
    stopping = os.path.exists(stop)
    try:
        with Store.open(store_path) as store:
            info = store.session(sid)
            if info.head is not None:
                head = store.node(info.head)
                assert head.messages == info.messages, (head.messages, info.messages)
                entries = list(store.log(info.head))[::-1]
                i = 0
                for e in entries:
                    if e.node.is_compaction:
                        assert e.message["content"] == f"summary up to m{i - 1}", e.message
                    else:
                        assert e.message == {"role": "user", "content": f"m{i}"}, (i, e.message)
                        i += 1
                        assert e.node.messages == i
                assert i == info.messages
                context = store.context(info.head)
                assert (context[0] if head.is_compaction else context[-1]) == entries[-1].message
                assert store.state_at(info.head)["step"] == i - 1
            assert info.messages >= seen, (info.messages, seen)
            seen = info.messages
            counts.add(seen)
    except Exception:
        say("error", reads, traceback.format_exc().replace("\\n", " | "))
        sys.exit(1)
    reads += 1
    if reads == 1:
        say("ready")
    if stopping:
        break
say("reads", reads, "distinct", len(counts), "last", seen)
"""


def test_readers_always_see_a_consistent_prefix(tmp_path: Path, spawn: Spawn) -> None:
    count = 800
    path = tmp_path / "store"
    with Store.open(path) as store:
        sid = store.new_session(title="watched")
    go, stop = tmp_path / "go", tmp_path / "stop"
    writer = spawn(STEADY_WRITER, path, sid, go, count)
    readers = [spawn(READER, path, sid, stop) for _ in range(2)]
    for reader in readers:
        assert reader.line() == "ready"
    release(go)
    while (line := writer.line()) != "done":
        assert line.startswith("at ")
    writer.finish()
    release(stop)
    for reader in readers:
        report = reader.line().split()
        assert report[0] == "reads", " ".join(report)
        reader.finish()
        reads, distinct, last = int(report[1]), int(report[3]), int(report[5])
        assert last == count  # the read after the writer finished sees everything
        assert reads >= 5 and distinct >= 3, "the reader should have overlapped the writer"
    with Store.open(path) as store:
        assert store.session(sid).messages == count
        assert not unsealed_packs(path)
        verify_every_object(store)


def test_a_lock_file_holding_no_pid_still_refuses_the_second_writer(tmp_path: Path) -> None:
    """The holder's pid is what its lock file says; a file holding other digits (5,000
    of them, past what int() takes) names no holder, and the refusal still comes."""
    (tmp_path / "sessions").mkdir()
    first = WriterLock(tmp_path, "a" * 32)
    first.acquire()
    try:
        (tmp_path / "sessions" / ("a" * 32)).write_text("9" * 5000 + "\n")
        with pytest.raises(SessionBusy) as refused:
            WriterLock(tmp_path, "a" * 32).acquire()
        assert refused.value.pid is None
    finally:
        first.release()
