"""The ``ags`` click group: the global options and the one place errors become messages.

Commands live in modules by what they work on (sessions.py, history.py,
maintenance.py, ...) and register on ``cli``; main.py imports them all.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import click

from objstore import AgsError, Store

from .output import visible

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for git killed by SIGPIPE


class AgsGroup(click.Group):
    """Every ``AgsError`` becomes one line on stderr and exit status 1; a
    traceback is always a bug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a reader that left early shows up here, not at exit
            return result
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
            where = f": {e.filename}" if e.filename else ""
            click.echo(visible(f"ags: {e.strerror or e}{where}"), err=True)
        except KeyboardInterrupt:
            click.echo("ags: interrupted", err=True)
            ctx.exit(130)
        ctx.exit(1)


@click.group(cls=AgsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ags")
@click.option(
    "--store",
    "store_path",
    envvar="AGS_STORE",
    type=click.Path(file_okay=False),
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


def open_store(ctx: click.Context) -> Store:
    """The store for this invocation, closed when the command ends."""
    root = ctx.find_root()
    store: Store | None = root.meta.get("ags.store")
    if store is None:
        store = Store.open(root.obj)
        root.meta["ags.store"] = store
        root.call_on_close(store.close)
    return store
