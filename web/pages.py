"""The pages that read: the session list, search, a transcript, the fork graph, a
diff, the actions at one message, and exports."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from agent.control_chars import HIDDEN_IN_LINE, visible
from agent.transcript import (
    FORK_MARKER,
    ShownEntry,
    anchor,
    context_entries,
    context_ids,
    entry_html,
    entry_markdown,
    shown_entries,
    transcript_entries,
)
from agent.transcript import render as render_transcript
from objstore import (
    InvalidInput,
    LogEntry,
    ObjectMissing,
    SearchHit,
    SearchIndex,
    SessionInfo,
    Store,
    UnknownSpec,
    diff_sessions,
    encode_document,
    export_session,
)

from .graph import family, fork_graph_svg
from .history import node_shown
from .notes import listing_note, session_note
from .site import NODE_RE, SESSION_RE, public_message, render, store

PER_PAGE: Final = 50
SEARCH_LIMIT: Final = 100
STATES: Final = ("active", "archived", "all")


def _session_id(request: Request) -> str:
    sid = request.path_params["sid"]
    if not SESSION_RE.fullmatch(sid):
        raise UnknownSpec(f"no session {sid}")
    return str(sid)


def _int(value: str | None, default: int) -> int:
    try:
        return max(int(value or default), 1)
    except ValueError:
        return default


# -- the session list -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Listing:
    rows: list[SessionInfo]
    total: int
    page: int
    pages: int
    projects: list[str]


def list_sessions(handle: Store, project: str, state: str, page: int) -> Listing:
    """One page of sessions, newest first, filtered by project root and state."""
    rows = handle.sessions(include_archived=state != "active")
    if state == "archived":
        rows = [r for r in rows if r.archived]
    projects = sorted({r.root for r in rows if isinstance(r.root, str)})
    if project:
        rows = [r for r in rows if r.root == project]
    pages = max((len(rows) + PER_PAGE - 1) // PER_PAGE, 1)
    page = min(page, pages)
    chosen = rows[(page - 1) * PER_PAGE : page * PER_PAGE]
    return Listing(chosen, len(rows), page, pages, projects)


def sessions_page(request: Request) -> Response:
    q = request.query_params
    state = q.get("state", "active")
    state = state if state in STATES else "active"
    project = q.get("project", "")
    with store(request) as handle:
        listing = list_sessions(handle, project, state, _int(q.get("page"), 1))
        note = listing_note(request, handle)
    return render(
        request,
        "sessions.html",
        listing=listing,
        state=state,
        project=project,
        states=STATES,
        note=note,
    )


# -- search -----------------------------------------------------------------------------


def marked_snippet(hit: SearchHit) -> Markup:
    """A hit's snippet with its matches in ``<mark>``, every piece made visible and escaped."""
    out, at = Markup(""), 0
    for start, end in hit.matches:
        out += Markup("{}<mark>{}</mark>").format(
            visible(hit.snippet[at:start]), visible(hit.snippet[start:end])
        )
        at = end
    return out + visible(hit.snippet[at:])


def search_text(typed: str) -> tuple[str, bool]:
    """What is searched for when ``typed`` is asked, and whether anything was left out.
    A control or hidden character (agent/control_chars.py) is never searched for nor
    put back into the search box: one that is a kind of space (a tab, a line break)
    is a space; any other (NUL, an escape, a bidi override) is left out."""
    hidden = HIDDEN_IN_LINE.findall(typed)
    cleaned = HIDDEN_IN_LINE.sub(lambda m: " " if m.group().isspace() else "", typed)
    return cleaned.strip(), any(not c.isspace() for c in hidden)


def search_page(request: Request) -> Response:
    q = request.query_params
    query, left_out = search_text(q.get("q", ""))
    archived = q.get("archived") == "1"
    hits: list[tuple[SearchHit, SessionInfo | None, Markup]] = []
    error = None
    if query:
        with store(request) as handle:
            try:
                with SearchIndex.open(handle) as index:
                    found = index.search(query, limit=SEARCH_LIMIT, include_archived=archived)
            except InvalidInput as e:
                found, error = [], public_message(request, str(e))
            infos: dict[str, SessionInfo | None] = {}
            for hit in found:
                if hit.session not in infos:
                    try:
                        infos[hit.session] = handle.session(hit.session)
                    except UnknownSpec:
                        infos[hit.session] = None
                hits.append((hit, infos[hit.session], marked_snippet(hit)))
    return render(
        request,
        "search.html",
        status_code=400 if error else 200,  # a query refused, said on its page
        query=query,
        left_out=left_out,
        archived=archived,
        hits=hits,
        error=error,
        limit=SEARCH_LIMIT,
        anchor=anchor,
    )


# -- a transcript ------------------------------------------------------------------------


def entry_controls(sid: str, read_only: bool) -> Callable[[LogEntry], str]:
    """The link each entry of a session's page carries to what can be done at it
    (``sid`` and node ids are hex: nothing to escape)."""
    if read_only or not sid:
        return lambda entry: ""
    return lambda entry: f'<a class="act" href="/s/{sid}/at/{entry.id}">fork · tag</a>'


def whole_entry(entry: LogEntry) -> str:
    """The address of an entry's whole text, where a page shows it cut (``entry_text``)."""
    return f"/text/{entry.id}"


class RenderedEntries:
    """The HTML of entries already rendered, by what decides it: the node (content-
    addressed, so never stale), the results paired with its calls, whether the model
    saw it, and the page's controls. Bounded; least recently used first out.

    Rendering Markdown and highlighting code is most of a transcript page's cost
    (0.8 s of a 3,000-message page here); a page seen again costs its walk.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[tuple[object, ...], str] = OrderedDict()
        self._lock = threading.Lock()  # pages are made in several worker threads

    def get(self, item: ShownEntry, sid: str, read_only: bool) -> str:
        key = (
            item.entry.id,
            tuple(c.result.id if c.result else None for c in item.calls),
            item.in_context,
            sid,
            read_only,
        )
        with self._lock:
            html = self._items.get(key)
            if html is not None:
                self._items.move_to_end(key)
                return html
        html = entry_html(item, entry_controls(sid, read_only), whole_entry)
        with self._lock:
            self._items[key] = html
            while len(self._items) > self.limit:
                self._items.popitem(last=False)
        return html


RENDERED: Final = RenderedEntries(limit=20_000)


def entries_html(shown: list[ShownEntry], sid: str, read_only: bool, fork_at: str | None) -> str:
    """The HTML of ``shown`` as a session's page lists them (the fork point marked)."""
    parts = []
    for item in shown:
        parts.append(RENDERED.get(item, sid, read_only))
        if item.entry.id == fork_at:
            parts.append(FORK_MARKER)
    return "\n".join(parts)


SHORT_ID_RE: Final = re.compile(r"[0-9a-f]{4,31}")


def _full_id_url(request: Request) -> Response | None:
    """A session page asked for by a short id (as ``ags ls`` prints it, typed or pasted
    into the address): a redirect to the page of the one session it names, whose
    address then holds the whole id. An id no session or several have: the error page."""
    short = request.path_params["sid"]
    if not SHORT_ID_RE.fullmatch(short):
        return None
    with store(request) as handle:
        sid = handle.session_id(short)  # UnknownSpec, AmbiguousSpec: the error page
    query = f"?{request.url.query}" if request.url.query else ""
    return RedirectResponse(f"/s/{sid}{query}", 308)


def session_page(request: Request) -> Response:
    redirect = _full_id_url(request)
    if redirect is not None:
        return redirect
    sid = _session_id(request)
    view = "context" if request.query_params.get("view") == "context" else "full"
    read_only = request.app.state.config.read_only
    with store(request) as handle:
        info = handle.session(sid)
        transcript = transcript_entries(handle, sid)
        forked_title = None
        parent = (info.forked_from or {}).get("session")
        if isinstance(parent, str):
            try:
                forked_title = handle.session(parent).title or ""
            except (UnknownSpec, InvalidInput):
                parent = None
        note = session_note(request, handle, info)
    entries = transcript.entries
    compactions = sum(1 for e in entries if e.node.is_compaction)
    in_context = context_ids(entries)
    fork_at = (info.forked_from or {}).get("node")
    if view == "context":
        shown = shown_entries(context_entries(entries), in_context)
    else:
        shown = shown_entries(entries, in_context)
    body = entries_html(shown, sid, read_only, fork_at if view == "full" else None)
    return render(
        request,
        "session.html",
        info=info,
        view=view,
        entries=Markup(body),
        count=len(entries),
        outside=len(entries) - len(in_context & {e.id for e in entries}),
        compactions=compactions,
        parent=parent,
        parent_title=forked_title,
        fork_before_start=bool(fork_at) and fork_at not in {e.id for e in entries},
        note=note,
    )


# -- one message: fork or tag there -------------------------------------------------------


def _node_id(request: Request) -> str:
    """The page's node id: UnknownSpec (a 404) for what cannot be one."""
    node = request.path_params["node"]
    if not NODE_RE.fullmatch(node):
        raise UnknownSpec(f"no node {node}")
    return str(node)


def _entry(handle: Store, node: str) -> LogEntry:
    """The entry at ``node``: UnknownSpec (a 404) for no such node. The id comes from
    the address, so it may be a message's or a file's: that is no node, not a store
    whose node is damaged (``Store.node`` says "corrupt" of an id a node links to)."""
    try:
        handle.target(node)  # UnknownSpec unless a node has this id
        at = handle.node(node)
    except (ObjectMissing, UnknownSpec):
        raise UnknownSpec(f"no node {node}") from None
    return LogEntry(at, handle.blob(at.content))


def at_node_page(request: Request) -> Response:
    sid, node = _session_id(request), _node_id(request)
    with store(request) as handle:
        info = handle.session(sid)
        node_shown(handle, info, node)  # under this session's title: of its history only
        entry = _entry(handle, node)
    shown = ShownEntry(entry, (), True)
    html = entry_html(shown, whole=whole_entry)
    return render(request, "at.html", info=info, node=node, entry=Markup(html))


def entry_text(request: Request) -> Response:
    """One entry whole, as the Markdown transcript has it, as plain text: where a page
    shows a long text cut (SHOWN_CHARS), it links here. Node ids name content, so the
    address is the store's, not a session's."""
    with store(request) as handle:
        text = entry_markdown(_entry(handle, _node_id(request)))
    return Response(visible(text, multiline=True), media_type="text/plain; charset=utf-8")


# -- the fork graph and diffs ---------------------------------------------------------------


def graph_page(request: Request) -> Response:
    sid = _session_id(request)
    with store(request) as handle:
        info = handle.session(sid)
        members = family(handle, sid)
        svg = fork_graph_svg(members, sid)
    mine = next((m for m in members if m.info.id == sid), None)
    others = [m.info.id for m in members if m.info.id != sid]
    other = mine.parent if mine and mine.parent else (others[0] if others else sid)
    return render(request, "graph.html", info=info, svg=Markup(svg), members=members, other=other)


def _names_head(spec: str) -> bool:
    """Whether ``spec`` starts from HEAD (``HEAD``, ``HEAD~2``, ``HEAD@{1}``)."""
    return re.split(r"@\{|~", spec, maxsplit=1)[0] == "HEAD"


def diff_page(request: Request) -> Response:
    a, b = request.query_params.get("a", ""), request.query_params.get("b", "")
    if not a or not b:
        raise InvalidInput("a diff needs two sessions or nodes: ?a=...&b=...")
    with store(request) as handle:
        for spec in (a, b):
            # HEAD is looked up for the directory the server runs in: say that there
            # is none without naming the directory (the store's error names it).
            if _names_head(spec) and handle.head() is None:
                raise UnknownSpec(
                    f"{spec}: nothing is checked out (HEAD is looked up where ags serve runs)"
                )
        diff = diff_sessions(handle, a, b)
        base = LogEntry(handle.node(diff.base), None) if diff.base else None
        names = {}
        for spec in (a, b):
            target = handle.target(spec)
            names[spec] = handle.session(target.session) if target.session else None
    sides = [
        Markup(entries_html(shown_entries(d[::-1], {x.id for x in d}), "", True, None))
        for d in (diff.only_a, diff.only_b)
    ]
    return render(
        request,
        "diff.html",
        a=a,
        b=b,
        info_a=names[a],
        info_b=names[b],
        base=base,
        only_a=len(diff.only_a),
        only_b=len(diff.only_b),
        side_a=sides[0],
        side_b=sides[1],
    )


# -- exports ----------------------------------------------------------------------------------

_EXPORTS: Final = {
    "json": "application/json",
    "md": "text/markdown; charset=utf-8",
    "html": "text/html; charset=utf-8",
}


def export_file(request: Request) -> Response:
    """A download: the export document, or the transcript as Markdown or one HTML page
    (as ``ags export`` writes them; sent as an attachment, never shown in this origin)."""
    sid = _session_id(request)
    fmt = request.path_params["fmt"]
    if fmt not in _EXPORTS:
        raise UnknownSpec(f"no export format {fmt}")
    with store(request) as handle:
        if fmt == "json":
            data = encode_document(export_session(handle, sid))
        else:
            text = render_transcript(transcript_entries(handle, sid), fmt)
            data = visible(text, multiline=True).encode("utf-8")
    return Response(
        data,
        media_type=_EXPORTS[fmt],
        headers={
            "content-disposition": f'attachment; filename="ags-{sid[:12]}.{fmt}"',
            "cache-control": "no-store",
        },
    )


def not_found(request: Request, exc: Exception) -> Response:
    return render(request, "error.html", status_code=404, message="No such page.")


ROUTES: Final = [
    Route("/", sessions_page),
    Route("/search", search_page),
    Route("/diff", diff_page),
    Route("/s/{sid}", session_page),
    Route("/s/{sid}/graph", graph_page),
    Route("/s/{sid}/at/{node}", at_node_page),
    Route("/s/{sid}/export/{fmt}", export_file),
    Route("/text/{node}", entry_text),
]
