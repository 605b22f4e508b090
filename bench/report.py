"""Benchmark results and how they are shown: an aligned text table, or JSON."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Unit = Literal["msg/s", "s", "B", "req"]


@dataclass(frozen=True, slots=True)
class Row:
    """One measurement of both stores. Values are in base units: seconds, bytes, messages/s.

    ``passed`` is None for a row that only reports.
    """

    key: str
    label: str
    unit: Unit
    ags: float
    jsonl: float
    target: str
    passed: bool | None
    # The peer stores' values in the same unit (bench/peers.py), None for a dash.
    peers: tuple[tuple[str, float | None], ...] = ()

    @property
    def ratio(self) -> float:
        """ags divided by JSONL."""
        return self.ags / self.jsonl if self.jsonl else float("inf")

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL", None: "-"}[self.passed]


@dataclass(frozen=True, slots=True)
class Report:
    """A whole run: the machine, the rows, and notes on what the rows measured."""

    machine: dict[str, Any]
    sizes: dict[str, int]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    quick: bool = False

    @property
    def failures(self) -> list[Row]:
        return [row for row in self.rows if row.passed is False]


def machine_info() -> dict[str, Any]:
    """The basics that numbers depend on, with the load average (other work skews timings)."""
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 2),
        "tempdir": tempfile.gettempdir(),
        "filesystem": filesystem_of(Path(tempfile.gettempdir())),
    }


def filesystem_of(path: Path) -> str:
    """The type of the file system ``path`` is on (its mount with the longest matching
    mount point in /proc/mounts), or "unknown" where there is no /proc/mounts."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    target, best, kind = str(path.resolve()), -1, "unknown"
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), fields[2]
    return kind


def format_value(value: float, unit: Unit) -> str:
    """A value in the unit a reader wants: ms or us for seconds, KB or MB for bytes."""
    if unit == "msg/s":
        return f"{value:,.0f}/s"
    if unit == "s":
        return f"{value * 1e6:,.0f} us" if value < 1e-3 else f"{value * 1e3:,.1f} ms"
    if unit == "req":
        return f"{value:,.0f} req"
    if value < 1024 * 1024:
        return f"{value / 1024:,.1f} KB"
    return f"{value / (1024 * 1024):,.1f} MB"


PEER_LABELS = {"zettcode": "zettcode", "langgraph": "LangGraph"}  # bench/peers.py


def _peer_cell(row: Row, peer: str) -> str:
    value = dict(row.peers).get(peer)
    return "-" if value is None else format_value(value, row.unit)


def render_table(report: Report) -> str:
    """The report as plain text: machine line, aligned table, notes."""
    m = report.machine
    lines = [
        f"ags vs JSONL-per-session, zettcode and LangGraph{' (quick run)' if report.quick else ''}",
        f"Python {m['python']} ({m['implementation']}), {m['cores']} cores, "
        f"load {m['load_1min']} at start, {m['platform']}, temp dir {m['tempdir']} "
        f"({m.get('filesystem', 'unknown')})",
        "",
    ]
    header = ("measure", "ags", "JSONL", *PEER_LABELS.values(), "ags/JSONL", "target", "result")
    cells = [header] + [
        (
            row.label,
            format_value(row.ags, row.unit),
            format_value(row.jsonl, row.unit),
            *(_peer_cell(row, peer) for peer in PEER_LABELS),
            f"{row.ratio:.3g}x",
            row.target,
            row.status,
        )
        for row in report.rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    right = set(range(1, 4 + len(PEER_LABELS)))
    for n, cell in enumerate(cells):
        lines.append(
            "  ".join(
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(cell, widths, strict=True))
            ).rstrip()
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    failed = report.failures
    lines += ["", f"{len(failed)} of {sum(r.passed is not None for r in report.rows)} targets FAIL"]
    lines += [f"  FAIL: {row.label} (target {row.target})" for row in failed]
    if report.notes:
        lines += ["", "Notes:"] + [f"  - {note}" for note in report.notes]
    return "\n".join(lines)


def report_json(report: Report) -> str:
    """The report as JSON: raw values in base units (seconds, bytes, messages/s)."""
    rows = [
        {**asdict(row), "peers": dict(row.peers), "ratio": row.ratio, "status": row.status}
        for row in report.rows
    ]
    doc = {
        "machine": report.machine,
        "quick": report.quick,
        "sizes": report.sizes,
        "rows": rows,
        "notes": report.notes,
    }
    return json.dumps(doc, indent=2)


def write_report(report: Report, as_json: bool) -> None:
    sys.stdout.write((report_json(report) if as_json else render_table(report)) + "\n")
