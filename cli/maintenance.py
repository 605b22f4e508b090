"""Commands that move or look after the store as a whole: export, import, gc,
fsck, du."""

from __future__ import annotations

import json
import sys
from typing import IO, Any

import click

from objstore.errors import AgsError
from objstore.exchange import export_session, import_document, parse_document
from objstore.files import write_private_file
from objstore.fsck import check_store
from objstore.gc import collect_garbage
from objstore.stats import store_usage

from .app import cli, open_store
from .output import emit_json, emit_lines, human_bytes, parse_duration, short


@cli.command("export")
@click.argument("spec")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write to FILE (mode 0600) instead of stdout, all or nothing; "
                   "only a regular file is replaced.")  # fmt: skip
@click.pass_context
def export_cmd(ctx: click.Context, spec: str, output: str | None) -> None:
    """Write a session (or a node of it) as one self-contained JSON document.

    The document holds the metadata, the head and every object the head
    reaches, decoded; its JSON Schema is docs/export.schema.json.

    \b
    Examples:
      ags export 3f2a -o session.json
      ags export 3f2a~10 | gzip > early.json.gz
    """
    doc = export_session(open_store(ctx), spec)
    data = json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8") + b"\n"
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    write_private_file(output, data)
    click.echo(f"exported {len(doc['objects'])} objects to {output}", err=True)


@cli.command("import")
@click.argument("file", type=click.File("rb"))
@click.option("--new-session", is_flag=True,
              help="Import as a new session even if the file's session exists.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def import_cmd(ctx: click.Context, file: IO[bytes], new_session: bool, as_json: bool) -> None:
    """Read an export document (a file, or - for stdin) into the store.

    Everything is checked first: the schema, every id, every link. A bad
    file changes nothing. Importing the same file again changes nothing;
    a later export of the same session moves it forward.

    \b
    Examples:
      ags import session.json
      ssh box ags export 3f2a | ags import -
    """
    try:
        data = file.read()
    except OSError as e:
        raise AgsError(f"cannot read {file.name}: {e.strerror or e}") from None
    doc = parse_document(data)
    result = import_document(open_store(ctx), doc, new_session=new_session)
    if as_json:
        emit_json(result)
        return
    click.echo(f"{result.action}: session {result.session} at {short(result.head)} "
               f"({result.objects} objects)")  # fmt: skip


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
@click.option("--dry-run", is_flag=True, help="Report what would go; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")  # fmt: skip
@click.pass_context
def gc(
    ctx: click.Context,
    retention: str,
    grace: str,
    reflog_age: str,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Drop archived sessions past retention, expire old reflog entries, and
    sweep objects nothing reaches. Safe beside a running agent.

    \b
    Examples:
      ags gc --dry-run
      ags gc --archived-older-than 7d --json
    """
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
            click.echo(str(problem))
        for warning in report.warnings:
            click.echo(f"ags: warning: {warning}", err=True)
        verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
        click.echo(f"checked {report.objects} objects and {report.refs} refs: {verdict}",
                   err=not report.ok)  # fmt: skip
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
