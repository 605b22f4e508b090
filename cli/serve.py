"""``ags serve``: the session browser (web/) on a local port."""

from __future__ import annotations

import os
import secrets
import webbrowser

import click

from objstore import InvalidInput

from .app import cli, open_store


@cli.command("serve")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="The port (0: any free one).")  # fmt: skip
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on; off loopback, the token is needed.")  # fmt: skip
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
@click.option("--read-only", is_flag=True, help="Show sessions; change nothing.")
@click.option("--token", "require_token", is_flag=True,
              help="Ask for the token on loopback too (a machine with other users).")  # fmt: skip
@click.pass_context
def serve_cmd(
    ctx: click.Context,
    port: int,
    host: str,
    open_browser: bool,
    read_only: bool,
    require_token: bool,
) -> None:
    """Browse sessions in a web browser: list, search, read transcripts, see forks,
    watch a session live, and rename, tag, fork, archive, export or delete.

    Listens on 127.0.0.1 only, unless --host says otherwise; then every
    request needs the token printed at start (the first visit brings it in
    the address, a cookie keeps it). Changes need a form of the page itself
    (anti-CSRF). Runs until Ctrl-C. The token is new at every start unless
    AGS_SERVE_TOKEN sets it.

    \b
    Examples:
      ags serve --open
      ags serve --read-only --port 9000
      ags serve --host 0.0.0.0        # prints an address with ?token=...
    """
    if not host.strip():  # an empty address binds every interface: say it, as 0.0.0.0
        raise click.BadParameter(
            "give an address (0.0.0.0 for every interface)", param_hint="--host"
        )
    # Imported here: the web stack takes ~0.5 s to import, which no other command should pay.
    from web.app import bind, serve
    from web.guard import Guard, is_loopback, needs_token
    from web.site import ServeConfig

    store = open_store(ctx)
    path = store.path
    read_only = read_only or store.read_only  # a backup, a snapshot: no button would work
    store.close()  # each page opens its own handle
    loopback = is_loopback(host)
    token = None
    if needs_token(host, require_token):
        token = os.environ.get("AGS_SERVE_TOKEN") or secrets.token_urlsafe(24)
        if len(token) < 16:
            raise InvalidInput("AGS_SERVE_TOKEN must be at least 16 characters")
    sock = bind(host, port)
    port = sock.getsockname()[1]
    guard = Guard(host, port, token, read_only)
    config = ServeConfig(path, read_only, guard)
    url = guard.first_url()
    mode = " (read-only)" if read_only else ""
    click.echo(f"ags serve: {path}{mode} at {url}", err=True)
    if not loopback:
        click.echo(
            f"ags serve: listening on {host}, not only this machine: anyone who can reach it "
            "needs the token above; the traffic is not encrypted",
            err=True,
        )
    click.echo("ags serve: Ctrl-C stops it", err=True)
    if open_browser:
        webbrowser.open(url)
    serve(config, sock)
