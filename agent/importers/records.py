"""What the importers share: finding source files, reading them a record at a
time, cleaning values the store would refuse, and the shapes they hand to the
writer (``Item``) and to the caller (``ImportRow``).

A JSONL file is read line by line with a bounded buffer: memory follows the
largest line, never the file. A line that does not end in a newline and does
not parse is a torn write (the source agent may still be writing it) and is
left for the next import.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final

import blake3

from objstore import NestingTooDeep, parse_json

from ..errors import SourceError

READ_CHUNK: Final = 1 << 16
LINE_DEPTH: Final = 500
"""Containers a record may nest; a deeper one is kept as text, with a problem. Far
beyond any real record (the store takes messages nested up to 100 deep, and keeps a
stub of a deeper one), and shallow enough that walking a record (``clean``,
``text_of``, ``json.dumps`` of its key) never meets Python's recursion limit."""
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
TOOL_NAMES: Final = ("claude-code", "codex", "gemini")


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a JSONL file: where it is and what it holds."""

    number: int  # 1-based
    offset: int
    end: int  # offset after the newline (or the end of the file)
    data: bytes  # without the newline


@dataclass(frozen=True, slots=True)
class Record:
    """One parsed source record: a JSON object, or None when the line is not one."""

    line: Line
    value: dict[str, Any] | None
    problem: str | None = None


@dataclass(slots=True)
class Item:
    """One thing to write into a session: a message, or a compaction with its summary.

    ``records`` counts the source records the item closes (a message made of
    several records is counted on its last), so that the writer knows how far
    into the source the session has got after this item.
    """

    message: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    compaction: bool = False


@dataclass(slots=True)
class ImportRow:
    """The outcome for one source file; ``--json`` prints these."""

    source: str
    tool: str
    session: str | None = None
    status: str = "unchanged"  # created, updated, unchanged, failed
    messages: int = 0
    problems: list[str] = field(default_factory=list)
    records: int = 0  # source records the session holds so far
    unknown_records: int = 0  # records of types this ags does not map, kept verbatim
    linked: list[str] = field(default_factory=list)  # sidechain sessions made from this file
    forked_from: str | None = None  # the session a changed past was forked from


def iter_lines(fp: IO[bytes], start: int = 0, number: int = 0) -> Iterator[Line]:
    """The lines of ``fp`` from byte ``start`` on, each as it is read."""
    fp.seek(start)
    pending = bytearray()
    offset = start
    while True:
        chunk = fp.read(READ_CHUNK)
        if not chunk:
            break
        pending += chunk
        cut = 0
        while True:
            nl = pending.find(b"\n", cut)
            if nl < 0:
                break
            number += 1
            yield Line(number, offset, offset + nl - cut + 1, bytes(pending[cut:nl]))
            offset += nl - cut + 1
            cut = nl + 1
        del pending[:cut]
    if pending:
        yield Line(number + 1, offset, offset + len(pending), bytes(pending))


def parse_line(line: Line) -> Record:
    """A line as a record. A torn last line (no newline, not JSON) has no value and the
    problem "torn": the caller reports it and does not consume it."""
    data = line.data.rstrip(b"\r")
    if not data.strip():
        return Record(line, None, None)
    problem = None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", errors="replace")
        problem = f"line {line.number}: not UTF-8 (byte {e.start}); bad bytes replaced by U+FFFD"
    try:
        value = parse_json(text, LINE_DEPTH, huge_as_text=True)  # (finite_float's rule)
    except NestingTooDeep:
        return Record(line, None, f"line {line.number}: nested too deeply to read, kept as text")
    except ValueError:
        if line.end - line.offset == len(line.data):  # no newline: still being written
            return Record(line, None, "torn")
        return Record(line, None, f"line {line.number}: not JSON, kept as text")
    if not isinstance(value, dict):
        return Record(line, None, f"line {line.number}: not a JSON object, kept as text")
    # Decoded text holds no surrogate; only a \\uD8xx-style escape can bring one in.
    if "\\ud" in text or "\\uD" in text:
        cleaned = clean(value)
        if cleaned != value:  # (a pair that makes one character is no change)
            value = cleaned
            said = f"line {line.number}: lone surrogate escapes replaced by U+FFFD"
            problem = said if problem is None else f"{problem}; {said.split(': ', 1)[1]}"
    return Record(line, value, problem)


def torn_problem(line: Line) -> str:
    return f"line {line.number}: torn last line ({len(line.data)} bytes), left for the next import"


def finite_float(text: str) -> float | str:
    """A JSON number as a float, or as its text when no double holds it (1e400):
    the store refuses infinities, and the number is kept as written."""
    value = float(text)
    return value if value not in (float("inf"), float("-inf")) else text


def clean(value: Any) -> Any:
    """``value`` with what canonical JSON refuses made storable: lone surrogates
    (a JSON text may escape them) become U+FFFD."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return _SURROGATE.sub("\ufffd", value)
        return value
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN cannot come from json.loads here
        return None
    return value


def raw_text(record: Record) -> str:
    """A line that is not a JSON object, kept as text in the transcript's source."""
    return record.line.data.decode("utf-8", errors="replace")


def record_key(value: Any) -> str:
    """A short stable digest of a record's JSON value."""
    data = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return blake3.blake3(data.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


def chain_digest(previous: str, key: str) -> str:
    """The running digest over the keys of the records a session holds, in order."""
    return blake3.blake3(f"{previous}:{key}".encode()).hexdigest()[:32]


def ags_time(value: Any) -> str | None:
    """A source timestamp (ISO 8601 text, or seconds / milliseconds since the epoch)
    as the store writes times: ``YYYY-MM-DDTHH:MM:SS.mmmZ`` in UTC."""
    when: datetime | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = value / 1000 if value > 1e11 else value
        try:
            when = datetime.fromtimestamp(seconds, UTC)
        except (OverflowError, OSError, ValueError):
            return None
    elif isinstance(value, str) and value:
        text = value.strip().replace("Z", "+00:00").replace("z", "+00:00")
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
    if when is None:
        return None
    when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def find_files(paths: Iterable[Path], accept: Any) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Every file under ``paths`` (what is not a folder taken as it is, folders
    searched recursively, symlinked folders not followed) that ``accept(path)``
    takes, oldest first: a resumed session's file comes after the one it copied;
    and each folder that could not be searched, with why."""
    found: dict[Path, float] = {}
    unreadable: list[tuple[Path, str]] = []

    def cannot_list(e: OSError) -> None:
        unreadable.append((Path(e.filename).absolute(), e.strerror or str(e)))

    for root in paths:
        if not root.is_dir():
            found[root.absolute()] = _mtime(root)  # (a FIFO too: stat_of refuses it)
            continue
        for folder, dirs, files in os.walk(root, onerror=cannot_list):
            dirs.sort()
            for name in sorted(files):
                path = Path(folder, name)
                if accept(path):
                    found[path.absolute()] = _mtime(path)
    return sorted(found, key=lambda p: (found[p], str(p))), unreadable


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def text_of(content: Any) -> str:
    """The text of a content value in any of the shapes the sources use: a string,
    a list of parts with ``text`` (or ``input_text``/``output_text``), or nested."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (text_of(part) for part in content) if t)
    if isinstance(content, dict):
        for key in ("text", "content", "output"):
            if key in content:
                return text_of(content[key])
        return ""
    return json.dumps(content, ensure_ascii=False)


def str_field(value: dict[str, Any], key: str) -> str | None:
    """``value[key]`` if it is a string, else None: a field of a source record can hold
    anything, and a type name that is a list must read as unknown, not fail a lookup."""
    item = value.get(key)
    return item if isinstance(item, str) else None


def dict_field(value: dict[str, Any], key: str) -> dict[str, Any]:
    """``value[key]`` if it is an object, else an empty one."""
    item = value.get(key)
    return item if isinstance(item, dict) else {}


def list_field(value: dict[str, Any], key: str) -> list[Any]:
    """``value[key]`` if it is a list, else an empty one."""
    item = value.get(key)
    return item if isinstance(item, list) else []


@dataclass(slots=True)
class Entry:
    """What the first pass over a JSONL file keeps of one line: where it is, and the
    few fields that place it; never its content."""

    number: int
    offset: int
    length: int
    key: str
    kind: str  # the record's type, "" for a line that is not a JSON object
    uuid: str | None = None
    parent: str | None = None
    sidechain: bool = False
    turn: str | None = None  # an assistant turn's id: its records join one message
    calls: bool = False  # the record asks for tool calls


class LineReader:
    """Reads single lines back by offset during the second pass (one open file),
    each checked against the key the first pass took of it: a file cut short or
    rewritten between the passes is a SourceError, never a line read as empty (an
    import that did that stored part of a session under the digest of all of it,
    and every later import took the session for complete). ``drop``: the field
    whose value ``line_key`` leaves out of the key, as the first pass did."""

    def __init__(self, path: Path, drop: str | None = None) -> None:
        self.path = path
        self._drop = drop
        self._fp: IO[bytes] | None = None

    def read(self, entry: Entry) -> Record:
        if self._fp is None:
            self._fp = self.path.open("rb")
        self._fp.seek(entry.offset)
        data = self._fp.read(entry.length)
        line = Line(entry.number, entry.offset, entry.offset + entry.length + 1, data)
        record = parse_line(line)
        value = record.value
        dropped = value.get(self._drop) if self._drop and value is not None else None
        if (
            len(data) != entry.length
            or line_key(data, dropped if isinstance(dropped, str) else None) != entry.key
        ):
            raise SourceError(
                f"{self.path} changed while it was imported (line {entry.number} is not "
                "what it was a moment before): nothing of it was taken; import it again"
            )
        return record

    def close(self) -> None:
        if self._fp is not None:
            self._fp.close()
            self._fp = None


def open_turn(entries: list[Entry], path: list[int]) -> int:
    """How many records at the end of ``path`` are an assistant turn that asked for
    tool calls and has no answer yet. The source is still writing it (more calls
    may be added to the same turn, and the results follow), so it waits for the
    next import rather than be stored half done."""
    held = 0
    asked = False
    turn: str | None = None
    for i in reversed(path):
        entry = entries[i]
        if entry.turn is None:
            if entry.kind in ("progress", "event_msg", "turn_context"):
                held += 1  # bookkeeping written between the parts of a turn
                continue
            break
        if turn is not None and entry.turn != turn:
            break
        turn = entry.turn
        asked = asked or entry.calls
        held += 1
    return held if asked else 0


def line_key(data: bytes, drop: str | None = None) -> str:
    """The key of a JSONL record: a digest of its bytes, without one value that
    legitimately differs between copies of the record (Claude Code's sessionId)."""
    if drop:
        data = data.replace(drop.encode("utf-8", errors="replace"), b"")
    return blake3.blake3(data.rstrip(b"\r")).hexdigest()[:32]


MAX_TOKENS: Final = 10**12  # tokens one call may count: far past any model's window


def token_count(value: Any) -> int:
    """A token count a source reports, or 0 for what is none: not an integer, below
    zero, or past MAX_TOKENS (a source file may hold anything; ``ags info`` showed
    "tokens: -9 in, 2000...0001 out")."""
    ok = type(value) is int and 0 <= value <= MAX_TOKENS
    return value if ok else 0


def stat_of(path: Path) -> tuple[int, int]:
    """A source file's size and mtime; SourceError if it is no regular file (a FIFO,
    or a link to a device: reading one would wait, or never end)."""
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise SourceError(f"{path} is not a regular file")
    return st.st_size, st.st_mtime_ns
