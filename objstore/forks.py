"""A store handle belongs to the process that opened it.

A child of ``os.fork`` (``multiprocessing``'s default way to start a process on
Linux before Python 3.14) gets a copy of every handle its parent has open: the
same open files, and so the same ``flock`` locks, which belong to an open file,
not to a process. A copy that went on would act for the parent: its close would
seal the pack the parent is still appending to (the parent's next appends then
go to a deleted file, acknowledged and lost), its unlock would unlock a ref the
parent is updating, and its copies of the lock files would keep the parent's
session writer locks held after the parent let go of them, until the child
exits. So, in a child:

* at the fork, the child's copies of every lock file and of every pack being
  written (``track``) are closed, without unlocking anything: the parent's
  locks hold as before, and the child holds none of them;
* every operation on a handle of the parent raises ``ForkedHandle``
  (``Opener.check``): its turn (turns.py) or its appends' queue may be held by a
  thread that the child does not have (a ``SearchIndex`` of the parent's
  too: SQLite's connections must not cross a fork);
* closing such a handle, or its collection, does nothing.

A handle the child opens itself is the child's own. ``subprocess`` does not
run these hooks, nor need them: what it starts runs another program, and ags
opens every file close-on-exec.
"""

from __future__ import annotations

import os
import weakref
from contextlib import suppress
from typing import Protocol

from .errors import ForkedHandle


class _Forgets(Protocol):
    def forget_in_child(self) -> None:
        """Close this process's copy of each file held, unlocking nothing."""


_generation = 0
"""How many forks this process is a child of: a handle opened at another count was
opened by an ancestor."""

_tracked: weakref.WeakSet[_Forgets] = weakref.WeakSet()


class Opener:
    """The process that opened a handle, and how many forks it was a child of then."""

    __slots__ = ("born", "pid")

    def __init__(self) -> None:
        self.born, self.pid = _generation, os.getpid()

    @property
    def forked(self) -> bool:
        """Whether this process is a child of a fork of the opener."""
        return self.born != _generation

    def check(self) -> None:
        """ForkedHandle in a child of a fork of the opener."""
        if self.born != _generation:
            raise ForkedHandle(self.pid, os.getpid())


def track(holder: _Forgets) -> None:
    """Close ``holder``'s files in a child of a fork (until ``untrack``)."""
    _tracked.add(holder)


def untrack(holder: _Forgets) -> None:
    _tracked.discard(holder)


def _in_child() -> None:
    global _generation
    _generation += 1
    for holder in list(_tracked):
        with suppress(OSError):  # each on its own: one that fails leaves the rest to do
            holder.forget_in_child()
    _tracked.clear()


os.register_at_fork(after_in_child=_in_child)
