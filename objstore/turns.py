"""Sharing a Store between threads: its operations take turns.

A ``Store`` handle may be used by several threads. Each public operation
holds the handle's ``Turns`` lock while it runs, so the handle's state (its
pack writer, its open packs, the heads it remembers, a batch) is changed by
one thread at a time; a thread calling in while another runs waits for its
turn. The lock is reentrant (an operation may call another), and a batch
holds it from its start to its end: a batch has the handle to itself.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Turns:
    """A reentrant lock for one handle's operations."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def one_at_a_time(method: F) -> F:
    """Run a method of an object with a ``_turns`` attribute in its turn."""

    @functools.wraps(method)
    def in_turn(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._turns:
            return method(self, *args, **kwargs)

    return in_turn  # type: ignore[return-value]
