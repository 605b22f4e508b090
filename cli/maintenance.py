"""Commands that move or look after the store as a whole: export (JSON, Markdown,
HTML), import (export documents, other agents' session files), gc, repack, fsck, du."""

from __future__ import annotations

import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click

from agent.importers import TOOL_NAMES, default_paths, import_sessions
from objstore import (
    AgsError,
    Store,
    StoreMissing,
    check_store,
    collect_garbage,
    encode_document,
    export_session,
    import_document,
    read_document,
    store_usage,
    write_private_file,
)
from objstore.remote import collect_remote_garbage, open_storage, remote

from .app import cli, open_store
from .output import (
    emit_json,
    emit_lines,
    human_bytes,
    json_safe,
    parse_duration,
    short,
    visible,
)


@cli.command("export")
@click.argument("spec")
@click.option("--format", "fmt", type=click.Choice(["json", "md", "html"]), default="json",
              show_default=True,
              help="json: the export document; md: a Markdown transcript; "
                   "html: one self-contained page.")  # fmt: skip
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True, allow_dash=True),
              help="Write to FILE (mode 0600) instead of stdout ('-'), all or nothing; "
                   "only a regular file is replaced.")  # fmt: skip
@click.pass_context
def export_cmd(ctx: click.Context, spec: str, fmt: str, output: str | None) -> None:
    """Write a session (or a node of it) as one self-contained JSON document,
    or as a transcript for people to read.

    The JSON document holds the metadata, the head and every object the head
    reaches, decoded; its JSON Schema is docs/export.schema.json. Markdown and
    HTML show roles, tool calls and results, compactions and the fork point;
    the HTML page needs no network and folds long tool output.

    \b
    Examples:
      ags export 3f2a -o session.json
      ags export 3f2a~10 | gzip > early.json.gz
      ags export 3f2a --format html -o session.html
      ags export 3f2a --format md | less
    """
    if output == "":
        raise click.BadParameter("give a file name, or - for stdout", param_hint="-o")
    store = open_store(ctx)
    if fmt == "json":
        doc = export_session(store, spec)
        data = encode_document(doc, json_safe)
        count = f"{len(doc['objects'])} objects"
    else:
        # Imported here: Markdown and highlighting take ~0.2 s to import.
        from agent.transcript import render, transcript_entries

        transcript = transcript_entries(store, spec)
        # For people: control and hidden characters shown as escapes, as on a terminal.
        data = visible(render(transcript, fmt), multiline=True).encode("utf-8")
        count = f"{len(transcript.entries)} entries"
    if output is None or output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    write_private_file(output, data)
    click.echo(f"exported {count} to {output}", err=True)


@cli.command("import")
@click.argument("paths", nargs=-1, type=click.Path(allow_dash=True))
@click.option("--from", "tool", type=click.Choice(TOOL_NAMES),
              help="Import another agent's session files (PATHs: files or folders; "
                   "default: the tool's own folder).")  # fmt: skip
@click.option("--new-session", is_flag=True,
              help="Import as a new session even if the file's session exists.")  # fmt: skip
@click.option(
    "--dry-run", is_flag=True, help="With --from: say what would be imported; write nothing."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def import_cmd(
    ctx: click.Context,
    paths: tuple[str, ...],
    tool: str | None,
    new_session: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Read an export document (a file, or - for stdin) into the store, or, with
    --from, the session files of Claude Code, Codex CLI or Gemini CLI.

    An export document is checked first: the schema, every id, every link; a
    bad file changes nothing. Importing the same file again changes nothing;
    a later export of the same session moves it forward.

    With --from, each source session becomes an ags session (title, project,
    times, model). Running it again imports only what was added: a grown file
    moves its session forward, a file whose past changed becomes a fork, an
    unchanged one is not read. Exit status 1 if any file failed as a whole.

    \b
    Examples:
      ags import session.json
      ssh box ags export 3f2a | ags import -
      ags import --from claude-code                 # all of ~/.claude/projects
      ags import --from codex ~/.codex/sessions/2025/06 --json
      ags import --from gemini --dry-run
    """
    if tool is not None:
        if new_session:
            raise click.UsageError("--new-session is for export documents, not --from")
        _import_from(ctx, tool, paths, dry_run=dry_run, as_json=as_json)
        return
    if dry_run:
        raise click.UsageError("--dry-run needs --from")
    if len(paths) != 1:
        raise click.UsageError("give one export document (or -), or --from TOOL")
    try:
        with click.open_file(paths[0], "rb") as file:
            doc = read_document(file, "<stdin>" if paths[0] == "-" else paths[0])
    except OSError as e:
        raise AgsError(f"cannot read {paths[0]}: {e.strerror or e}") from None
    result = import_document(open_store(ctx), doc, new_session=new_session)
    if as_json:
        emit_json(result)
        return
    click.echo(f"{result.action}: session {result.session} at {short(result.head)} "
               f"({result.objects} objects)")  # fmt: skip


def _import_from(
    ctx: click.Context, tool: str, paths: tuple[str, ...], *, dry_run: bool, as_json: bool
) -> None:
    sources = [Path(p).expanduser() for p in paths]
    missing = [p for p in sources if not p.exists()]
    if missing:  # said before a store is made for it
        raise AgsError(f"no such file or folder: {missing[0]}")
    if not sources and not any(p.exists() for p in default_paths(tool)):
        where = " or ".join(str(p) for p in default_paths(tool))
        raise AgsError(f"no {tool} sessions here: {where} does not exist (give a PATH)")
    with ExitStack() as stack:
        if not dry_run:
            store = open_store(ctx)
        else:  # writes nothing, not even a new store: an empty one in its place
            try:
                store = open_store(ctx, create=False)
            except StoreMissing:
                empty = stack.enter_context(tempfile.TemporaryDirectory(prefix="ags-dry-run-"))
                store = stack.enter_context(Store.open(Path(empty) / "store"))
        failed = _import_files(store, tool, sources, dry_run=dry_run, as_json=as_json)
    if failed:
        ctx.exit(1)


def _import_files(
    store: Store, tool: str, sources: list[Path], *, dry_run: bool, as_json: bool
) -> bool:
    """Import and say what was imported; return whether any file failed as a whole."""
    bar: Any = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if as_json or not sys.stderr.isatty():
            return
        if bar is None:
            bar = click.progressbar(length=total, label=f"importing {tool}", file=sys.stderr)
            bar.__enter__()
        bar.update(done - bar.pos)

    try:
        rows = import_sessions(
            store, tool, sources, dry_run=dry_run, progress=progress, on_wait=_say_waiting
        )
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    if as_json:
        emit_json(rows)
    else:
        lines = []
        for row in rows:
            what = f"{row.status:<9} {short(row.session)} {row.messages:>6} msgs  {row.source}"
            lines.append(visible(what))  # a file's name may hold anything but "/"
            lines += [visible(f"          ! {p}") for p in row.problems]
        counts = {s: sum(1 for r in rows if r.status == s)
                  for s in ("created", "updated", "unchanged", "failed")}  # fmt: skip
        would = " (dry run: nothing written)" if dry_run else ""
        lines.append(f"{len(rows)} files: " + ", ".join(f"{n} {s}" for s, n in counts.items())
                     + would)  # fmt: skip
        emit_lines(lines, page=False)
    return any(row.status == "failed" for row in rows)


def _say_waiting() -> None:
    click.echo("ags: waiting for another import into this store to finish", err=True)


def _duration_or_never(value: str) -> float | None:
    return None if value.strip().lower() == "never" else parse_duration(value)


@cli.command()
@click.option(
    "--archived-older-than",
    "retention",
    default="30d",
    show_default=True,
    help="Drop sessions archived longer ago than this ('never' keeps them).",
)
@click.option(
    "--grace",
    default="1h",
    show_default=True,
    help="Never sweep objects written more recently than this (at least 10m).",
)
@click.option(
    "--reflog-older-than",
    "reflog_age",
    default="90d",
    show_default=True,
    help="Expire reflog entries older than this ('never' keeps them).",
)
@click.option(
    "--remote",
    "remote_name",
    metavar="NAME",
    help="Collect on this remote instead: drop its packs no remote ref reaches "
    "(ages from the server's clock, the same --grace).",
)
@click.option("--dry-run", is_flag=True, help="Report what would go; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")  # fmt: skip
@click.pass_context
def gc(
    ctx: click.Context,
    retention: str,
    grace: str,
    reflog_age: str,
    remote_name: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Drop archived sessions past retention, expire old reflog entries, and
    sweep objects nothing reaches. Safe beside a running agent. With --remote,
    collect on a remote instead (safe beside a push).

    \b
    Examples:
      ags gc --dry-run
      ags gc --archived-older-than 7d --json
      ags gc --remote origin --grace 2h
    """
    if remote_name is not None:
        _remote_gc(open_store(ctx), remote_name, parse_duration(grace), dry_run, as_json)
        return
    archived_older_than = _duration_or_never(retention)
    reflog_older_than = _duration_or_never(reflog_age)
    grace_seconds = parse_duration(grace)
    store = open_store(ctx)
    bar: Any = None

    def progress(phase: str, done: int, total: int) -> None:
        nonlocal bar
        if phase != "sweep" or not sys.stderr.isatty() or as_json:
            return
        if bar is None:
            bar = click.progressbar(length=total, label="sweeping packs", file=sys.stderr)
            bar.__enter__()
        bar.update(done - bar.pos)

    try:
        report = collect_garbage(
            store,
            archived_older_than=archived_older_than,
            grace=grace_seconds,
            reflog_older_than=reflog_older_than,
            dry_run=dry_run,
            progress=progress,
        )
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    if as_json:
        emit_json(report)
        return
    would = "would be " if dry_run else ""
    lines = [
        f"sessions {would}dropped: {len(report.sessions_dropped)}",
        *(f"  {sid}" for sid in report.sessions_dropped),
        f"reflog entries {would}expired: {report.reflog_entries_expired}",
        f"objects {would}swept: {report.objects_swept}",
        f"bytes {would}freed: {human_bytes(report.bytes_freed)}",
    ]
    if report.sessions_skipped:
        lines.append(f"skipped (a writer holds them): {' '.join(report.sessions_skipped)}")
    emit_lines(lines, page=False)


def _remote_gc(store: Store, name: str, grace: float, dry_run: bool, as_json: bool) -> None:
    with open_storage(remote(store, name)) as storage:
        report = collect_remote_garbage(store, storage, name, grace=grace, dry_run=dry_run)
    if as_json:
        emit_json(report)
        return
    would = "would be " if dry_run else ""
    emit_lines(
        [
            f"packs {would}deleted: {report.packs_deleted}"
            f" ({report.packs_rewritten} sent again with what is still reached)",
            f"objects {would}dropped: {report.objects_dropped}",
            f"stray keys {would}deleted: {report.other_keys_deleted}",
        ],
        page=False,
    )


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def repack(ctx: click.Context, as_json: bool) -> None:
    """Merge small packs now, as a writer does when it closes: until at most 8 of
    them are left beside packs that each hold twice the ones below (Git's
    geometric repack). Skips if another process is repacking; safe beside a
    running agent.

    \b
    Example:
      ags repack
    """
    store = open_store(ctx)
    before = len(store.objects.sealed_packs())
    merged = 0
    while step := store.repack():
        merged += step
    after = len(store.objects.sealed_packs())
    if as_json:
        emit_json({"packs_before": before, "packs_after": after, "packs_merged": merged})
    elif merged:
        click.echo(f"packs: {before} -> {after} ({merged} merged)")
    else:
        click.echo(f"packs: {before} (none to merge, or another process is repacking)")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def fsck(ctx: click.Context, as_json: bool) -> None:
    """Verify every object's hash, every link, every ref, reflog and pack, and
    who can reach the store's files. Lists each problem and goes on; exits 1
    if there is any (files other users can read are a warning).

    \b
    Example:
      ags fsck
    """
    report = check_store(open_store(ctx))
    if as_json:
        emit_json(report)
    else:
        for problem in report.problems:
            click.echo(visible(str(problem)))
        for warning in report.warnings:
            click.echo(visible(f"ags: warning: {warning}"), err=True)
        verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
        rate = report.bytes_read / 1e6 / max(report.seconds, 1e-9)
        click.echo(f"checked {report.objects} objects and {report.refs} refs "
                   f"({report.bytes_read / 1e6:,.1f} MB in {report.seconds:.1f} s, "
                   f"{rate:,.1f} MB/s): {verdict}", err=not report.ok)  # fmt: skip
    if not report.ok:
        ctx.exit(1)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def du(ctx: click.Context, as_json: bool) -> None:
    """Store size: bytes on disk, objects, stored (compressed) bytes, unique
    bytes, logical bytes (each session counted in full) and the dedup ratio.

    \b
    Example:
      ags du
    """
    usage = store_usage(open_store(ctx))
    if as_json:
        emit_json(usage)
        return
    rows = [
        ("store", usage.path),
        ("on disk", human_bytes(usage.disk_bytes)),
        ("sessions", usage.sessions),
        ("objects", f"{usage.objects} in {usage.packs} packs"),
        ("stored", f"{human_bytes(usage.stored_bytes)} compressed"),
        ("unique", f"{human_bytes(usage.unique_bytes)} "
                   f"(compression {usage.compression_ratio:.1f}x)"),
        ("logical", f"{human_bytes(usage.logical_bytes)} "
                    f"(dedup {usage.dedup_ratio:.1f}x: each session counted in full)"),
    ]  # fmt: skip
    emit_lines([f"{k + ':':<10}{v}" for k, v in rows], page=False)
