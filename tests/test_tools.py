"""The agent's tools: files on the host, shell in a real sandbox, notes in the state."""

from __future__ import annotations

import json
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from docker_fixture import owned_project, require_docker
from hazards import deadline, deep_tree

from agent import tools
from agent.confined import MAX_DEPTH
from agent.sandbox import Sandbox
from agent.tools import (
    ARGUMENTS_CHARS,
    EDIT_BYTES,
    LIST_ENTRIES,
    READ_BYTES,
    TOOLS,
    Toolbox,
    tool_schemas,
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "README.md").write_text("# demo\n")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("def main():\n    return 1\n")
    return root


@pytest.fixture
def state() -> dict[str, Any]:
    return {}


@pytest.fixture
def box(project: Path, state: dict[str, Any]) -> Toolbox:
    return Toolbox(project, None, state)


# -- the schemas


def test_every_tool_has_an_openai_function_schema() -> None:
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(TOOLS)
    for schema in schemas:
        assert schema["type"] == "function"
        assert schema["function"]["description"]
        assert schema["function"]["parameters"]["type"] == "object"
    json.dumps(schemas)  # sent as JSON as it is
    mutating = {name for name, spec in TOOLS.items() if spec.mutating}
    assert mutating == {"shell", "write_file", "edit_file"}


# -- files


def test_read_file_gives_the_text_and_pages_by_lines(box: Toolbox, project: Path) -> None:
    assert box.run("read_file", {"path": "src/app.py"}).content == "def main():\n    return 1\n"
    (project / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    page = box.run("read_file", {"path": "/workspace/long.txt", "offset": 3, "limit": 2})
    assert page.ok
    assert page.content == "line 3\nline 4\n\n[lines 3-4 of 10]"


def test_read_file_failures_are_error_text(box: Toolbox, project: Path) -> None:
    missing = box.run("read_file", {"path": "nope.txt"})
    assert not missing.ok
    assert missing.content == "error: nope.txt: No such file or directory"
    (project / "blob.bin").write_bytes(b"\x00\x01" * 10)
    assert "binary file (20 bytes)" in box.run("read_file", {"path": "blob.bin"}).content
    folder = box.run("read_file", {"path": "src"})
    assert folder.content == "error: src is a directory: use list_files"
    past = box.run("read_file", {"path": "README.md", "offset": 5})
    assert "past the end" in past.content and "1 lines" in past.content


def test_a_huge_result_is_cut_in_the_middle_with_a_marker(project: Path) -> None:
    state = {"scratchpad": "x" * 100_000}
    out = Toolbox(project, None, state, result_limit=1000).run("scratchpad", {"action": "read"})
    assert out.ok
    assert "[... 99000 characters cut here by ags ...]" in out.content
    assert len(out.content) < 1100


def test_read_file_gives_whole_lines_up_to_its_byte_limit(box: Toolbox, project: Path) -> None:
    line = "y" * 99 + "\n"
    (project / "wide.txt").write_text(line * 1000)  # 100,000 bytes in 1000 lines
    out = box.run("read_file", {"path": "wide.txt"})
    assert out.ok
    shown = READ_BYTES // 100
    assert out.content == line * shown + (
        f"\n[lines 1-{shown} of 1000; cut at {READ_BYTES} bytes: read on with offset={shown + 1}]"
    )
    rest = box.run("read_file", {"path": "wide.txt", "offset": 991})
    assert rest.content == line * 10 + "\n[lines 991-1000 of 1000]"


def test_read_file_of_a_one_line_300_mb_file_keeps_memory_bounded(
    box: Toolbox, project: Path
) -> None:
    with open(project / "one-line.txt", "wb") as f:
        for _ in range(300):
            f.write(b"z" * (1 << 20))
    tracemalloc.start()
    try:
        out = box.run("read_file", {"path": "one-line.txt"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.ok
    note = f"[line 1 of at least 1 is cut after its first {READ_BYTES} bytes]"
    assert out.content == "z" * READ_BYTES + "\n" + note
    assert peak < 2_000_000, f"reading it peaked at {peak} bytes"


def test_read_file_counts_lines_only_so_far(
    box: Toolbox, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tools, "SCAN_BYTES", 1000)
    (project / "long.txt").write_text("".join(f"{n:09}\n" for n in range(1, 1001)))  # 10 KB
    first = box.run("read_file", {"path": "long.txt", "limit": 2})
    assert first.content == "000000001\n000000002\n\n[lines 1-2 of at least 100]"
    past = box.run("read_file", {"path": "long.txt", "offset": 500})
    assert not past.ok
    assert past.content == (
        "error: offset 500 is past the first 1000 bytes of long.txt, which hold 100 lines; "
        "read further with shell (sed -n '500,+1999p' long.txt)"
    )


def test_read_file_of_a_fifo_fails_at_once(box: Toolbox, project: Path) -> None:
    os.mkfifo(project / "pipe")
    with deadline(5):  # the old read_file blocked here for good, and ags run with it
        out = box.run("read_file", {"path": "pipe"})
    assert not out.ok and out.content == "error: pipe is a FIFO, not a regular file"


def test_edit_file_refuses_what_it_cannot_hold_or_decode(box: Toolbox, project: Path) -> None:
    (project / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    out = box.run("edit_file", {"path": "latin1.txt", "old": "caf", "new": "tea"})
    assert not out.ok
    assert out.content == "error: latin1.txt is not UTF-8 text (byte 3): edit it with shell"
    with open(project / "huge.txt", "wb") as f:
        f.truncate(EDIT_BYTES + 1)
    big = box.run("edit_file", {"path": "huge.txt", "old": "a", "new": "b"})
    assert not big.ok and f"edit_file works on files up to {EDIT_BYTES} bytes" in big.content
    assert (project / "latin1.txt").read_bytes() == b"caf\xe9\n"


def test_text_that_is_not_unicode_is_an_error_not_a_crash(box: Toolbox, project: Path) -> None:
    out = box.run("write_file", '{"path": "s.txt", "content": "a\\ud800b"}')
    assert not out.ok and "lone surrogate" in out.content
    assert not (project / "s.txt").exists()


def test_arguments_nested_too_deep_or_too_large_are_errors(box: Toolbox) -> None:
    deep = box.run("read_file", '{"path": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert not deep.ok and "nested too deeply" in deep.content
    huge = box.run("write_file", '{"path": "x", "content": "' + "a" * ARGUMENTS_CHARS + '"}')
    assert not huge.ok and "more than the" in huge.content


def test_list_files_of_a_very_deep_tree_is_an_answer_not_a_crash(project: Path) -> None:
    box = Toolbox(project, None, {}, result_limit=1_000_000)
    with deep_tree(project, 1500):  # deeper than Python's recursion limit
        out = box.run("list_files", {"recursive": True})
    assert out.ok
    chain = [line for line in out.content.splitlines() if line.startswith("d/")]
    assert chain == ["d/" * n for n in range(1, MAX_DEPTH + 1)]


def test_write_file_creates_directories_and_replaces(box: Toolbox, project: Path) -> None:
    made = box.run("write_file", {"path": "docs/new/notes.md", "content": "one\n"})
    assert made.ok and made.content == "created docs/new/notes.md (4 bytes)"
    again = box.run("write_file", {"path": "/workspace/docs/new/notes.md", "content": "two\r\n"})
    assert again.content == "replaced docs/new/notes.md (5 bytes)"
    assert (project / "docs/new/notes.md").read_bytes() == b"two\r\n"


def test_edit_file_replaces_exactly_one_occurrence(box: Toolbox, project: Path) -> None:
    out = box.run("edit_file", {"path": "src/app.py", "old": "return 1", "new": "return 2"})
    assert out.ok and out.content == "edited src/app.py: replaced 1 occurrence at line 2"
    assert (project / "src/app.py").read_text() == "def main():\n    return 2\n"


def test_edit_file_refuses_missing_or_repeated_text(box: Toolbox, project: Path) -> None:
    target = project / "twice.txt"
    target.write_text("a = 1\na = 1\n")
    none = box.run("edit_file", {"path": "twice.txt", "old": "b = 1", "new": "b = 2"})
    assert not none.ok and "does not occur" in none.content
    two = box.run("edit_file", {"path": "twice.txt", "old": "a = 1", "new": "a = 2"})
    assert not two.ok and "occurs 2 times" in two.content and "exactly once" in two.content
    assert target.read_text() == "a = 1\na = 1\n"


def test_edit_file_keeps_windows_line_endings(box: Toolbox, project: Path) -> None:
    (project / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    assert box.run("edit_file", {"path": "crlf.txt", "old": "two", "new": "2"}).ok
    assert (project / "crlf.txt").read_bytes() == b"one\r\n2\r\n"


def test_list_files_flat_and_recursive_without_git(box: Toolbox, project: Path) -> None:
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert box.run("list_files", {}).content == "README.md\nsrc/"
    deep = box.run("list_files", {"path": ".", "recursive": True})
    assert deep.content == "README.md\nsrc/\nsrc/app.py"
    assert box.run("list_files", {"path": "src"}).content == "src/app.py"


def test_list_files_stops_at_its_cap(box: Toolbox, project: Path) -> None:
    many = project / "many"
    many.mkdir()
    for n in range(LIST_ENTRIES + 5):
        (many / f"f{n:05}").touch()
    lines = box.run("list_files", {"path": "many"}).content.splitlines()
    assert len(lines) == LIST_ENTRIES + 1
    assert lines[-1].startswith("[... more entries not shown")


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("read_file", {"path": "../outside.txt"}),
        ("read_file", {"path": "src/../../outside.txt"}),
        ("read_file", {"path": "/etc/passwd"}),
        ("read_file", {"path": "/workspace/../etc/passwd"}),
        ("read_file", {"path": "link-out/outside.txt"}),
        ("read_file", {"path": "file-link"}),
        ("write_file", {"path": "../outside.txt", "content": "x"}),
        ("write_file", {"path": "link-out/new.txt", "content": "x"}),
        ("write_file", {"path": "dangling", "content": "x"}),
        ("edit_file", {"path": "file-link", "old": "secret", "new": "leaked"}),
        ("list_files", {"path": "link-out"}),
        ("list_files", {"path": ".."}),
    ],
)
def test_paths_that_leave_the_project_are_refused(
    box: Toolbox, project: Path, tool: str, arguments: dict[str, Any]
) -> None:
    outside = project.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "outside.txt").write_text("secret\n")
    (project.parent / "outside.txt").write_text("secret\n")
    (project / "link-out").symlink_to(outside)
    (project / "file-link").symlink_to(outside / "outside.txt")
    (project / "dangling").symlink_to(outside / "not-yet.txt")

    out = box.run(tool, arguments)

    assert not out.ok
    assert out.content.startswith("error: ")
    assert "outside the project" in out.content
    assert "secret" not in out.content
    assert (outside / "outside.txt").read_text() == "secret\n"
    assert not (outside / "new.txt").exists() and not (outside / "not-yet.txt").exists()


def test_a_symlink_that_stays_inside_is_followed(box: Toolbox, project: Path) -> None:
    (project / "alias.py").symlink_to(project / "src" / "app.py")
    assert box.run("read_file", {"path": "alias.py"}).content.startswith("def main")


# -- notes in the state


def test_scratchpad_lives_in_the_state(box: Toolbox, state: dict[str, Any]) -> None:
    assert box.run("scratchpad", {"action": "read"}).content == "(the scratchpad is empty)"
    assert box.run("scratchpad", {"action": "write", "text": "plan: read code"}).ok
    assert box.run("scratchpad", {"action": "append", "text": "then test"}).ok
    assert state["scratchpad"] == "plan: read code\nthen test"
    assert box.run("scratchpad", {"action": "read"}).content == "plan: read code\nthen test"
    assert not box.run("scratchpad", {"action": "write"}).ok


def test_todo_lives_in_the_state(box: Toolbox, state: dict[str, Any]) -> None:
    box.run("todo", {"action": "add", "text": "write tests"})
    box.run("todo", {"action": "add", "text": "fix bug"})
    box.run("todo", {"action": "add", "text": "drop me"})
    done = box.run("todo", {"action": "done", "index": 1})
    assert done.content == "1. [x] write tests\n2. [ ] fix bug\n3. [ ] drop me"
    box.run("todo", {"action": "remove", "index": 3})
    assert state["todos"] == [
        {"text": "write tests", "done": True},
        {"text": "fix bug", "done": False},
    ]
    bad = box.run("todo", {"action": "done", "index": 7})
    assert not bad.ok and "no todo item 7: the list has 2 items" in bad.content


def test_notes_are_not_mutating_in_the_approval_sense() -> None:
    assert not TOOLS["scratchpad"].mutating and not TOOLS["todo"].mutating


# -- bad calls


@pytest.mark.parametrize(
    ("name", "arguments", "says"),
    [
        ("rm_rf", {}, "there is no tool 'rm_rf'"),
        ("read_file", {}, "read_file needs path"),
        ("read_file", {"path": 7}, "path must be a string"),
        ("read_file", {"path": "README.md", "lines": 3}, "takes no argument lines"),
        ("read_file", "{not json", "not valid JSON"),
        ("read_file", "[1, 2]", "must be a JSON object"),
        ("todo", {"action": "shuffle"}, "must be one of list, add, done, remove"),
        ("todo", {"action": "done", "index": True}, "index must be an integer"),
        ("read_file", {"path": ""}, "path is empty"),
        ("read_file", {"path": "a\0b"}, "contains a NUL"),
        ("read_file", {"path": "a\ud800"}, "holds a character no file name can"),
        ("read_file", {"path": "a/" * 3000}, "more than 4096"),
        ("todo", {"action": "x" * 1000}, "not 'xxxxxxxxxxxxxxx"),
        ("read_file", {"path": [[[[[]]]]]}, "path must be a string, not a JSON array"),
        ("shell", {"command": "ls"}, "no sandbox"),
        # digits Python will not turn into an int: more than 4,300, or a superscript
        ("read_file", {"path": "README.md", "offset": "9" * 5000}, "offset must be an integer"),
        ("todo", {"action": "done", "index": "\u00b2"}, "index must be an integer, not '\u00b2'"),
    ],
)
def test_bad_calls_become_error_text(box: Toolbox, name: str, arguments: Any, says: str) -> None:
    out = box.run(name, arguments)
    assert not out.ok
    assert out.content.startswith("error: ")
    assert says in out.content


def test_arguments_as_json_text_and_numbers_as_strings_are_accepted(box: Toolbox) -> None:
    out = box.run("read_file", '{"path": "src/app.py", "offset": "2", "limit": 1.0}')
    assert out.ok and out.content == "    return 1\n\n[lines 2-2 of 2]"


# -- shell in a real sandbox


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    image = require_docker()
    with Sandbox.start(owned_project(tmp_path_factory.mktemp("shell-project")), image) as box:
        yield box


def test_shell_runs_in_the_project_and_reports_the_exit_code(sandbox: Sandbox) -> None:
    tools = Toolbox(sandbox.project_root, sandbox, {})
    tools.run("write_file", {"path": "in.txt", "content": "hello\n"})
    out = tools.run("shell", {"command": "cat in.txt; pwd"})
    assert out.ok and out.content == "hello\n/workspace\n[exit code 0]"
    failed = tools.run("shell", {"command": "echo oops >&2; exit 4"})
    assert not failed.ok and failed.content == "oops\n[exit code 4]"


def test_shell_says_a_nul_character_cannot_be_in_a_command(sandbox: Sandbox) -> None:
    tools = Toolbox(sandbox.project_root, sandbox, {})
    out = tools.run("shell", {"command": "echo a\x00b"})
    assert not out.ok
    assert out.content == "error: command contains a NUL character, which no command can hold"
    assert tools.run("shell", {"command": "echo still here"}).content.startswith("still here")


def test_shell_timeout_is_reported_to_the_model(sandbox: Sandbox) -> None:
    out = Toolbox(sandbox.project_root, sandbox, {}).run(
        "shell", {"command": "echo begun; sleep 60", "timeout": 1}
    )
    assert not out.ok
    assert out.content.startswith("begun\n[timed out after 1 s")


def test_shell_says_why_it_cannot_write_a_project_root_owns(tmp_path: Path) -> None:
    image = require_docker()
    if os.geteuid() != 0:
        pytest.skip("ags must run as root for this case")
    project = tmp_path / "root-owned"
    project.mkdir()
    project.chmod(0o755)
    with Sandbox.start(project, image) as box:
        tools = Toolbox(project, box, {})
        out = tools.run("shell", {"command": "echo hi > made.txt"})
        assert not out.ok
        assert out.content == (
            f"sh: can't create made.txt: Permission denied\n[exit code 1]\n[{box.write_note()}]"
        )
        # The file tools run in ags itself, and can.
        assert tools.run("write_file", {"path": "made.txt", "content": "hi\n"}).ok
        assert (project / "made.txt").read_text() == "hi\n"
        assert tools.run("shell", {"command": "cat made.txt"}).content == "hi\n[exit code 0]"


def test_shell_results_say_when_the_sandbox_was_restarted(sandbox: Sandbox) -> None:
    tools = Toolbox(sandbox.project_root, sandbox, {})
    client = docker.from_env()
    try:
        client.containers.get(sandbox.container_id).kill()
    finally:
        client.close()
    out = tools.run("shell", {"command": "echo back"})
    assert out.ok
    assert out.content.startswith("[the sandbox was restarted: its container stopped")
    assert out.content.endswith("]\nback\n[exit code 0]")


# -- the race the sandbox can run against the file tools

RACE_ROUNDS = 500
# Self-healing: in the moment d is missing a tool's write may make a d of its
# own, which the sandbox's uid may not be able to empty; it is moved aside.
_FLIP = (
    "n=0; while :; do n=$((n+1)); "
    "rm -rf d || mv d stuck-$n; mkdir d && echo inside > d/f; "
    "rm -rf d || mv d stuck-d$n; ln -s {outside} d; done >/dev/null 2>&1"
)


def files_of(where: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(where.iterdir())}


def test_a_sandbox_swapping_a_directory_for_a_symlink_cannot_lead_the_file_tools_out(
    tmp_path: Path,
) -> None:
    """A command in the sandbox flips project/d between a real directory and a
    symlink to a host directory outside the project, as fast as it can, while
    every file tool works on d/ in a loop. Nothing outside may be read,
    listed or written. (Against the tools that checked a path and then opened
    it, this leaked the secret and wrote outside within a few dozen rounds.)"""
    image = require_docker()
    project = tmp_path / "project"
    (project / "d").mkdir(parents=True)
    (project / "d" / "f").write_text("inside\n")
    owned_project(project)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("SECRET\n")
    (outside / "canary-name").write_text("SECRET\n")
    before = files_of(outside)

    leaks: list[tuple[str, str]] = []
    saw_link = saw_dir = 0
    with Sandbox.start(project, image) as box:
        tools = Toolbox(project, box, {})
        client = docker.from_env()
        try:
            container = client.containers.get(box.container_id)
            container.exec_run(["sh", "-c", _FLIP.format(outside=outside)], detach=True)
            for n in range(RACE_ROUNDS):
                for name, arguments in (
                    ("read_file", {"path": "d/f"}),
                    ("list_files", {"path": "d"}),
                    ("write_file", {"path": "d/f", "content": f"round {n}\n"}),
                    ("write_file", {"path": f"d/new-{n}", "content": "x"}),
                    ("edit_file", {"path": "d/f", "old": "round", "new": "edited"}),
                ):
                    out = tools.run(name, arguments)
                    if "SECRET" in out.content or "canary" in out.content:
                        leaks.append((name, out.content))
                if (project / "d").is_symlink():
                    saw_link += 1
                elif (project / "d").is_dir():
                    saw_dir += 1
        finally:
            client.close()

    assert leaks == []
    assert files_of(outside) == before, "a file outside the project was written"
    # The race really ran: d was seen both ways, many times.
    assert saw_link > RACE_ROUNDS // 20 and saw_dir > RACE_ROUNDS // 20, (saw_link, saw_dir)
