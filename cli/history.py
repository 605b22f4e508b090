"""Commands that read history: log (and its fork graph), show, diff."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import click

from objstore import LogEntry, Node, SessionInfo, Store

if TYPE_CHECKING:
    from objstore import SearchHit

from .app import cli, open_store
from .file_diff import change_lines, change_word, delta_lines
from .output import (
    color_enabled,
    emit_json,
    emit_lines,
    first_line,
    message_start,
    message_text,
    one_line,
    relative_time,
    short,
    style,
    tool_call_summary,
    visible,
    wrap,
)

LOG_TEXT_CHARS = 20_000  # of one message in a transcript; ags show prints all of it
ROLE_COLORS = {"user": "green", "assistant": "cyan", "tool": "magenta", "system": "blue"}


def entry_json(entry: LogEntry) -> dict[str, Any]:
    n = entry.node
    out: dict[str, Any] = {
        "node": n.id,
        "type": n.type,
        "parent": n.parent,
        "messages": n.messages,
        "meta": n.meta,
        "message" if n.type == "message" else "summary": entry.message,
    }
    if n.is_compaction:
        out["kept"] = list(n.kept)
    if n.files:
        out["files"] = [{"path": f.path, "before": f.before, "after": f.after} for f in n.files]
    return out


def entry_lines(entry: LogEntry, *, oneline: bool) -> list[str]:
    """One transcript entry for people: role, wrapped text, tool calls and results summarised."""
    n = entry.node
    if not n.is_compaction:
        return message_lines(entry.message, oneline=oneline, node=n)
    text = message_text(entry.message)
    head = f"{style(short(n.id), fg='yellow')} {style('compaction', fg='red', bold=True)}"
    if oneline:
        return [f"{head}: {first_line(text, 60)}"]
    kept = f", kept {len(n.kept)} messages verbatim" if n.kept else ""
    when = relative_time(n.meta.get("time"))
    return [f"{head}  {when}  (earlier turns summarised{kept})", *wrap(text)]


def message_lines(msg: Any, *, oneline: bool, node: Node | None = None) -> list[str]:
    """A message for people; with its ``node``, led by the node's short id and time."""
    role = msg.get("role") if isinstance(msg, dict) else None
    role = role if isinstance(role, str) else "?"
    text, left_out = message_start(msg, LOG_TEXT_CHARS)
    calls = msg.get("tool_calls") if isinstance(msg, dict) else None
    label = style(one_line(role, "?"), fg=ROLE_COLORS.get(role), bold=True)
    if role == "tool" and isinstance(msg, dict):
        label += f" {one_line(msg.get('name') or msg.get('tool_name'))}".rstrip()
    if node is not None:
        label = f"{style(short(node.id), fg='yellow')} {label}"
    if oneline:
        summary = first_line(text, 60)
        if calls:
            summary = (summary + " " if summary else "") + " ".join(
                "-> " + tool_call_summary(c) for c in (calls if isinstance(calls, list) else [])
            )
        return [f"{label}: {summary}"]
    lines = [f"{label}  {relative_time(node.meta.get('time'))}" if node else label]
    if role == "tool":
        body = text.rstrip("\n").split("\n")
        shown = body[:6]
        lines += wrap("\n".join(shown))
        if len(body) > len(shown):
            where = f"; ags show {short(node.id)}" if node else ""
            lines.append(f"    ... ({len(body) - len(shown)} more lines{where})")
    elif text:
        lines += wrap(text)
        if left_out:
            where = f"; ags show {short(node.id)}" if node else ""
            lines.append(f"    ... ({left_out:,} more characters{where})")
    for call in calls if isinstance(calls, list) else []:
        lines.append("    " + style("-> " + tool_call_summary(call), fg="magenta"))
    return lines


@cli.command()
@click.argument("spec", default="HEAD")
@click.option("--oneline", is_flag=True, help="One line per message.")
@click.option("-n", "limit", type=click.IntRange(0, sys.maxsize), help="Show at most N entries.")
@click.option("--context", "context_only", is_flag=True,
              help="Only what the model sees at SPEC (after compactions).")  # fmt: skip
@click.option("--graph", is_flag=True, help="Draw sessions and their forks.")
@click.option("--all", "show_all", is_flag=True, help="With --graph: every session.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def log(
    ctx: click.Context,
    spec: str,
    oneline: bool,
    limit: int | None,
    context_only: bool,
    graph: bool,
    show_all: bool,
    as_json: bool,
) -> None:
    """Show a transcript, newest first: the whole history, compacted turns included.

    SPEC is a session (full id or unique prefix), a node, a tag, HEAD (the
    default), SPEC~N or SPEC@{N}.

    \b
    Examples:
      ags log 3f2a --oneline -n 20
      ags log 3f2a --context        # what the model would see now
      ags log --graph --all         # every session and its forks
    """
    if graph and context_only:
        raise click.UsageError("--context and --graph exclude each other")
    store = open_store(ctx)
    if graph:
        _log_graph(store, None if show_all else spec, as_json)
        return
    if show_all:
        raise click.UsageError("--all goes with --graph")
    if context_only:
        messages = store.context(spec)[::-1]
        chosen = messages[:limit] if limit is not None else messages
        if as_json:
            emit_json(chosen)
            return
        emit_lines([line for msg in chosen for line in message_lines(msg, oneline=oneline)])
        return
    entries: Iterable[LogEntry] = store.log(spec)
    if limit is not None:
        entries = itertools.islice(entries, limit)
    if as_json:
        emit_json([entry_json(e) for e in entries])
        return
    lines = list(_transcript_lines(entries, oneline))
    emit_lines(lines or ["(no messages yet)"])


def _transcript_lines(entries: Iterable[LogEntry], oneline: bool) -> Iterator[str]:
    for i, entry in enumerate(entries):
        if i and not oneline:
            yield ""
        yield from entry_lines(entry, oneline=oneline)


def _log_graph(store: Store, spec: str | None, as_json: bool) -> None:
    """Sessions as a tree of forks: each fork under the session it was forked from."""
    rows = store.sessions(include_archived=True)
    by_id = {r.id: r for r in rows}
    children: dict[str | None, list[SessionInfo]] = {}
    for r in sorted(rows, key=lambda r: r.created):
        parent = (r.forked_from or {}).get("session")
        children.setdefault(parent if parent in by_id else None, []).append(r)
    if spec is None:
        tops = children.get(None, [])
    else:
        sid = store.session_id(spec)
        top = by_id[sid]  # climb to the root of its fork tree
        while (top.forked_from or {}).get("session") in by_id:
            top = by_id[top.forked_from["session"]]  # type: ignore[index]
        tops = [top]

    def tree(r: SessionInfo) -> dict[str, Any]:
        return {
            "session": r.id,
            "title": r.title,
            "messages": r.messages,
            "forked_at": (r.forked_from or {}).get("node"),
            "archived": r.archived,
            "forks": [tree(c) for c in children.get(r.id, [])],
        }

    if as_json:
        emit_json([tree(t) for t in tops])
        return
    lines: list[str] = []

    def draw(r: SessionInfo, prefix: str, depth: int) -> None:
        at = (r.forked_from or {}).get("node")
        where = f"  forked at {short(at)}" if depth and at else ""
        flag = " [archived]" if r.archived else ""
        lines.append(
            f"{prefix}* {style(short(r.id), fg='yellow')} {one_line(r.title, '(untitled)')}{flag}"
            f"  ({r.messages} messages, {relative_time(r.updated)}){where}"
        )
        kids = children.get(r.id, [])
        for kid in kids:
            lines.append(f"{prefix}|\\")
            draw(kid, prefix + "| ", depth + 1)

    for t in tops:
        draw(t, "", 0)
    emit_lines(lines or ["no sessions"])


@cli.command()
@click.argument("spec", default="HEAD")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def show(ctx: click.Context, spec: str, as_json: bool) -> None:
    """One node in full: its message, meta (time, model, token usage), the files
    its tool call changed (write_file, edit_file), and the agent state in force there.

    \b
    Examples:
      ags show 3f2a
      ags show 3f2a~2 --json
    """
    store = open_store(ctx)
    node = store.node(store.node_id(spec))
    entry = LogEntry(node, store.blob(node.content))
    state = store.state_at(node.id)
    if as_json:
        emit_json({**entry_json(entry), "state": state})
        return
    lines = [f"node     {node.id}", f"type     {node.type}", f"parent   {node.parent or '-'}",
             f"position message {node.messages}"]  # fmt: skip
    for key, value in sorted(node.meta.items()):
        lines.append(visible(f"{key:<8} {json.dumps(value, ensure_ascii=False)}"))
    if node.is_compaction:
        lines.append(f"kept     {', '.join(short(k) for k in node.kept) or '-'}")
    if node.files:
        lines += [f"files    {len(node.files)} changed", *change_lines(node.files)]
    if isinstance(entry.message, dict):
        lines += ["", *_full_message(entry.message)]
    else:
        lines += ["", visible(json.dumps(entry.message, ensure_ascii=False))]
    if state:
        lines += ["", "state:", *("    " + s for s in json.dumps(state, indent=2).split("\n"))]
    emit_lines(lines)


def _full_message(msg: dict[str, Any]) -> list[str]:
    """A message with nothing cut: every field, content unwrapped."""
    lines = [f"role     {one_line(msg.get('role'), '?')}"]
    for key, value in sorted(msg.items()):
        if key in ("role", "content"):
            continue
        lines.append(visible(f"{key:<8} {json.dumps(value, ensure_ascii=False)}"))
    lines += ["", *message_text(msg).split("\n")]
    return lines


@cli.command()
@click.argument("a")
@click.argument("b")
@click.option(
    "--files",
    "files",
    is_flag=True,
    help="Show how the files the agent's tools changed differ from A to B.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def diff(ctx: click.Context, a: str, b: str, files: bool, as_json: bool) -> None:
    """Where two sessions part: their common ancestor and the messages unique to each.

    With --files: a unified diff, from A to B, of each file that write_file or
    edit_file changed between them (binary files are named, not shown). What
    shell commands changed is not recorded.

    \b
    Examples:
      ags diff 3f2a 9c8d
      ags diff 3f2a~4 3f2a --files
    """  # fmt: skip
    if files:
        _diff_files(open_store(ctx), a, b, as_json)
        return
    from objstore import diff_sessions  # the diff and search machinery: loaded when used

    result = diff_sessions(open_store(ctx), a, b)
    if as_json:
        emit_json({
            "base": result.base,
            "only_a": [entry_json(e) for e in result.only_a],
            "only_b": [entry_json(e) for e in result.only_b],
        })  # fmt: skip
        return
    lines = [f"common ancestor: {result.base or '(none: no shared history)'}", ""]
    for name, entries in ((a, result.only_a), (b, result.only_b)):
        lines.append(style(f"only in {visible(name)} ({len(entries)}):", bold=True))
        for e in entries:
            lines += ["  " + line for line in entry_lines(e, oneline=True)]
        lines.append("")
    emit_lines(lines)


def _diff_files(store: Store, a: str, b: str, as_json: bool) -> None:
    from objstore import diff_files

    deltas = diff_files(store, a, b)
    if as_json:
        emit_json([{"path": d.path, "a": d.a, "b": d.b} for d in deltas])
        return
    if not deltas:
        emit_lines(["no file the agent changed differs between them"])
        return
    lines = []
    for d in deltas:
        lines.append(style(visible(f"{change_word(d.a, d.b)} {d.path}"), bold=True))
        lines += delta_lines(store, d)
    emit_lines(lines)


@cli.command()
@click.argument("query")
@click.option("--session", "session_spec", help="Only this session (id, prefix, HEAD).")
@click.option("--role", help="Only messages of this role (user, assistant, tool; summary).")
@click.option("--all", "include_archived", is_flag=True, help="Search archived sessions too.")
@click.option("-n", "limit", type=click.IntRange(1, sys.maxsize), default=50, show_default=True,
              help="At most N hits.")  # fmt: skip
@click.option("--rebuild", is_flag=True, help="Rebuild the index from the objects first.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def search(
    ctx: click.Context,
    query: str,
    session_spec: str | None,
    role: str | None,
    include_archived: bool,
    limit: int,
    rebuild: bool,
    as_json: bool,
) -> None:
    """Full-text search over every message of every session, compacted history
    included. Words must all match; "quoted phrases" and word* prefixes work.

    The index (cache/search.sqlite) is derived from the objects and kept up to
    date on every search; --rebuild makes it again from scratch.

    \b
    Examples:
      ags search "connection refused" --role tool
      ags search pytest --session 3f2a --json
    """
    from objstore import SearchIndex, fts_query

    fts_query(query)  # a query that cannot match is refused before the index is touched
    store = open_store(ctx)
    sid = store.session_id(session_spec) if session_spec is not None else None  # "": refused
    with SearchIndex(store) as index:
        stats = index.rebuild() if rebuild else index.refresh()
        for failed_sid, why in stats.failed:
            click.echo(f"ags: session {failed_sid} skipped: {visible(why)}", err=True)
        hits = index.search(
            query,
            session=sid,
            role=role,
            limit=limit,
            include_archived=include_archived,
            refresh=False,
        )
    if as_json:
        emit_json(hits)
        return
    if not hits:
        click.echo("no matches")
        return
    lines = []
    for hit in hits:
        role_label = "summary" if hit.is_summary else hit.role
        marks = ("\x1b[1m", "\x1b[0m") if color_enabled() else ("[", "]")
        lines.append(
            f"{style(short(hit.session), fg='yellow')} {short(hit.node)} "
            f"{style(one_line(role_label, '?'), fg=ROLE_COLORS.get(role_label or ''))}: "
            f"{_marked_snippet(hit, *marks)}"
        )
    emit_lines(lines)


def _marked_snippet(hit: SearchHit, before: str, after: str) -> str:
    """The hit's snippet, visible, each match between ``before`` and ``after`` (which
    may be escape sequences of our own, so the text is made visible piece by piece)."""
    out, at = [], 0
    for start, end in hit.matches:
        out += [visible(hit.snippet[at:start]), before, visible(hit.snippet[start:end]), after]
        at = end
    return "".join([*out, visible(hit.snippet[at:])])
