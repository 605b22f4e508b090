"""Trees and waits that would break a test run rather than fail a test.

:func:`deep_tree`: a chain of nested directories deeper than Python's
recursion limit, made and removed with directory fds (``shutil.rmtree``, and
so pytest's clean-up of old temporary directories, recurses once per level
and fails on it). :func:`deadline`: a call that would block for good fails
instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


@contextlib.contextmanager
def deep_tree(parent: Path, depth: int, name: str = "d") -> Iterator[Path]:
    """``parent/name/name/...`` ``depth`` levels deep, removed on the way out."""
    fd = os.open(parent, _DIR)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    try:
        yield parent / name
    finally:
        _remove_chain(parent, name)


def _remove_chain(parent: Path, name: str) -> None:
    fds = [os.open(parent, _DIR)]
    try:
        while True:  # down to the bottom, holding each level's fd
            try:
                fds.append(os.open(name, _DIR, dir_fd=fds[-1]))
            except FileNotFoundError:
                break
        while len(fds) > 1:  # up again, emptying and removing each level
            level = fds.pop()
            try:
                for entry in os.listdir(level):
                    if entry != name:  # whatever a test left beside the chain
                        os.unlink(entry, dir_fd=level)
            finally:
                os.close(level)
            os.rmdir(name, dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


class Blocked(Exception):
    """A block ran past its :func:`deadline`. Not an OSError, which code under test may catch."""


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Raise :class:`Blocked` if the block takes more than ``seconds`` (main thread only)."""

    def expire(signum: int, frame: object) -> None:
        raise Blocked(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
