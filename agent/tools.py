"""The tools a model can call, and the toolbox that runs them.

Each tool is a :class:`ToolSpec`: a name, a description and a JSON schema for
its arguments (sent to the model in OpenAI function-tool form by
:func:`tool_schemas`), and ``mutating``, which says whether the loop must ask
the user before running it. Approval is the loop's job, not the toolbox's.

* ``shell`` runs in the :class:`~agent.sandbox.Sandbox`.
* ``read_file``, ``write_file``, ``edit_file`` and ``list_files`` work on the
  project root directly on the host: it is the same directory the sandbox sees
  at /workspace, and the host is faster. Every one of them goes through the
  toolbox's :class:`~agent.confined.ConfinedFS`, whose walk cannot be raced
  out of the project by a command in the sandbox swapping directories for
  symlinks. A path is relative to the project root or absolute under
  /workspace; a path that leaves the project root (by ``..``, an absolute path
  elsewhere, or a symlink that points out) is refused. Reads take regular
  files only and are bounded in bytes (READ_BYTES given back, SCAN_BYTES
  read, EDIT_BYTES for an edit); writes replace a file atomically. What
  ``write_file`` and ``edit_file`` change is given back in
  :attr:`ToolOutcome.files` (the content before and after), which the loop
  stores on the tool result's node, so that ``rewind --files`` can put it
  back (agent/checkpoints.py). A ``shell`` command's effects are not
  recorded: they cannot be undone.
* ``scratchpad`` and ``todo`` change only the agent state dict handed to the
  toolbox (``state["scratchpad"]: str``, ``state["todos"]: list of
  {"text": str, "done": bool}``); the loop persists it.

:meth:`Toolbox.run` never raises for a tool's own failure (unknown tool, bad
arguments, missing file, timeout, a failing sandbox): the model gets an error
text it can act on, and ``ok`` is False.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, BinaryIO

from agent.confined import ConfinedError, ConfinedFS, FileTooLarge, OutsideRoot
from agent.messages import ARGUMENTS_DEPTH
from agent.sandbox import WORKSPACE, Sandbox, SandboxError, truncate_middle
from objstore import MAX_OBJECT_BYTES, InvalidInput, NestingTooDeep, check_file_path, parse_json

RESULT_LIMIT = 40_000
"""Characters of a tool result the model gets; the middle of a longer one is cut.

Above the sandbox's own 30,000-byte output limit, so a shell result is cut once."""

SHELL_TIMEOUT = 60
SHELL_TIMEOUT_MAX = 600
READ_LINES = 2000
READ_BYTES = 32_000
"""Bytes of a file one read_file gives back (whole lines; the start of one longer line)."""
SCAN_BYTES = 64 * 1024 * 1024
"""Bytes of a file one read_file reads at most, to count its lines and reach ``offset``."""
EDIT_BYTES = 8 * 1024 * 1024
"""The largest file edit_file changes (it holds the file in memory, twice)."""
LIST_ENTRIES = 1000
ARGUMENTS_CHARS = 4 * 1024 * 1024
"""The longest tool arguments, as JSON text, that a call may carry."""

_SHELL_STATUS = re.compile(r"^\[(exit code -?\d+|timed out after \d+ s)\b[^\n]*", re.M)
_SNIFF = 8192  # bytes looked at for a NUL to call a file binary
_CHUNK = 64 * 1024
_UNLISTED = frozenset({".git"})
_DENIED = "Permission denied"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool as the model sees it, and whether running it needs the user's approval."""

    name: str
    description: str
    parameters: dict[str, Any]
    mutating: bool

    def schema(self) -> dict[str, Any]:
        """The tool in OpenAI function-tool form (Ollama takes the same)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


FileChanges = dict[str, tuple[bytes | None, bytes | None]]
"""Project-relative path -> (content before, content after); None: no file."""


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a tool call gives back to the model; ``ok`` is False for any failure.
    ``files``: what it changed in the project (write_file, edit_file)."""

    content: str
    ok: bool
    files: FileChanges = field(default_factory=dict)


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_PATH = {
    "type": "string",
    "description": "A path relative to the project root, or absolute under /workspace.",
}

TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in [
        ToolSpec(
            "shell",
            "Run a shell command (sh -c) in the sandbox, in /workspace, which is the project "
            "root. No network. stdout and stderr come back together, with the exit code; "
            "long output is cut in the middle. The command and all it started are killed "
            "when the timeout passes, and anything it leaves running in the background is "
            "killed when it ends.",
            _object(
                {
                    "command": {"type": "string", "description": "The command for sh -c."},
                    "timeout": {
                        "type": "integer",
                        "description": f"Seconds before the command is killed; default "
                        f"{SHELL_TIMEOUT}, at most {SHELL_TIMEOUT_MAX}.",
                    },
                },
                ["command"],
            ),
            mutating=True,
        ),
        ToolSpec(
            "read_file",
            f"Read a text file. Gives up to {READ_LINES} lines (and {READ_BYTES} bytes) "
            "unless limit says otherwise; use offset to read further.",
            _object(
                {
                    "path": _PATH,
                    "offset": {"type": "integer", "description": "First line to read, from 1."},
                    "limit": {"type": "integer", "description": "How many lines to read."},
                },
                ["path"],
            ),
            mutating=False,
        ),
        ToolSpec(
            "write_file",
            "Write content to a file, replacing it whole if it exists; missing directories "
            "are made.",
            _object(
                {"path": _PATH, "content": {"type": "string", "description": "The whole file."}},
                ["path", "content"],
            ),
            mutating=True,
        ),
        ToolSpec(
            "edit_file",
            "Replace one exact piece of text in a file. old must occur exactly once: include "
            "enough surrounding lines to make it unique.",
            _object(
                {
                    "path": _PATH,
                    "old": {"type": "string", "description": "The exact text to replace."},
                    "new": {"type": "string", "description": "The text to put in its place."},
                },
                ["path", "old", "new"],
            ),
            mutating=True,
        ),
        ToolSpec(
            "list_files",
            f"List a directory (default: the project root); directories end in /. recursive "
            f"lists the whole tree, skipping .git, at most {LIST_ENTRIES} entries.",
            _object(
                {
                    "path": _PATH,
                    "recursive": {"type": "boolean", "description": "List the whole tree."},
                },
                [],
            ),
            mutating=False,
        ),
        ToolSpec(
            "scratchpad",
            "Your notes, kept across turns and resumes: read them, replace them (write), or "
            "add to them (append).",
            _object(
                {
                    "action": {"type": "string", "enum": ["read", "write", "append"]},
                    "text": {"type": "string", "description": "For write and append."},
                },
                ["action"],
            ),
            mutating=False,
        ),
        ToolSpec(
            "todo",
            "Your todo list, kept across turns and resumes: list it, add an item, mark one "
            "done, or remove one. Items are numbered from 1.",
            _object(
                {
                    "action": {"type": "string", "enum": ["list", "add", "done", "remove"]},
                    "text": {"type": "string", "description": "For add."},
                    "index": {"type": "integer", "description": "For done and remove."},
                },
                ["action"],
            ),
            mutating=False,
        ),
    ]
}


def tool_schemas() -> list[dict[str, Any]]:
    """Every tool in OpenAI function-tool form, for the model request."""
    return [spec.schema() for spec in TOOLS.values()]


class Toolbox:
    """Runs tool calls for one session over ``project_root``, its sandbox and its state."""

    def __init__(
        self,
        project_root: Path,
        sandbox: Sandbox | None,
        state: dict[str, Any],
        *,
        result_limit: int = RESULT_LIMIT,
    ) -> None:
        self.files = ConfinedFS(project_root, aliases=(WORKSPACE,))
        self.root = self.files.root
        self.sandbox = sandbox
        self.state = state
        self.result_limit = result_limit
        self._changed: FileChanges = {}  # what the running call changed
        self._handlers: dict[str, Callable[[dict[str, Any]], str]] = {
            "shell": self._shell,
            "read_file": self._read_file,
            "write_file": self._write_file,
            "edit_file": self._edit_file,
            "list_files": self._list_files,
            "scratchpad": self._scratchpad,
            "todo": self._todo,
        }

    def run(self, name: str, arguments: dict[str, Any] | str | None) -> ToolOutcome:
        """Run tool ``name``; ``arguments`` may be a dict or its JSON text."""
        spec = TOOLS.get(name)
        if spec is None:
            return ToolOutcome(
                f"error: there is no tool {name!r}; the tools are {', '.join(TOOLS)}", False
            )
        self._changed = {}
        try:
            args = _checked_arguments(spec, arguments)
            content = self._handlers[name](args)
            ok = True
        except _CommandFailed as failed:
            content, ok = str(failed), False
        except _ToolFailed as failed:
            content, ok = f"error: {failed}", False
        except SandboxError as exc:
            content, ok = f"error: the sandbox failed: {exc}", False
        except OutsideRoot as exc:
            hint = ""
            if PurePosixPath(exc.path).is_absolute():
                hint = f": use a path relative to the project root or under {WORKSPACE}"
            content, ok = f"error: {exc}{hint}", False
        except ConfinedError as exc:
            content, ok = f"error: {exc}", False
        except OSError as exc:
            content, ok = f"error: {_os_error(exc)}", False
        content, _ = truncate_middle(content, self.result_limit)
        changed, self._changed = self._changed, {}
        return ToolOutcome(content, ok, changed)

    def close(self) -> None:
        """Let go of the project's directory fd (a dropped toolbox does so when collected)."""
        self.files.close()

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the tools

    def _shell(self, args: dict[str, Any]) -> str:
        if self.sandbox is None:
            raise _ToolFailed("there is no sandbox in this session, so shell cannot run")
        timeout = args.get("timeout", SHELL_TIMEOUT)
        if timeout < 1:
            raise _ToolFailed("timeout must be at least 1 second")
        note = ""
        if timeout > SHELL_TIMEOUT_MAX:
            timeout = SHELL_TIMEOUT_MAX
            note = f" (timeout capped at {SHELL_TIMEOUT_MAX} s)"
        if "\x00" in args["command"]:  # exec refuses it ("invalid argument")
            raise _ToolFailed("command contains a NUL character, which no command can hold")
        result = self.sandbox.run(args["command"], timeout)
        output = result.output
        if output and not output.endswith("\n"):
            output += "\n"
        if result.notice:
            output = f"[{result.notice}]\n{output}"
        if result.timed_out:
            raise _CommandFailed(
                f"{output}[timed out after {timeout} s: the command and all it started "
                f"were killed]{note}"
            )
        status = f"[exit code {result.exit_code}]{note}"
        if result.exit_code != 0:
            if not self.sandbox.can_write_project and _DENIED in output:
                status += f"\n[{self.sandbox.write_note()}]"
            raise _CommandFailed(output + status)
        return output + status

    def _read_file(self, args: dict[str, Any]) -> str:
        given = args["path"]
        offset = args.get("offset", 1)
        limit = args.get("limit", READ_LINES)
        if offset < 1 or limit < 1:
            raise _ToolFailed("offset and limit must be at least 1")
        try:
            f = self.files.open_file(given)
        except IsADirectoryError:
            raise _ToolFailed(f"{given} is a directory: use list_files") from None
        with f:
            head = f.read(_SNIFF)
            if b"\0" in head:
                size = os.fstat(f.fileno()).st_size
                raise _ToolFailed(f"{given} is a binary file ({size} bytes)")
            f.seek(0)
            page = _page(f, offset, limit)
        if page.total == 0:
            return f"({given} is empty)"
        if page.last < offset:
            if page.total is None:
                raise _ToolFailed(
                    f"offset {offset} is past the first {SCAN_BYTES} bytes of {given}, which "
                    f"hold {page.counted} lines; read further with shell "
                    f"(sed -n '{offset},+{limit - 1}p' {given})"
                )
            raise _ToolFailed(f"offset {offset} is past the end: {given} has {page.total} lines")
        text = page.text.decode("utf-8", errors="replace")
        of = f"{page.total}" if page.total is not None else f"at least {page.counted}"
        if page.cut_line:
            return text + f"\n[line {page.last} of {of} is cut after its first {READ_BYTES} bytes]"
        if page.full:
            return text + (
                f"\n[lines {offset}-{page.last} of {of}; cut at {READ_BYTES} bytes: read on "
                f"with offset={page.last + 1}]"
            )
        if offset > 1 or page.total is None or page.last < page.total:
            text += f"\n[lines {offset}-{page.last} of {of}]"
        return text

    def _write_file(self, args: dict[str, Any]) -> str:
        data = _utf8(args["content"], "content")
        before = self._content_before(args["path"])
        try:
            written = self.files.write_bytes(args["path"], data)
        except IsADirectoryError:
            raise _ToolFailed(f"{args['path']} is a directory") from None
        self._record(written.path, before, data)
        verb = "created" if written.created else "replaced"
        return f"{verb} {written.path} ({len(data)} bytes)"

    def _edit_file(self, args: dict[str, Any]) -> str:
        given = args["path"]
        old: str = args["old"]
        if not old:
            raise _ToolFailed("old is empty: give the exact text to replace")
        try:
            raw = self.files.read_bytes(given, EDIT_BYTES)
        except IsADirectoryError:
            raise _ToolFailed(f"{given} is a directory") from None
        except FileTooLarge as exc:
            raise _ToolFailed(
                f"{given} is {exc.size} bytes; edit_file works on files up to {EDIT_BYTES} "
                "bytes: change it with shell"
            ) from None
        try:
            text = raw.decode("utf-8")  # \r\n stays as it is
        except UnicodeDecodeError as exc:
            raise _ToolFailed(
                f"{given} is not UTF-8 text (byte {exc.start}): edit it with shell"
            ) from None
        count = text.count(old)
        if count != 1:
            how = "does not occur" if count == 0 else f"occurs {count} times"
            raise _ToolFailed(
                f"old text {how} in {given}; it must occur exactly once"
                + (" (include more surrounding lines)" if count > 1 else "")
            )
        at = text.index(old)
        new = _utf8(text[:at] + args["new"] + text[at + len(old) :], "new")
        written = self.files.write_bytes(given, new, make_parents=False)
        self._record(written.path, raw, new)
        line = text.count("\n", 0, at) + 1
        return f"edited {written.path}: replaced 1 occurrence at line {line}"

    def _content_before(self, path: str) -> bytes | None:
        """What a write to ``path`` will replace: the regular file's bytes, or None.
        A file too big to keep as one object is refused: its write could not be undone."""
        try:
            if self.files.kind(path) != "file":
                return None  # nothing there yet (a directory or device fails the write)
            return self.files.read_bytes(path, MAX_OBJECT_BYTES)
        except FileNotFoundError:
            return None
        except FileTooLarge as exc:
            raise _ToolFailed(
                f"{path} is {exc.size} bytes, more than ags keeps to undo a write "
                f"({MAX_OBJECT_BYTES}): change it with shell"
            ) from None

    def _record(self, path: str, before: bytes | None, after: bytes) -> None:
        """Remember what this call changed, for the tool result's node."""
        if before == after:
            return
        try:
            check_file_path(path)
        except InvalidInput:
            return  # a name the store cannot record (not UTF-8): the write stands unrecorded
        first = self._changed.get(path, (before, after))[0]
        self._changed[path] = (first, after)

    def _list_files(self, args: dict[str, Any]) -> str:
        given = args.get("path", ".")
        entries: list[str] = []
        try:
            for entry in self.files.walk(
                given, recursive=args.get("recursive", False), limit=LIST_ENTRIES, skip=_UNLISTED
            ):
                if entry is None:
                    entries.append("[... more entries not shown: list a subdirectory]")
                    break
                entries.append(entry.path + "/" if entry.is_dir else entry.path)
        except NotADirectoryError:
            raise _ToolFailed(f"{given} is not a directory") from None
        if not entries:
            return f"({given} is empty)"
        return "\n".join(entries)

    def _scratchpad(self, args: dict[str, Any]) -> str:
        action = args["action"]
        current = str(self.state.get("scratchpad") or "")
        if action == "read":
            return current or "(the scratchpad is empty)"
        text = args.get("text")
        if text is None:
            raise _ToolFailed(f"scratchpad {action} needs text")
        if action == "write":
            self.state["scratchpad"] = text
        else:
            joiner = "\n" if current and not current.endswith("\n") else ""
            self.state["scratchpad"] = current + joiner + text
        return f"scratchpad saved ({len(self.state['scratchpad'])} characters)"

    def _todo(self, args: dict[str, Any]) -> str:
        action = args["action"]
        todos: list[dict[str, Any]] = self.state.setdefault("todos", [])
        if action == "add":
            text = args.get("text")
            if not text:
                raise _ToolFailed("todo add needs text")
            todos.append({"text": text, "done": False})
        elif action in ("done", "remove"):
            index = args.get("index")
            if index is None:
                raise _ToolFailed(f"todo {action} needs index")
            if not 1 <= index <= len(todos):
                raise _ToolFailed(f"no todo item {index}: the list has {len(todos)} items")
            if action == "done":
                todos[index - 1]["done"] = True
            else:
                del todos[index - 1]
        if not todos:
            return "(the todo list is empty)"
        return "\n".join(
            f"{n}. [{'x' if item['done'] else ' '}] {item['text']}"
            for n, item in enumerate(todos, start=1)
        )


def shell_status(content: str) -> tuple[str, str | None]:
    """A ``shell`` result split into the command's output and its status
    ("exit code 0", "timed out after 60 s"), from the status line ``_shell``
    ends every result with; (content, None) for a result without one (an error
    before the command ran)."""
    found = list(_SHELL_STATUS.finditer(content))
    if not found:
        return content, None
    return content[: found[-1].start()], found[-1].group(1)


class _ToolFailed(Exception):
    """A tool could not do what it was asked; the message is for the model."""


class _CommandFailed(Exception):
    """A shell command ran but failed (non-zero exit, timeout); its output is the content."""


@dataclass(frozen=True, slots=True)
class _Page:
    """The lines of a file that one read_file gives back.

    ``text`` is whole lines from the offset asked for to ``last`` (none when
    ``last`` is before the offset), or with ``cut_line`` the start of line
    ``last`` alone, which passed READ_BYTES. ``full``: the next wanted line did
    not fit in READ_BYTES. ``total`` is the file's line count, None when
    counting stopped at SCAN_BYTES, having seen ``counted`` lines (the last
    perhaps in part).
    """

    text: bytes
    last: int
    total: int | None
    counted: int
    full: bool
    cut_line: bool


def _page(f: BinaryIO, offset: int, limit: int) -> _Page:
    """Lines ``offset``.. ``offset + limit - 1`` of ``f``, read in chunks: memory
    stays within READ_BYTES plus a chunk however long the lines are."""
    out = bytearray()
    line = 1  # the line the next byte belongs to
    line_began = 0  # len(out) where the current line began
    line_bytes = 0  # bytes of the current line read so far
    last = offset - 1
    full = cut_line = False
    scanned = 0
    ended = False
    while scanned < SCAN_BYTES:
        chunk = f.read(min(_CHUNK, SCAN_BYTES - scanned))
        if not chunk:
            ended = True
            break
        scanned += len(chunk)
        at = 0
        while at < len(chunk):
            newline = chunk.find(b"\n", at)
            end = len(chunk) if newline < 0 else newline + 1
            if offset <= line < offset + limit and not full:
                piece = chunk[at:end]
                if len(out) + len(piece) <= READ_BYTES:
                    out += piece
                elif line == offset:  # the first line alone is too long: keep its start
                    out += piece[: READ_BYTES - len(out)]
                    full = cut_line = True
                    last = line
                else:
                    del out[line_began:]  # only whole lines
                    full = True
            line_bytes += end - at
            if newline >= 0:
                if offset <= line < offset + limit and not full:
                    last = line
                line += 1
                line_began = len(out)
                line_bytes = 0
            at = end
    if ended and line_bytes and offset <= line < offset + limit and not full:
        last = line  # the last line, without a newline
    seen = line - 1 + (1 if line_bytes else 0)
    return _Page(bytes(out), last, seen if ended else None, seen, full, cut_line)


def _utf8(text: str, name: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _ToolFailed(
            f"{name} holds a character that cannot be written as UTF-8 "
            f"({text[exc.start]!r} at {exc.start}, a lone surrogate)"
        ) from None


def _os_error(exc: OSError) -> str:
    reason = exc.strerror or type(exc).__name__
    return f"{exc.filename}: {reason}" if exc.filename else reason


_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
}


def _checked_arguments(spec: ToolSpec, arguments: dict[str, Any] | str | None) -> dict[str, Any]:
    """The arguments checked against the tool's schema, with light repairs.

    Models (small local ones most) send ``"5"`` for 5 and ``"true"`` for true,
    or the arguments as JSON text; those are accepted. Anything else wrong is a
    _ToolFailed that says what the schema wants.
    """
    if arguments is None or arguments == "":
        arguments = {}
    if isinstance(arguments, str):
        if len(arguments) > ARGUMENTS_CHARS:
            raise _ToolFailed(
                f"the arguments for {spec.name} are {len(arguments)} characters long, more than "
                f"the {ARGUMENTS_CHARS} allowed"
            )
        try:
            arguments = parse_json(arguments, ARGUMENTS_DEPTH)
        except NestingTooDeep as exc:
            raise _ToolFailed(
                f"the arguments for {spec.name} are nested too deeply: {exc}"
            ) from None
        except ValueError as exc:
            raise _ToolFailed(f"the arguments for {spec.name} are not valid JSON: {exc}") from exc
    if not isinstance(arguments, dict):
        raise _ToolFailed(f"the arguments for {spec.name} must be a JSON object")
    properties: dict[str, Any] = spec.parameters["properties"]
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        raise _ToolFailed(
            f"{spec.name} takes no argument {', '.join(unknown)}; "
            f"it takes {', '.join(properties) or 'none'}"
        )
    missing = [name for name in spec.parameters["required"] if arguments.get(name) is None]
    if missing:
        raise _ToolFailed(f"{spec.name} needs {', '.join(missing)}")
    checked: dict[str, Any] = {}
    for name, value in arguments.items():
        if value is None:
            continue  # an optional argument sent as null means "not given"
        schema = properties[name]
        value = _coerced(value, schema["type"])
        wanted = _TYPES[schema["type"]]
        if not isinstance(value, wanted) or (
            schema["type"] == "integer" and isinstance(value, bool)
        ):
            article = "an" if schema["type"] == "integer" else "a"
            raise _ToolFailed(
                f"{spec.name}: {name} must be {article} {schema['type']}, not {_brief(value)}"
            )
        if "enum" in schema and value not in schema["enum"]:
            raise _ToolFailed(
                f"{spec.name}: {name} must be one of {', '.join(schema['enum'])}, "
                f"not {_brief(value)}"
            )
        checked[name] = value
    return checked


def _coerced(value: Any, kind: str) -> Any:
    if kind == "integer":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            try:
                return int(value)
            except ValueError:  # "²" is a digit too, and 5,000 digits are past the limit
                return value  # not an integer here: the check below says so
    if kind == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _brief(value: Any) -> str:
    """A wrong argument, shown short: a model may send anything, nested any deep."""
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
