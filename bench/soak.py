"""``python -m bench.soak``: many processes on one store for minutes, then proof that
nothing acknowledged was lost.

Eight writer processes (``--writers``) append, compact and fork, each
reopening its handle now and then (which seals its pack and may merge
packs), while one process runs gc in a loop, one repacks in a loop and one
searches in a loop, for ``--minutes`` (default 10). Each writer records every
step the store acknowledged, flushed as it returns. Then every acknowledged
message must be on its session's history with its content, and fsck must
find nothing. Exit status 0 only then.

The store starts with sessions that gc will drop and packs aged past gc's
grace period, and the writers now and then append a message that only those
doomed sessions hold: so gc sweeps packs while writers deduplicate against
them, the race the writer's freshen rule (FORMAT.md 11) exists for.

Not part of the test suite (it takes minutes); ``--minutes 0.2`` is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from objstore import MIN_GRACE, SearchIndex, Store, check_store, collect_garbage

from .measure import disk_bytes

COMMON = 200  # messages only the doomed sessions hold when the soak starts
AGED_BY = 2 * 3600  # seconds the starting packs are made to look old
FILLER = "lorem ipsum dolor sit amet " * 8


@dataclass
class WorkerStats:
    """What one process did; written as JSON when it stops."""

    role: str
    steps: int = 0
    compactions: int = 0
    forks: int = 0
    reopens: int = 0
    swept: int = 0
    bytes_freed: int = 0
    merged: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def prepare(path: Path, rng: random.Random) -> None:
    """Live sessions, archived ones gc will drop (holding the COMMON messages alone),
    all in packs whose times are set back past gc's grace period."""
    with Store.open(path) as store, store.batch():
        for k in range(5):
            sid = store.new_session(title=f"kept {k}")
            for i in range(100):
                store.append(sid, {"role": "user", "content": f"kept {k}-{i} {FILLER}"})
        for k in range(20):
            sid = store.new_session(title=f"doomed {k}")
            for i in range(10):
                n = k * 10 + i
                store.append(sid, {"role": "user", "content": f"common-{n}"})
                store.append(sid, {"role": "assistant", "content": f"old {n} {FILLER}"})
            store.archive(sid)
    old = time.time() - AGED_BY
    for dirpath, _dirs, files in os.walk(path / "objects"):
        for name in files:
            os.utime(os.path.join(dirpath, name), (old, old))


def _guard(stats: WorkerStats, step: Callable[[], None]) -> None:
    try:
        step()
    except Exception:
        stats.errors.append(traceback.format_exc(limit=6))


def writer(path: str, index: int, deadline: float, out: str, seed: int) -> None:
    """Append, compact and fork until the deadline; record each acknowledged step."""
    rng = random.Random(seed)
    stats = WorkerStats(f"writer {index}")
    with open(f"{out}/acks-{index}.jsonl", "w") as acks:

        def ack(*event: Any) -> None:
            acks.write(json.dumps(event) + "\n")
            acks.flush()

        store = Store.open(path)
        sid = store.new_session(title=f"writer {index}")
        ack("session", sid)
        n = 0
        while time.time() < deadline:

            def step() -> None:
                nonlocal n, sid, store
                if rng.random() < 0.05:
                    content = f"common-{rng.randrange(COMMON)}"
                else:
                    content = f"w{index}-{n} {FILLER[: rng.randrange(len(FILLER))]}"
                role = "user" if n % 2 else "assistant"
                state = {"n": n} if n % 7 == 0 else None
                nid = store.append(sid, {"role": role, "content": content}, state=state)
                ack("append", sid, nid, content)
                n += 1
                stats.steps += 1
                if n % 40 == 0:
                    ack("append", sid, store.compact(sid, f"summary {index}-{n}", keep=4), None)
                    stats.compactions += 1
                if n % 150 == 0:
                    fork = store.fork(f"{sid}~2", title=f"writer {index} fork {n}")
                    ack("fork", fork, store.session(fork).head)
                    store.release(sid)
                    sid = fork
                    stats.forks += 1
                if n % 300 == 0:
                    store.close()  # seals the pack; may merge packs
                    store = Store.open(path)
                    stats.reopens += 1

            _guard(stats, step)
        store.close()
    Path(f"{out}/stats-writer-{index}.json").write_text(json.dumps(asdict(stats)))


def gc_loop(path: str, deadline: float, out: str) -> None:
    stats = WorkerStats("gc")
    while time.time() < deadline:

        def step() -> None:
            with Store.open(path) as store:
                report = collect_garbage(
                    store, archived_older_than=0, grace=MIN_GRACE, reflog_older_than=None
                )
            stats.steps += 1
            stats.swept += report.objects_swept
            stats.bytes_freed += report.bytes_freed

        _guard(stats, step)
        time.sleep(2)
    Path(f"{out}/stats-gc.json").write_text(json.dumps(asdict(stats)))


def repack_loop(path: str, deadline: float, out: str) -> None:
    stats = WorkerStats("repack")
    while time.time() < deadline:

        def step() -> None:
            with Store.open(path) as store:
                stats.merged += store.repack()
            stats.steps += 1

        _guard(stats, step)
        time.sleep(0.5)
    Path(f"{out}/stats-repack.json").write_text(json.dumps(asdict(stats)))


def search_loop(path: str, deadline: float, out: str, seed: int) -> None:
    rng = random.Random(seed)
    stats = WorkerStats("search")
    while time.time() < deadline:

        def step() -> None:
            start = time.perf_counter()
            with Store.open(path) as store, SearchIndex(store) as index:
                index.search(f"w{rng.randrange(8)}-{rng.randrange(200)}")
            stats.latencies.append(time.perf_counter() - start)
            stats.steps += 1

        _guard(stats, step)
        time.sleep(0.2)
    Path(f"{out}/stats-search.json").write_text(json.dumps(asdict(stats)))


@dataclass(frozen=True, slots=True)
class Verdict:
    acknowledged: int
    missing: list[str]
    verify_seconds: float
    fsck_problems: list[str]
    fsck_objects: int
    fsck_seconds: float


def verify(path: Path, out: Path) -> Verdict:
    """Every acknowledged step is in the store, and fsck finds nothing."""
    start = time.perf_counter()
    missing: list[str] = []
    acked = 0
    with Store.open(path) as store:
        chains: dict[str, set[str]] = {}

        def chain(sid: str) -> set[str]:
            """The nodes of the session's own part of history: from its head back to
            where it was forked (included). A writer acknowledges only nodes it
            appended to the session, so this is enough, and each node is read once
            however many forks share it."""
            if sid not in chains:
                info = store.session(sid)
                stop = (info.forked_from or {}).get("node")
                nodes = set()
                for node in store.walk(info.head):
                    if node.id == stop:
                        break
                    nodes.add(node.id)
                if stop is not None:
                    nodes.add(stop)
                chains[sid] = nodes
            return chains[sid]

        for acks in sorted(out.glob("acks-*.jsonl")):
            for line in acks.read_text().splitlines():
                kind, sid, *rest = json.loads(line)
                acked += 1
                try:
                    if kind == "session":
                        store.session(sid)
                    elif rest[0] not in chain(sid):
                        missing.append(f"{kind} {rest[0]} is not in session {sid}")
                    elif kind == "append" and rest[1] is not None:
                        message = store.blob(store.node(rest[0]).content)
                        if message.get("content") != rest[1]:
                            missing.append(f"{rest[0]} holds {message!r}, not {rest[1]!r}")
                except Exception as e:
                    missing.append(f"{kind} {sid} {rest}: {e}")
        verified = time.perf_counter() - start
        start = time.perf_counter()
        report = check_store(store)
    return Verdict(
        acked,
        missing,
        verified,
        [str(p) for p in report.problems],
        report.objects,
        time.perf_counter() - start,
    )


def run_soak(path: Path, out: Path, minutes: float, writers: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    prepare(path, rng)
    deadline = time.time() + minutes * 60
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=writer, args=(str(path), w, deadline, str(out), seed + w))
        for w in range(writers)
    ]
    procs += [
        ctx.Process(target=gc_loop, args=(str(path), deadline, str(out))),
        ctx.Process(target=repack_loop, args=(str(path), deadline, str(out))),
        ctx.Process(target=search_loop, args=(str(path), deadline, str(out), seed)),
    ]
    started = time.time()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    elapsed = time.time() - started
    stats = [json.loads(f.read_text()) for f in sorted(out.glob("stats-*.json"))]
    exits = [p.exitcode for p in procs]
    verdict = verify(path, out)
    by_role = {s["role"]: s for s in stats}
    writers_stats = [s for s in stats if s["role"].startswith("writer")]
    latencies = by_role.get("search", {}).get("latencies") or [0.0]
    return {
        "minutes": minutes,
        "seconds": round(elapsed, 1),
        "writers": writers,
        "cores": os.cpu_count(),
        "appends": sum(s["steps"] for s in writers_stats),
        "compactions": sum(s["compactions"] for s in writers_stats),
        "forks": sum(s["forks"] for s in writers_stats),
        "reopens": sum(s["reopens"] for s in writers_stats),
        "gc_runs": by_role.get("gc", {}).get("steps", 0),
        "gc_swept": by_role.get("gc", {}).get("swept", 0),
        "gc_freed": by_role.get("gc", {}).get("bytes_freed", 0),
        "repack_runs": by_role.get("repack", {}).get("steps", 0),
        "packs_merged": by_role.get("repack", {}).get("merged", 0),
        "searches": len(by_role.get("search", {}).get("latencies", [])),
        "search_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "search_max_ms": round(max(latencies) * 1000, 1),
        "packs_at_end": len(list((path / "objects" / "pack").glob("*.pack"))),
        "disk_bytes": disk_bytes(path),
        "acknowledged": verdict.acknowledged,
        "missing": verdict.missing[:20],
        "missing_count": len(verdict.missing),
        "verify_seconds": round(verdict.verify_seconds, 1),
        "fsck_objects": verdict.fsck_objects,
        "fsck_problems": verdict.fsck_problems[:20],
        "fsck_seconds": round(verdict.fsck_seconds, 1),
        "errors": [e for s in stats for e in s["errors"]][:20],
        "error_count": sum(len(s["errors"]) for s in stats),
        "exit_codes": exits,
        "ok": not verdict.missing
        and not verdict.fsck_problems
        and not any(s["errors"] for s in stats)
        and exits == [0] * len(procs)
        and len(stats) == len(procs),
    }


def print_report(r: dict[str, Any]) -> None:
    rate = r["appends"] / r["seconds"] if r["seconds"] else 0
    rows = [
        ("ran", f"{r['seconds']:.0f} s: {r['writers']} writers + gc + repack + search "
                f"on {r['cores']} cores"),
        ("appends acknowledged", f"{r['appends']:,} ({rate:,.0f}/s)"),
        ("compactions / forks", f"{r['compactions']:,} / {r['forks']:,}"),
        ("handles reopened", f"{r['reopens']:,} (each seals a pack)"),
        ("gc runs", f"{r['gc_runs']:,}: swept {r['gc_swept']:,} objects, "
                    f"freed {r['gc_freed'] / 1e6:.1f} MB"),
        ("repack loop", f"{r['repack_runs']:,} runs merged {r['packs_merged']:,} packs "
                        f"(writers' closes merge too); packs at the end {r['packs_at_end']}"),
        ("searches", f"{r['searches']:,}: median {r['search_p50_ms']} ms, "
                     f"slowest {r['search_max_ms']} ms"),
        ("store on disk", f"{r['disk_bytes'] / 1e6:.1f} MB"),
        ("verified", f"{r['acknowledged'] - r['missing_count']:,} of {r['acknowledged']:,} "
                     f"acknowledged steps present ({r['verify_seconds']} s)"),
        ("fsck", f"{len(r['fsck_problems'])} problems in {r['fsck_objects']:,} objects "
                 f"({r['fsck_seconds']} s)"),
        ("errors", f"{r['error_count']}"),
        ("result", "PASS" if r["ok"] else "FAIL"),
    ]  # fmt: skip
    for key, value in rows:
        print(f"{key:<22}{value}")
    for line in r["missing"] + r["fsck_problems"] + r["errors"]:
        print(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="Writers, gc, repack and search on one store; then check nothing was lost.",
        epilog="Example: uv run python -m bench.soak --minutes 10",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--writers", type=int, default=8, help="writer processes (default 8)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the store afterwards")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="ags-soak-"))
    try:
        (base / "out").mkdir()
        result = run_soak(base / "store", base / "out", args.minutes, args.writers, args.seed)
        if args.json:
            print(json.dumps(result, indent=1))
        else:
            print_report(result)
        return 0 if result["ok"] else 1
    finally:
        if args.keep:
            print(f"store kept at {base / 'store'}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
