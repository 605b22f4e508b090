"""Writer locks: one writer per session, named by pid, released by a crash.

``locks/sessions/<session id>`` is ``flock``ed for as long as a process
writes the session; the holder writes its pid into the file so that a refused
second writer can say who holds it. The kernel drops the lock when the holder
dies, however it dies, so there is never a stale lock to clean up.
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from pathlib import Path

from .errors import SessionBusy
from .files import FileLock, read_file


class WriterLock:
    def __init__(self, locks_dir: Path, session_id: str) -> None:
        self.session_id = session_id
        self._lock = FileLock(locks_dir / "sessions" / session_id)

    @property
    def held(self) -> bool:
        return self._lock.held

    def acquire(self) -> None:
        """Take the lock or raise SessionBusy naming the holder's pid."""
        if self._lock.acquire(blocking=False):
            fd = self._lock.fd
            with suppress(OSError):  # a full disk: the lock is held all the same, unnamed
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return
        raise SessionBusy(self.session_id, self._holder_pid())

    def _holder_pid(self) -> int | None:
        # The holder writes its pid right after taking the lock; give it a moment.
        for _ in range(20):
            try:
                text = read_file(self._lock.path).decode("ascii", "replace").strip()
            except FileNotFoundError:
                text = ""
            if text.isdigit() and len(text) <= 10:  # a pid; a damaged file may hold more
                return int(text)
            time.sleep(0.005)
        return None

    def release(self) -> None:
        if self._lock.held:
            os.ftruncate(self._lock.fd, 0)  # an idle session's lock file takes no disk block
        self._lock.release()
