"""The ``ags`` command line: parses arguments, calls objstore, prints.

No logic of its own lives here. Every ``AgsError`` becomes one line on
stderr and exit status 1; a traceback is always a bug.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click

from objstore import AgsError, Store


class AgsGroup(click.Group):
    """The one place that turns errors into one-line messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AgsError as e:
            click.echo(f"ags: {e}", err=True)
        except OSError as e:  # the disk, not the user: full, read-only, out of file handles
            where = f": {e.filename}" if e.filename else ""
            click.echo(f"ags: {e.strerror or e}{where}", err=True)
        ctx.exit(1)


@click.group(cls=AgsGroup)
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
    """ags keeps AI-agent sessions the way Git keeps source.

    \b
    Example:
      ags sessions --json
    """
    ctx.obj = store_path


def _open(ctx: click.Context) -> Store:
    store = Store.open(ctx.obj)
    ctx.call_on_close(store.close)
    return store


@cli.command("sessions")
@click.option("--all", "show_all", is_flag=True, help="Include archived sessions.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON rows.")
@click.pass_context
def sessions(ctx: click.Context, show_all: bool, as_json: bool) -> None:
    """List sessions, most recently active first.

    \b
    Example:
      ags sessions --all
    """
    rows = _open(ctx).sessions(include_archived=show_all)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], indent=2))
        return
    for r in rows:
        title = r.title or "(untitled)"
        click.echo(f"{r.id[:12]}  {r.updated[:19]}  {r.messages:>6}  {title}")


def main() -> None:
    cli(prog_name="ags")


if __name__ == "__main__":
    main()
