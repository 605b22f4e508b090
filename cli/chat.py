"""``ags chat`` (the interactive loop) and ``ags run`` (one turn, for scripts)."""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from agent.errors import ModelError, ModelUnavailable
from agent.loop import MAX_STEPS, Agent, AgentEvents, TurnResult
from agent.models import ModelClient, make_client
from agent.resume import Choice, choose_session
from agent.sandbox import Sandbox
from agent.tools import Toolbox
from objstore import AgsError, InvalidInput, Store
from objstore.resolve import project_root

from .app import cli, open_store
from .approval import approval_request
from .chat_commands import COMMANDS, ChatCommands
from .chat_input import ChatCompleter, ChatPrompt, history_path, open_history, quiet_keys
from .chat_view import TerminalView, ToolResult, make_console, status_line
from .output import (
    emit_json,
    emit_lines,
    first_line,
    one_line,
    short,
    style,
    tool_call_summary,
    visible,
)

EXIT_INTERRUPTED = 130
EXIT_STOPPED = 3  # the loop gave the turn back early (too many steps)


@dataclass(frozen=True, slots=True)
class AgentOptions:
    resume: str | None
    continue_latest: bool
    model: str | None
    provider: str
    base_url: str | None
    max_context_tokens: int | None
    max_output_tokens: int | None
    stream_tools: bool | None
    image: str | None
    network: bool
    project: str | None


def agent_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options ``chat`` and ``run`` share, gathered into one AgentOptions."""
    options = [
        click.option("--resume", metavar="SPEC",
                     help="Continue a session, or fork at a node or tag."),
        click.option("--continue", "continue_latest", is_flag=True,
                     help="Continue the most recent session of this project."),
        click.option("--model", envvar="AGS_MODEL", help="Model name (default: gemma4)."),
        click.option("--provider", type=click.Choice(["ollama", "openai"]), default="ollama",
                     envvar="AGS_PROVIDER", show_default=True, help="Wire format of the server."),
        click.option("--base-url", envvar="AGS_BASE_URL",
                     help="Model server (default: $OLLAMA_HOST or localhost:11434; "
                          "$OPENAI_BASE_URL for openai)."),
        click.option("--max-context-tokens", type=click.IntRange(min=256),
                     help="Context budget; compaction at 80% (default: the model's)."),
        click.option("--max-output-tokens", type=click.IntRange(min=1),
                     envvar="AGS_MAX_OUTPUT_TOKENS",
                     help="Cap on each reply's tokens (default: the server's)."),
        click.option("--stream-tools/--no-stream-tools", default=None,
                     help="Stream requests that offer tools (default: yes, until a server "
                          "shows it cannot)."),
        click.option("--image", envvar="AGS_IMAGE", help="Sandbox image."),
        click.option("--network", is_flag=True, help="Give the sandbox a network."),
        click.option("--project", type=click.Path(file_okay=False),
                     help="Project directory (default: here, checked against the session's)."),
    ]  # fmt: skip

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        names = AgentOptions.__slots__
        opts = AgentOptions(**{n: kwargs.pop(n) for n in names})
        return command(*args, opts=opts, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


class TerminalEvents(AgentEvents):
    """The plain, line-based output (a pipe, a script, ``ags run``): the answer
    streamed to stdout as it comes, everything else to stderr; asks before
    mutating tools, showing all of what it asks about (approval.py). Everything
    a model, a tool or a server wrote is printed made visible (output.visible).
    On a terminal, ``ags chat`` shows turns with ``chat_view.TerminalView``."""

    def __init__(self, *, yes_tools: bool, stream: bool = True) -> None:
        self.yes_tools = yes_tools
        self.stream = stream
        self.ask = sys.stdin.isatty()
        self.project = Path.cwd()  # the project the file tools work in; set once known
        self.results: list[ToolResult] = []
        self._call: tuple[str, Any] | None = None

    def text(self, fragment: str) -> None:
        if self.stream:
            click.echo(visible(fragment, multiline=True), nl=False)

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


class Workplace:
    """What a chat keeps while its session may change (``\\resume``): the store,
    the model client, the sandbox over the project and the tools; and the
    agent working on the session now, which holds that session's writer lock."""

    def __init__(
        self,
        store: Store,
        client: ModelClient,
        toolbox: Toolbox,
        events: AgentEvents,
        opts: AgentOptions,
        choice: Choice,
    ) -> None:
        self.store = store
        self.client = client
        self.toolbox = toolbox
        self.events = events
        self.opts = opts
        self.choice = choice
        self.agent = self._open(choice)

    def _open(self, choice: Choice) -> Agent:
        """An agent on ``choice``: its writer lock taken, its budget checked, its
        unanswered tool calls recovered, and checked out for the project."""
        store, client, events = self.store, self.client, self.events

        def create() -> str:
            sid = choice.create(store, client.model)
            store.checkout(sid, root=choice.project)
            if choice.how == "forked":
                events.notice(f"forked into new session {sid}")
            return sid

        agent = Agent(
            store, choice.session, client, self.toolbox, events, base=choice.base, create=create
        )  # the writer lock
        try:
            agent.max_context_tokens = self.opts.max_context_tokens or _model_context(client)
            agent.check_budget(
                "--max-context-tokens" if self.opts.max_context_tokens else "the model's window"
            )
            agent.recover()
            head = store.head(choice.project)
            if choice.session is not None and (head is None or head.session != choice.session):
                store.checkout(choice.session, root=choice.project)
        except BaseException:
            agent.close()
            raise
        return agent

    def switch(self, spec: str) -> str:
        """Work on the session (or a fork at the node) ``spec`` names from now on.
        It must belong to this project: the sandbox is this project's. The
        current session is let go only once the new one is ready."""
        choice = choose_session(
            self.store, resume=spec, continue_latest=False, project=self.opts.project
        )
        if choice.session is not None and choice.session == self.agent.sid:
            raise InvalidInput(f"already in session {short(choice.session)}")
        agent = self._open(choice)
        self.agent.close()
        self.agent, self.choice = agent, choice
        return _banner(self)

    def close(self) -> None:
        self.agent.close()


@contextmanager
def running_agent(
    ctx: click.Context, opts: AgentOptions, events: AgentEvents
) -> Iterator[Workplace]:
    """A fresh sandbox, the session chosen with its writer lock held, unanswered
    tool calls recovered; everything let go on the way out. The client and the
    sandbox come first: with a bad model setting or no Docker engine, nothing
    is written; a new session or a fork is written with the first answer."""
    project = Path(project_root(opts.project))
    client = make_client(
        opts.provider,
        opts.base_url,
        opts.model,
        max_output_tokens=opts.max_output_tokens,
        stream_tools=opts.stream_tools,
    )
    with closing(client), Sandbox.start(project, opts.image, opts.network) as sandbox:
        store = open_store(ctx)  # only now: a bad setting must not even make a store
        choice = choose_session(
            store,
            resume=opts.resume,
            continue_latest=opts.continue_latest,
            project=opts.project,
        )
        toolbox = Toolbox(choice.project, sandbox, {})
        if isinstance(events, TerminalEvents | TerminalView):
            events.project = toolbox.root
        place = Workplace(store, client, toolbox, events, opts, choice)
        try:
            yield place
        finally:
            place.close()


def _model_context(client: ModelClient) -> int | None:
    try:
        length = client.context_length()
    except ModelUnavailable:
        raise  # no server: say so now, not after the chat call's retries too
    except ModelError:
        return None  # the first chat call will say what is wrong, more precisely
    return int(length) if length else None


@cli.command()
@agent_options
@click.option("--yes-tools", is_flag=True, help="Run mutating tools without asking.")
@click.option("--max-steps", type=click.IntRange(min=1), default=MAX_STEPS, show_default=True,
              help="Model calls in the turn before it stops early.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary, not the stream.")
@click.argument("prompt")
@click.pass_context
def run(
    ctx: click.Context,
    prompt: str,
    yes_tools: bool,
    max_steps: int,
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
    events = TerminalEvents(yes_tools=yes_tools, stream=not as_json)
    with running_agent(ctx, opts, events) as place:
        agent, choice = place.agent, place.choice
        agent.max_steps = max_steps
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
        _plain_chat(ctx, opts)


def _banner(place: Workplace) -> str:
    choice = place.choice
    if choice.session is None:
        what = "a new session" if choice.how == "new" else f"a fork of {choice.fork_spec}"
        return f"{what} (saved from the first answer on)"
    info = place.store.session(choice.session)
    return f"session {short(info.id)} ({choice.how}, {info.messages} messages)"


def _terminal_chat(ctx: click.Context, opts: AgentOptions) -> None:
    """The chat on a terminal: chat_view.py shows it, chat_input.py reads it."""
    console = make_console()
    view = TerminalView(console, Path.cwd())
    with running_agent(ctx, opts, view) as place:
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
            f"ags chat · {_banner(place)} · {one_line(place.client.model)} · "
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


class _PlainPrinter:
    """Command output in the plain chat: stdout, errors on stderr."""

    def line(self, text: str = "") -> None:
        click.echo(text)

    def error(self, text: str) -> None:
        click.echo(text, err=True)

    def long(self, lines: Sequence[str]) -> None:
        emit_lines(lines)


def _plain_chat(ctx: click.Context, opts: AgentOptions) -> None:
    """The line-based chat: for pipes, scripts, and terminals that cannot do more."""
    if sys.stdin.isatty():
        with suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
    events = TerminalEvents(yes_tools=False)
    with running_agent(ctx, opts, events) as place:
        commands = ChatCommands(
            place.store, lambda: place.agent, place.switch, events.results, _PlainPrinter()
        )
        click.echo(
            f"ags chat: {_banner(place)} with {place.client.model}; \\help for commands",
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
