"""How the benchmark measures: wall-clock time and bytes allocated on disk."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def disk_bytes(root: Path) -> int:
    """Bytes the files and directories under ``root`` take on disk (``st_blocks * 512``).

    Allocated blocks, not file lengths: a 100-byte file costs a whole block,
    which is what a user's disk pays.
    """
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Run ``fn`` once; return (seconds it took, its result)."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def paired_medians(
    first: Callable[[], object], second: Callable[[], object], runs: int
) -> tuple[float, float]:
    """The median wall-clock times of ``runs`` calls of each of two functions.

    The calls alternate, so a burst of load on a shared machine hits both
    sides instead of skewing one.
    """
    a: list[float] = []
    b: list[float] = []
    for _ in range(runs):
        a.append(timed(first)[0])
        b.append(timed(second)[0])
    return statistics.median(a), statistics.median(b)
