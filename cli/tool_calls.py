"""Tool calls as the chat lists them: what a call was (``call_line``, one line)
and what it gave back (``ToolResult``, kept whole for ``\\show N``). Shared by
the terminal view, the plain output and the backslash commands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .output import one_line, tool_call_summary, visible


@dataclass(frozen=True, slots=True)
class ToolResult:
    """One tool call of this chat and all it gave back, for ``\\show N``."""

    number: int
    name: str
    arguments: Any
    content: str
    ok: bool


def call_line(name: str, arguments: Any, width: int) -> str:
    """One line for a tool call: the tool and what it works on (a shell command's
    first line, a path), cut to ``width``; what is left out is said."""
    shown = one_line(name, "?")
    args = arguments if isinstance(arguments, dict) else None
    if args is None:
        return cut(tool_call_summary({"name": name, "arguments": arguments}), width)
    if name == "shell" and isinstance(args.get("command"), str):
        lines = args["command"].strip("\n").split("\n")
        more = f"  (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
        return cut(f"{shown} {visible(lines[0])}", width - len(more)) + more
    if isinstance(args.get("path"), str):
        extra = ""
        if name == "write_file" and isinstance(args.get("content"), str):
            extra = f"  ({counted(line_count(args['content']), 'line')})"
        return cut(f"{shown} {visible(args['path'])}", width - len(extra)) + extra
    return cut(tool_call_summary({"name": name, "arguments": args}), width)


def line_count(text: str) -> int:
    """Lines of ``text``, a last line without a newline counted too."""
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def counted(n: int, what: str) -> str:
    """'1 line', '3 lines'."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, the cut marked with an ellipsis."""
    width = max(width, 10)
    return text if len(text) <= width else text[: width - 1] + "…"
