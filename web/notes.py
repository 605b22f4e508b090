"""The one-line notes a page shows after a change: "Renamed", "Deleted: session ...".

A change answers with a redirect to the page that shows its result, and that
address carries the note: a key (``?note=tagged``) and, for two of them, one
value (``&tag=NAME``, ``&session=PREFIX``). A page shows only the keys below,
each as its own fixed text, and only when what the page shows agrees with it
(an archived session for "archived", a tag that exists for "tagged", no
session left with the prefix for "deleted"); a value is shown only if it is
of its kind (a tag name, twelve hex digits). The text of an address never
reaches a page itself, so a link from elsewhere cannot make the site say what
it did not do ("?note=your session was deleted, call ...").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlencode

from starlette.requests import Request

from objstore import AgsError, SessionInfo, Store


@dataclass(frozen=True, slots=True)
class Note:
    text: str  # with {value} where the value goes
    param: str = ""  # the query parameter of the value, if the note has one
    value_re: re.Pattern[str] | None = None


TAG_NAME_RE: Final = re.compile(r"[A-Za-z0-9._+\-/]{1,200}")  # refs.py checks it exactly
SESSION_PREFIX_RE: Final = re.compile(r"[0-9a-f]{12}")

SESSION_NOTES: Final = {
    "renamed": Note("Renamed"),
    "tagged": Note("Tagged: {value}", "tag", TAG_NAME_RE),
    "forked": Note("Forked: this is the new session"),
    "archived": Note("Archived: hidden from the list until unarchived"),
    "unarchived": Note("Unarchived"),
}
LISTING_NOTES: Final = {
    "deleted": Note("Deleted: session {value}", "session", SESSION_PREFIX_RE),
}


def note_url(path: str, key: str, value: str = "") -> str:
    """The address of ``path`` with the note ``key`` (and its value)."""
    note = SESSION_NOTES.get(key) or LISTING_NOTES[key]
    params = {"note": key, **({note.param: value} if note.param else {})}
    return f"{path}?{urlencode(params)}"


def _value(request: Request, note: Note) -> str | None:
    """The note's value from the address, if it has one and it is of its kind; "" for
    a note without a value; None for a value that is missing or not of its kind."""
    if not note.param:
        return ""
    value = request.query_params.get(note.param, "")
    return value if note.value_re is not None and note.value_re.fullmatch(value) else None


def session_note(request: Request, handle: Store, info: SessionInfo) -> str | None:
    """The note a session's page shows, or None."""
    key = request.query_params.get("note", "")
    note = SESSION_NOTES.get(key)
    value = _value(request, note) if note is not None else None
    if note is None or value is None:
        return None
    if (key == "archived" and not info.archived) or (key == "unarchived" and info.archived):
        return None
    if key == "forked" and not info.forked_from:
        return None
    if key == "tagged":
        try:
            handle.target(f"tags/{value}")
        except AgsError:  # no such tag (any more), or not a tag name after all
            return None
    return note.text.format(value=value)


def listing_note(request: Request, handle: Store) -> str | None:
    """The note the list of sessions shows, or None."""
    note = LISTING_NOTES.get(request.query_params.get("note", ""))
    value = _value(request, note) if note is not None else None
    if note is None or not value:
        return None
    if any(r.id.startswith(value) for r in handle.sessions(include_archived=True)):
        return None  # not deleted (or brought back since)
    return note.text.format(value=value)
