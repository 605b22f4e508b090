"""``ags remote``: the remotes a store syncs with (S3-compatible buckets, directories).

The logic lives in objstore/remote; this module parses, calls and prints.
"""

from __future__ import annotations

import click

from objstore.remote import (
    BadRemote,
    add_remote,
    check_remote_name,
    checked_marker,
    open_storage,
    parse_location,
    remotes,
    remove_remote,
)

from .app import cli, open_store
from .output import emit_json, visible


@cli.group("remote", invoke_without_command=True)
@click.option("-v", "--verbose", is_flag=True, help="Show each remote's URL, endpoint and region.")
@click.option("--json", "as_json", is_flag=True, help="Print the remotes as JSON.")
@click.pass_context
def remote_cmd(ctx: click.Context, verbose: bool, as_json: bool) -> None:
    """The remotes this store syncs with: S3-compatible buckets (AWS S3, MinIO, R2,
    SeaweedFS) or directories (a USB disk, a share). Without a subcommand, list them.

    Credentials never go in a remote: they come from the environment
    (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), AWS_PROFILE or ~/.aws/credentials.

    \b
    Examples:
      ags remote -v
      ags remote add origin s3://team-bucket/ags --region eu-west-1
      ags remote add usb /media/usb/ags
      ags remote remove usb
    """
    if ctx.invoked_subcommand is not None:
        return
    found = remotes(open_store(ctx))
    if as_json:
        emit_json(
            [
                {"name": n, "url": r.url, "endpoint": r.endpoint, "region": r.region}
                for n, r in found.items()
            ]
        )
        return
    width = max((len(name) for name in found), default=0)
    for name, location in found.items():
        if not verbose:
            click.echo(name)
            continue
        extra = "".join(
            f"  {label} {value}"
            for label, value in (("endpoint", location.endpoint), ("region", location.region))
            if value is not None
        )
        click.echo(visible(f"{name:<{width}}  {location.url}{extra}"))


@remote_cmd.command("add")
@click.argument("name")
@click.argument("url")
@click.option("--endpoint", help="The S3 server, for any but AWS: http(s)://host[:port].")
@click.option(
    "--region",
    help="The bucket's region (default: AWS_REGION, AWS_DEFAULT_REGION or the profile's, "
    "else us-east-1).",
)
@click.option(
    "--no-check",
    is_flag=True,
    help="Add without connecting (by default the remote must answer, exist, accept "
    "the credentials and enforce conditional writes).",
)
@click.pass_context
def remote_add(
    ctx: click.Context,
    name: str,
    url: str,
    endpoint: str | None,
    region: str | None,
    no_check: bool,
) -> None:
    """Add a remote: s3://BUCKET[/PREFIX] on an S3-compatible server, or a directory.

    ags first checks the remote: the endpoint answers, the bucket (or
    directory) exists, the credentials work, it is empty or an ags remote,
    and the server enforces conditional writes (If-None-Match, If-Match),
    without which two pushes could both win. Nothing is written to the store
    unless it passes.

    \b
    Examples:
      ags remote add origin s3://team-bucket/ags
      ags remote add lab s3://sessions --endpoint http://10.0.0.5:8333
      ags remote add usb /media/usb/ags
      ags remote add later s3://bucket/ags --no-check
    """
    store = open_store(ctx)
    check_remote_name(name)
    location = parse_location(url, endpoint, region)
    if name in remotes(store):
        raise BadRemote(f"remote {name!r} exists already (ags remote remove {name} first)")
    if not no_check:
        with open_storage(location) as storage:
            checked_marker(storage)  # a place of other things is refused, left as it was
    add_remote(store, name, location)
    checked = "" if no_check else " (checked: conditional writes are enforced)"
    click.echo(visible(f"added remote {name}: {location.url}{checked}"))


@remote_cmd.command("remove")
@click.argument("name")
@click.pass_context
def remote_remove(ctx: click.Context, name: str) -> None:
    """Forget a remote, and its remote-tracking refs (remotes/NAME/...). Nothing
    on the remote itself changes.

    \b
    Examples:
      ags remote remove usb
    """
    location = remove_remote(open_store(ctx), name)
    click.echo(visible(f"removed remote {name} ({location.url})"))
