"""One fsync at a time for a file that threads append to, shared by all of them
(group commit): each fsync covers every byte written before it began.

A thread that wants its bytes durable while an fsync runs waits, and is woken
once: when an fsync that covers its bytes is done, or, if it wrote after that
fsync began, to run the next fsync itself (the first such waiter only). The
others sleep on. (Waking every waiter at the end of each fsync, as a condition's
``notify_all`` does, woke the ones it did not cover for nothing: each wake of a
thread is a switch of threads under the interpreter lock, and those switches
were about a sixth of what eight appending threads spent holding it.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class _Waiter:
    """A thread waiting for the bytes up to ``wanted`` to be durable."""

    __slots__ = ("wanted", "turn", "wake")

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.turn = False  # woken to run the next fsync, not because it is covered
        self.wake = threading.Lock()
        self.wake.acquire()


class SharedFsync:
    """The fsyncs of one file (module doc). ``synced``: the bytes known durable."""

    def __init__(self) -> None:
        self.synced = 0
        self._mutex = threading.Lock()
        self._running = False
        self._waiting: list[_Waiter] = []

    def cover(self, wanted: int, fsync: Callable[[], int]) -> None:
        """Return once the first ``wanted`` bytes are durable: at once if they are,
        after an fsync another thread runs if it covers them, else after running
        ``fsync`` here (it returns the end of what it covered: the bytes written
        when it began). Raises what ``fsync`` raised, the next waiter trying again."""
        if self.synced >= wanted:
            return
        with self._mutex:
            if self.synced >= wanted:
                return
            waiter = None
            if self._running:
                waiter = _Waiter(wanted)
                self._waiting.append(waiter)
            else:
                self._running = True
        if waiter is not None:
            self._wait(waiter)
            if not waiter.turn:
                return  # covered
        end = None
        try:
            end = fsync()
        finally:
            self._done(end)

    def _wait(self, waiter: _Waiter) -> None:
        try:
            waiter.wake.acquire()
        except BaseException:  # interrupted (Ctrl-C): leave, or hand the turn on
            with self._mutex:
                handed = waiter not in self._waiting
                if not handed:
                    self._waiting.remove(waiter)
            if handed and waiter.turn:
                self._done(None)
            raise

    def _done(self, end: int | None) -> None:
        """An fsync that covered the bytes up to ``end`` (None: it failed) is over: wake
        the waiters it covered, and the first of the rest to run the next one."""
        with self._mutex:
            if end is not None and end > self.synced:
                self.synced = end
            woken = [w for w in self._waiting if w.wanted <= self.synced]
            rest = [w for w in self._waiting if w.wanted > self.synced]
            if rest:
                rest[0].turn = True
                woken.append(rest.pop(0))
            else:
                self._running = False
            self._waiting = rest
        for waiter in woken:
            waiter.wake.release()
