"""How the command line prints: colour, pager, JSON, times, message summaries.

Colour only on a terminal and never with NO_COLOR (https://no-color.org);
long output goes through a pager only on a terminal. Nothing here decides
what to print, only how.

Text from a session (titles, messages, tool output, names, metadata) is
written by whoever wrote the session: a model, a tool, an imported file. It
never reaches the terminal as it is: ``visible`` (agent/control_chars.py,
shared with the session browser) turns every control
character (escape sequences, carriage returns, backspaces, bidi overrides,
invisible format characters) into an escape a person can read, terminal or
not, and ``emit_json`` writes the same characters as JSON escapes, which
keeps the JSON exact.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final

import click

from agent.control_chars import HIDDEN_IN_BODY
from agent.control_chars import visible as visible  # re-exported: the commands print with it


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON spells an astral character as a surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def color_enabled() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def style(text: str, **kwargs: Any) -> str:
    return click.style(text, **kwargs) if color_enabled() else text


def emit_lines(lines: Iterable[str], *, page: bool = True) -> None:
    """Print lines; on a terminal, through the pager when they do not fit."""
    if page and sys.stdout.isatty():
        text = "\n".join(lines)
        if text.count("\n") + 1 > shutil.get_terminal_size().lines - 1:
            click.echo_via_pager(text + "\n", color=color_enabled())
            return
        click.echo(text)
        return
    for line in lines:
        click.echo(line)


def json_safe(text: str) -> str:
    """JSON text with every hidden character as a ``\\u`` escape: the same JSON value
    (JSON escapes C0 controls itself; in JSON text the others occur only in strings)."""
    return HIDDEN_IN_BODY.sub(_json_escape, text)


def emit_json(value: Any) -> None:
    """Print JSON: exactly the value, safe for a terminal (``json_safe``)."""
    click.echo(json_safe(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False)))


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name in dir(type(value)):  # properties (dedup_ratio, ok, ...) too
            if isinstance(getattr(type(value), name, None), property):
                out[name] = to_jsonable(getattr(value, name))
        return out
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    return value


def relative_time(iso: str | None, now: datetime | None = None) -> str:
    """'3 minutes ago' for a time as refs store it."""
    if not iso:
        return "never"
    try:
        then = datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    except (ValueError, TypeError):
        return visible(str(iso))
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    if seconds < 0:
        return "just now"
    for unit, size in (("year", 31536000), ("month", 2592000), ("week", 604800),
                       ("day", 86400), ("hour", 3600), ("minute", 60)):  # fmt: skip
        if seconds >= size:
            n = seconds // size
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def counted(n: int, noun: str) -> str:
    """``1 pack``, ``2 packs``, ``1,000 objects``: a count and its noun, plural unless one."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def short(oid: str | None, n: int = 12) -> str:
    return oid[:n] if oid else "-"


def one_line(value: Any, default: str = "") -> str:
    """A value from a session (a title, a role, a path) for one line: visible, or
    ``default`` when it is missing or empty."""
    if value is None or value == "":
        return default
    return visible(value if isinstance(value, str) else str(value))


def message_text(message: Any) -> str:
    """The readable text of a message, whatever shape its content takes; visible,
    newlines and tabs kept."""
    return visible(_raw_text(message), multiline=True)


def message_start(message: Any, limit: int) -> tuple[str, int]:
    """The first ``limit`` characters of ``message_text`` (cut before it is made
    visible, so a huge message costs its first part only), and how many were left."""
    raw = _raw_text(message)
    return visible(raw[:limit], multiline=True), max(len(raw) - limit, 0)


def _raw_text(message: Any) -> str:
    if not isinstance(message, dict):
        return json.dumps(message, ensure_ascii=False)
    from objstore import content_text  # here: it loads search (sqlite3), which ls needs not

    return content_text(message.get("content"))  # a string, or the text of its parts


def tool_call_summary(call: Any) -> str:
    """``name(arg=value, ...)`` for one tool call, values cut short: a listing, not
    what a person approves (``approval.approval_request`` shows all of it)."""
    if not isinstance(call, dict):
        return _cut(str(call), 60)
    fn: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
    name = one_line(fn.get("name"), "?")
    args = fn.get("arguments", {})
    if isinstance(args, dict):
        shown = ", ".join(
            f"{_cut(str(k), 40)}={_cut(json.dumps(v, ensure_ascii=False), 40)}"
            for k, v in args.items()
        )
    else:
        shown = _cut(str(args), 60)
    return f"{name}({shown})"


def _cut(text: str, n: int) -> str:
    text = visible(text)
    return text if len(text) <= n else text[: n - 1] + "…"


def first_line(text: str, n: int = 72) -> str:
    return _cut(text.strip().split("\n", 1)[0] if text.strip() else "", n)


def wrap(text: str, indent: str = "    ", width: int | None = None) -> list[str]:
    width = width or min(shutil.get_terminal_size().columns, 100)
    lines: list[str] = []
    for para in text.split("\n"):
        if not para.strip():
            lines.append(indent.rstrip())
            continue
        lines += textwrap.wrap(
            para, width=width, initial_indent=indent, subsequent_indent=indent,
            replace_whitespace=False, drop_whitespace=True, break_long_words=True,
        ) or [indent]  # fmt: skip
    return lines


def parse_duration(text: str) -> float:
    """Seconds in '30d', '1h', '90m', '2w', '45s' or '0'; click.BadParameter otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = text.strip().lower()
    try:
        if text == "0" or text == "now":
            return 0.0
        if text and text[-1] in units:
            seconds = float(text[:-1]) * units[text[-1]]
            if 0 <= seconds <= MAX_DURATION:  # (not NaN: "nand"; not "infd")
                return seconds
            if seconds > MAX_DURATION:
                raise click.BadParameter(f"{text!r} is longer than 1,000 years")
    except ValueError:
        pass
    raise click.BadParameter(f"{text!r} is not a duration like 30d, 12h, 90m or 45s")


MAX_DURATION: Final = 1000 * 365 * 86400
"""The longest duration ``parse_duration`` takes: a time that long ago is still a date
ags writes (its year has four digits)."""
