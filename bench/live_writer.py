"""A session's writer in a process of its own, for the live-reader row (format_rows.py).

Its own module, importing nothing of the bench but what it needs: a process
started with ``spawn`` imports it afresh.
"""

from __future__ import annotations

from objstore import Store

from .conversations import summary_text


def write_compacted(store: Store, sid: str, messages: list[object]) -> None:
    """The session of the live-reader row: every message appended, compacted every 500
    keeping 4 (as the JSONL side is)."""
    for i, message in enumerate(messages, 1):
        store.append(sid, message)  # type: ignore[arg-type]
        if i % 500 == 0:
            store.compact(sid, summary_text(seed=i), 4)


def write_and_hold(
    path: str, sid: str, messages: list[object], ready: object, stop: object
) -> None:
    """The session's writer, in a process of its own: appends the whole session
    (``write_compacted``) and keeps its handle (and so its unsealed pack) open."""
    with Store.open(path) as store:
        write_compacted(store, sid, messages)
        ready.set()  # type: ignore[attr-defined]
        while not stop.wait(0.05):  # type: ignore[attr-defined]
            pass  # holding the handle open; appending would change what is read
