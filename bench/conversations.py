"""Generated agent conversations: the workload both stores are measured on.

A ``Project`` is a deterministic set of source files and standing prompts.
A conversation over it is what a coding agent writes down: user prompts,
assistant messages with OpenAI-style ``tool_calls``, tool results holding
file contents or command output, and assistant replies. Like a real session
it repeats itself: a few hot files are read again and again, and the same
standing instructions are sent more than once. Tool-call ids are unique, as
they are in real transcripts, so a repeated file read is a new message.

Everything comes from ``random.Random(seed)``: the same seed gives the same
messages, byte for byte.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

# Word lists read better as one string each than as a column of literals.
_WORDS = (  # noqa: SIM905
    "request session buffer token parser config cache index record handler stream "
    "payload client server queue worker result error retry timeout offset batch "
    "schema field value entry path node graph store commit branch user model"
).split()
_VERBS = "load parse build check read write merge apply render fetch update resolve".split()  # noqa: SIM905
_TYPES = ("str", "int", "bytes", "float", "bool", "Path", "dict[str, Any]", "list[str]")
_ASKS = (
    "The test {test} fails with a KeyError; find out why and fix it.",
    "Add a --json flag to the {cmd} command and a test for it.",
    "Refactor {func} so it no longer reads the whole file into memory.",
    "Why is {func} slow on large inputs? Measure it, then make it faster.",
    "Rename {func} to something clearer and update every caller.",
)
_REPLIES = (
    "I found the cause: {func} assumed the {word} was always present. I added a guard "
    "and a regression test; the suite passes now.",
    "Done. {func} now streams the {word} in chunks of 64 KiB instead of reading it at "
    "once, and the memory use stays flat on a 2 GB input.",
    "The slow part was a quadratic loop in {func}: each {word} was searched in a list. "
    "It now uses a dict, and the benchmark went from 4.1 s to 0.2 s.",
)
_STANDING_PROMPTS = (
    "Project rules: run `uv run pytest -q` before you say you are done; keep functions "
    "small with type hints and docstrings; never commit; ask before deleting files; "
    "prefer the standard library; follow the existing layout of the package. " * 3,
    "Context: this is a Python 3.11 service managed with uv. The CI runs ruff, mypy "
    "--strict and pytest on every push. Tests must use real files in tmp_path rather "
    "than mocks, and every public function needs a docstring. " * 3,
)


@dataclass(frozen=True, slots=True)
class Project:
    """The repository a generated agent works on: source files and standing prompts."""

    files: dict[str, str]
    prompts: tuple[str, ...]

    @property
    def paths(self) -> list[str]:
        return sorted(self.files)


def make_project(seed: int, n_files: int = 40) -> Project:
    """A project of ``n_files`` source-like Python files of about 1-6 KB each."""
    rng = random.Random(seed)
    files = {}
    for i in range(n_files):
        path = f"src/app/{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{i}.py"
        files[path] = _source_file(rng, n_funcs=rng.randint(3, 14))
    return Project(files=files, prompts=_STANDING_PROMPTS)


def _identifier(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)}_{rng.choice(_WORDS)}"


def _source_file(rng: random.Random, n_funcs: int) -> str:
    header = f'"""The {rng.choice(_WORDS)} {rng.choice(_WORDS)} module."""\n\n'
    header += "from __future__ import annotations\n\nimport os\nfrom typing import Any\n\n"
    return header + "\n\n".join(_source_function(rng) for _ in range(n_funcs))


def _source_function(rng: random.Random) -> str:
    name, arg, other = _identifier(rng), rng.choice(_WORDS), rng.choice(_WORDS)
    kind = rng.choice(_TYPES)
    lines = [
        f"def {name}({arg}: {kind}, {other}: int = {rng.randint(0, 64)}) -> {rng.choice(_TYPES)}:",
        f'    """{name.replace("_", " ").capitalize()} from the {arg} and its {other}."""',
        "    out = []",
        f"    for i, item in enumerate({arg}):",
        f"        if i >= {other}:",
        "            break",
        f"        out.append({_identifier(rng)}(item, {rng.choice(_WORDS)}=i))",
    ]
    if rng.random() < 0.5:
        lines += [
            "    if not out:",
            f'        raise ValueError(f"no {rng.choice(_WORDS)} in {{{arg}!r}}")',
        ]
    lines.append(f"    return {_identifier(rng)}(out)")
    return "\n".join(lines) + "\n"


class Conversation:
    """An endless agent transcript over a project; ``take(n)`` gives the next ``n`` messages."""

    def __init__(self, project: Project, seed: int) -> None:
        self.project = project
        self._rng = random.Random(seed)
        self._paths = project.paths
        # A few hot files take most reads, the way an agent keeps reopening what it edits.
        self._weights = [1.0 / (rank + 1) for rank in range(len(self._paths))]
        self._messages = self._turns()

    def take(self, n: int) -> list[Message]:
        return [next(self._messages) for _ in range(n)]

    def _turns(self) -> Iterator[Message]:
        turn = 0
        while True:
            if turn % 8 == 0:
                yield {"role": "user", "content": self._rng.choice(self.project.prompts)}
            yield {"role": "user", "content": self._fill(self._rng.choice(_ASKS))}
            for _ in range(self._rng.randint(1, 4)):
                yield from self._tool_round()
            yield {"role": "assistant", "content": self._fill(self._rng.choice(_REPLIES))}
            turn += 1

    def _tool_round(self) -> Iterator[Message]:
        """One assistant message calling 1-3 tools, then one result per call."""
        calls = [self._tool_call() for _ in range(self._rng.randint(1, 3))]
        yield {
            "role": "assistant",
            "content": self._fill("Let me look at {func} and the {word} handling first."),
            "tool_calls": [call for call, _ in calls],
        }
        for call, result in calls:
            yield {"role": "tool", "tool_call_id": call["id"], "content": result}

    def _tool_call(self) -> tuple[Message, str]:
        """A tool call and the text its result holds."""
        kind = self._rng.choices(("read", "grep", "test", "edit"), weights=(5, 2, 2, 1))[0]
        if kind == "read":
            path = self._rng.choices(self._paths, weights=self._weights)[0]
            name, args, result = "read_file", {"path": path}, self.project.files[path]
        elif kind == "grep":
            word = self._rng.choice(_WORDS)
            name, args, result = "grep", {"pattern": word, "path": "src"}, self._grep(word)
        elif kind == "test":
            name, args = "run_command", {"command": "uv run pytest -q"}
            result = self._test_output()
        else:
            path = self._rng.choice(self._paths)
            old = self._identifier()
            args = {"path": path, "old": old, "new": old + "_checked"}
            name, result = "edit_file", f"Edited {path}: 1 replacement."
        call = {
            "id": f"call_{self._rng.getrandbits(96):024x}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        return call, result

    def _grep(self, word: str) -> str:
        hits = []
        for path in self._rng.sample(self._paths, 6):
            for lineno, line in enumerate(self.project.files[path].splitlines(), 1):
                if word in line:
                    hits.append(f"{path}:{lineno}:{line}")
        return "\n".join(hits[:40]) or "(no matches)"

    def _test_output(self) -> str:
        passed = self._rng.randint(40, 400)
        lines = [f"tests/test_{self._rng.choice(_WORDS)}.py {'.' * 60}" for _ in range(6)]
        if self._rng.random() < 0.4:
            func = self._identifier()
            lines += [
                f"FAILED tests/test_{self._rng.choice(_WORDS)}.py::test_{func} - KeyError: "
                f"'{self._rng.choice(_WORDS)}'",
                f"1 failed, {passed} passed in {self._rng.uniform(1, 30):.2f}s",
            ]
        else:
            lines.append(f"{passed} passed in {self._rng.uniform(1, 30):.2f}s")
        return "\n".join(lines)

    def _identifier(self) -> str:
        return _identifier(self._rng)

    def _fill(self, template: str) -> str:
        return template.format(
            func=self._identifier(),
            word=self._rng.choice(_WORDS),
            test=f"test_{self._identifier()}",
            cmd=self._rng.choice(_WORDS),
        )


def summary_text(seed: int) -> str:
    """A compaction summary of about 1.5 KB, like the ones agents write."""
    rng = random.Random(seed)
    points = [
        f"- {_identifier(rng).replace('_', ' ').capitalize()}: changed the {rng.choice(_WORDS)} "
        f"handling in src/app/{rng.choice(_WORDS)}.py; tests pass."
        for _ in range(18)
    ]
    return "Summary of the session so far:\n" + "\n".join(points)
