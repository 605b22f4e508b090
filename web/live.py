"""Live pages: a session another process is writing, updated as messages land.

A transcript page opens ``/s/<id>/events?since=<head>`` (server-sent events).
Every POLL_S seconds one worker thread opens one store handle and reads the
ref of each session a page watches (``Watchers``): one read of one small file
per session through ``Store.session``, whatever the length of the history,
and the same call whatever the store's format; each stream compares what was
read with what its page shows. Only when the head, title or archived state
moved does that stream read history, and then only the new nodes: it walks
back from the new head to the head the page has.

What it sends (``event: update``, JSON): the new entries' HTML to append, and
the entries to replace (the last assistant message and tool results before
the old head, so that a result that lands after its call is shown inside
it). A history that moved other than forward (a rewind), a new compaction
(what the model sees changed from there), or more than MAX_NEW new entries
send ``event: reload``; a deleted session sends ``event: gone``.

At most MAX_WATCHERS streams are open at once; one more is answered 503, and
its page shows the session as it was, without live updates.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agent.transcript import anchor, shown_entries
from objstore import AgsError, LogEntry, SessionInfo, Store, UnknownSpec

from .pages import entries_html
from .site import NODE_RE, SESSION_RE, open_store

POLL_S: Final = 0.5
HEARTBEAT_S: Final = 15.0
MAX_NEW: Final = 1000
REOPEN_MAX: Final = 64  # entries before the old head looked at for unanswered calls
MAX_WATCHERS: Final = 32  # a browser holds at most 6 connections to a server: many tabs' worth


@dataclass(slots=True)
class Seen:
    """What the page shows now."""

    head: str | None
    title: str | None = None
    archived: bool = False
    messages: int = -1

    def shows(self, info: SessionInfo) -> bool:
        """Whether the page is up to date with ``info``."""
        return (info.head, info.title, info.archived, info.messages) == (
            self.head,
            self.title,
            self.archived,
            self.messages,
        )


class Look(enum.Enum):
    NO_NEWS = "no news"  # the session was not read this time (it was not watched yet)
    FAILED = "failed"  # the store could not be read: the stream ends, the page comes back
    CLOSED = "closed"  # the server is stopping: the stream ends


class Watchers:
    """The live streams of one server, and the look at the store they share.

    Every POLL_S, while a stream is open, one worker thread opens one handle and
    reads each watched session's ref; each stream waits for that look
    (``next_look``) instead of opening a handle of its own. 300 streams that each
    looked for themselves kept most of a core busy here (0.5-0.85) and made pages
    2 to 7 times slower, each look taking a worker thread a page waits for; one
    look for all of them takes 0.03. ``join`` refuses a stream beyond ``limit``.

    Used from the event loop only (its thread), so it needs no lock.
    """

    def __init__(self, store_path: Path, limit: int = MAX_WATCHERS) -> None:
        self.store_path = store_path
        self.limit = limit
        self.looks = 0  # how many times the store was looked at (tests count them)
        self._watched: dict[int, str] = {}  # stream number -> its session
        self._numbers = itertools.count()
        self._found: dict[str, SessionInfo | None] | None = {}  # None: the look failed
        self._looked: anyio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def streams(self) -> int:
        return len(self._watched)

    def join(self, sid: str) -> int | None:
        """A number for a new stream watching ``sid``, or None if ``limit`` are open
        (or the server is stopping)."""
        if len(self._watched) >= self.limit or self._closed:
            return None
        self._loop = asyncio.get_running_loop()
        number = next(self._numbers)
        self._watched[number] = sid
        if self._looked is None:
            self._looked = anyio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._look_while_watched())
        return number

    def leave(self, number: int) -> None:
        self._watched.pop(number, None)

    def close_soon(self) -> None:
        """End every stream, from any thread or a signal handler (the server stops):
        uvicorn waits for open responses before it stops, and then cancels them, each
        with a traceback, while a stream would go on forever."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._close)
        self._closed = True

    def _close(self) -> None:
        self._closed = True
        if self._looked is not None:
            self._looked.set()  # wakes every stream, which sees CLOSED

    async def next_look(self, sid: str) -> SessionInfo | None | Look:
        """What the next look finds for ``sid``: its info, None if it is gone."""
        assert self._looked is not None  # made by join
        await self._looked.wait()
        if self._closed:
            return Look.CLOSED
        if self._found is None:
            return Look.FAILED
        return self._found.get(sid, Look.NO_NEWS)

    async def _look_while_watched(self) -> None:
        while self._watched and not self._closed:
            await anyio.sleep(POLL_S)
            sessions = set(self._watched.values())
            if not sessions:
                continue
            found = None  # what a look that fails leaves: every stream ends
            try:
                found = await anyio.to_thread.run_sync(self._look, sessions)
            except (AgsError, OSError):
                pass  # the store cannot be read now: each page comes back and is told why
            finally:
                self._found = found
                self.looks += 1
                looked, self._looked = self._looked, anyio.Event()
                if looked is not None:
                    looked.set()

    def _look(self, sessions: set[str]) -> dict[str, SessionInfo | None]:
        found: dict[str, SessionInfo | None] = {}
        with open_store(self.store_path) as handle:
            for sid in sessions:
                try:
                    found[sid] = handle.session(sid)
                except UnknownSpec:
                    found[sid] = None
                except AgsError:  # a damaged ref: its stream's own read says what it can
                    pass
        return found


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
    with open_store(store_path) as handle:
        try:
            info: SessionInfo = handle.session(sid)
        except UnknownSpec:
            return "gone", {}
        if seen.shows(info):
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


class _Watching(StreamingResponse):
    """An event stream that gives its place among the watchers back when it ends,
    however it ends (the page closed, the server stopping), even before its first
    event."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def _session(store_path: Path, sid: str) -> SessionInfo:
    with open_store(store_path) as handle:
        return handle.session(sid)


async def events(request: Request) -> Response:
    sid = request.path_params["sid"]
    since = request.query_params.get("since") or None
    if not SESSION_RE.fullmatch(sid) or (since is not None and not NODE_RE.fullmatch(since)):
        raise UnknownSpec("no such session or node")
    cfg = request.app.state.config
    watchers: Watchers = request.app.state.watchers
    seen = Seen(since)
    first = await anyio.to_thread.run_sync(_session, cfg.store_path, sid)  # UnknownSpec: 404
    if first.head == since:  # what the page shows: only history that moves is news
        seen.title, seen.archived, seen.messages = first.title, first.archived, first.messages
    number = watchers.join(sid)
    if number is None:
        return PlainTextResponse(
            f"ags serve: {watchers.limit} pages are watching sessions live, the most this "
            "server allows: close some; this page shows the session without live updates\n",
            status_code=503,
            headers={"cache-control": "no-store", "retry-after": "30"},
        )

    async def stream() -> AsyncIterator[str]:
        quiet = 0.0
        info: SessionInfo | None | Look = first
        yield "retry: 2000\n\n"
        while True:
            event: tuple[str, Any] | None = None
            if info is None:
                event = "gone", {}
            elif isinstance(info, SessionInfo) and not seen.shows(info):
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
            info = await watchers.next_look(sid)
            if info is Look.FAILED or info is Look.CLOSED:
                return  # the browser comes back in 2 s, and its request says what is wrong
            quiet += POLL_S

    return _Watching(stream(), lambda: watchers.leave(number))


ROUTES: Final = [Route("/s/{sid}/events", events)]
