"""Reflogs: the history of every ref, one JSON line per update.

``logs/<ref path>`` holds lines like::

    {"gen":7,"new":"<id>","old":"<id>","reason":"append","time":"2026-11-29T08:25:01.123Z"}

A line is written before the ref file is renamed into place, under the same
lock. So a crash can leave a line whose ``gen`` is above the ref's
generation: that update never happened and readers drop it. When a later
update writes the same ``gen`` again, the last line for a generation wins.
A last line without its newline is a torn write and is dropped too.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import canonical
from .files import read_file


@dataclass(frozen=True, slots=True)
class ReflogEntry:
    old: str | None
    new: str | None
    gen: int
    time: str
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {
            "gen": self.gen,
            "new": self.new,
            "old": self.old,
            "reason": self.reason,
            "time": self.time,
        }

    def line(self) -> bytes:
        return canonical.dumps(self.as_dict()) + b"\n"


def _parse(raw: bytes) -> ReflogEntry | None:
    try:
        d = canonical.loads(raw)
        entry = ReflogEntry(d["old"], d["new"], int(d["gen"]), d["time"], d["reason"])
    except (ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(v, str | None) for v in (entry.old, entry.new)):
        return None
    if not isinstance(entry.time, str) or not isinstance(entry.reason, str):
        return None
    return entry


def read_reflog(path: str, current_gen: int | None) -> list[ReflogEntry]:
    """The effective entries, oldest first. ``current_gen`` None means the ref is gone."""
    try:
        data = read_file(path)
    except FileNotFoundError:
        return []
    by_gen: dict[int, ReflogEntry] = {}
    for raw in data.split(b"\n")[:-1]:  # the part after the last newline is torn
        entry = _parse(raw)
        if entry is not None:
            by_gen[entry.gen] = entry
    entries = [by_gen[g] for g in sorted(by_gen)]
    if current_gen is not None:
        entries = [e for e in entries if e.gen <= current_gen]
    return entries


def unreadable_lines(path: str) -> list[int]:
    """The numbers (from 1) of the whole lines of a reflog that do not parse: damage,
    since a crash can only tear the last line, which has no newline."""
    try:
        data = read_file(path)
    except FileNotFoundError:
        return []
    return [n for n, raw in enumerate(data.split(b"\n")[:-1], 1) if _parse(raw) is None]
