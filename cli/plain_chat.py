"""The plain, line-based face of ``ags chat`` and ``ags run``: for pipes,
scripts and terminals that cannot do more. Answers alone go to stdout, all
else to stderr; the prompt only to a terminal."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import click

from objstore import AgsError

from .agent_options import AgentOptions
from .approval import approval_request
from .chat_commands import ChatCommands
from .output import emit_lines, first_line, one_line, style, tool_call_summary, visible
from .tool_calls import ToolResult
from .workplace import ProjectEvents, running_agent


class PlainEvents(ProjectEvents):
    """The plain, line-based output (a pipe, a script, ``ags run``): the answer
    streamed to stdout as it comes, everything else to stderr; asks before
    mutating tools, showing all of what it asks about (approval.py). Everything
    a model, a tool or a server wrote is printed made visible (output.visible).
    On a terminal, ``ags chat`` shows turns with ``chat_view.TerminalView``."""

    project: Path

    def __init__(self, *, yes_tools: bool, stream: bool = True) -> None:
        self.yes_tools = yes_tools
        self.stream = stream
        self.ask = sys.stdin.isatty()
        self.project = Path.cwd()
        self.results: list[ToolResult] = []
        self._call: tuple[str, Any] | None = None

    def text(self, fragment: str) -> None:
        if self.stream:
            click.echo(visible(fragment, multiline=True), nl=False)

    def text_dropped(self) -> None:
        if self.stream:  # the cut-off text ends its line; the answer starts on the next
            click.echo("")
        self.notice("the answer above was cut off; it starts over below")

    def notice(self, message: str) -> None:
        click.echo(style(f"ags: {visible(message)}", dim=True), err=True)

    def tool_started(self, name: str, arguments: Any) -> None:
        self._call = (name, arguments)
        call = {"name": name, "arguments": arguments}
        click.echo(style(f"\n-> {tool_call_summary(call)}", fg="magenta"), err=True)

    def tool_finished(self, name: str, content: str, ok: bool) -> None:
        if self._call is not None:
            number = len(self.results) + 1
            self.results.append(ToolResult(number, name, self._call[1], content, ok))
            self._call = None
        mark = "ok" if ok else "failed"
        click.echo(style(f"   {mark}: {first_line(content, 100)}", dim=True), err=True)

    def approve(self, name: str, arguments: Any) -> str:
        if self.yes_tools:
            return "yes"
        if not self.ask:
            self.notice(f"{name} needs approval: refused (no terminal; pass --yes-tools)")
            return "no"
        width = min(shutil.get_terminal_size().columns, 120)
        for line in approval_request(name, arguments, self.project, width):
            click.echo(line, err=True)
        answer = click.prompt(
            f"run it? [y]es / [n]o / [a]lways for {one_line(name)}",
            type=click.Choice(["y", "n", "a", "yes", "no", "always"]),
            show_choices=False,
            err=True,
        )
        return {"y": "yes", "n": "no", "a": "always"}.get(answer, answer)


class _PlainPrinter:
    """Command output in the plain chat: stdout, errors on stderr."""

    def line(self, text: str = "") -> None:
        click.echo(text)

    def error(self, text: str) -> None:
        click.echo(text, err=True)

    def long(self, lines: Sequence[str]) -> None:
        emit_lines(lines)


def plain_chat(ctx: click.Context, opts: AgentOptions) -> None:
    """The line-based chat: for pipes, scripts, and terminals that cannot do more."""
    if sys.stdin.isatty():
        with suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
    events = PlainEvents(yes_tools=False)
    with running_agent(ctx, opts, events) as place:
        commands = ChatCommands(
            place.store, lambda: place.agent, place.switch, events.results, _PlainPrinter()
        )
        click.echo(
            f"ags chat: {place.describe()} with {place.client.model}; \\help for commands",
            err=True,
        )
        while True:
            try:
                line = _read_line()
            except (EOFError, KeyboardInterrupt):
                click.echo(err=True)
                break
            line = line.strip()
            if not line:
                continue
            if line.startswith("\\"):
                if not commands.run(line):
                    break
                continue
            try:
                result = place.agent.turn(line)
            except AgsError as e:  # the model failed, the context is full: the chat goes on
                click.echo(f"\nags: {visible(str(e))}", err=True)
                continue
            click.echo()
            if result.stopped:
                events.notice(f"turn stopped: {result.stopped}")


def _read_line() -> str:
    """The next line the user typed. The prompt goes to the terminal only: piped
    input gets none, and piped output keeps only the answers."""
    if not sys.stdin.isatty():
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line
    prompt = style("> ", bold=True)
    if sys.stdout.isatty():
        return input(prompt)  # readline redraws the prompt it was given
    click.echo(prompt, nl=False, err=True)
    return input()
