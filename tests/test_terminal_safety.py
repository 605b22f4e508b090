"""Hostile text from a session never reaches the terminal as it is.

Titles, messages, tool calls and results, metadata, reflog reasons and
imported sessions carry escape sequences (colour, an OSC window title, screen
clear), carriage returns, backspaces, C1 controls, bidi overrides and
invisible characters. Every command that prints them, terminal or not, must
show them as visible escapes; ``--json`` must still give back exactly the
stored values.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.main import cli
from cli.output import visible
from objstore import Store
from objstore.exchange import export_session
from objstore.refs import session_ref

AGS = str(Path(sys.executable).with_name("ags"))

# An OSC window title, clear screen, red, a carriage return over the line, a
# backspace, an 8-bit CSI, a right-to-left override, an isolate, a BOM, a hidden
# tag character, and a newline that would draw a row of its own.
HOSTILE = (
    "pwned\x1b]0;owned title\x07\x1b[2J\x1b[31mred\rover\x08\x9b1m"
    "\u202eevil\u2066x\u2069\ufeff\U000e0041\nfake row"
)
# What may never be printed raw: every C0 control but newline and tab, DEL, C1,
# bidi controls, line/paragraph separators, invisible format and tag characters.
RAW = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u202a-\u202e\u2028\u2029"
    "\u2060-\u2064\u2066-\u206f\ufeff\U000e0000-\U000e007f]"
)


def assert_clean(text: str, where: str) -> None:
    found = RAW.search(text)
    assert found is None, f"{where}: raw {found.group()!r} at {found.start()}: {text!r}"


@dataclass
class Hostile:
    path: Path
    a: str
    b: str
    imported: str


def build(tmp_path: Path) -> Hostile:
    path = tmp_path / "store"
    root = tmp_path / "proj\x1b[31m\nx"
    root.mkdir()
    with Store.open(path) as s:
        a = s.new_session(title=HOSTILE, root=root, model=HOSTILE)
        s.append(a, {"role": "user", "content": HOSTILE}, meta={"model": HOSTILE, HOSTILE: 1})
        s.append(
            a,
            {
                "role": "assistant",
                "content": [{"type": "text", "text": HOSTILE}],
                "thinking": HOSTILE,
                "tool_calls": [
                    {"id": "call_1", "name": HOSTILE, "arguments": {HOSTILE: HOSTILE}},
                    {"id": "call_2", "name": "shell", "arguments": {"command": HOSTILE}},
                ],
            },
            state={"scratchpad": HOSTILE, "todos": [{"text": HOSTILE, "done": False}]},
        )
        s.append(a, {"role": "tool", "tool_call_id": "call_1", "name": HOSTILE,
                     "content": (HOSTILE + "\n") * 3})  # fmt: skip
        s.append(a, {"role": HOSTILE, "content": "a role of its own"})
        s.compact(a, HOSTILE, keep=1)
        s.append(a, {"role": "assistant", "content": "after " + HOSTILE})
        b = s.fork(f"{a}~2", title=HOSTILE)
        s.append(b, {"role": "user", "content": "branch " + HOSTILE})
        s.tag("hostile-tag", a)
        # A reflog reason the API would never write, as a damaged or foreign store may hold.
        s.refs.transact(
            session_ref(b), HOSTILE, lambda cur: {**cur.body, "target": s.node_id(f"{b}~1")}
        )
        s.checkout(a)
        doc = export_session(s, b)
    doc["session"] = {**doc["session"], "id": "f" * 32, "title": "imported " + HOSTILE}
    imported = tmp_path / "imported.json"
    imported.write_text(json.dumps(doc))
    return Hostile(path, a, b, "f" * 32)


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Hostile:
    monkeypatch.chdir(tmp_path)
    return build(tmp_path)


def run(world: Hostile, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", str(world.path), *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


COMMANDS = [
    ["import", "../imported.json"],
    ["sessions"],
    ["ls", "--all"],
    ["log", "{a}"],
    ["log", "{a}", "--oneline"],
    ["log", "{a}", "--context"],
    ["log", "{a}~4"],
    ["log", "--graph", "--all"],
    ["show", "{a}"],
    ["show", "{a}~2"],
    ["show", "{a}~3"],
    ["show", "{a}~5"],
    ["info", "{a}"],
    ["info", "{b}"],
    ["search", "pwned"],
    ["search", "role"],
    ["search", "pwned", "--role", "summary"],
    ["diff", "{a}", "{b}"],
    ["tags"],
    ["reflog", "{b}"],
    ["checkout", "{a}"],
    ["status"],
    ["delete", "{a}"],  # refused without --yes: the message quotes the title
    ["fsck"],
    ["export", "{a}"],
    ["export", "{a}", "--format", "md"],
    ["export", "{a}", "--format", "html"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_no_raw_control_character_reaches_the_terminal(hostile, args, tmp_path):
    run(hostile, "import", str(tmp_path / "imported.json"))
    filled = [x.format(a=hostile.a, b=hostile.b) for x in args]
    if filled[0] == "import":
        filled[1] = str(tmp_path / "imported.json")
    code, out, err = run(hostile, *filled)
    assert code in (0, 1), err
    assert_clean(out, "stdout")
    assert_clean(err, "stderr")
    assert "owned title" in out + err or args[0] in ("import", "tags", "fsck", "checkout")


def test_a_newline_in_a_title_draws_no_row_of_its_own(hostile):
    code, out, _ = run(hostile, "sessions")
    assert code == 0
    rows = out.splitlines()
    assert len(rows) == 2  # a and its fork, one line each
    assert all(visible(HOSTILE)[:40] in row for row in rows)  # the listing cuts at 40
    assert not any(row.startswith("fake row") for row in rows)


JSON_COMMANDS = [
    ["sessions", "--json"],
    ["log", "{a}", "--json"],
    ["log", "{a}", "--context", "--json"],
    ["show", "{a}~3", "--json"],
    ["info", "{a}", "--json"],
    ["search", "pwned", "--json"],
    ["diff", "{a}", "{b}", "--json"],
    ["reflog", "{b}", "--json"],
    ["export", "{a}"],
]


@pytest.mark.parametrize("args", JSON_COMMANDS, ids=[" ".join(c) for c in JSON_COMMANDS])
def test_json_stays_exact_and_safe(hostile, args):
    code, out, err = run(hostile, *[x.format(a=hostile.a, b=hostile.b) for x in args])
    assert code == 0, err
    assert_clean(out, "stdout")
    exact = "\x1b]0;owned title\x07\x1b[2J" if args[0] == "search" else HOSTILE  # a snippet
    assert any(exact in text for text in strings(json.loads(out)))  # the value, exactly


def strings(value: object) -> list[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value, *(t for v in value.values() for t in strings(v))]
    if isinstance(value, list):
        return [t for v in value for t in strings(v)]
    return []


def test_exact_values_through_json(hostile):
    _, out, _ = run(hostile, "log", hostile.a, "--json")
    entries = json.loads(out)
    with Store.open(hostile.path) as s:
        assert [e["message" if e["type"] == "message" else "summary"] for e in entries] == [
            e.message for e in s.log(hostile.a)
        ]
    _, out, _ = run(hostile, "sessions", "--json")
    assert {r["title"] for r in json.loads(out)} == {HOSTILE}


def test_the_installed_script_prints_nothing_raw_either(hostile):
    """The same through a real process (no CliRunner), stdout and stderr as bytes."""
    a = hostile.a
    for args in (["sessions"], ["log", a], ["show", a + "~3"], ["delete", a]):
        proc = subprocess.run(
            [AGS, "--store", str(hostile.path), *args], capture_output=True, timeout=60
        )
        assert proc.returncode in (0, 1), proc.stderr
        assert_clean(proc.stdout.decode("utf-8"), f"{args} stdout")
        assert_clean(proc.stderr.decode("utf-8"), f"{args} stderr")
        assert b"\\x1b]0;owned title\\x07" in proc.stdout + proc.stderr


def test_visible_escapes_like_python_and_keeps_text():
    assert visible("a\x1b[31mb\rc\td\ne") == "a\\x1b[31mb\\rc\\td\\ne"
    assert visible("a\x1b[31mb\rc\td\ne", multiline=True) == "a\\x1b[31mb\\rc\td\ne"
    assert visible("\x9b\u202e\U000e0041\x7f") == "\\x9b\\u202e\\U000e0041\\x7f"
    # Text people write stays as it is: accents, CJK, emoji with joiners, Persian ZWNJ.
    plain = "café 東京 👩\u200d💻 می\u200cخواهم ünïcødé"
    assert visible(plain) == plain


# -- run and chat: what the model and the tools send ------------------------------


def test_run_and_chat_show_model_and_tool_output_visibly(tmp_path):
    from docker_fixture import require_docker
    from model_server import FakeModelServer

    image = require_docker()
    project = tmp_path / "project"
    project.mkdir()
    with FakeModelServer() as server:
        env = {**os.environ, "AGS_STORE": str(tmp_path / "store"), "AGS_BASE_URL": server.url,
               "AGS_IMAGE": image}  # fmt: skip
        env.pop("OLLAMA_HOST", None)
        env.pop("NO_COLOR", None)
        escape_codes = r"printf '\033]0;owned title\007\033[2J\r\010\302\233'; echo"
        server.add(
            {
                "text": HOSTILE,
                "thinking": HOSTILE,
                "tool_calls": [
                    {"name": "shell", "arguments": {"command": escape_codes}},
                    {"name": "write_file", "arguments": {"path": "h.txt", "content": HOSTILE}},
                    {"name": HOSTILE, "arguments": {HOSTILE: HOSTILE}},
                ],
            },
            {"text": "done " + HOSTILE},
            {"text": "json " + HOSTILE},
            {"text": "chat " + HOSTILE},
        )
        runs = [
            ["run", "go", "--yes-tools"],
            ["run", "--continue", "again", "--json"],
        ]
        outputs = []
        for args in runs:
            proc = subprocess.run(
                [AGS, *args], env=env, cwd=project, capture_output=True, timeout=180,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            outputs.append(proc)
        chat = subprocess.run(
            [AGS, "chat", "--continue"], env=env, cwd=project, capture_output=True, timeout=180,
            input=(b"hello\n\\title new\x1b]0;t\x07title\n\\sessions\n\\info\n\\log\n"
                   b"\\bogus\x1b[2J\n\\exit\n"),
        )  # fmt: skip
        assert chat.returncode == 0, chat.stderr
        outputs.append(chat)
    assert (project / "h.txt").read_bytes().decode() == HOSTILE  # the file got the bytes as sent
    for proc in outputs:
        assert_clean(proc.stdout.decode(), f"{proc.args} stdout")
        assert_clean(proc.stderr.decode(), f"{proc.args} stderr")
    first, as_json, chat = outputs
    assert visible(HOSTILE, multiline=True) in first.stdout.decode()  # the streamed answer
    assert "\\x1b]0;owned title\\x07" in first.stderr.decode()  # the tool's output, visible
    assert json.loads(as_json.stdout)["reply"] == "json " + HOSTILE  # --json: exact
    assert "title: new\\x1b]0;t\\x07title" in chat.stdout.decode()
    assert "unknown command \\bogus\\x1b[2J" in chat.stderr.decode()


# -- any message at all --------------------------------------------------------------

_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["\x1b]0;t\x07", "\r", "\x9b", "\u202e", "\U000e0041", "\n", "\t"]
)
_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=10,
)
_MESSAGES = _ANY_JSON | st.fixed_dictionaries(
    {"role": _ANY_JSON, "content": _ANY_JSON},
    optional={"tool_calls": _ANY_JSON, "name": _ANY_JSON, "tool_name": _ANY_JSON},
)


@settings(derandomize=True, database=None, deadline=None, max_examples=300)
@given(message=_MESSAGES, oneline=st.booleans())
def test_any_message_prints_without_error_and_without_raw_controls(message, oneline):
    """What a transcript, show and search print of any JSON a message blob may hold."""
    from cli.history import _full_message, message_lines
    from cli.output import tool_call_summary

    lines = message_lines(message, oneline=oneline)
    if isinstance(message, dict):
        lines += _full_message(message)
        lines.append(tool_call_summary(message))
    for line in lines:
        assert_clean(line, "line")
