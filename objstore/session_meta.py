"""The rules of a session ref's ``meta`` (FORMAT.md 6.1), checked in full.

Every value ags writes keeps them: the API refuses a title of 1,001
characters, a time that is not one, a relative root. A ref that breaks them
was written by something else: a hand edit, another program, a remote that
was tampered with. ``meta_damage`` says what is wrong with one; ``ags fsck``
reports it, and a fetch refuses such a ref from a remote (remote/fetch.py).
A listing reads a ref more leniently (``store.session_info`` checks the types
only), so one odd value does not hide a session from ``ags ls``.
"""

from __future__ import annotations

import re
from typing import Any, Final

from .objects import ID_RE
from .refs import SESSION_ID_RE

TIME_RE: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")
MAX_TEXT: Final = 1000  # characters of a title or a model name
MAX_ROOT: Final = 4096  # characters of a project root (PATH_MAX)


def is_time(value: Any) -> bool:
    return isinstance(value, str) and TIME_RE.fullmatch(value) is not None


def is_title(value: Any) -> bool:
    return value is None or (type(value) is str and len(value) <= MAX_TEXT and "\0" not in value)


def meta_damage(meta: Any) -> str | None:
    """What breaks FORMAT.md 6.1 in a session ref's ``meta``, or None if nothing."""
    if not isinstance(meta, dict):
        return "its meta is not an object"
    for name in ("created", "updated"):
        if not is_time(meta.get(name)):
            return f"meta.{name} is {_shown(meta.get(name))}, not a time"
    archived = meta.get("archived_at")
    if archived is not None and not is_time(archived):
        return f"meta.archived_at is {_shown(archived)}, not a time or null"
    if not is_title(meta.get("title")):
        return f"meta.title is not text of at most {MAX_TEXT} characters without a NUL"
    model = meta.get("model")
    if model is not None and (type(model) is not str or len(model) > MAX_TEXT):
        return f"meta.model is not text of at most {MAX_TEXT} characters"
    root = meta.get("root")
    if root is not None and not _is_root(root):
        return f"meta.root is {_shown(root)}, not an absolute path"
    messages = meta.get("messages", 0)
    if type(messages) is not int or messages < 0:
        return f"meta.messages is {_shown(messages)}, not a count"
    forked = meta.get("forked_from")
    if forked is not None and not _is_fork_origin(forked):
        return f"meta.forked_from is {_shown(forked)}, not a session and a node"
    imported = meta.get("imported")
    if imported is not None and not isinstance(imported, dict):
        return f"meta.imported is {_shown(imported)}, not an object or null"
    return None


def _is_root(value: Any) -> bool:
    return (
        type(value) is str
        and value.startswith("/")
        and len(value) <= MAX_ROOT
        and "\0" not in value
    )


def _is_fork_origin(value: Any) -> bool:
    """``{"session": <session id or null>, "node": <node id or null>}``, nothing else."""
    if not isinstance(value, dict) or set(value) != {"session", "node"}:
        return False
    session, node = value["session"], value["node"]
    return _is_id_or_null(session, SESSION_ID_RE) and _is_id_or_null(node, ID_RE)


def _is_id_or_null(value: Any, pattern: re.Pattern[str]) -> bool:
    return value is None or (type(value) is str and pattern.fullmatch(value) is not None)


def _shown(value: Any) -> str:
    """A value as an error shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["MAX_TEXT", "TIME_RE", "is_time", "is_title", "meta_damage"]
