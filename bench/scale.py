"""``python -m bench.scale``: a store of 10,000 sessions and 1,000,000 messages, and
what the everyday commands cost on it (issue 11, item 5).

Not part of the tests, nor of ``python -m bench`` (building the store takes
minutes). The store is built once with the bulk API (``Store.batch``) under
``--dir`` and reused by later runs of the same size. Each command is then
measured two ways: in this process (open a Store, do the call, close it; the
median of a few runs after a warm-up), and as the ``ags`` command line in a
child process, whose wall time and peak RSS (``wait4``'s ``ru_maxrss``) are
what a user sees.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from objstore import SearchIndex, Store, check_store

from .conversations import Conversation, make_project
from .measure import disk_bytes

AGS = str(Path(sys.executable).parent / "ags")
BATCH_SESSIONS = 20  # sessions per batch: one sync per 20 sessions' messages


def build(path: Path, sessions: int, messages: int) -> float:
    """Write the store; return the seconds it took."""
    project = make_project(42)
    per = messages // sessions
    start = time.perf_counter()
    with Store.open(path) as store:
        for first in range(0, sessions, BATCH_SESSIONS):
            with store.batch():
                sids = []
                for n in range(first, min(first + BATCH_SESSIONS, sessions)):
                    sid = store.new_session(title=f"session {n}", root=f"/src/project-{n % 40}")
                    for message in Conversation(project, seed=1000 + n).take(per):
                        store.append(sid, message)
                    sids.append(sid)
            for sid in sids:
                store.release(sid)
            if first % 1000 == 0:
                print(f"  built {first:,} sessions, {time.perf_counter() - start:,.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
    return time.perf_counter() - start


def median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm: the page cache, and any cache ags keeps
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


# The child reports its own peak (VmHWM of its address space): ru_maxrss from wait4
# would start from this process's peak, which a fork-then-exec child inherits.
PEAK_REPORTER = """
import atexit, sys
out, code = sys.argv[1], sys.argv[2]
def peak():
    with open("/proc/self/status") as status, open(out, "w") as f:
        f.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
atexit.register(peak)
sys.argv = ["ags", *sys.argv[3:]]
exec(code)
"""
CLI = "from cli.main import main; main()"


def child(code: str, args: list[str], scratch: Path) -> tuple[float, float, int]:
    """Run ``code`` in a new Python with ``args`` as its argv; return (seconds, peak
    RSS in MB, exit status)."""
    out = scratch / "peak"
    out.unlink(missing_ok=True)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_REPORTER, str(out), code, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    seconds = time.perf_counter() - start
    return seconds, int(out.read_text()) / 1024, proc.returncode


def measure(path: Path, runs: int) -> dict[str, Any]:
    with Store.open(path) as store:
        rows = store.sessions()
        sid = rows[len(rows) // 2].id
        word = next(
            m["content"].split()[4]
            for m in store.context(sid)
            if isinstance(m.get("content"), str) and m["content"].startswith("Let me look at ")
        )
    out: dict[str, Any] = {
        "store_bytes": disk_bytes(path),
        # What fsck reads: the store without cache/ (the search and listing indexes,
        # derived data that anything may delete, and that fsck does not check).
        "checked_bytes": disk_bytes(path) - disk_bytes(path / "cache"),
        "session": sid,
        "word": word,
    }

    def ls() -> object:
        with Store.open(path) as store:
            return store.sessions()

    def log20() -> object:
        with Store.open(path) as store:
            entries = store.log(sid)
            return [next(entries) for _ in range(20)]

    # The first search builds the index: measured from nothing each run, as a child
    # (its peak memory is the point), not on an index an earlier run left.
    for suffix in ("", "-wal", "-shm"):
        (path / f"cache/search.sqlite{suffix}").unlink(missing_ok=True)
    build = child(CLI, ["--store", str(path), "search", word], path.parent)
    out["search_build_s"], out["search_build_rss_mb"], out["search_build_exit"] = build

    def search() -> object:
        with Store.open(path) as store, SearchIndex(store) as index:
            return index.search(word)

    out["ls_ms"] = median_ms(ls, runs)
    out["log20_ms"] = median_ms(log20, runs)
    out["search_ms"] = median_ms(search, runs)
    start = time.perf_counter()
    with Store.open(path) as store:
        report = check_store(store)
    out["fsck_s"] = time.perf_counter() - start
    out["fsck_problems"] = len(report.problems)
    out["fsck_mb_s"] = out["checked_bytes"] / 1e6 / out["fsck_s"]
    store_arg = ["--store", str(path)]
    repack = "from objstore import Store\nwith Store.open(sys.argv[1]) as s: s.repack()"
    commands = {
        "ls": (CLI, [*store_arg, "ls"]),
        "log -n 20": (CLI, [*store_arg, "log", sid, "-n", "20"]),
        "search": (CLI, [*store_arg, "search", word]),
        "fsck": (CLI, [*store_arg, "fsck"]),
        "gc": (CLI, [*store_arg, "gc", "--grace", "10m"]),
        "repack (Store.repack)": (repack, [str(path)]),
        "du": (CLI, [*store_arg, "du"]),
        "--help (start-up alone)": (CLI, ["--help"]),
    }
    out["cli"] = {
        "search (first: builds the index)": {
            "s": out["search_build_s"],
            "rss_mb": out["search_build_rss_mb"],
            "exit": out["search_build_exit"],
        }
    }
    for name, (code, args) in commands.items():
        seconds, rss, status = child(code, args, path.parent)
        out["cli"][name] = {"s": seconds, "rss_mb": rss, "exit": status}
    return out


def render(result: dict[str, Any]) -> str:
    r = result
    lines = [
        f"store: {r['sessions']:,} sessions, {r['messages']:,} messages, "
        f"{r['store_bytes'] / 1e6:,.0f} MB on disk; built in {r['build_s']:,.0f} s "
        f"({r['messages'] / r['build_s']:,.0f} messages/s, Store.batch)"
        if r.get("build_s")
        else f"store: {r['sessions']:,} sessions, {r['messages']:,} messages, "
        f"{r['store_bytes'] / 1e6:,.0f} MB on disk (built by an earlier run)",
        f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at the end",
        "",
        "in-process (a new Store each time; median)    measured     target",
        f"  ls (Store.sessions)                    {r['ls_ms']:>10.1f} ms   <= 50 ms",
        f"  log S -n 20 (first 20 of Store.log)    {r['log20_ms']:>10.1f} ms   <= 50 ms",
        f"  search, warm                           {r['search_ms']:>10.1f} ms   <= 100 ms",
        f"  search, first (builds the index)       {r['search_build_s']:>10.1f} s"
        "     (a child; see below)",
        f"  fsck (check_store)                     {r['fsck_mb_s']:>10.1f} MB/s  >= 50 MB/s"
        f"  ({r['checked_bytes'] / 1e6:,.0f} MB without cache/ in {r['fsck_s']:.0f} s,"
        f" {r['fsck_problems']} problems)",
        "",
        "command line (a child process)           wall time    peak RSS  (target <= 300 MB)",
    ]
    for name, c in r["cli"].items():
        flag = "" if c["exit"] == 0 else f"  exit {c['exit']}"
        lines.append(f"  ags {name:<36} {c['s']:>8.2f} s  {c['rss_mb']:>7.0f} MB{flag}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description="Build a big store with the bulk API and time the everyday commands on it.",
        epilog="Example: uv run python -m bench.scale --sessions 1000 --messages 100000",
    )
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5, help="runs per in-process median")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ags-bench",
        help="where the store is built and kept for the next run",
    )
    parser.add_argument("--rebuild", action="store_true", help="build the store again")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    path = args.dir / f"scale-{args.sessions}x{args.messages}"
    built = path / "built.json"
    build_s = None
    if args.rebuild or not built.exists():
        shutil.rmtree(path, ignore_errors=True)
        build_s = build(path / "store", args.sessions, args.messages)
        built.write_text(json.dumps({"build_s": build_s}))
    else:
        build_s = json.loads(built.read_text()).get("build_s")
    result = measure(path / "store", args.runs)
    result.update(sessions=args.sessions, messages=args.messages, build_s=build_s)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
