"""``ags chat`` (the interactive loop) and ``ags run`` (one turn, for scripts)."""

from __future__ import annotations

import functools
import shutil
import sys
from collections.abc import Callable, Iterator
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
from agent.tokens import describe_usage
from agent.tools import Toolbox
from objstore import AgsError, Store, project_root

from .app import cli, open_store
from .approval import approval_request
from .history import entry_lines
from .output import (
    emit_json,
    first_line,
    one_line,
    relative_time,
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
    """Streams the answer to stdout, everything else to stderr; asks before mutating
    tools, showing all of what it asks about (approval.py). Everything a model, a
    tool or a server wrote is printed made visible (output.visible)."""

    def __init__(self, *, yes_tools: bool, stream: bool = True) -> None:
        self.yes_tools = yes_tools
        self.stream = stream
        self.ask = sys.stdin.isatty()
        self.project = Path.cwd()  # the project the file tools work in; set once known

    def text(self, fragment: str) -> None:
        if self.stream:
            click.echo(visible(fragment, multiline=True), nl=False)

    def notice(self, message: str) -> None:
        click.echo(style(f"ags: {visible(message)}", dim=True), err=True)

    def tool_started(self, name: str, arguments: Any) -> None:
        call = {"name": name, "arguments": arguments}
        click.echo(style(f"\n-> {tool_call_summary(call)}", fg="magenta"), err=True)

    def tool_finished(self, name: str, content: str, ok: bool) -> None:
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


@contextmanager
def running_agent(
    ctx: click.Context, opts: AgentOptions, events: AgentEvents
) -> Iterator[tuple[Agent, Choice]]:
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

        def create() -> str:
            sid = choice.create(store, client.model)
            store.checkout(sid, root=choice.project)
            if choice.how == "forked":
                events.notice(f"forked into new session {sid}")
            return sid

        toolbox = Toolbox(choice.project, sandbox, {})
        if isinstance(events, TerminalEvents):
            events.project = toolbox.root
        agent = Agent(
            store, choice.session, client, toolbox, events, base=choice.base, create=create
        )  # the writer lock
        try:
            agent.max_context_tokens = opts.max_context_tokens or _model_context(client)
            agent.check_budget(
                "--max-context-tokens" if opts.max_context_tokens else "the model's window"
            )
            agent.recover()
            head = store.head(choice.project)
            if choice.session is not None and (head is None or head.session != choice.session):
                store.checkout(choice.session, root=choice.project)
            yield agent, choice
        finally:
            agent.close()


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
    with running_agent(ctx, opts, events) as (agent, choice):
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


SESSION_COMMANDS = ("info", "title", "fork", "compact", "log", "rewind")
CHAT_HELP = """\
\\help             this list
\\sessions         recent sessions
\\info             this session
\\title NAME       rename this session
\\fork             fork here; prints the new id (resume it with ags chat --resume ID)
\\compact [focus]  summarise older turns now
\\log              the last messages
\\rewind N         go back N messages (undo: ags rewind ID ID@{1})
\\exit             leave (Ctrl-D too)"""


@cli.command()
@agent_options
@click.pass_context
def chat(ctx: click.Context, opts: AgentOptions) -> None:
    """The interactive agent: talk, and it works in a sandbox over your project.

    Every message is saved as it completes; Ctrl-C stops the current answer or
    tool and keeps everything so far; a crash loses nothing and the next
    resume marks unfinished tool calls. Type \\help for commands.

    \b
    Examples:
      ags chat
      ags chat --continue
      ags chat --resume 3f2a~4 --model qwen3 --provider openai --base-url http://localhost:8000
    """
    if sys.stdin.isatty():
        with suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
    events = TerminalEvents(yes_tools=False)
    with running_agent(ctx, opts, events) as (agent, choice):
        store = agent.store
        if choice.session is None:
            what = "a new session" if choice.how == "new" else f"a fork of {choice.fork_spec}"
            where = f"{what} (saved from the first answer on)"
        else:
            info = store.session(choice.session)
            where = f"session {short(info.id)} ({choice.how}, {info.messages} messages)"
        click.echo(f"ags chat: {where} with {agent.client.model}; \\help for commands", err=True)
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
                if not _chat_command(store, agent, line):
                    break
                continue
            try:
                result = agent.turn(line)
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


def _chat_command(store: Store, agent: Agent, line: str) -> bool:
    """Run one backslash command; False to leave the chat."""
    name, _, arg = line[1:].partition(" ")
    arg = arg.strip()
    sid = agent.sid
    try:
        if name in ("exit", "quit", "q"):
            return False
        if name == "help":
            click.echo(CHAT_HELP)
        elif name == "sessions":
            for s in store.sessions()[:15]:
                mark = "*" if s.id == sid else " "
                click.echo(f"{mark} {short(s.id)}  {one_line(s.title, '(untitled)')[:40]:<40}  "
                           f"{relative_time(s.updated)}")  # fmt: skip
        elif name not in SESSION_COMMANDS:
            click.echo(f"unknown command \\{visible(name)}; \\help lists them", err=True)
        elif sid is None:
            click.echo(f"\\{name}: nothing yet; the session starts with the first answer",
                       err=True)  # fmt: skip
        elif name == "info":
            s = store.session(sid)
            usage = describe_usage(agent.state.get("usage", {}))
            click.echo(f"session {s.id}  {one_line(s.title, '(untitled)')}\n"
                       f"{s.messages} messages, about {agent.context_tokens()} tokens in context"
                       f" (limit {agent.max_context_tokens or 'unknown'})\n"
                       f"tokens used: {usage}; "
                       f"retries {agent.state.get('retries', 0)}")  # fmt: skip
        elif name == "title":
            if not arg:
                raise click.UsageError("\\title needs a NAME")
            store.set_title(sid, arg)
            click.echo(f"title: {visible(arg)}")
        elif name == "fork":
            click.echo(f"forked: {store.fork(sid)} (ags chat --resume that id)")
        elif name == "compact":
            agent.compact(arg or None)
        elif name == "log":
            entries = list(store.log(sid))[:10][::-1]
            for entry in entries:
                click.echo("\n".join(entry_lines(entry, oneline=True)))
        elif name == "rewind":
            steps = int(arg) if arg.isdigit() else 0
            if steps < 1:
                raise click.UsageError("\\rewind needs a number of messages, like \\rewind 2")
            node = agent.rewind(steps)
            click.echo(
                f"rewound to {short(node)}; undo: ags rewind {short(sid)} {short(sid)}@{{1}}"
            )
    except (AgsError, click.UsageError) as e:
        click.echo(f"ags: {visible(str(e))}", err=True)
    except KeyboardInterrupt:
        click.echo("ags: interrupted; nothing changed", err=True)
    return True
