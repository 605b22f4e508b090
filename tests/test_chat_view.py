"""The parts of the terminal chat that need no terminal: the streaming Markdown
renderer, the compact tool results, the status line, the private history
file and completion. (tests/test_chat_terminal.py runs the whole of it in
tmux.)"""

from __future__ import annotations

import io
import os
import random
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from prompt_toolkit.history import InMemoryHistory
from rich.console import Console

from agent.tools import shell_status
from cli.chat import between_turns
from cli.chat_commands import COMMANDS, _is_count
from cli.chat_input import ChatCompleter, PrivateHistory, open_history
from cli.chat_view import TerminalView, result_lines, status_text
from cli.markdown_stream import MarkdownStream, _window, markdown
from cli.tool_calls import ToolResult
from objstore import Store

DOCUMENT = """\
# Title

A paragraph with **bold**, `code`, a [link](https://example.com/x) and
#hashtag on its second line, and a setext heading next:

Heading two
-----------

1. first
2. second
   - nested
   - items

3. third, after a blank line

> a quote
> over two lines

| name | value |
|------|-------|
| a    | 1     |
| b    | 2     |

```python
def f(x):
    return x * 2
```

    indented code

---

Last words.
"""


def console(width: int = 80) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, force_terminal=True, color_system="256"), out


def streamed(text: str, seed: int) -> tuple[str, int]:
    """``text`` fed in random small pieces: what was printed, and in how many prints."""
    target, out = console()
    prints = 0

    def show(renderable: object) -> None:
        nonlocal prints
        prints += 1
        target.print(renderable)

    stream = MarkdownStream(show, height=10)
    rng = random.Random(seed)
    at = 0
    while at < len(text):
        step = rng.randint(1, 7)
        stream.feed(text[at : at + step])
        at += step
        target.render_lines(stream, target.options)  # a frame of the live part
    stream.finish()
    return out.getvalue(), prints


@pytest.mark.parametrize("seed", range(5))
def test_a_streamed_answer_prints_as_the_whole_answer_renders(seed):
    whole, out = console()
    whole.print(markdown(DOCUMENT))
    printed, prints = streamed(DOCUMENT, seed)
    assert printed == out.getvalue()
    assert prints >= 10  # block by block as they finished, not all at the end


def test_a_partial_line_never_decides_where_a_block_ends():
    printed: list[object] = []
    stream = MarkdownStream(printed.append)
    stream.feed("A paragraph\n#")  # '#' alone would be an empty heading
    stream.feed("hashtag continues it\n")
    assert printed == []  # still one paragraph: nothing is finished
    stream.feed("\nNext paragraph\n")
    assert len(printed) == 1


def test_a_long_code_block_renders_only_a_screenful_while_it_streams():
    code = "".join(f"value_{i} = compute({i})\n" for i in range(600))
    target, _ = console()
    stream = MarkdownStream(target.print, height=20)
    stream.feed("```python\n" + code)
    window = _window(stream.pending, 20)
    assert window.count("\n") <= 21 and "value_599" in window and "value_500" not in window
    frame = target.render_lines(stream, target.options)
    assert len(frame) == 20
    assert "value_599" in "".join(s.text for s in frame[-2])


def test_markup_emoji_and_escapes_print_as_text():
    target, out = console()
    view = TerminalView(target, Path("."))
    view.say("[bold]title[/bold] :warning:")
    view.text("model says [red]x[/red] :smile:\n")
    view.tool_started("shell", {"command": "printf '\\033[2J'"})
    view.tool_finished("shell", "\x1b[2J\x1b]0;owned\x07\n[exit code 0]", True)
    view.end_turn(None)
    shown = out.getvalue()
    assert "[bold]title[/bold] :warning:" in shown
    assert "model says [red]x[/red] :smile:" in shown
    assert "\\x1b[2J\\x1b]0;owned\\x07" in shown  # made visible
    assert "\x1b[2J" not in shown and "\x1b]0" not in shown


def test_a_tool_result_in_a_few_lines():
    output = "".join(f"row {i}\n" for i in range(10)) + "[exit code 2]"
    lines = [t.plain for t in result_lines(ToolResult(3, "shell", {}, output, False), 80)]
    assert lines[0] == "  ⎿  exit code 2 · 10 lines · \\show 3"
    assert lines[1:5] == [f"     row {i}" for i in range(4)] and lines[5] == "     … 6 more lines"
    one = result_lines(ToolResult(1, "write_file", {}, "created a.txt (3 bytes)", True), 80)
    assert [t.plain for t in one] == ["  ⎿  ok · created a.txt (3 bytes)"]
    quiet = result_lines(ToolResult(2, "shell", {}, "[exit code 0]", True), 80)
    assert [t.plain for t in quiet] == ["  ⎿  exit code 0 · no output"]


def test_shell_status_is_read_from_the_tools_own_last_line():
    assert shell_status("a\n[exit code 0] in the output\nb\n[exit code 1]") == (
        "a\n[exit code 0] in the output\nb\n",
        "exit code 1",
    )
    assert shell_status("x\n[timed out after 5 s: killed]")[1] == "timed out after 5 s"
    assert shell_status("error: no sandbox") == ("error: no sandbox", None)


def test_the_status_line_says_what_is_estimated():
    counted = {"prompt_tokens": 1200, "completion_tokens": 300, "calls": 2}
    assert status_text("gemma4", "0123456789ab" * 5, 2500, 10000, counted) == (
        "gemma4 · session 01234567 · context 2.5k/10.0k (25%) · spent 1.5k tokens"
    )
    unreported = {"calls": 1, "unreported_calls": 1, "estimated_prompt_tokens": 900,
                  "estimated_completion_tokens": 100}  # fmt: skip
    assert status_text("m", None, 10, None, unreported) == (
        "m · session new · context 10 (limit unknown) · "
        "spent ~1.0k tokens (estimated: the server reports none)"
    )
    mixed = {**counted, **unreported, "calls": 3}
    assert status_text("m\x1b[31m", None, 0, 100, mixed).startswith("m\\x1b[31m · ")
    assert "spent 1.5k + ~1.0k estimated tokens" in status_text("m", None, 0, 100, mixed)


def test_the_history_file_is_private_whatever_the_umask(tmp_path):
    path = tmp_path / "state" / "ags" / "history"
    old = os.umask(0)
    try:
        history, where = open_history(path)
        assert isinstance(history, PrivateHistory) and str(path) in where
        history.store_string("first\nsecond line")
        history.store_string("a secret token")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert list(PrivateHistory(path).load_history_strings()) == [
        "a secret token",
        "first\nsecond line",
    ]


def test_a_history_file_others_could_read_is_made_private(tmp_path):
    path = tmp_path / "history"
    path.write_text("\n# old\n+kept\n")
    path.chmod(0o644)
    history, _ = open_history(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert list(history.load_history_strings()) == ["kept"]


def test_a_history_path_that_is_a_symlink_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    (tmp_path / "history").symlink_to(elsewhere)
    history, where = open_history(tmp_path / "history")
    assert isinstance(history, InMemoryHistory) and where.startswith("not kept:")
    assert elsewhere.read_text() == ""


def test_completion_of_commands_and_session_ids(tmp_path):
    with Store.open(tmp_path / "store") as store:
        sid = store.new_session(title="fix the \x1b[31mbuild")
        completer = ChatCompleter(COMMANDS, store)

        def offered(text: str) -> list[tuple[str, str]]:
            found = completer.get_completions(Document(text), CompleteEvent())
            return [(c.text, c.display_meta_text) for c in found]

        assert [text for text, _ in offered("\\s")] == ["\\sessions", "\\show"]
        assert offered("hello \\s") == []  # commands only at the start
        assert offered("\\resume ") == [(sid, "fix the \\x1b[31mbuild")]
        assert offered(f"\\resume {sid[:4]}") == [(sid, "fix the \\x1b[31mbuild")]
        assert offered("\\resume build") == [(sid, "fix the \\x1b[31mbuild")]
        assert offered("\\resume zzzz") == []
        assert offered("\\title ") == []  # takes no session


def test_a_ctrl_c_between_turns_does_not_end_the_chat():
    # raise_signal delivers to this (the main) thread before it returns, so the
    # handler in place runs at once; os.kill could land on another thread of the
    # test process and be handled later.
    caught: list[int] = []
    usual = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        with between_turns():
            signal.raise_signal(signal.SIGINT)  # must not raise, nor reach the usual handler
        assert caught == []
        signal.raise_signal(signal.SIGINT)  # and the usual handling is back after
        assert caught == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, usual)


def test_other_commands_start_without_the_agent_stack():
    """Defining chat and run imports neither the model clients (httpx, which
    imports rich when it is installed) nor the Docker SDK nor prompt_toolkit:
    ``ags sessions`` starts in a third of a second, not one."""
    code = "import sys, cli.main; print([m for m in " + repr(HEAVY) + " if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


HEAVY = ("httpx", "docker", "rich", "prompt_toolkit", "agent.loop")


def test_run_stops_after_as_many_steps_as_the_loop_does():
    from agent.loop import MAX_STEPS
    from cli import chat

    assert chat.MAX_STEPS == MAX_STEPS


@pytest.mark.parametrize(
    ("text", "count"),
    [("2", True), ("0", True), ("123456789", True), ("", False), ("-1", False), ("2x", False),
     ("\u00b2", False), ("\u0663", False), ("9" * 10, False), ("9" * 5000, False)],
)  # fmt: skip
def test_what_rewind_and_show_take_for_a_count(text: str, count: bool) -> None:
    # "²".isdigit() is true and int() refuses it, as it refuses 5,000 digits: either
    # one, typed after \rewind or \show, ended the chat with a ValueError.
    assert _is_count(text) is count
    if count:
        assert int(text) >= 0
