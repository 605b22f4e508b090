"""Which packs to merge, so that the number of packs stays small.

Every process that writes gets a pack of its own, and a lookup that misses
searches every pack, so packs must not pile up. When a store holds more than
``MAX_PACKS`` sealed packs, the small ones are merged into one, leaving the
big ones alone: sizes then grow geometrically and each object is copied
O(log n) times over the store's life, as with Git's geometric repacking.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

MAX_PACKS: Final = 8


def packs_to_merge(sizes: Sequence[int]) -> list[int]:
    """Indexes (into ``sizes``) of the packs to merge into one; empty if none need to be.

    Takes packs smallest first, and stops before a pack bigger than twice all
    those taken so far: merging it would copy much to gain little.
    """
    if len(sizes) <= MAX_PACKS:
        return []
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    taken: list[int] = []
    total = 0
    for i in order:
        if len(taken) >= 2 and sizes[i] > 2 * total:
            break
        taken.append(i)
        total += sizes[i]
    return taken
