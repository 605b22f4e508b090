"""The tools a model can call, and the toolbox that runs them.

Each tool is a :class:`ToolSpec`: a name, a description and a JSON schema for
its arguments (sent to the model in OpenAI function-tool form by
:func:`tool_schemas`), and ``mutating``, which says whether the loop must ask
the user before running it. Approval is the loop's job, not the toolbox's.

* ``shell`` runs in the :class:`~agent.sandbox.Sandbox`.
* ``read_file``, ``write_file``, ``edit_file`` and ``list_files`` work on the
  project root directly on the host: it is the same directory the sandbox sees
  at /workspace, and the host is faster. A path is relative to the project
  root or absolute under /workspace; a path that leaves the project root (by
  ``..``, an absolute path elsewhere, or a symlink that points out) is refused.
* ``scratchpad`` and ``todo`` change only the agent state dict handed to the
  toolbox (``state["scratchpad"]: str``, ``state["todos"]: list of
  {"text": str, "done": bool}``); the loop persists it.

:meth:`Toolbox.run` never raises for a tool's own failure (unknown tool, bad
arguments, missing file, timeout, a failing sandbox): the model gets an error
text it can act on, and ``ok`` is False.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from agent.messages import ARGUMENTS_DEPTH
from agent.sandbox import WORKSPACE, Sandbox, SandboxError, truncate_middle
from objstore.limits import parse_json

RESULT_LIMIT = 40_000
"""Characters of a tool result the model gets; the middle of a longer one is cut.

Above the sandbox's own 30,000-byte output limit, so a shell result is cut once."""

SHELL_TIMEOUT = 60
SHELL_TIMEOUT_MAX = 600
READ_LINES = 2000
LIST_ENTRIES = 1000


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


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a tool call gives back to the model; ``ok`` is False for any failure."""

    content: str
    ok: bool


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
            "when the timeout passes.",
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
            f"Read a text file. Gives up to {READ_LINES} lines unless limit says otherwise; "
            "use offset to read further.",
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
            "Write content to a file, replacing it if it exists; missing directories are made.",
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
        self.root = Path(project_root).resolve()
        self.sandbox = sandbox
        self.state = state
        self.result_limit = result_limit
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
        except OSError as exc:
            content, ok = f"error: {_os_error(exc, self.root)}", False
        content, _ = truncate_middle(content, self.result_limit)
        return ToolOutcome(content, ok)

    # -- paths

    def _resolve(self, path: str) -> Path:
        """The host path for a tool's ``path``, or _ToolFailed if it leaves the project root."""
        if not path or "\0" in path:
            raise _ToolFailed("path is empty or contains a NUL character")
        given = PurePosixPath(path)
        if given.is_absolute():
            workspace = PurePosixPath(WORKSPACE)
            if given != workspace and workspace not in given.parents:
                raise _ToolFailed(
                    f"{path} is outside the project: use a path relative to the project root "
                    f"or under {WORKSPACE}"
                )
            given = given.relative_to(workspace)
        resolved = (self.root / given).resolve()  # follows symlinks, including dangling ones
        if resolved != self.root and self.root not in resolved.parents:
            raise _ToolFailed(f"{path} leads outside the project root; that is not allowed")
        return resolved

    def _shown(self, path: Path) -> str:
        rel = path.relative_to(self.root).as_posix()
        return "." if rel == "." else rel

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
        result = self.sandbox.run(args["command"], timeout)
        output = result.output
        if output and not output.endswith("\n"):
            output += "\n"
        if result.timed_out:
            raise _CommandFailed(
                f"{output}[timed out after {timeout} s: the command and all it started "
                f"were killed]{note}"
            )
        status = f"[exit code {result.exit_code}]{note}"
        if result.exit_code != 0:
            raise _CommandFailed(output + status)
        return output + status

    def _read_file(self, args: dict[str, Any]) -> str:
        path = self._resolve(args["path"])
        offset = args.get("offset", 1)
        limit = args.get("limit", READ_LINES)
        if offset < 1 or limit < 1:
            raise _ToolFailed("offset and limit must be at least 1")
        if path.is_dir():
            raise _ToolFailed(f"{args['path']} is a directory: use list_files")
        with path.open("rb") as f:
            if b"\0" in f.read(8192):
                size = path.stat().st_size
                raise _ToolFailed(f"{args['path']} is a binary file ({size} bytes)")
            f.seek(0)
            lines: list[str] = []
            total = 0
            for number, raw in enumerate(f, start=1):
                total = number
                if offset <= number < offset + limit:
                    lines.append(raw.decode("utf-8", errors="replace"))
        if total == 0:
            return f"({args['path']} is empty)"
        if offset > total:
            raise _ToolFailed(f"offset {offset} is past the end: {args['path']} has {total} lines")
        text = "".join(lines)
        last = offset + len(lines) - 1
        if offset > 1 or last < total:
            text += f"\n[lines {offset}-{last} of {total}]"
        return text

    def _write_file(self, args: dict[str, Any]) -> str:
        path = self._resolve(args["path"])
        if path.is_dir():
            raise _ToolFailed(f"{args['path']} is a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = args["content"].encode("utf-8")
        existed = path.exists()
        path.write_bytes(data)
        verb = "replaced" if existed else "created"
        return f"{verb} {self._shown(path)} ({len(data)} bytes)"

    def _edit_file(self, args: dict[str, Any]) -> str:
        path = self._resolve(args["path"])
        old: str = args["old"]
        if not old:
            raise _ToolFailed("old is empty: give the exact text to replace")
        if path.is_dir():
            raise _ToolFailed(f"{args['path']} is a directory")
        with path.open(encoding="utf-8", newline="") as f:  # keep \r\n as it is
            text = f.read()
        count = text.count(old)
        if count != 1:
            how = "does not occur" if count == 0 else f"occurs {count} times"
            raise _ToolFailed(
                f"old text {how} in {args['path']}; it must occur exactly once"
                + (" (include more surrounding lines)" if count > 1 else "")
            )
        at = text.index(old)
        with path.open("w", encoding="utf-8", newline="") as f:
            f.write(text[:at] + args["new"] + text[at + len(old) :])
        line = text.count("\n", 0, at) + 1
        return f"edited {self._shown(path)}: replaced 1 occurrence at line {line}"

    def _list_files(self, args: dict[str, Any]) -> str:
        top = self._resolve(args.get("path", "."))
        if not top.is_dir():
            raise _ToolFailed(f"{args.get('path', '.')} is not a directory")
        entries: list[str] = []
        for path in _walk(top, args.get("recursive", False)):
            if len(entries) == LIST_ENTRIES:
                entries.append("[... more entries not shown: list a subdirectory]")
                break
            shown = self._shown(path)
            entries.append(shown + "/" if path.is_dir() and not path.is_symlink() else shown)
        if not entries:
            return f"({args.get('path', '.')} is empty)"
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


class _ToolFailed(Exception):
    """A tool could not do what it was asked; the message is for the model."""


class _CommandFailed(Exception):
    """A shell command ran but failed (non-zero exit, timeout); its output is the content."""


def _walk(top: Path, recursive: bool) -> Iterator[Path]:
    """The entries under ``top`` in sorted order, without .git; symlinks are not entered."""
    try:
        children = sorted(p for p in top.iterdir() if p.name != ".git")
    except OSError:
        if recursive:
            return  # an unreadable subdirectory; the top one was checked by the caller
        raise
    for path in children:
        yield path
        if recursive and path.is_dir() and not path.is_symlink():
            yield from _walk(path, True)


def _os_error(exc: OSError, root: Path) -> str:
    where = exc.filename
    if isinstance(where, str) and where.startswith(str(root)):
        where = os.path.relpath(where, root)
    reason = exc.strerror or type(exc).__name__
    return f"{where}: {reason}" if where else reason


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
        try:
            arguments = parse_json(arguments, ARGUMENTS_DEPTH)
        except ValueError as exc:  # not JSON, or nested deeper than a message may be
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
                f"{spec.name}: {name} must be {article} {schema['type']}, not {value!r}"
            )
        if "enum" in schema and value not in schema["enum"]:
            raise _ToolFailed(
                f"{spec.name}: {name} must be one of {', '.join(schema['enum'])}, not {value!r}"
            )
        checked[name] = value
    return checked


def _coerced(value: Any, kind: str) -> Any:
    if kind == "integer":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
    if kind == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value
