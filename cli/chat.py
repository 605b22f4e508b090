"""``ags chat`` (the interactive agent) and ``ags run`` (one turn, for scripts).

On a terminal the chat is shown by chat_view.py and read by chat_input.py;
otherwise it is plain text (plain_chat.py), as ``ags run`` always is.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from objstore import AgsError

from .agent_options import AgentOptions, agent_options
from .app import cli
from .output import emit_json, one_line

if TYPE_CHECKING:
    from agent.loop import TurnResult

    from .chat_view import TerminalView

EXIT_INTERRUPTED = 130
MAX_STEPS = 40  # agent.loop.MAX_STEPS, which this module must not import (agent_options.py)
EXIT_STOPPED = 3  # the loop gave the turn back early (too many steps)


@cli.command()
@agent_options
@click.option("--yes-tools", is_flag=True, help="Run mutating tools without asking.")
@click.option("--max-steps", type=click.IntRange(min=1), metavar="N",
              help=f"Model calls in the turn before it stops (default: {MAX_STEPS}).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary, not the stream.")
@click.argument("prompt")
@click.pass_context
def run(
    ctx: click.Context,
    prompt: str,
    yes_tools: bool,
    max_steps: int | None,
    as_json: bool,
    opts: AgentOptions,
) -> None:
    """One turn, for scripts: PROMPT goes to the model, tools run, the answer streams.

    Exit status: 0 the model finished; 1 an error (one line on stderr; nothing
    of the turn is stored); 3 stopped early (too many steps, or the reply was
    cut off by the output limit); 130 interrupted. Without a terminal,
    mutating tools are refused unless --yes-tools.

    \b
    Examples:
      ags run "list the files" --yes-tools
      ags run --continue "now run the tests" --json
      ags run --resume 3f2a~2 "try another way"    # forks there
    """
    if not prompt.strip():
        raise click.BadParameter("say what to do", param_hint="PROMPT")
    from .plain_chat import PlainEvents
    from .workplace import running_agent

    events = PlainEvents(yes_tools=yes_tools, stream=not as_json)
    with running_agent(ctx, opts, events) as place:
        agent, choice = place.agent, place.choice
        agent.max_steps = max_steps or MAX_STEPS
        result = agent.turn(prompt)
        state = agent.state
    if as_json:
        emit_json({
            "session": agent.sid,
            "how": choice.how,
            "reply": result.reply,
            "done_reason": result.done_reason,
            "stopped": result.stopped,
            "model_calls": result.model_calls,
            "tool_calls": result.tool_calls,
            "usage": state.get("usage"),
            "retries": state.get("retries"),
        })  # fmt: skip
    elif result.reply and not result.reply.endswith("\n"):
        click.echo()
    ctx.exit(_exit_status(result))


def _exit_status(result: TurnResult) -> int:
    if result.stopped == "interrupted":
        return EXIT_INTERRUPTED
    return 0 if result.stopped is None else EXIT_STOPPED


@cli.command()
@agent_options
@click.pass_context
def chat(ctx: click.Context, opts: AgentOptions) -> None:
    """The interactive agent: talk, and it works in a sandbox over your project.

    Every message is saved as it completes; Ctrl-C stops the current answer or
    tool and keeps everything so far; a crash loses nothing and the next
    resume marks unfinished tool calls. Type \\help for commands.

    On a terminal the answer is rendered as Markdown as it streams, tools are
    shown in a few lines each (\\show N has all of a result), approvals take
    one key (y, n, a), and the prompt keeps a history across runs. With
    stdin or stdout not a terminal it is plain text, answers alone on stdout.

    \b
    Examples:
      ags chat
      ags chat --continue
      ags chat --resume 3f2a~4 --model qwen3 --provider openai --base-url http://localhost:8000
    """
    if sys.stdin.isatty() and sys.stdout.isatty() and os.environ.get("TERM") != "dumb":
        _terminal_chat(ctx, opts)
    else:
        from .plain_chat import plain_chat

        plain_chat(ctx, opts)


def _terminal_chat(ctx: click.Context, opts: AgentOptions) -> None:
    """The chat on a terminal: chat_view.py shows it, chat_input.py reads it."""
    from .chat_commands import COMMANDS, ChatCommands
    from .chat_input import ChatCompleter, ChatPrompt, history_path, open_history, quiet_keys
    from .chat_view import TerminalView, make_console, status_line
    from .workplace import running_agent

    console = make_console()
    view = TerminalView(console, Path.cwd())
    with running_agent(ctx, opts, view) as place, between_turns():
        store = place.store
        history, kept = open_history(history_path())
        completer = ChatCompleter(COMMANDS, store)
        prompt = ChatPrompt(completer, history)
        help_extra = (
            "Enter sends; Alt-Enter or a trailing \\ starts a new line; Tab completes;\n"
            "Up/Down: history, " + kept + ";\n"
            "Ctrl-C stops an answer or a tool, clears the input, twice at an empty prompt leaves."
        )
        commands = ChatCommands(
            store, lambda: place.agent, place.switch, view.results, _ConsolePrinter(view),
            help_extra,
        )  # fmt: skip
        view.say(
            f"ags chat · {place.describe()} · {one_line(place.client.model)} · "
            "\\help for commands, Ctrl-D to leave",
            "dim",
        )
        while True:
            try:
                line = prompt.read(status_line(place.agent))
            except EOFError:
                break
            if not line.strip():
                continue
            if line.lstrip().startswith("\\"):
                if not commands.run(line):
                    break
                continue
            agent = place.agent
            agent.interrupts.pending = False  # a Ctrl-C after the last turn was for that one
            view.begin_turn()
            try:
                with quiet_keys():
                    result = agent.turn(line)
            except AgsError as e:  # the model failed, the context is full: the chat goes on
                view.end_turn(None)
                view.error(str(e))
                continue
            except BaseException:
                view.end_turn(None)  # the terminal as it was, whatever happened
                raise
            view.end_turn(result)


@contextmanager
def between_turns() -> Iterator[None]:
    """A Ctrl-C that lands between turns does nothing. The prompt reads Ctrl-C
    as a key and a turn stops at it (the loop's Interrupts); one pressed just
    as an answer ends falls between the two, and must not end the chat."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals only reach the main thread
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _ConsolePrinter:
    """Command output on the terminal: text, never markup; long output paged."""

    def __init__(self, view: TerminalView) -> None:
        self.view = view

    def line(self, text: str = "") -> None:
        self.view.say(text)

    def error(self, text: str) -> None:
        self.view.say(text, "red")

    def long(self, lines: Sequence[str]) -> None:
        if len(lines) + 2 > self.view.console.height:
            click.echo_via_pager("\n".join(lines) + "\n", color=False)
        else:
            for line in lines:
                self.view.say(line)
