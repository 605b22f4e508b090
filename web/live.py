"""Live pages: a session another process is writing, updated as messages land.

A transcript page opens ``/s/<id>/events?since=<head>`` (server-sent events).
The server looks at the session's ref every POLL_S seconds: one read of one
small file through ``Store.session``, whatever the length of the history,
and the same call whatever the store's format. Only when the head, title or
archived state moved does it read history, and then only the new nodes: it
walks back from the new head to the head the page has.

What it sends (``event: update``, JSON): the new entries' HTML to append, and
the entries to replace (the last assistant message and tool results before
the old head, so that a result that lands after its call is shown inside
it). A history that moved other than forward (a rewind), a new compaction
(what the model sees changed from there), or more than MAX_NEW new entries
send ``event: reload``; a deleted session sends ``event: gone``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agent.transcript import anchor, shown_entries
from objstore import LogEntry, SessionInfo, Store, UnknownSpec

from .pages import entries_html
from .site import NODE_RE, SESSION_RE

POLL_S: Final = 0.5
HEARTBEAT_S: Final = 15.0
MAX_NEW: Final = 1000
REOPEN_MAX: Final = 64  # entries before the old head looked at for unanswered calls


@dataclass(slots=True)
class Seen:
    """What the page shows now."""

    head: str | None
    title: str | None = None
    archived: bool = False
    messages: int = -1


def _opens_calls(entry: LogEntry) -> bool:
    msg = entry.message if isinstance(entry.message, dict) else {}
    return msg.get("role") == "tool" or (
        msg.get("role") == "assistant" and bool(msg.get("tool_calls"))
    )


def _walk_back(handle: Store, start: str | None, stop: str | None, limit: int) -> list[LogEntry]:
    """Entries from ``start`` back to (not including) ``stop``, oldest first; at most
    ``limit``+1 (more means there were more)."""
    out: list[LogEntry] = []
    at = start
    while at is not None and at != stop and len(out) <= limit:
        node = handle.node(at)
        out.append(LogEntry(node, handle.blob(node.content)))
        at = node.parent
    return out[::-1]


def changes(store_path: Path, sid: str, seen: Seen, read_only: bool) -> tuple[str, Any] | None:
    """The event that brings a page showing ``seen`` up to date, or None; updates ``seen``."""
    with Store.open(store_path) as handle:
        try:
            info: SessionInfo = handle.session(sid)
        except UnknownSpec:
            return "gone", {}
        same = (info.head, info.title, info.archived, info.messages) == (
            seen.head,
            seen.title,
            seen.archived,
            seen.messages,
        )
        if same:
            return None
        new: list[LogEntry] = []
        if info.head != seen.head:
            new = _walk_back(handle, info.head, seen.head, MAX_NEW)
            reached_seen = seen.head is None or (bool(new) and new[0].node.parent == seen.head)
            if len(new) > MAX_NEW or not reached_seen or any(e.node.is_compaction for e in new):
                return "reload", {}
        reopened: list[LogEntry] = []
        if new and seen.head is not None:
            back = _walk_back(handle, seen.head, None, REOPEN_MAX)
            for entry in reversed(back):
                if entry.node.is_compaction or not _opens_calls(entry):
                    break
                reopened.insert(0, entry)
    seen.head, seen.title, seen.archived = info.head, info.title, info.archived
    seen.messages = info.messages
    old = {e.id for e in reopened}
    everything = [*reopened, *new]
    shown = shown_entries(everything, {e.id for e in everything})
    replace = [
        {"id": anchor(s.entry.id), "html": entries_html([s], sid, read_only, None)}
        for s in shown
        if s.entry.id in old
    ]
    append = [entries_html([s], sid, read_only, None) for s in shown if s.entry.id not in old]
    return "update", {
        "head": info.head,
        "title": info.title,
        "archived": info.archived,
        "messages": info.messages,
        "replace": replace,
        "append": append,
    }


async def events(request: Request) -> Response:
    sid = request.path_params["sid"]
    since = request.query_params.get("since") or None
    if not SESSION_RE.fullmatch(sid) or (since is not None and not NODE_RE.fullmatch(since)):
        raise UnknownSpec("no such session or node")
    cfg = request.app.state.config
    seen = Seen(since)
    with Store.open(cfg.store_path) as handle:
        info = handle.session(sid)
    if info.head == since:  # what the page shows: only history that moves is news
        seen.title, seen.archived, seen.messages = info.title, info.archived, info.messages

    async def stream() -> AsyncIterator[str]:
        quiet = 0.0
        yield "retry: 2000\n\n"
        while True:
            event = await anyio.to_thread.run_sync(
                changes, cfg.store_path, sid, seen, cfg.read_only
            )
            if event is not None:
                kind, data = event
                ident = f"id: {seen.head}\n" if kind == "update" and seen.head else ""
                yield f"event: {kind}\n{ident}data: {json.dumps(data)}\n\n"
                quiet = 0.0
                if kind != "update":
                    return
            elif quiet >= HEARTBEAT_S:
                yield ": still here\n\n"
                quiet = 0.0
            await anyio.sleep(POLL_S)
            quiet += POLL_S

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


ROUTES: Final = [Route("/s/{sid}/events", events)]
