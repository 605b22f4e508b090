"""Sharing a Store between threads: its operations take turns, and a durable append
waits for its fsync outside its turn, so that appends of several threads share
one fsync (group commit).

A ``Store`` handle may be used by several threads. Each public operation
holds the handle's ``Turns`` while it runs, so the handle's state (its pack
writer, its open packs, the heads it remembers, a batch) is changed by one
thread at a time. The turn is reentrant (an operation may call another), and
a batch holds it from its start to its end: a batch has the handle to itself.

An append gives up its turn (``leave``) once its records are in the pack and
what is left is to wait for them to be durable: that touches nothing other
threads change. Meanwhile the next thread writes its
records, and the fsync one thread makes covers every record written before
it started (packs.PackWriter.sync). Locks are taken in one order, turn ->
session -> ref stripe -> fsync, and a thread that left its turn never waits
for it again in the same operation, so no two threads can wait for each
other.

Appends of several threads do not each take the turn: they queue, and one
thread at a time takes the turn and runs every queued append (combining.py).
An fsync does not wait for appends still to come: the queue already gathers
every append that arrives while an fsync runs into the next write, and a wait
(a 2 ms "gather" before each fsync, until the flat combining came) measured
no faster, at the cost of a wake-up per group.

A turn is not taken in a child of a fork (forks.py): a thread the child does not
have may hold it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from . import forks

F = TypeVar("F", bound=Callable[..., Any])


class Turns:
    """The turn of one handle: a reentrant lock its holder can leave early."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._left = threading.local()  # exits still owed by a thread that left
        self.opener = forks.Opener()  # its process: no turn in a child of a fork

    def __enter__(self) -> None:
        self.opener.check()
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return
        self._lock.acquire()
        self._owner, self._depth = me, 1

    def __exit__(self, *exc: object) -> None:
        if self._owner == threading.get_ident():
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._lock.release()
            return
        owed = getattr(self._left, "exits", 0)
        if owed:  # the exits of an operation whose thread left its turn
            self._left.exits = owed - 1

    def mine(self) -> bool:
        """Whether this thread holds the turn (in a batch, or an operation within one)."""
        return self._owner == threading.get_ident()

    def leave(self) -> None:
        """Give up the turn for the rest of the current operation (no-op if not held)."""
        if self._owner != threading.get_ident():
            return
        self._left.exits = getattr(self._left, "exits", 0) + self._depth
        self._owner, self._depth = None, 0
        self._lock.release()


def one_at_a_time(method: F) -> F:
    """Run a method of an object with a ``_turns`` attribute in its turn."""

    @functools.wraps(method)
    def in_turn(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._turns:
            return method(self, *args, **kwargs)

    return in_turn  # type: ignore[return-value]
