"""Commands on sessions and refs: listing, forking, HEAD, rewind, tags, metadata,
archive and delete."""

from __future__ import annotations

import os
from typing import Any

import click

from objstore import InvalidInput

from .app import cli, open_store
from .output import (
    emit_json,
    emit_lines,
    human_bytes,
    one_line,
    relative_time,
    short,
    style,
    to_jsonable,
    visible,
)

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@cli.command("sessions")
@click.option("--archived", is_flag=True, help="Only archived sessions.")
@click.option("--all", "show_all", is_flag=True, help="Archived sessions too.")
@JSON_OPTION
@click.pass_context
def sessions(ctx: click.Context, archived: bool, show_all: bool, as_json: bool) -> None:
    """List sessions, most recently active first (alias: ls).

    \b
    Columns: short id, title, last activity, messages, project root.
    Example:
      ags sessions --all --json
    """
    if archived and show_all:
        raise click.UsageError("--archived and --all exclude each other")
    rows = open_store(ctx).sessions(include_archived=archived or show_all)
    if archived:
        rows = [r for r in rows if r.archived]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no sessions" + ("" if show_all or archived else " (--all shows archived)"))
        return
    home = os.path.expanduser("~")
    lines = []
    for r in rows:
        title = one_line(r.title, "(untitled)") + (" [archived]" if r.archived else "")
        root = r.root if isinstance(r.root, str) else ""
        if root.startswith(home + os.sep):
            root = "~" + root[len(home) :]
        root = visible(root)
        lines.append(
            f"{style(short(r.id), fg='yellow')}  {title[:40]:<40}  "
            f"{relative_time(r.updated):>15}  {r.messages:>6}  {root}"
        )
    emit_lines(lines)


cli.add_command(sessions, "ls")


@cli.command()
@click.argument("spec")
@click.option("--title", help="Title of the new session (default: the source's).")
@click.pass_context
def fork(ctx: click.Context, spec: str, title: str | None) -> None:
    """Start a new session at any node; print its id. Copies no message.

    \b
    Examples:
      ags fork 3f2a              # at the session's head
      ags fork 3f2a~4 --title "try again"
      ags fork mytag
    """
    click.echo(open_store(ctx).fork(spec, title=title))


@cli.command()
@click.argument("spec")
@click.pass_context
def checkout(ctx: click.Context, spec: str) -> None:
    """Make SPEC current for this project (HEAD).

    A session attaches HEAD to it; any other spec (a node, SESSION~N, a tag)
    detaches HEAD there, and continuing from a detached HEAD starts a fork.

    \b
    Examples:
      ags checkout 3f2a
      ags checkout 3f2a~3
    """
    target = open_store(ctx).checkout(spec)
    if target.session is not None:
        click.echo(f"HEAD is now session {target.session}")
    else:
        click.echo(f"HEAD is now detached at node {target.node}")


@cli.command()
@JSON_OPTION
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Say what is checked out for this project.

    \b
    Example:
      ags status
    """
    store = open_store(ctx)
    target = store.head()
    info = store.session(target.session) if target and target.session else None
    if as_json:
        emit_json({"head": target, "session": info})
        return
    if target is None:
        click.echo("nothing checked out here (ags checkout SPEC)")
    elif info is not None:
        click.echo(f"on session {info.id}  {one_line(info.title, '(untitled)')}")
        click.echo(f"  {info.messages} messages, last active {relative_time(info.updated)}")
        if info.archived:
            click.echo("  archived: unarchive it to continue")
    else:
        click.echo(f"HEAD detached at node {target.node}: continuing starts a fork")


@cli.command()
@click.argument("session")
@click.argument("spec")
@click.option(
    "--files",
    is_flag=True,
    help="Also put back the files write_file and edit_file changed after SPEC.",
)
@click.option(
    "--force",
    is_flag=True,
    help="With --files: overwrite files that changed since the agent wrote them.",
)
@click.pass_context
def rewind(ctx: click.Context, session: str, spec: str, files: bool, force: bool) -> None:
    """Move SESSION's head back to SPEC, a node of its own history.

    The reflog keeps the old head, so a rewind is undone with
    ``ags rewind SESSION SESSION@{1}`` (with --files, its files too).

    With --files, each file the agent's write_file and edit_file changed after
    SPEC gets back what it held at SPEC: a file the agent created is removed,
    one it changed or deleted comes back. A file that changed since the agent
    wrote it (by hand, by a shell command, a symlink put there) is not
    overwritten: the rewind is refused with the list, unless --force. What
    shell commands did is not recorded and cannot be undone.

    \b
    Examples:
      ags rewind 3f2a 3f2a~2
      ags rewind 3f2a 3f2a~4 --files
      ags rewind 3f2a 3f2a@{1}      # undo
    """  # fmt: skip
    if force and not files:
        raise click.UsageError("--force only applies with --files")
    store = open_store(ctx)
    sid = store.session_id(session)
    old = store.session(sid).head
    if files:
        from agent.checkpoints import rewind_with_files  # only here: the file machinery

        new, restored = rewind_with_files(store, sid, spec, force=force)
    else:
        new, restored = store.rewind(sid, spec), []
    click.echo(f"session {short(sid)} now at {short(new)} (was {short(old)})")
    for item in restored:
        click.echo(visible(f"  {item.action:<8} {item.path}"))
    if files and not restored:
        click.echo("  no file to put back")
    undo = " --files" if files else ""
    click.echo(f"undo: ags rewind {short(sid)} {short(sid)}@{{1}}{undo}")


@cli.command()
@click.argument("name")
@click.argument("spec", required=False)
@click.option("-f", "--force", is_flag=True, help="Move an existing tag.")
@click.option("-d", "--delete", is_flag=True, help="Delete the tag NAME.")
@click.pass_context
def tag(ctx: click.Context, name: str, spec: str | None, force: bool, delete: bool) -> None:
    """Name a node: a checkpoint to fork, export or rewind to.

    \b
    Examples:
      ags tag before-refactor 3f2a
      ags tag -d before-refactor
    """
    store = open_store(ctx)
    if delete:
        if spec is not None or force:
            raise click.UsageError("tag -d takes only the NAME of the tag to delete")
        store.delete_tag(name)
        click.echo(f"deleted tag {name}")
        return
    if spec is None:
        raise click.UsageError("tag needs a SPEC to name (or -d to delete)")
    click.echo(f"{name} -> {store.tag(name, spec, force=force)}")


@cli.command()
@JSON_OPTION
@click.pass_context
def tags(ctx: click.Context, as_json: bool) -> None:
    """List tags and the nodes they name.

    \b
    Example:
      ags tags --json
    """
    found = open_store(ctx).tags()
    if as_json:
        emit_json(found)
        return
    emit_lines([visible(f"{name}  {short(node)}") for name, node in found.items()] or ["no tags"])


@cli.command()
@click.argument("session")
@click.argument("title")
@click.pass_context
def title(ctx: click.Context, session: str, title: str) -> None:
    """Set a session's title.

    \b
    Example:
      ags title 3f2a "fix the flaky build"
    """
    store = open_store(ctx)
    store.set_title(session, title)
    click.echo(f"session {short(store.session_id(session))}: {visible(title)}")


@cli.command()
@click.argument("session")
@JSON_OPTION
@click.pass_context
def info(ctx: click.Context, session: str, as_json: bool) -> None:
    """A session's metadata, counts, token usage, parent, and the bytes it
    holds alone versus shares with other sessions.

    \b
    Example:
      ags info 3f2a
    """
    from agent.tokens import describe_usage
    from objstore import session_usage  # loaded by the commands that size sessions only

    store = open_store(ctx)
    usage = session_usage(store, session)
    # The agent's totals say which calls the server counted (agent/tokens.py).
    state = store.state_at(session) if usage.session.head else {}
    totals = {**usage.usage, **(state.get("usage") or {})}
    if as_json:
        emit_json({**to_jsonable(usage), "usage": totals})
        return
    s = usage.session
    fork = s.forked_from or {}
    rows: list[tuple[str, Any]] = [
        ("session", s.id),
        ("title", s.title or "(untitled)"),
        ("created", f"{s.created} ({relative_time(s.created)})"),
        ("updated", f"{s.updated} ({relative_time(s.updated)})"),
        ("archived", s.archived_at or "no"),
        ("project", s.root or "-"),
        ("model", s.model or "-"),
        ("head", s.head or "(empty)"),
        ("forked from", f"{fork.get('session')} at {fork.get('node')}" if fork else "-"),
        ("messages", f"{s.messages} ({', '.join(f'{n} {r}' for r, n in usage.roles.items())})"),
        ("compactions", usage.compactions),
        ("tokens", describe_usage(totals)),
        ("objects", usage.objects),
        ("stored", f"{human_bytes(usage.stored_bytes)}: "
                   f"{human_bytes(usage.unique_stored_bytes)} its own, "
                   f"{human_bytes(usage.shared_stored_bytes)} shared"),
    ]  # fmt: skip
    emit_lines([f"{k + ':':<13}{visible(str(v))}" for k, v in rows], page=False)


@cli.command()
@click.argument("session")
@click.pass_context
def archive(ctx: click.Context, session: str) -> None:
    """Hide a session and refuse to resume or append to it until unarchived.

    gc drops archived sessions after the retention period.

    \b
    Example:
      ags archive 3f2a
    """
    store = open_store(ctx)
    store.archive(session)
    click.echo(f"archived {store.session_id(session)}")


@cli.command()
@click.argument("session")
@click.pass_context
def unarchive(ctx: click.Context, session: str) -> None:
    """Bring an archived session back.

    \b
    Example:
      ags unarchive 3f2a
    """
    store = open_store(ctx)
    was = store.session(session)
    store.unarchive(session)
    click.echo(f"unarchived {was.id}" if was.archived else f"{was.id} was not archived")


@cli.command()
@click.argument("session")
@click.option("--yes", is_flag=True, help="Really delete.")
@click.pass_context
def delete(ctx: click.Context, session: str, yes: bool) -> None:
    """Delete a session's ref. Its objects stay until gc, and until the reflog
    entry expires ``ags reflog`` shows the head to fork from.

    \b
    Example:
      ags delete 3f2a --yes
    """
    store = open_store(ctx)
    if not yes:  # only the preview pays for the sizes: they walk every session
        from objstore import session_usage

        usage = session_usage(store, session)
        s = usage.session
        raise InvalidInput(
            f"would delete session {s.id} ({s.title or 'untitled'}, {s.messages} messages, "
            f"{human_bytes(usage.unique_stored_bytes)} not shared): add --yes to delete it"
        )
    info = store.session(session)
    store.delete(info.id)
    click.echo(f"deleted session {info.id} (head was {info.head or 'empty'})")


@cli.command()
@click.argument("spec")
@JSON_OPTION
@click.pass_context
def reflog(ctx: click.Context, spec: str, as_json: bool) -> None:
    """The history of a ref: every change of a session's head or metadata, newest
    first. The moves are numbered: ``SESSION@{N}`` is where the Nth move left from
    (a title, an archive or an import that leaves the target where it was gets no
    number).

    \b
    Example:
      ags reflog 3f2a
    """
    lines = open_store(ctx).reflog(spec)
    if as_json:
        emit_json(lines)
        return
    moved = [line.old != line.new for line in lines]
    width = len(f"@{{{sum(moved)}}}")
    rows, n = [], 0
    for line, moves in zip(lines, moved, strict=True):
        n += moves
        label = f"@{{{n}}}" if moves else ""
        rows.append(
            visible(
                f"{label:<{width}}  {_short_target(line.old)} -> {_short_target(line.new)}  "
                f"{line.reason}  {relative_time(line.time)}"
            )
        )
    emit_lines(rows or ["no entries"])


def _short_target(value: str | None) -> str:
    """A reflog value for a line: a node id shortened, a session HEAD named by its
    shortened id (``sessions/3f2a...``, not cut inside the id)."""
    if value and value.startswith("sessions/"):
        return "sessions/" + short(value[len("sessions/") :])
    return short(value)
