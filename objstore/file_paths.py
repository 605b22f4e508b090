"""The paths a node's ``files`` field names (FORMAT.md 4.2): project-relative POSIX
paths, checked the same way by every writer and every reader.

A path is relative to the session's project root, ``/``-separated, and can only
name something inside that root: no leading ``/``, no empty, ``.`` or ``..``
part, no NUL, within the limits of limits.py. A reader that restores files
from a node can then join a recorded path to a root without leaving it
lexically (links are the restorer's business, agent/confined.py).
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidInput, LimitExceeded
from .limits import MAX_FILE_NAME_BYTES, MAX_FILE_PATH_BYTES


def check_file_path(path: Any) -> str:
    """Return ``path`` if it is a valid recorded path, else raise InvalidInput that
    says why (LimitExceeded for one over a limit)."""
    if type(path) is not str:
        raise InvalidInput(f"a file path must be text, not {type(path).__name__}")
    if "\0" in path:
        raise InvalidInput(f"file path {path!r} holds a NUL character")
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput(f"file path {path!r} is not valid Unicode") from None
    if size > MAX_FILE_PATH_BYTES:
        raise LimitExceeded(
            f"file path of {size:,} bytes is over the limit of {MAX_FILE_PATH_BYTES:,}",
            "too long",
        )
    if path.startswith("/"):
        raise InvalidInput(f"file path {path!r} is absolute; it must be relative to the project")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise InvalidInput(
                f"file path {path!r} has an empty, '.' or '..' part; "
                "it must name a file inside the project"
            )
        if len(part.encode("utf-8")) > MAX_FILE_NAME_BYTES:
            raise LimitExceeded(
                f"file path {path!r} has a part over {MAX_FILE_NAME_BYTES} bytes", "too long"
            )
    return path
