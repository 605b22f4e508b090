"""What a person sees before approving a tool call: all of it, nothing cut.

``approval_request`` returns the text to show, as lines: the whole shell
command, the whole change a file tool would make (a diff against the file as
it is now; all of a new file), and every argument besides. Control and hidden
characters are made visible (``output.visible``); long lines are wrapped, the
continuation marked with ``↪`` so a wrap never looks like a line of its own.
How the person is asked is the caller's business (``plain_chat.PlainEvents``,
``chat_view.TerminalView``).

The preview reads the file the way the tool will find it (a path relative to
the project root, or under /workspace), without waiting on a FIFO or reading
a huge file, and says so when the tool is going to refuse the call.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any, Final

from agent.confined import ConfinedError, ConfinedFS, FileTooLarge, NotRegularFile, OutsideRoot
from agent.sandbox import WORKSPACE
from agent.tools import SHELL_TIMEOUT, SHELL_TIMEOUT_MAX

from .output import visible

INDENT: Final = "    "
WRAPPED: Final = "  ↪ "  # the gutter of a wrapped line's continuation
PREVIEW_BYTES: Final = 8 * 1024 * 1024  # a current file bigger than this is not diffed
_LINES = re.compile(r"(?<=\n)")  # split after each newline only (not \r, \v, U+2028...)


def approval_request(name: str, arguments: Any, project: Path, width: int = 100) -> list[str]:
    """The lines to show before asking whether to run tool ``name`` with ``arguments``
    (a dict, or the raw text of arguments that did not parse) over ``project``."""
    if not isinstance(arguments, dict):
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return [
            f"{visible(name)} with arguments that are not a JSON object "
            "(the tool will refuse them):",
            *_block(text.split("\n"), width),
        ]
    args = dict(arguments)
    if name == "shell" and isinstance(args.get("command"), str):
        lines = _shell(args, width)
    elif name == "write_file" and _strings(args, "path", "content"):
        lines = _write_file(args, project, width)
    elif name == "edit_file" and _strings(args, "path", "old", "new"):
        lines = _edit_file(args, project, width)
    else:
        lines = [f"{visible(name)}:"]
    for key, value in args.items():  # whatever the specific view did not show
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        lines += [f"  {visible(str(key))}:", *_block(shown.split("\n"), width)]
    return lines


def _strings(args: dict[str, Any], *names: str) -> bool:
    return all(isinstance(args.get(n), str) for n in names)


def _shell(args: dict[str, Any], width: int) -> list[str]:
    command: str = args.pop("command")
    timeout = args.pop("timeout", SHELL_TIMEOUT)
    if type(timeout) is int:
        when = f"timeout {min(max(timeout, 1), SHELL_TIMEOUT_MAX)} s"
    else:
        when = f"timeout {visible(json.dumps(timeout))}, which the tool may refuse"
    return [f"shell: run in the sandbox ({when}):", *_block(command.split("\n"), width)]


def _write_file(args: dict[str, Any], project: Path, width: int) -> list[str]:
    path: str = args.pop("path")
    content: str = args.pop("content")
    shown = visible(path)
    current, why = _current_text(project, path)
    if why is not None:
        return [f"write_file {shown} ({why}); the new content:", *_new_text(content, width)]
    if current is None:
        head = f"write_file: create {shown} ({_size(content)}):"
        return [head, *_new_text(content, width)]
    if current == content:
        return [f"write_file: {shown} already holds exactly this ({_size(content)})"]
    head = f"write_file: replace {shown} ({_size(current)} -> {_size(content)}):"
    return [head, *_diff(current, content, (f"{shown} (now)", f"{shown} (after)"), width)]


def _edit_file(args: dict[str, Any], project: Path, width: int) -> list[str]:
    path: str = args.pop("path")
    old: str = args.pop("old")
    new: str = args.pop("new")
    shown = visible(path)
    current, why = _current_text(project, path)
    if why is None and current is None:
        why = "it does not exist: the tool will fail"
    elif why is None and current is not None:
        count = current.count(old) if old else 0
        if count == 1:
            at = current.index(old)
            after = current[:at] + new + current[at + len(old) :]
            names = (f"{shown} (now)", f"{shown} (after)")
            return [f"edit_file: change {shown}:", *_diff(current, after, names, width)]
        how = f"occurs {count} times" if count else "does not occur"
        if not old:
            how = "is empty"
        why = f"the old text {how} in it: the tool will fail"
    names = ("old (the text to replace)", "new (its replacement)")
    return [f"edit_file {shown} ({why}); the edit asked for:", *_diff(old, new, names, width)]


def _current_text(project: Path, path: str) -> tuple[str | None, str | None]:
    """(the file's text now, or None if there is none; why it cannot be shown, or None).

    Read through the same confined walk the tool uses, so a preview never shows
    a file outside the project, whatever the sandbox does to the paths."""
    if not path or "\0" in path:
        return None, "the path is empty or holds a NUL: the tool will refuse it"
    try:
        with ConfinedFS(project, aliases=(WORKSPACE,)) as files:
            data = files.read_bytes(path, PREVIEW_BYTES)
    except FileNotFoundError:
        return None, None
    except OutsideRoot:
        return None, "the path leads outside the project: the tool will refuse it"
    except NotRegularFile:
        return None, "it is not a regular file"
    except FileTooLarge as e:
        return None, f"it is {e.size:,} bytes now, too big to compare"
    except (ConfinedError, OSError) as e:
        return None, f"it cannot be read now ({getattr(e, 'strerror', None) or e})"
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "it is not UTF-8 text now"


def _size(text: str) -> str:
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    return f"{lines} line{'' if lines == 1 else 's'}, {len(text.encode('utf-8')):,} bytes"


def _new_text(content: str, width: int) -> list[str]:
    if not content:
        return [INDENT + "(empty)"]
    return _block(_marked("+", _lines(content)), width)


def _lines(text: str) -> list[str]:
    """``text`` split after each newline, each line keeping its own."""
    return [line for line in _LINES.split(text) if line]


def _diff(before: str, after: str, names: tuple[str, str], width: int) -> list[str]:
    """A unified diff (3 lines of context) of the whole change."""
    lines = difflib.unified_diff(_lines(before), _lines(after), *names, lineterm="")
    out: list[str] = []
    for number, line in enumerate(lines):
        if number < 2 or line.startswith("@@"):  # the file names, a hunk's range
            out.append(line.rstrip("\n"))
        else:
            out += _marked(line[0], [line[1:]])
    return _block(out, width)


def _marked(mark: str, lines: list[str]) -> list[str]:
    """Diff lines: ``mark`` and the text, and diff's note for a last line with no newline."""
    out: list[str] = []
    for line in lines:
        if not line:
            continue
        if line.endswith("\n"):
            out.append(mark + line[:-1])
        else:
            out += [mark + line, "\\ No newline at end of file"]
    return out


def _block(lines: list[str], width: int) -> list[str]:
    """Each line indented and visible (tabs kept), wrapped to ``width`` columns."""
    room = max(width - len(INDENT), 20)
    out: list[str] = []
    for line in lines:
        text = visible(line, multiline=True)
        out.append(INDENT + text[:room])
        for at in range(room, len(text), room):
            out.append(WRAPPED + text[at : at + room])
    return out
