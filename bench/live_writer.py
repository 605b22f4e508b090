"""A session's writer in a process of its own, for the live-reader row (format_rows.py).

Its own module, importing nothing of the bench but what it needs: a process
started with ``spawn`` imports it afresh.
"""

from __future__ import annotations

from objstore import Store

from .conversations import summary_text


def write_and_hold(
    path: str, sid: str, messages: list[object], ready: object, stop: object
) -> None:
    """The session's writer, in a process of its own: appends the whole session and
    keeps its handle (and so its unsealed pack) open, appending now and then."""
    with Store.open(path) as store:
        compact_every, keep = 500, 4
        for i, message in enumerate(messages, 1):
            store.append(sid, message)  # type: ignore[arg-type]
            if i % compact_every == 0:
                store.compact(sid, summary_text(seed=i), keep)
        ready.set()  # type: ignore[attr-defined]
        while not stop.wait(0.05):  # type: ignore[attr-defined]
            pass  # holding the handle open; appending would change what is read
