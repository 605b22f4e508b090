"""The backslash commands of ``ags chat`` (``\\help`` lists them), the same on a
terminal and in the plain line-based chat. What they do lives in the store
and the agent; this module parses them and prints through a ``Printer``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import click

from agent.loop import Agent
from agent.tokens import describe_usage
from objstore import AgsError, Store

from .history import entry_lines
from .output import one_line, relative_time, short, visible
from .tool_calls import ToolResult, call_line


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """A backslash command as completion offers it."""

    name: str
    help: str
    takes_session: bool = False


COMMANDS: Final = (
    CommandSpec("help", "this list"),
    CommandSpec("sessions", "recent sessions"),
    CommandSpec("resume", "switch to another session of this project", takes_session=True),
    CommandSpec("info", "this session"),
    CommandSpec("title", "rename this session"),
    CommandSpec("fork", "fork here; prints the new id"),
    CommandSpec("compact", "summarise older turns now"),
    CommandSpec("log", "the last messages"),
    CommandSpec("rewind", "go back N messages"),
    CommandSpec("show", "tool result N in full"),
    CommandSpec("last", "the last tool result in full"),
    CommandSpec("exit", "leave"),
)
SESSION_COMMANDS: Final = ("info", "title", "fork", "compact", "log", "rewind")
CHAT_HELP: Final = """\
\\help             this list
\\sessions         recent sessions
\\resume ID        switch to another session of this project (Tab completes ids)
\\info             this session
\\title NAME       rename this session
\\fork             fork here; prints the new id (resume it with ags chat --resume ID)
\\compact [focus]  summarise older turns now
\\log              the last messages
\\rewind N [--files [--force]]
                  go back N messages (undo: ags rewind ID ID@{1}); --files also
                  puts back what write_file and edit_file changed since (not
                  what shell commands did: they cannot be undone)
\\show N, \\last    the Nth tool result of this chat, or the last one, in full
\\exit             leave (Ctrl-D too)"""


class Printer(Protocol):
    def line(self, text: str = "") -> None:
        """One line (or several) that is the command's output, already visible."""

    def error(self, text: str) -> None:
        """An error of the command, already visible."""

    def long(self, lines: Sequence[str]) -> None:
        """Lines to read whole: paged on a terminal when taller than the screen."""


class ChatCommands:
    """Runs backslash commands against the agent working now (``agent()``; a
    ``\\resume`` changes it through ``switch``)."""

    def __init__(
        self,
        store: Store,
        agent: Callable[[], Agent],
        switch: Callable[[str], str],
        results: list[ToolResult],
        printer: Printer,
        help_extra: str = "",
    ) -> None:
        self.store = store
        self.agent = agent
        self.switch = switch
        self.results = results
        self.out = printer
        self.help_extra = help_extra

    def run(self, line: str) -> bool:
        """Run one backslash command; False to leave the chat."""
        name, _, arg = line.strip()[1:].partition(" ")
        arg = arg.strip()
        try:
            return self._run(name, arg)
        except (AgsError, click.UsageError) as e:
            self.out.error(f"ags: {visible(str(e))}")
        except KeyboardInterrupt:
            self.out.error("ags: interrupted; nothing changed")
        return True

    def _run(self, name: str, arg: str) -> bool:
        agent = self.agent()
        sid = agent.sid
        if name in ("exit", "quit", "q"):
            return False
        if name == "help":
            self.out.line(CHAT_HELP + (f"\n\n{self.help_extra}" if self.help_extra else ""))
        elif name == "sessions":
            for s in self.store.sessions()[:15]:
                mark = "*" if s.id == sid else " "
                self.out.line(f"{mark} {short(s.id)}  {one_line(s.title, '(untitled)')[:40]:<40}  "
                              f"{relative_time(s.updated)}")  # fmt: skip
        elif name == "resume":
            if not arg:
                raise click.UsageError("\\resume needs a session id (Tab completes them)")
            self.out.line(f"now in {self.switch(arg)}")
        elif name in ("show", "last"):
            self._show(name, arg)
        elif name not in SESSION_COMMANDS:
            self.out.error(f"unknown command \\{visible(name)}; \\help lists them")
        elif sid is None:
            self.out.error(f"\\{name}: nothing yet; the session starts with the first answer")
        else:
            self._session_command(agent, sid, name, arg)
        return True

    def _session_command(self, agent: Agent, sid: str, name: str, arg: str) -> None:
        store = self.store
        if name == "info":
            s = store.session(sid)
            usage = describe_usage(agent.state.get("usage", {}))
            self.out.line(f"session {s.id}  {one_line(s.title, '(untitled)')}\n"
                          f"{s.messages} messages, about {agent.context_tokens()} tokens in "
                          f"context (limit {agent.max_context_tokens or 'unknown'})\n"
                          f"tokens used: {usage}; "
                          f"retries {agent.state.get('retries', 0)}")  # fmt: skip
        elif name == "title":
            if not arg:
                raise click.UsageError("\\title needs a NAME")
            store.set_title(sid, arg)
            self.out.line(f"title: {visible(arg)}")
        elif name == "fork":
            self.out.line(f"forked: {store.fork(sid)} (ags chat --resume that id)")
        elif name == "compact":
            with agent.interrupts.installed():  # Ctrl-C lands in the summary call only
                agent.compact(arg or None)
        elif name == "log":
            entries = list(store.log(sid))[:10][::-1]
            self.out.long([line for e in entries for line in entry_lines(e, oneline=True)])
        elif name == "rewind":
            words = arg.split()
            steps = int(words[0]) if words and _is_count(words[0]) else 0
            flags = set(words[1:])
            if (
                steps < 1
                or flags - {"--files", "--force"}
                or ("--force" in flags) > ("--files" in flags)
            ):
                raise click.UsageError(
                    "\\rewind needs a number of messages, like \\rewind 2 or \\rewind 2 --files"
                )
            files = "--files" in flags
            node, restored = agent.rewind(steps, files=files, force="--force" in flags)
            for item in restored:
                self.out.line(visible(f"  {item.action:<8} {item.path}"))
            undo = " --files" if files else ""
            self.out.line(
                f"rewound to {short(node)}; undo: ags rewind {short(sid)} {short(sid)}@{{1}}{undo}"
            )

    def _show(self, name: str, arg: str) -> None:
        if not self.results:
            self.out.error(f"\\{name}: no tool has run in this chat yet")
            return
        if name == "last" or not arg:
            result = self.results[-1]
        elif _is_count(arg) and 1 <= int(arg) <= len(self.results):
            result = self.results[int(arg) - 1]
        else:
            raise click.UsageError(f"\\show needs a tool result's number, 1 to {len(self.results)}")
        mark = "" if result.ok else " (failed)"
        head = f"#{result.number} {call_line(result.name, result.arguments, 200)}{mark}"
        self.out.long([head, *visible(result.content, multiline=True).split("\n")])


def _is_count(text: str) -> bool:
    """Whether ``text`` is a count as a person types one: ASCII digits, few enough for
    ``int`` (``"²".isdigit()`` is true, and ``int`` refuses it and 5,000 digits)."""
    return text.isascii() and text.isdigit() and len(text) <= 9
