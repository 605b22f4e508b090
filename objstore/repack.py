"""Which packs to merge, so that the number of packs stays small.

Every process that writes gets a pack of its own, and a lookup that misses
searches every pack, so packs must not pile up. When a store holds more than
``MAX_PACKS`` sealed packs, packs are merged so that the rest form a
geometric progression (each at least twice the next smaller one), as Git's
geometric repacking does: sizes then grow geometrically and each object is
copied O(log n) times over the store's life.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

MAX_PACKS: Final = 8
FACTOR: Final = 2


def packs_to_merge(sizes: Sequence[int]) -> list[int]:
    """Indexes (into ``sizes``) of the packs to merge into one; empty if none need to be.

    Smallest first: from the biggest pack down, find where the progression
    breaks (a pack less than twice the next smaller one); every pack below
    the break is merged, and so is each pack above it that the merged pack
    would not be half the size of. At least two packs are merged. (A policy
    that took packs from the smallest up and stopped at the first big step
    merged only the newest tiny packs for ever while same-sized packs piled
    up above them.)
    """
    if len(sizes) <= MAX_PACKS:
        return []
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    ordered = [sizes[i] for i in order]
    split = 0
    for i in range(len(ordered) - 1, 0, -1):
        if ordered[i] < FACTOR * ordered[i - 1]:
            split = i + 1  # the pair that breaks the progression is merged, both
            break
    split = max(split, 2)
    total = sum(ordered[:split])
    while split < len(ordered) and ordered[split] < FACTOR * total:
        total += ordered[split]
        split += 1
    return order[:split]
