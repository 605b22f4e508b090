"""Fsyncs of a file that threads append to, shared by all of them (group commit):
each fsync covers every byte written before it began.

A thread that wants its bytes durable waits for a running fsync that covers
them (one that began after they were written), and is woken once, when it has
returned. If none does, it runs an fsync of its own at once, beside the one
still running: up to OVERLAP fsyncs of a file run at a time, each making what
was written before it began durable when it returns (as POSIX has it for any
fsync, whatever else runs). A thread that finds OVERLAP running, none of them
covering it, waits for the newest to end and looks again; so a slow disk still
gathers the appends of many threads under one fsync.

An fsync that fails (EIO, ENOSPC) ends the file's fsyncs: what was written
after the last one that returned is of unknown durability, and no later fsync
can tell, since Linux reports a writeback error once and marks the pages clean
(so a second fsync returns 0 with the data not on disk). Every thread whose
bytes it was to cover raises, and so does every later ``cover`` of bytes past
``synced``; the file's owner stops writing to it (ObjectStore retires the pack).

Why not one at a time, the next fsync run by a thread the one before woke: that
thread then had to take the interpreter lock from the thread writing the next
appends, which gives it up only for moments (a syscall) and takes it back
before a woken thread runs. With eight threads appending, an fsync of about
130 us took about 320 from its start until its thread ran again, and the next
fsync began about 160 us after that, the disk idle meanwhile. With two at a
time the next group's leader starts its fsync as soon as it has written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

OVERLAP: Final = 2
"""Fsyncs of one file running at a time. With no bound, eight threads each calling
fsync 5 ms long ran 193 fsyncs for 200 appends; with 2, 68 (with 1, under 66)."""


class _Run:
    """An fsync running: the bytes it covers, and the threads waiting for it."""

    __slots__ = ("end", "waiters")

    def __init__(self, end: int) -> None:
        self.end = end
        self.waiters: list[_Waiter] = []


class _Waiter:
    """A thread waiting for a running fsync to return."""

    __slots__ = ("wake",)

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()


class SharedFsync:
    """The fsyncs of one file (module doc). ``synced``: the bytes known durable."""

    def __init__(self) -> None:
        self.synced = 0
        self.failed: OSError | None = None  # the first fsync that failed (module doc)
        self._mutex = threading.Lock()
        self._running: list[_Run] = []  # oldest first

    def cover(self, wanted: int, end: int, fsync: Callable[[], object]) -> None:
        """Return once the first ``wanted`` bytes are durable: at once if they are,
        after a running fsync that covers them, else after running ``fsync`` here,
        which covers the first ``end`` bytes (``end >= wanted``: every write up to
        there has returned). Raises what ``fsync`` raised, and once an fsync failed,
        an OSError of its errno for bytes past ``synced`` (module doc); a thread that
        waited for an fsync that raised anything else looks again."""
        while self.synced < wanted:
            waiter = None
            with self._mutex:
                if self.synced >= wanted:
                    return
                if self.failed is not None:
                    raise self._failure()
                run = next((r for r in self._running if r.end >= wanted), None)
                if run is None and len(self._running) < OVERLAP:
                    run = _Run(end)
                    self._running.append(run)
                else:  # one that covers these bytes, or else the newest
                    run = run or self._running[-1]
                    waiter = _Waiter()
                    run.waiters.append(waiter)
            if waiter is None:
                try:
                    self._run(run, fsync)
                except OSError:
                    if self.synced >= wanted:  # an earlier fsync covered them after all
                        return
                    raise
                continue  # returns, or raises if another fsync failed meanwhile
            try:
                waiter.wake.acquire()
            except BaseException:  # interrupted (Ctrl-C): leave
                with self._mutex:
                    if waiter in run.waiters:
                        run.waiters.remove(waiter)
                raise

    def _run(self, run: _Run, fsync: Callable[[], object]) -> None:
        """Run ``fsync`` for ``run``, then wake every thread that waits for it. One that
        returns after another fsync of the file failed is not trusted (module doc):
        the error it would have reported may be the one the other took, so the bytes
        it covers are not counted durable."""
        ok = False
        try:
            fsync()
            ok = True
        except OSError as e:
            with self._mutex:
                self.failed = self.failed or e
            raise
        finally:
            with self._mutex:
                self._running.remove(run)
                trusted = ok and self.failed is None
                if trusted and run.end > self.synced:
                    self.synced = run.end
                woken, run.waiters = run.waiters, []
            for waiter in woken:
                waiter.wake.release()

    def _failure(self) -> OSError:
        """The error for bytes past ``synced`` once an fsync failed (a new one for each
        thread: one exception raised in several threads would share a traceback)."""
        assert self.failed is not None
        return OSError(self.failed.errno, f"an fsync of this file failed: {self.failed.strerror}")
