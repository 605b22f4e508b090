"""``ags chat`` in a real terminal: tmux runs the installed ``ags`` script, keys
are typed with send-keys and the screen is read with capture-pane, against
the fake model server and a real Docker sandbox (as test_agent.py runs them).

What a person sees is what is checked: the answer rendered as it streams, tools
in a few lines, approvals with one key, the prompt's history, completion and
status line, Ctrl-C and Ctrl-D.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from docker_fixture import owned_project
from model_server import FakeModelServer
from tmux_terminal import Tmux

from objstore import Store

AGS = str(Path(sys.executable).with_name("ags"))
PROMPT = re.compile(r"^> *$", re.M)  # an empty prompt line


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    p.mkdir()
    (p / "README.md").write_text("# demo\n")
    return owned_project(p)


@pytest.fixture
def chat(tmp_path: Path, server: FakeModelServer, image: str, project: Path):
    """Start ``ags chat ARGS`` in a terminal of its own; each call a new run."""
    terminals: list[Tmux] = []
    env = {
        **os.environ,
        "AGS_STORE": str(tmp_path / "store"),
        "AGS_BASE_URL": server.url,
        "AGS_IMAGE": image,
        "AGS_HISTORY": str(tmp_path / "state" / "history"),
        "PAGER": "less",
    }
    for name in ("OLLAMA_HOST", "NO_COLOR", "LESS"):
        env.pop(name, None)

    def start(*args: str, height: int = 30) -> Tmux:
        workdir = tmp_path / f"tty{len(terminals)}"
        workdir.mkdir()
        terminal = Tmux(workdir, [AGS, "chat", *args], env, project, height=height)
        terminals.append(terminal)
        terminal.wait_for("\\help for commands")
        return terminal

    yield start
    for terminal in terminals:
        terminal.close()


def ready(terminal: Tmux, after: str = "", timeout: float = 60) -> str:
    """Wait for an empty prompt with its status line (below the line ``> after``
    when given, so the prompt being answered is not taken for the next one);
    return the scrollback from that line on."""

    def back(text: str) -> bool:
        if after:
            if f"> {after}" not in text:
                return False
            text = text[text.rindex(f"> {after}") :]
        return PROMPT.search(text) is not None and "· spent " in text

    seen = terminal.wait_for(back, timeout=timeout, whole=True)
    return seen[seen.rindex(f"> {after}") :] if after else terminal.screen()


def shown_after(terminal: Tmux, typed: str, text: str, timeout: float = 60) -> str:
    """Wait for ``text`` below the line ``> typed``; the scrollback from that line on."""

    def below(seen: str) -> bool:
        return f"> {typed}" in seen and text in seen[seen.rindex(f"> {typed}") :]

    seen = terminal.wait_for(below, timeout=timeout, whole=True)
    return seen[seen.rindex(f"> {typed}") :]


def ask(terminal: Tmux, text: str, timeout: float = 60) -> str:
    """Type ``text`` and Enter; wait for the turn to end; what it showed."""
    terminal.type(text)
    terminal.send("Enter")
    return ready(terminal, text, timeout)


def history_of(store_path: Path) -> list[dict[str, Any]]:
    with Store.open(store_path) as s:
        sid = s.sessions()[0].id
        return [e.message for e in s.log(sid)][::-1]


ANSWER = """\
# Plan

Some **bold** words, [bold]no markup[/bold], :warning: and a \x1b]0;pwned\x07 title.

```python
def hello(name):
    return f"hi {name}"
```

Done.
"""


def test_a_turn_as_a_person_sees_it(tmp_path, server, chat, project):
    server.add(
        {"text": ANSWER, "chunks": 40},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo one; seq 1 12; exit 3"}}]},
        {"text": "It failed with exit code 3."},
    )
    terminal = chat()
    screen = ready(terminal)
    assert re.search(r"gemma4 · session new · context [\d.k]+/[\d.k]+ \(\d+%\) · spent 0 tokens",
                     screen), screen  # fmt: skip

    screen = ask(terminal, "hello")
    assert "Plan" in screen and "# Plan" not in screen and "**" not in screen
    assert "Some bold words, [bold]no markup[/bold], :warning: and a \\x1b]0;pwned\\x07 title." in (
        screen
    )  # rich markup, emoji codes and escapes print as themselves
    coloured = terminal.screen(colours=True)
    code = next(line for line in coloured.splitlines() if "hello" in line and "def" in line)
    assert re.search(r"\x1b\[[0-9;]*3[18];[25];", code), code  # highlighted
    assert re.search(r"session [0-9a-f]{8} · context .* · spent \d+ tokens", screen), screen

    terminal.type("run it")
    terminal.send("Enter")
    screen = shown_after(terminal, "run it", "Allow?")
    assert "shell: run in the sandbox (timeout 60 s):" in screen
    assert "echo one; seq 1 12; exit 3" in screen
    terminal.send("y")
    screen = ready(terminal, "run it")
    assert "It failed with exit code 3." in screen
    assert "⏺ shell echo one; seq 1 12; exit 3" in screen
    assert "⎿  exit code 3 · 13 lines · \\show 1" in screen
    assert "… 9 more lines" in screen and "\n     4\n" not in screen

    screen = ask(terminal, "\\show 1")
    assert "[exit code 3]" in screen
    assert all(f"\n{n}\n" in screen for n in range(1, 13))  # all of it

    terminal.send("C-c")  # at an empty prompt: asks
    terminal.wait_for("Ctrl-C again to leave (or Ctrl-D)")
    terminal.send("C-c")
    assert terminal.exit_status() == 0

    history = tmp_path / "state" / "history"
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    assert stat.S_IMODE(history.parent.stat().st_mode) == 0o700
    assert "+hello\n" in history.read_text() and "+\\show 1\n" in history.read_text()
    stored = history_of(tmp_path / "store")
    assert stored[1]["content"] == ANSWER  # the model's text, stored as it came
    assert stored[4]["content"].endswith("[exit code 3]")


def test_a_long_answer_is_printed_once_as_it_streams(tmp_path, server, chat):
    blocks = []
    for n in range(80):
        if n % 3 == 0:
            blocks.append(f"Paragraph {n} says something\nover two lines, number {n}.")
        elif n % 3 == 1:
            blocks.append("\n".join(f"- item {n}.{i}" for i in range(4)))
        else:
            code = "\n".join(f"value_{n}_{i} = compute({i})" for i in range(12))
            blocks.append(f"```python\n{code}\n```")
    answer = "\n\n".join(blocks) + "\n"
    assert answer.count("\n") >= 600
    server.add({"text": answer, "chunks": 900, "chunk_delay": 0.004})
    terminal = chat()
    ready(terminal)
    before = terminal.written()
    ask(terminal, "tell me everything", timeout=120)
    drawn = terminal.written() - before
    seen = terminal.scrollback()
    expected = [line for line in answer.splitlines() if line and not line.startswith("```")]
    expected = [line.removeprefix("- ") for line in expected]
    shown = [line.strip(" •") for line in seen.splitlines()]
    shown = [line for line in shown if line]
    # every line of the answer once, in order: nothing lost, nothing drawn twice
    start = shown.index("Paragraph 0 says something over two lines, number 0.")
    joined = [e for b in _paragraphs(expected) for e in b]
    assert shown[start : start + len(joined)] == joined
    assert seen.count("value_77_11 = compute(11)") == 1
    # Drawing cost: the answer once, plus the live region while it streamed;
    # re-rendering the whole answer for each of the 900 pieces would be ~1000x.
    plain = len(answer.encode())
    assert drawn < 60 * plain, (drawn, plain)


def _paragraphs(lines: list[str]) -> list[list[str]]:
    """The answer's lines as rich shows them: a two-line paragraph as one line."""
    out: list[list[str]] = []
    for line in lines:
        if line.startswith("over two lines") and out:
            out[-1][-1] += " " + line
        else:
            out.append([line])
    return out


def test_approvals_show_everything_and_take_one_key(tmp_path, server, chat, project):
    tall = "".join(f"line {i}\n" for i in range(60))
    long_command = "echo " + " ".join(f"word{i:03d}" for i in range(40)) + " && echo end"
    server.add(
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "big.txt", "content": tall}}]},
        {"text": "not written"},
        {"tool_calls": [{"name": "shell", "arguments": {"command": long_command}}]},
        {"text": "not run"},
        {"delay": 1.5, "tool_calls": [
            {"name": "edit_file", "arguments": {"path": "README.md", "old": "# demo",
                                                "new": "# demo two"}}]},
        {"text": "edited"},
    )  # fmt: skip
    terminal = chat()
    ready(terminal)

    terminal.type("write a tall file")
    terminal.send("Enter")
    screen = terminal.wait_for("+line 20")  # taller than the screen: in the pager
    assert "Allow?" not in screen
    terminal.send("G")
    terminal.wait_for("+line 59")
    terminal.send("q")
    screen = terminal.wait_for("Allow?")
    assert "write_file: create big.txt (60 lines, 470 bytes): (all 61 lines shown in the pager" in (
        screen.replace("\n", " ")
    )
    assert "p page again" in screen
    terminal.send("n")
    screen = ready(terminal, "write a tall file")
    assert "⎿  declined" in screen and "not written" in screen
    assert not (project / "big.txt").exists()

    terminal.type("run a long one")
    terminal.send("Enter")
    screen = shown_after(terminal, "run a long one", "Allow?")
    unwrapped = re.sub(r"\n\s*↪ ", "", screen)
    assert long_command in unwrapped  # the whole command, wrapped, never cut
    terminal.send("Escape")  # Escape is no
    ready(terminal, "run a long one")

    terminal.type("edit the readme")
    terminal.send("Enter")
    time.sleep(0.3)
    terminal.type("y")  # typed ahead while the model thinks: must not approve
    shown_after(terminal, "edit the readme", "Allow?")
    time.sleep(0.5)
    screen = shown_after(terminal, "edit the readme", "Allow?")
    assert re.search(r"^Allow\? .*\(edit_file, this chat\) *$", screen, re.M), screen  # unanswered
    assert (project / "README.md").read_text() == "# demo\n"
    assert "    -# demo" in screen and "    +# demo two" in screen
    coloured = terminal.screen(colours=True)
    added = next(line for line in coloured.splitlines() if "+# demo two" in line)
    assert "\x1b[32m" in added  # green
    terminal.send("a")
    screen = ready(terminal, "edit the readme")
    assert "always" in screen and "edited" in screen
    assert (project / "README.md").read_text() == "# demo two\n"
    terminal.send("C-d")
    assert terminal.exit_status() == 0


def test_ctrl_c_stops_an_answer_then_a_tool_and_the_chat_goes_on(tmp_path, server, chat):
    server.add(
        {"text": "slow " * 300, "chunks": 300, "chunk_delay": 0.05},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60; echo never"}}]},
        {"text": "still here"},
    )
    terminal = chat()
    ready(terminal)
    terminal.type("talk slowly")
    terminal.send("Enter")
    terminal.wait_for("slow slow slow")
    terminal.send("C-c")
    screen = ready(terminal, "talk slowly")
    assert "stopped (Ctrl-C); all that was said so far is kept" in screen

    terminal.type("run the job")
    terminal.send("Enter")
    shown_after(terminal, "run the job", "Allow?")
    terminal.send("y")
    shown_after(terminal, "run the job", "running shell")
    began = time.monotonic()
    terminal.send("C-c")
    screen = ready(terminal, "run the job")
    assert time.monotonic() - began < 20
    assert "⎿  interrupted" in screen

    assert "still here" in ask(terminal, "are you there?")
    terminal.send("C-d")
    assert terminal.exit_status() == 0
    stored = history_of(tmp_path / "store")
    assert [m["role"] for m in stored] == [
        "user", "assistant", "user", "assistant", "tool", "user", "assistant",
    ]  # fmt: skip
    assert stored[1]["content"].startswith("slow slow") and len(stored[1]["content"]) < 1500
    assert stored[4]["content"].startswith("[ags] Interrupted by the user")


def test_history_across_runs_completion_and_resume(tmp_path, server, chat):
    server.add({"text": "first answer"})
    first = chat()
    ready(first)
    assert "first answer" in ask(first, "the first question")
    first.send("C-d")
    assert first.exit_status() == 0
    with Store.open(tmp_path / "store") as s:
        sid = s.sessions()[0].id

    second = chat()
    ready(second)
    second.send("Up")
    second.wait_for("> the first question")
    second.send("C-c")  # with text typed: clears it, does not leave
    second.wait_for(lambda s: PROMPT.search(s) is not None and "the first question" not in s)
    second.type("\\res")
    second.send("Tab")
    second.wait_for("> \\resume")
    second.type(" ")
    screen = second.wait_for(sid[:12])  # the sessions, with their titles
    assert "the first question" in screen
    second.send("Tab")
    second.wait_for(f"> \\resume {sid}")
    second.send("Enter")
    screen = second.wait_for("now in session")
    assert f"now in session {sid[:12]} (resumed, 2 messages)" in screen
    second.wait_for(f"session {sid[:8]} · context")
    second.send("C-d")
    assert second.exit_status() == 0
