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

The thread that is to start the next fsync first waits until no other
append is on its way to the pack (``gather``), for at most about as long as
an fsync takes: an append is on its way from its call, before it has its
turn, until it leaves its turn to wait for its fsync. Without that wait each
fsync covered the appends written while the one before it ran, and the
threads fell into two groups that took turns, about half of them per fsync.
Where the work of all the appends on their way takes less than an fsync, one
fsync covers them all, at the cost of an fsync's time in which nothing is
written; where it takes longer, the wait ends after an fsync's time and the
next fsync runs while they work, as it did without it. One thread alone never
waits: nothing else is on its way.

Appends of several threads do not each take the turn: they queue, and one
thread at a time takes the turn and runs every queued append (combining.py);
the queued ones count as on their way until that thread has written them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

GATHER_WAIT: Final = 0.002
"""Seconds an fsync waits at most for the appends on their way, however slow fsyncs
are: a few appends' work, so a thread that is slow to come (an append of the same
session waiting for this fsync, a batch) costs little."""


class Turns:
    """The turn of one handle: a reentrant lock its holder can leave early."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._left = threading.local()  # exits still owed by a thread that left
        self._coming: set[int] = set()  # threads whose append is on its way to the pack
        self._arrival = threading.Condition(threading.Lock())

    def __enter__(self) -> None:
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

    def set_out(self) -> None:
        """Count this thread's append as on its way to the pack (``gather``)."""
        with self._arrival:
            self._coming.add(threading.get_ident())

    def arrived(self, *threads: int) -> None:
        """This thread's append (or those of ``threads``, written by a leader that ran
        them: combining.py) is no longer on its way: it wrote its records, failed,
        or waits for another append of its session. Idempotent."""
        gone = threads or (threading.get_ident(),)
        if not self._coming.isdisjoint(gone):
            with self._arrival:
                self._coming.difference_update(gone)
                if not self._coming:
                    self._arrival.notify_all()

    def mine(self) -> bool:
        """Whether this thread holds the turn (in a batch, or an operation within one)."""
        return self._owner == threading.get_ident()

    def gather(self, longest: float) -> None:
        """Wait, for at most ``longest`` seconds (and GATHER_WAIT), until no append is
        on its way to the pack."""
        if self._coming and longest > 0:
            with self._arrival:
                self._arrival.wait_for(lambda: not self._coming, min(longest, GATHER_WAIT))

    def leave(self) -> None:
        """Give up the turn for the rest of the current operation (no-op if not held);
        the operation's append, if any, has arrived."""
        self.arrived()
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


def on_the_way(method: F) -> F:
    """For an append, which takes its turn itself once it has encoded and checked what
    it writes (touching nothing of the handle's): on its way to the pack
    (``Turns.gather``) from its call until it leaves its turn or returns."""

    @functools.wraps(method)
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        turns = self._turns
        turns.set_out()
        try:
            return method(self, *args, **kwargs)
        finally:
            turns.arrived()

    return counted  # type: ignore[return-value]
