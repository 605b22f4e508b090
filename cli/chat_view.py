"""What a person sees of an agent turn on a terminal: the answer rendered as
Markdown while it streams (markdown_stream.py), each tool call and its result
in a few lines (the whole result one ``\\show N`` away), approvals asked with
one key after all of the request is shown, and a line saying what is going
on. The status line under the prompt comes from ``status_line``.

Everything from a session, a model, a tool or a server is printed made visible
(``output.visible``) and as text, never as rich markup: the console is made
with markup, emoji codes and highlighting off, and text goes in as ``Text``.
The plain output for pipes and scripts is ``plain_chat.PlainEvents``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Final

import click
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.text import Text

from agent.loop import Agent, TurnResult
from agent.tokens import spent_tokens
from agent.tools import shell_status

from .approval import INDENT, WRAPPED, approval_request
from .chat_input import read_key
from .markdown_stream import MarkdownStream
from .output import one_line, short, visible
from .tool_calls import ToolResult, call_line, counted, cut
from .workplace import ProjectEvents

RESULT_LINES: Final = 4  # lines of a tool's output shown under its call
SPINNER: Final = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
ANSWERS: Final = {"y": "yes", "n": "no", "a": "always"}


def make_console() -> Console:
    """The chat's console: stdout, no markup, no emoji codes, no highlighting of
    numbers and strings in text it did not style itself."""
    return Console(markup=False, emoji=False, highlight=False)


class TerminalView(ProjectEvents):
    """The events of the agent loop, shown on a terminal (see the module doc)."""

    def __init__(self, console: Console, project: Path) -> None:
        self.console = console
        self.project = project  # the project the file tools work in; set once known
        self.results: list[ToolResult] = []
        self._stream: MarkdownStream | None = None
        self._live: Live | None = None
        self._activity = _Activity()
        self._call: tuple[str, Any] | None = None  # the tool call running now
        self._last = ""  # what the turn printed last, "text" or "tool": a blank line between

    # -- a turn ----------------------------------------------------------------

    def begin_turn(self) -> None:
        self.console.print()
        self._activity.set("waiting for the model")
        self._last = ""
        self._start_live()

    def end_turn(self, result: TurnResult | None) -> None:
        self._settle()
        self._stop_live()
        if self._call is not None:  # the tool running when the turn ended
            self._call = None
            self.say("  ⎿  interrupted: it was stopped; its effects may be partial", "yellow")
        if result is not None and result.stopped == "interrupted":
            self.say("stopped (Ctrl-C); all that was said so far is kept", "yellow")
        elif result is not None and result.stopped:
            self.say(f"turn stopped: {result.stopped}", "yellow")
        self.console.print()

    def text(self, fragment: str) -> None:
        if self._stream is None:
            spaced = self._last == "tool"
            self._stream = MarkdownStream(self._print, guard=self._guard, spaced=spaced)
            self._last = "text"
        self._stream.height = max(self.console.height - 4, 3)
        self._activity.set("writing")
        self._stream.feed(visible(fragment, multiline=True))

    def text_dropped(self) -> None:
        self.notice("the answer above was cut off; it starts over below")

    def notice(self, message: str) -> None:
        self._settle()
        self.say(f"ags: {visible(message)}", "dim")

    def tool_started(self, name: str, arguments: Any) -> None:
        self._settle()
        self._call = (name, arguments)
        if self._last == "text":
            self._print(Text(""))
        self._last = "tool"
        line = Text("⏺ ", style="magenta")
        line.append(call_line(name, arguments, self.console.width - 2), style="bold")
        self._print(line)
        self._activity.set(f"running {one_line(name)}")

    def tool_finished(self, name: str, content: str, ok: bool) -> None:
        self._settle()
        if self._call is None:  # refused before it started: nothing ran
            self._print(Text("  ⎿  declined", style="yellow"))
            return
        _, arguments = self._call
        self._call = None
        result = ToolResult(len(self.results) + 1, name, arguments, content, ok)
        self.results.append(result)
        self._print(*result_lines(result, self.console.width))
        self._activity.set("waiting for the model")

    def approve(self, name: str, arguments: Any) -> str:
        self._settle()
        with self._paused():
            paged = self._show_request(name, arguments)
            while True:
                keys = "ynap" if paged else "yna"
                self.console.print(_question(name, paged), end="")
                try:
                    key = read_key(keys)
                except (KeyboardInterrupt, EOFError):
                    self.console.print(Text(" stopped", style="yellow"))
                    raise KeyboardInterrupt from None
                if key == "p":
                    self.console.print()
                    _page(approval_request(name, arguments, self.project, self._width()))
                    continue
                self.console.print(Text(ANSWERS[key], style="bold"))
                return ANSWERS[key]

    def _show_request(self, name: str, arguments: Any) -> bool:
        """Show all of the request: through the pager (True) if it is taller than the screen."""
        lines = approval_request(name, arguments, self.project, self._width())
        if len(lines) + 3 > self.console.height:  # never cut: the pager shows it all
            _page(lines)
            head = Text(f"{lines[0]} ", style="bold")
            head.append(f"(all {len(lines)} lines shown in the pager; p shows them again)",
                        style="dim")  # fmt: skip
            self.console.print(head)
            return True
        for line in _styled_request(lines):
            self.console.print(line)
        return False

    def _width(self) -> int:
        return min(self.console.width, 120)

    # -- printing --------------------------------------------------------------

    def say(self, text: str, style: str | None = None) -> None:
        """A line of ags's own (already visible), in ``style``."""
        self._print(Text(text, style=style or ""))

    def _print(self, *renderables: RenderableType) -> None:
        """Print above the live region, if there is one. Under the Live's lock:
        rich positions the cursor from the live region's last height and learns
        the new one only while it prints, so a refresh from its thread in
        between would move the cursor by the wrong count and overwrite lines."""
        with self._guard():
            for renderable in renderables:
                self.console.print(renderable)

    def _guard(self) -> AbstractContextManager[Any]:
        """The live region's lock (reentrant), held while printing above it."""
        live = self._live
        return live._lock if live is not None else nullcontext()

    def error(self, message: str) -> None:
        self.say(f"ags: {visible(message)}", "red")

    # -- the live region -------------------------------------------------------

    def _settle(self) -> None:
        """The answer being streamed is complete (or cut short): print the rest."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.finish()

    def _start_live(self) -> None:
        if self._live is None:
            self._live = Live(
                _LiveArea(self),
                console=self.console,
                refresh_per_second=8,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def _stop_live(self) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            live.stop()

    @contextmanager
    def _paused(self) -> Iterator[None]:
        was_live = self._live is not None
        self._stop_live()
        try:
            yield
        finally:
            if was_live:
                self._start_live()


class _Activity:
    """What the turn is doing and since when, for the line under the answer."""

    def __init__(self) -> None:
        self.what = ""
        self.since = time.monotonic()

    def set(self, what: str) -> None:
        if what != self.what:
            self.what, self.since = what, time.monotonic()

    def line(self) -> Text:
        now = time.monotonic()
        frame = SPINNER[int(now * 10) % len(SPINNER)]
        return Text(f"{frame} {self.what} · {now - self.since:.0f}s · Ctrl-C stops", style="dim")


class _LiveArea:
    """The bottom of the screen during a turn: the block being written, and the activity."""

    def __init__(self, view: TerminalView) -> None:
        self.view = view

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        stream = self.view._stream
        if stream is not None:
            yield stream
        yield self.view._activity.line()


def result_lines(result: ToolResult, width: int) -> list[Text]:
    """A tool result in a few lines: its status (for ``shell`` the exit code), and
    its output: one line beside the status; else how many lines, the first
    RESULT_LINES of them, and the ``\\show N`` that shows all."""
    output, status = (
        shell_status(result.content) if result.name == "shell" else (result.content, None)
    )
    lines = output.rstrip("\n").split("\n") if output.strip() else []
    if status is None:
        status = "ok" if result.ok else "failed"
    head = Text("  ⎿  ", style="dim")
    head.append(status, style="green" if result.ok else "red")
    room = max(width - len(INDENT) - 1, 20)
    if not lines:
        head.append(" · no output", style="dim")
        return [head]
    if len(lines) == 1 and len(head) + 3 + len(visible(lines[0])) <= width:
        head.append(" · " + visible(lines[0]), style="dim")
        return [head]
    head.append(f" · {counted(len(lines), 'line')} · \\show {result.number}", style="dim")
    out = [head]
    for line in lines[:RESULT_LINES]:
        out.append(Text(INDENT + " " + cut(visible(line), room), style="dim"))
    if len(lines) > RESULT_LINES:
        rest = len(lines) - RESULT_LINES
        out.append(Text(f"{INDENT} … {counted(rest, 'more line')}", style="dim"))
    return out


def status_line(agent: Agent) -> str:
    """The line under the prompt for ``agent`` (``status_text``)."""
    return status_text(
        agent.client.model,
        agent.sid,
        agent.context_tokens(),
        agent.max_context_tokens,
        agent.state.get("usage") or {},
    )


def status_text(
    model: str, session: str | None, used: int, limit: int | None, usage: dict[str, Any]
) -> str:
    """Model, session, context used (tokens, and % of the limit when known), and the
    tokens the session's model calls have cost, saying what is estimated."""
    sid = short(session, 8) if session else "new"
    if limit:
        context = f"context {_tokens(used)}/{_tokens(limit)} ({used * 100 // limit}%)"
    else:
        context = f"context {_tokens(used)} (limit unknown)"
    counted, estimated = spent_tokens(usage)
    if not estimated:
        spent = f"spent {_tokens(counted)} tokens"
    elif not counted:
        spent = f"spent ~{_tokens(estimated)} tokens (estimated: the server reports none)"
    else:
        spent = f"spent {_tokens(counted)} + ~{_tokens(estimated)} estimated tokens"
    return f"{one_line(model)} · session {sid} · {context} · {spent}"


def _tokens(n: int) -> str:
    if n < 1000:
        return str(n)
    if n < 100_000:
        return f"{n / 1000:.1f}k"
    return f"{n // 1000}k"


def _question(name: str, paged: bool) -> Text:
    question = Text("Allow? ", style="bold")
    question.append(f"y yes · n no · a always ({one_line(name)}, this chat)")
    if paged:
        question.append(" · p page again")
    question.append(" ")
    return question


def _styled_request(lines: list[str]) -> Iterator[Text]:
    """The request's lines, a diff's added and removed lines coloured (a wrapped
    line's continuation as the line it continues)."""
    style = ""
    for number, line in enumerate(lines):
        if not line.startswith(WRAPPED):
            body = line[len(INDENT) :] if line.startswith(INDENT) else None
            if number == 0:
                style = "bold"
            elif body is None:
                style = ""
            elif body.startswith(("+++", "---")):
                style = "bold"
            elif body.startswith("+"):
                style = "green"
            elif body.startswith("-"):
                style = "red"
            elif body.startswith("@@"):
                style = "cyan"
            else:
                style = ""
        yield Text(line, style=style)


def _page(lines: list[str]) -> None:
    """Show ``lines`` through the pager ($PAGER, else less), all of them."""
    click.echo_via_pager("\n".join(lines) + "\n", color=False)
