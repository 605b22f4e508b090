"""Sealing a handle's full pack in a thread of its own, while its appends go on into
a new pack (FORMAT.md 5.2).

A seal (fsync the pack, write the ref files its journal is ahead of, compress its
objects into a block pack, delete it) took 20-55 ms, once per ~1,000 appends, and
every thread appending through the handle waited for it. Here the handle starts a
new pack at once and a ``BackgroundSeal`` does the file work of the old one; the
compression releases the GIL, so it runs on another core.

What stays with the handle, in its turn (turns.py): the switch (the old pack's held
records written, so nothing is added to it from there on) and, once the seal is
done, taking in the block pack and letting go of the old pack (``ObjectStore``
reads it until then; its file descriptor must not close under a reader). Until
its seal is done the old pack is one of the handle's packs for every reader of the
handle, and, like any pack without an index, for every other process.

One seal at a time: a handle whose new pack fills before the old one is sealed
waits for that seal. The thread is not a daemon, so an interpreter that exits
normally finishes the seal first; a process killed meanwhile leaves two packs
without an index, which the next open recovers like any pack a crash left.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from .packs import PackWriter


class BackgroundSeal:
    """The seal of one full pack, run by ``seal(writer)`` in a new thread; ``wait``
    returns the path of the block pack it wrote, or raises what it raised."""

    def __init__(self, writer: PackWriter, seal: Callable[[PackWriter], Path]) -> None:
        self.writer = writer
        self._seal = seal
        self._sealed: Path | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"ags seal {writer.name}")
        self._thread.start()

    def _run(self) -> None:
        try:
            self._sealed = self._seal(self.writer)
        except BaseException as e:  # handed to whoever waits for the seal
            self._error = e

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    @property
    def in_its_thread(self) -> bool:
        """Whether the caller runs in the seal's own thread (a handle dropped without
        closing, collected there), which must not wait for itself."""
        return self._thread is threading.current_thread()

    def wait(self) -> Path | None:
        """Wait for the seal to end; the block pack's path, or the seal's error. None in
        a process forked while the seal ran: the thread is not there, and the pack is
        the parent's to seal."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sealed
