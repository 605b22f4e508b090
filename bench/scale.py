"""``python -m bench.scale``: a store of 10,000 sessions and 1,000,000 messages, and
what the everyday commands cost on it (issue 11, item 5).

Not part of the tests, nor of ``python -m bench`` (building the store takes
minutes). The store is built once with the bulk API (``Store.batch``) under
``--dir`` and reused by later runs of the same size. Each command is then
measured two ways: in this process (open a Store, do the call, close it; the
median of a few runs after a warm-up), and as the ``ags`` command line in a
child process, whose wall time and peak RSS are what a user sees. ``--only``
runs some rows (the first search alone takes minutes).

What writes (gc, repack) runs on a copy of the store, made for each such row
and removed after it: the kept store stays as it was built, search index aside.
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from objstore import SearchIndex, Store, check_store

from .conversations import Conversation, make_project
from .measure import disk_bytes

AGS = str(Path(sys.executable).parent / "ags")
BATCH_SESSIONS = 20  # sessions per batch: one sync per 20 sessions' messages
SWEPT_SESSIONS = 1_000  # what the "gc (sweeps ...)" row purges before it collects
IN_PROCESS = ("ls", "log", "search", "search-build", "fsck")
CLI_ROWS = ("cli-ls", "cli-log", "cli-search", "cli-fsck", "cli-gc", "cli-gc-sweep",
            "cli-repack", "cli-du", "cli-help")  # fmt: skip
ROWS = IN_PROCESS + CLI_ROWS


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
TREE_POLL_S = 0.02  # how often the processes a child forks (fsck's workers) are looked at


@dataclass(frozen=True, slots=True)
class ChildRun:
    """One run of a child: its wall time, exit status and memory. ``rss_mb``: its own
    peak (VmHWM). ``tree_rss_mb``: the peaks of it and of every process it started
    (fsck's workers), summed, each read every TREE_POLL_S while it ran: what the
    command holds at most if each process peaks at once. ``together_rss_mb``: the
    most their resident sizes summed to at one look (sampled, so a lower bound)."""

    s: float
    rss_mb: float
    exit: int
    tree_rss_mb: float
    together_rss_mb: float


def _descendants(root: int) -> list[int]:
    """The processes below ``root``, from each one's parent in /proc/PID/stat."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        below = parents.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _memory_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in kB; (0, 0) once it is gone."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, hwm


def child(code: str, args: list[str], scratch: Path) -> ChildRun:
    """Run ``code`` in a new Python with ``args`` as its argv, watching the processes
    it starts."""
    out = scratch / "peak"
    out.unlink(missing_ok=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", PEAK_REPORTER, str(out), code, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peaks: dict[int, int] = {}  # of each process started below the child, in kB
    together = 0
    while proc.poll() is None:
        pids = [proc.pid, *_descendants(proc.pid)]
        now = 0
        for pid in pids:
            rss, hwm = _memory_kb(pid)
            now += rss
            if pid != proc.pid and hwm:
                peaks[pid] = max(peaks.get(pid, 0), hwm)
        together = max(together, now)
        time.sleep(TREE_POLL_S)
    seconds = time.perf_counter() - start
    own = int(out.read_text()) if out.exists() else 0
    return ChildRun(
        seconds, own / 1024, proc.returncode, (own + sum(peaks.values())) / 1024, together / 1024
    )


def scratch_copy(path: Path, purge: int = 0) -> Path:
    """A copy of the store at ``path`` to write in, beside it; with ``purge``, that many
    sessions (every tenth) purged from it, so that gc has their history to sweep."""
    copy = path.parent / "scratch"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(path, copy, symlinks=True)
    if purge:
        with Store.open(copy) as store:
            for info in store.sessions()[::10][:purge]:
                store.purge(info.id)
    return copy


def measure(path: Path, runs: int, only: frozenset[str]) -> dict[str, Any]:
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
        "cli": {},
    }

    def ls() -> object:
        with Store.open(path) as store:
            return store.sessions()

    def log20() -> object:
        with Store.open(path) as store:
            entries = store.log(sid)
            return [next(entries) for _ in range(20)]

    def search() -> object:
        with Store.open(path) as store, SearchIndex(store) as index:
            return index.search(word)

    if "search-build" in only:
        # The first search builds the index: measured from nothing each run, as a child
        # (its peak memory is the point), not on an index an earlier run left.
        for suffix in ("", "-wal", "-shm"):
            (path / f"cache/search.sqlite{suffix}").unlink(missing_ok=True)
        build = child(CLI, ["--store", str(path), "search", word], path.parent)
        out["search_build_s"], out["search_build_rss_mb"] = build.s, build.rss_mb
        out["search_build_exit"] = build.exit
        out["cli"]["search (first: builds the index)"] = asdict(build)
    for name, key, fn in (("ls", "ls_ms", ls), ("log", "log20_ms", log20),
                          ("search", "search_ms", search)):  # fmt: skip
        if name in only:
            out[key] = median_ms(fn, runs)
    if "fsck" in only:
        start = time.perf_counter()
        with Store.open(path) as store:
            report = check_store(store)
        out["fsck_s"] = time.perf_counter() - start
        out["fsck_problems"] = len(report.problems)
        out["fsck_mb_s"] = out["checked_bytes"] / 1e6 / out["fsck_s"]
    store_arg = ["--store", str(path)]
    gc = ["gc", "--grace", "10m"]
    # (row, what it is called, code, its arguments, what it needs: None, or the number
    # of sessions to purge from a copy it runs on, 0 for none)
    commands: list[tuple[str, str, str, list[str], int | None]] = [
        ("cli-ls", "ls", CLI, [*store_arg, "ls"], None),
        ("cli-log", "log -n 20", CLI, [*store_arg, "log", sid, "-n", "20"], None),
        ("cli-search", "search", CLI, [*store_arg, "search", word], None),
        ("cli-fsck", "fsck", CLI, [*store_arg, "fsck"], None),
        ("cli-gc", "gc (nothing to sweep)", CLI, gc, 0),
        (
            "cli-gc-sweep",
            f"gc (sweeps {SWEPT_SESSIONS:,} purged sessions)",
            CLI,
            gc,
            SWEPT_SESSIONS,
        ),  # fmt: skip
        ("cli-repack", "repack", CLI, ["repack"], 0),
        ("cli-du", "du", CLI, [*store_arg, "du"], None),
        ("cli-help", "--help (start-up alone)", CLI, ["--help"], None),
    ]
    for row, name, code, args, purge in commands:
        if row not in only:
            continue
        if purge is None:
            run = child(code, args, path.parent)
        else:
            copy = scratch_copy(path, purge)
            try:
                run = child(code, ["--store", str(copy), *args], path.parent)
            finally:
                shutil.rmtree(copy, ignore_errors=True)
        out["cli"][name] = asdict(run)
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
    ]
    if "ls_ms" in r:
        lines.append(f"  ls (Store.sessions)                    {r['ls_ms']:>10.1f} ms   <= 50 ms")
    if "log20_ms" in r:
        lines.append(
            f"  log S -n 20 (first 20 of Store.log)    {r['log20_ms']:>10.1f} ms   <= 50 ms"
        )
    if "search_ms" in r:
        lines.append(
            f"  search, warm                           {r['search_ms']:>10.1f} ms   <= 100 ms"
        )
    if "search_build_s" in r:
        lines.append(
            f"  search, first (builds the index)       {r['search_build_s']:>10.1f} s"
            "     (a child; see below)"
        )
    if "fsck_mb_s" in r:
        lines.append(
            f"  fsck (check_store)                     {r['fsck_mb_s']:>10.1f} MB/s  >= 50 MB/s"
            f"  ({r['checked_bytes'] / 1e6:,.0f} MB without cache/ in {r['fsck_s']:.0f} s,"
            f" {r['fsck_problems']} problems)"
        )
    lines += [
        "",
        "command line (a child process)           wall time    peak RSS  with workers"
        "  (target <= 300 MB)",
    ]
    for name, c in r["cli"].items():
        flag = "" if c["exit"] == 0 else f"  exit {c['exit']}"
        tree = c["tree_rss_mb"]
        workers = f"{tree:>7.0f} MB" if tree > c["rss_mb"] else "       -"
        lines.append(f"  ags {name:<36} {c['s']:>8.2f} s  {c['rss_mb']:>7.0f} MB  {workers}{flag}")
    if any(c["tree_rss_mb"] > c["rss_mb"] for c in r["cli"].values()):
        lines.append(
            "  (with workers: the peak of the command and of each process it started, summed)"
        )
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
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        default=list(ROWS),
        metavar="ROW[,ROW...]",
        help=f"the rows to run, of: {', '.join(ROWS)} (default: all)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.only) - set(ROWS)
    if unknown:
        parser.error(f"no row {', '.join(sorted(unknown))}; rows: {', '.join(ROWS)}")
    path = args.dir / f"scale-{args.sessions}x{args.messages}"
    built = path / "built.json"
    build_s = None
    if args.rebuild or not built.exists():
        shutil.rmtree(path, ignore_errors=True)
        build_s = build(path / "store", args.sessions, args.messages)
        built.write_text(json.dumps({"build_s": build_s}))
    else:
        build_s = json.loads(built.read_text()).get("build_s")
    result = measure(path / "store", args.runs, frozenset(args.only))
    result.update(sessions=args.sessions, messages=args.messages, build_s=build_s)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
