"""The requests that change the store: rename, tag, fork, archive, unarchive, delete.

Each is a POST of a URL-encoded form that web/guard.py has read and checked
(token, origin, anti-CSRF field) before it gets here; with ``--read-only``
the guard refuses them all. Each is one call of the ``Store`` API, and answers with a
redirect to the page that shows the result (303, so a reload does not post
again). Delete is reached through a page that asks first.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from agent.control_chars import visible
from objstore import InvalidInput, UnknownSpec

from .history import steps_to
from .notes import note_url
from .site import NODE_RE, SESSION_RE, config, render, store


class ReadOnly(InvalidInput):
    """A change asked of a server started with --read-only."""


def _form(request: Request) -> dict[str, str]:
    form: dict[str, str] = request.state.form  # read and checked by the guard
    return form


def _session_id(request: Request) -> str:
    sid = request.path_params["sid"]
    if not SESSION_RE.fullmatch(sid):
        raise UnknownSpec(f"no session {sid}")
    return str(sid)


def _node(form: dict[str, str]) -> str:
    node = form.get("node", "")
    if not NODE_RE.fullmatch(node):
        raise InvalidInput("no node given: choose a message first")
    return node


def _title_sent(form: dict[str, str], current: str | None) -> str | None:
    """The title a form sent, whose field showed ``current`` with its control characters
    made visible (``routes\\tand config`` for a tab): that text sent back unchanged is
    the title as it is, not the escapes; an empty field is no title."""
    sent = form.get("title", "").strip()
    if current is not None and sent == visible(current).strip():
        return current
    return sent or None


def _back(sid: str, note: str, value: str = "") -> Response:
    return RedirectResponse(note_url(f"/s/{sid}", note, value), 303)


def rename(request: Request) -> Response:
    form, sid = _form(request), _session_id(request)
    with store(request) as handle:
        handle.set_title(sid, _title_sent(form, handle.session(sid).title))
    return _back(sid, "renamed")


def tag(request: Request) -> Response:
    form, sid = _form(request), _session_id(request)
    name = form.get("name", "").strip()
    with store(request) as handle:
        if form.get("node"):
            node = _node(form)
            steps_to(handle, sid, node)  # a message of this session, not of another
        else:
            node = handle.node_id(sid)
        handle.tag(name, node, force=form.get("force") == "1")
    return _back(sid, "tagged", name)


def fork(request: Request) -> Response:
    form, sid = _form(request), _session_id(request)
    with store(request) as handle:
        title = _title_sent(form, handle.session(sid).title)
        spec = sid
        if form.get("node"):
            # sid~N names the node and keeps the session: the fork records where
            # it came from.
            spec = f"{sid}~{steps_to(handle, sid, _node(form))}"
        new = handle.fork(spec, title=title)
    return _back(new, "forked")


def archive(request: Request) -> Response:
    _form(request)
    sid = _session_id(request)
    with store(request) as handle:
        handle.archive(sid)
    return _back(sid, "archived")


def unarchive(request: Request) -> Response:
    _form(request)
    sid = _session_id(request)
    with store(request) as handle:
        handle.unarchive(sid)
    return _back(sid, "unarchived")


def confirm_delete(request: Request) -> Response:
    if config(request).read_only:
        raise ReadOnly("this server is read-only (ags serve --read-only)")
    sid = _session_id(request)
    with store(request) as handle:
        info = handle.session(sid)
    return render(request, "delete.html", info=info)


def delete(request: Request) -> Response:
    form, sid = _form(request), _session_id(request)
    if form.get("confirm") != "yes":
        raise InvalidInput("deleting a session needs the confirmation of its page")
    with store(request) as handle:
        handle.delete(sid)
    return RedirectResponse(note_url("/", "deleted", sid[:12]), 303)


ROUTES: Final = [
    Route("/s/{sid}/title", rename, methods=["POST"]),
    Route("/s/{sid}/tag", tag, methods=["POST"]),
    Route("/s/{sid}/fork", fork, methods=["POST"]),
    Route("/s/{sid}/archive", archive, methods=["POST"]),
    Route("/s/{sid}/unarchive", unarchive, methods=["POST"]),
    Route("/s/{sid}/delete", confirm_delete, methods=["GET"]),
    Route("/s/{sid}/delete", delete, methods=["POST"]),
]
