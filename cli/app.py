"""The ``ags`` click group: the global options and the one place errors become messages.

Commands live in modules by what they work on (sessions.py, history.py,
maintenance.py, ...) and register on ``cli``; main.py imports them all.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final, NoReturn, TextIO

import click

from objstore import AgsError, Store, StoreMissing, StoreWarning

from .output import visible

# The commands that write on an empty store: they create it, and say so. Every
# other command needs a store that exists, so that a mistyped --store is an
# error and not a new, empty store.
CREATING_COMMANDS: Final = frozenset({"chat", "run", "import"})


@contextmanager
def store_warnings_on_stderr() -> Iterator[None]:
    """Print each StoreWarning (damage the store worked around) once, as ``ags: warning:``."""
    shown: set[str] = set()
    original = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if not issubclass(category, StoreWarning):
            original(message, category, filename, lineno, file, line)
        elif str(message) not in shown:
            shown.add(str(message))
            click.echo(visible(f"ags: warning: {message}"), err=True)

    with warnings.catch_warnings():
        warnings.simplefilter("always", StoreWarning)
        warnings.showwarning = show
        yield


EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for git killed by SIGPIPE


# The module that defines each command (importing it registers the command on
# ``cli``): a command's module, and what it imports, is loaded only when that
# command runs, so ``ags ls`` does not pay for the model clients, Docker, S3 or the
# web server. tests/test_cli_startup.py checks this table against the modules.
COMMAND_MODULES: Final = {
    **dict.fromkeys(
        ["archive", "checkout", "delete", "fork", "info", "ls", "reflog", "rewind",
         "sessions", "status", "tag", "tags", "title", "unarchive"],
        "cli.sessions",
    ),
    **dict.fromkeys(["diff", "log", "search", "show"], "cli.history"),
    **dict.fromkeys(["du", "export", "fsck", "gc", "import", "repack"], "cli.maintenance"),
    **dict.fromkeys(["chat", "run"], "cli.chat"),
    **dict.fromkeys(["clone", "fetch", "pull", "push"], "cli.sync"),
    "remote": "cli.remotes",
    "serve": "cli.serve",
}  # fmt: skip


class AgsGroup(click.Group):
    """Every ``AgsError`` becomes one line on stderr and exit status 1; a
    traceback is always a bug. Commands are loaded when used (COMMAND_MODULES)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMAND_MODULES})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMAND_MODULES.get(cmd_name)
        if cmd_name not in self.commands and module is not None:
            # The import statement's machinery, not importlib.import_module: so that
            # ``python -X importtime`` shows what loading a command costs.
            __import__(module)
        return self.commands.get(cmd_name)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # plain ``ags``: the help
        except click.UsageError as e:  # ags --bogus
            _usage_error(e)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with store_warnings_on_stderr():
                result = super().invoke(ctx)
            sys.stdout.flush()  # a reader that left early shows up here, not at exit
            return result
        except click.exceptions.NoArgsIsHelpError:
            raise  # ``ags remote`` alone: its help
        except click.UsageError as e:  # a bad option or argument of a command
            _usage_error(e)
        except BrokenPipeError:
            # The reader of our output went away (ags show X | head): stop quietly,
            # as git does. Later flushes of stdout go nowhere instead of failing again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            ctx.exit(EXIT_BROKEN_PIPE)
        except AgsError as e:  # messages quote names and values from sessions: made visible
            click.echo(f"ags: {visible(str(e))}", err=True)
        except OSError as e:  # the disk, not the user: full, read-only, out of file handles
            if e.errno == errno.EROFS and e.filename:  # a store on a backup, a snapshot
                click.echo(
                    visible(f"ags: cannot write {e.filename}: read-only file system"), err=True
                )
            else:
                where = f": {e.filename}" if e.filename else ""
                click.echo(visible(f"ags: {e.strerror or e}{where}"), err=True)
        except KeyboardInterrupt:
            click.echo("ags: interrupted", err=True)
            ctx.exit(130)
        ctx.exit(1)


def _usage_error(e: click.UsageError) -> NoReturn:
    """A bad option or argument as one line on stderr, as every other error, and exit
    status 2, click's and the shell's for a usage error (click's own form is four
    lines: the usage, a hint, a blank line, the error)."""
    where = e.ctx.command_path if e.ctx is not None else "ags"
    message = " ".join(e.format_message().split())
    click.echo(visible(f"ags: {message} (see '{where} -h')"), err=True)
    raise click.exceptions.Exit(2)


@click.group(cls=AgsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ags")
@click.option(
    "--store",
    "store_path",
    envvar="AGS_STORE",
    type=click.Path(),  # a file there: Store.open says so, in words fit for AGS_STORE too
    help="The store directory (default: $AGS_STORE, else ~/.ags).",
)
@click.pass_context
def cli(ctx: click.Context, store_path: str | None) -> None:
    """ags keeps AI-agent sessions the way Git keeps source: every message is an
    immutable object, a session is a ref, a fork copies nothing.

    \b
    Examples:
      ags sessions                 # what is there
      ags log 3f2a --oneline       # one session's transcript
      ags fork 3f2a~4 --title retry
      ags export 3f2a -o s.json    # move it to another machine
    """
    ctx.obj = store_path


def open_store(ctx: click.Context, *, create: bool = True) -> Store:
    """The store for this invocation, closed when the command ends.

    Only the commands in CREATING_COMMANDS create a missing store (saying so on
    stderr), and only when ``create``; the others report it missing.
    """
    root = ctx.find_root()
    store: Store | None = root.meta.get("ags.store")
    if store is None:
        try:
            store = Store.open(root.obj, create=False)
        except StoreMissing:
            if not create or ctx.command.name not in CREATING_COMMANDS:
                raise
            store = Store.open(root.obj)
            click.echo(f"ags: created a new store at {store.path}", err=True)
        root.meta["ags.store"] = store
        root.call_on_close(store.close)
    return store


@cli.command()
@click.pass_context
def init(ctx: click.Context) -> None:
    """Create an empty store (private to you: mode 0700) at --store, $AGS_STORE or ~/.ags.

    Only init, chat, run and import create a store; every other command
    says when there is none, so a mistyped --store is an error, not a new
    empty store. Running init on an existing store changes nothing.

    \b
    Examples:
      ags init
      ags --store /data/ags init
    """
    path = ctx.find_root().obj
    try:
        store = Store.open(path, create=False)
        existed = True
    except StoreMissing:
        store = Store.open(path)
        existed = False
    store.close()
    if existed:
        click.echo(f"an ags store is already at {store.path}")
    else:
        click.echo(f"initialized an empty ags store at {store.path}")
