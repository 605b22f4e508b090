"""``python -m bench``: run every scenario in a temporary directory and print the table.

The exit status is 0 whether or not targets are met: the run is a report.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from .conversations import make_project
from .peers import reset, skip_peers, versions_note
from .report import Report, Row, machine_info, write_report
from .scenarios import DEFAULT_SIZES, QUICK_SIZES, SCENARIOS, Sizes

PROJECT_SEED = 42


def run_benchmark(sizes: Sizes, quick: bool = False, only: list[str] | None = None) -> Report:
    """Run every scenario (or those named in ``only``), each in its own temporary
    directory, removed afterwards."""
    machine = machine_info()  # before the run, so the load average is other work's
    project = make_project(PROJECT_SEED)
    rows: list[Row] = []
    notes: list[str] = []
    for scenario in SCENARIOS:
        if only and scenario.__name__ not in only:
            continue
        base = Path(tempfile.mkdtemp(prefix=f"ags-bench-{scenario.__name__}-"))
        try:
            outcome = scenario(base, sizes, project)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        rows += outcome.rows
        notes.append(outcome.note)
    if any(row.peers for row in rows):
        notes.append(versions_note())
    return Report(machine, asdict(sizes), rows, notes, quick)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Compare ags with a JSONL file per session, zettcode's session store and "
        "LangGraph's SqliteSaver on generated agent sessions.",
        epilog="Example: uv run python -m bench --quick --json",
    )
    parser.add_argument("--quick", action="store_true", help="a small, fast run (smoke test)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--no-peers",
        action="store_true",
        help="leave zettcode and LangGraph out (their cells are dashes); otherwise they are "
        "installed from PyPI into ~/.cache/ags-bench/peers-venv on the first run",
    )
    parser.add_argument(
        "--only",
        metavar="SCENARIO",
        action="append",
        choices=[s.__name__ for s in SCENARIOS],
        help="run only this scenario (again for more): " + ", ".join(s.__name__ for s in SCENARIOS),
    )
    parser.add_argument(
        "--dir",
        metavar="DIR",
        type=_directory,
        help="run the scenarios in temporary directories under DIR, to measure the file "
        "system it is on (default: the system's temporary directory)",
    )
    return parser.parse_args(argv)


def _directory(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {text}")
    return path.resolve()


@contextmanager
def _temporary_directories_under(directory: Path | None) -> Iterator[None]:
    """Every temporary directory made meanwhile, in this process and in the children it
    starts (the live writer, the peers' drivers), is made under ``directory``."""
    if directory is None:
        yield
        return
    before_dir, before_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = str(directory), str(directory)
    try:
        yield
    finally:
        tempfile.tempdir = before_dir
        if before_env is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = before_env


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print it; always 0 (a failed target is reported, not raised)."""
    args = parse_args(argv)
    sizes = QUICK_SIZES if args.quick else DEFAULT_SIZES
    reset()
    if args.no_peers:
        skip_peers("left out (--no-peers)")
    with _temporary_directories_under(args.dir):
        report = run_benchmark(sizes, quick=args.quick, only=args.only)
    write_report(report, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
