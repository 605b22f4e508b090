"""Appends of several threads written by one of them (flat combining).

Each thread appending through a shared ``Store`` used to take the handle's turn
for its own append, write its records, leave the turn and wait for the fsync
that covered them: a lock handoff, a write and two or three wake-ups per append,
and with the GIL each wake-up is a switch of threads. Here a thread queues its
append, already encoded and checked (the leader hashes and compresses it: for
messages of a few KB that costs less than the thread switches its GIL release
brings), and one thread at a time, the *leader*,
takes the turn and runs every queued append: their records go to the pack in
one write, one fsync covers them all (shared with other leaders' by group
commit, turns.py), and each queued thread is woken once, when its append is
durable or has failed.

A thread that queues an append while no leader runs becomes the leader. A
leader takes what is queued when it has the turn; as it gives the turn up to
wait for its fsync, it hands the lead to the first thread queued since (that
thread takes the turn and writes the next group while the fsync runs), or, if
none, lets the next thread to queue lead. So a thread appending alone leads
every time: one write and one fsync per append, as before.

A leader gathers before it takes the queue. The threads of a group, woken once
their appends are durable, often append again at once (agents writing their
next messages), but they come back one at a time, each needing the interpreter
lock: the first to queue found no leader, led a group of one, and paid an fsync
of its own, and the next did the same. So the leader that follows waits for the
threads woken last to queue again, up to GATHER_WINDOW after they were woken,
and writes them as one group. A thread woken that does not append again is
waited for only that long, once. A leader counts itself among the threads it
woke, so a thread appending alone has set the count back to zero by the time
its next append leads: it never waits.

A queued thread that is interrupted (Ctrl-C in the main thread) still waits
until its append is done, and then raises: its append is being written by
another thread, and a leader must never wait for a thread that left. A leader
interrupted before it took the queue (waiting for the handle's turn) withdraws
its own append, which raises, and hands the lead on: left in the queue, the
append came back without an id, and the lead was handed to it, a thread no
longer waiting, so every later append waited for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Final

GATHER_WINDOW: Final = 0.0005
"""Seconds after a group's threads were woken that the next leader waits for them to
queue again (module doc). Eight threads appending 1,000 messages each: groups of one
went from two thirds of all groups to under a twentieth, fsyncs from 1,497 to 1,104,
and the run from 5,407 to 6,244/s (medians of interleaved runs); 0.25, 1 and 2 ms
did the same within the noise."""


class QueuedAppend:
    """One thread's append, waiting in the queue for the leader that runs it."""

    __slots__ = ("work", "result", "error", "lead", "interrupted", "_wake")

    def __init__(self, work: Callable[[list[Callable[[], None]]], Any]) -> None:
        # Run by the leader in the handle's turn, given the list of what lets go of the
        # append's ref lock once it is durable (RefStore.transact's ``until_durable``).
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None
        self.lead = False  # woken to lead, not because it is done
        self.interrupted: BaseException | None = None  # raised once the append is done
        self._wake = threading.Lock()
        self._wake.acquire()

    def wake(self) -> None:
        self._wake.release()

    def wait(self) -> None:
        """Wait to be woken (done, or made the leader); an interruption meanwhile is
        kept for ``outcome`` to raise."""
        while True:
            try:
                self._wake.acquire()
                return
            except BaseException as e:  # noqa: PERF203 - a rare Ctrl-C
                self.interrupted = e

    def outcome(self) -> Any:
        """What the append returned, or what it (or an interruption) raised."""
        if self.interrupted is not None:
            raise self.interrupted
        if self.error is not None:
            raise self.error
        return self.result


class AppendQueue:
    """The appends queued on one handle and who leads (module doc)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._queued: list[QueuedAppend] = []
        self._leading = False
        # Threads woken with their appends done and not queued since (any thread that
        # queues counts as one of them), and when they were woken: ``gather``.
        self._returning = 0
        self._woken_at = 0.0
        self._back = threading.Condition(self._mutex)

    def join(self, append: QueuedAppend) -> bool:
        """Queue an append; whether its thread is to lead now. One that is not waits
        (``QueuedAppend.wait``) and leads if woken with ``lead`` set."""
        with self._mutex:
            self._queued.append(append)
            if self._returning:
                self._returning -= 1
                if not self._returning:
                    self._back.notify()
            if self._leading:
                return False
            self._leading = True
            return True

    def waking(self, count: int) -> None:
        """A leader is about to wake ``count`` threads whose appends are done."""
        if count:
            with self._mutex:
                self._returning += count
                self._woken_at = time.monotonic()

    def gather(self) -> None:
        """Before a leader takes the queue: wait for the threads woken last to queue
        again, at most until GATHER_WINDOW after they were woken (module doc)."""
        with self._mutex:
            if not self._returning:
                return
            end = self._woken_at + GATHER_WINDOW
            while self._returning:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._back.wait(left)
            self._returning = 0  # the rest are not waited for again

    def withdraw(self, append: QueuedAppend) -> None:
        """Take a leader's own append out of the queue: it was interrupted before it
        took the queue, and the lead goes to the next (``pass_lead``), not to it."""
        with self._mutex:
            if append in self._queued:
                self._queued.remove(append)

    def take(self) -> list[QueuedAppend]:
        """Everything queued, for the leader to run (in the handle's turn)."""
        with self._mutex:
            taken, self._queued = self._queued, []
            return taken

    def pass_lead(self) -> None:
        """The leader is done taking: wake the first thread queued since to lead, or let
        the next thread that queues lead."""
        with self._mutex:
            if not self._queued:
                self._leading = False
                return
            nxt = self._queued[0]
        nxt.lead = True
        nxt.wake()
