"""A set of object ids in 16 to 32 bytes an id, for what walks a whole store.

gc's mark, the sweep's copy, and ``du`` each remember every object of the
store; a Python ``set`` of hex id strings takes about 150 bytes an id (the
string and the set's slot), 300 MB for two million objects. ``IdSet`` keeps
the first ``key_bytes`` raw bytes of each id in one ``bytearray`` laid out as
an open-addressed hash table (linear probing, at most 70% full, of any size,
not a power of two: a table sized for what it will hold is never twice that),
with optional ``int`` columns beside it: nothing is a Python object per id.
An id's first 8 bytes are its hash: BLAKE3 output is uniform.

gc's mark keeps 16 bytes of an id (``MARK_KEY_BYTES``): 41 MB for the 1.8
million ids of a store of a million messages, where whole ids in a table of a
power of two took 134 MB. Two ids that share 16 bytes would be one to the
mark: the second would be taken as marked already, kept by the sweep, and not
followed, so what only it reaches could be swept. Among two million ids the
chance that any two share 128 bits is about n**2 / 2**129, 6e-27, far below
that of an undetected disk or memory error. Nor can one be made: giving an id
the 16 bytes of one already in a store takes about 2**128 hashes; a pair made
together takes about 2**64, but only a node taken as marked loses anything
(blobs and files link to nothing), and a node's bytes are the store's to
write (its parent, its time), not something to try 2**64 times.

fsck keeps less still (the first 60 bits of an id, ``fsck_read.key``, in the sets
of fsck.py ``_Seen``) because a false match there only hides a report.
"""

from __future__ import annotations

from array import array
from typing import Final

ID_BYTES: Final = 32
MARK_KEY_BYTES: Final = 16  # what gc's mark keeps of an id (the module docstring says why)
_MAX_FILL: Final = 0.7
_MIN_SLOTS: Final = 1024


def _slots_for(count: int) -> int:
    """Enough slots for ``count`` ids at most 70% full."""
    return max(_MIN_SLOTS, int(count / _MAX_FILL) + 1)


class IdSet:
    """Object ids (hex strings or 32 raw bytes), each with ``columns`` signed 64-bit
    values (0 until set). ``expected``: how many ids it will hold, so that it does
    not grow (growing keeps the old table and the new one for a moment).

    ``key_bytes``: how much of an id is kept. Whole ids (the default), or 16 bytes
    for gc's mark (``MARK_KEY_BYTES``: the module docstring argues it); a prefix of
    8 bytes for a count or a size, where two ids sharing one (about one chance in
    10**7 for two million ids) only makes a number a little wrong.

    The all-zero key marks an empty slot; it is kept apart, in ``_zero``.
    """

    def __init__(self, expected: int = 0, columns: int = 0, key_bytes: int = ID_BYTES) -> None:
        self._key_bytes = key_bytes
        self._empty = bytes(key_bytes)
        self._slots = _slots_for(expected)
        self._table = bytearray(self._slots * key_bytes)
        self._columns = [array("q", bytes(8 * self._slots)) for _ in range(columns)]
        self._zero: list[int] | None = None  # the all-zero id's values, if it is in
        self._count = 0

    def __len__(self) -> int:
        return self._count + (self._zero is not None)

    def __contains__(self, oid: object) -> bool:
        try:
            return self._slot(self._key(oid)) >= 0  # type: ignore[arg-type]
        except (ValueError, TypeError):
            return False  # not an id: in no set of ids

    def add(self, oid: str | bytes) -> bool:
        """Put ``oid`` in; return whether it was not in before. What is not an object id
        (a damaged node's link) names no object and is never in the set: adding it
        changes nothing and returns True, so a walk goes on to find it unreadable,
        as it does with a set of strings."""
        try:
            key = self._key(oid)
        except ValueError:
            return True
        return self._put(key)[1]

    def get(self, oid: str | bytes, column: int) -> int | None:
        """The value in ``column`` of ``oid``, or None if it is not in the set."""
        raw = self._key(oid)
        if raw == self._empty:
            return None if self._zero is None else self._zero[column]
        slot = self._slot(raw)
        return None if slot < 0 else self._columns[column][slot]

    def set(self, oid: str | bytes, *values: int) -> None:
        """Put ``oid`` in with its values (one for each column)."""
        raw = self._key(oid)
        if raw == self._empty:
            self._zero = list(values)
            return
        slot, _new = self._put(raw)
        for column, value in zip(self._columns, values, strict=True):
            column[slot] = value

    def _key(self, oid: str | bytes) -> bytes:
        return _raw(oid)[: self._key_bytes]

    def _home(self, raw: bytes) -> int:
        return int.from_bytes(raw[:8], "little") % self._slots

    def _slot(self, raw: bytes) -> int:
        """Where ``raw`` is in the table, or -1 (the zero id: 0 if in, else -1)."""
        empty, size = self._empty, self._key_bytes
        if raw == empty:
            return 0 if self._zero is not None else -1
        table, slots = self._table, self._slots
        i = self._home(raw)
        while True:
            at = i * size
            if table.startswith(raw, at):
                return i
            if table.startswith(empty, at):
                return -1
            i = i + 1 if i + 1 < slots else 0

    def _put(self, raw: bytes) -> tuple[int, bool]:
        empty, size = self._empty, self._key_bytes
        if raw == empty:
            new = self._zero is None
            if new:
                self._zero = [0] * len(self._columns)
            return -1, new
        table, slots = self._table, self._slots
        i = self._home(raw)
        while True:
            at = i * size
            if table.startswith(raw, at):
                return i, False
            if table.startswith(empty, at):
                break
            i = i + 1 if i + 1 < slots else 0
        if (self._count + 1) > self._slots * _MAX_FILL:
            self._grow()
            return self._put(raw)
        table[at : at + size] = raw
        self._count += 1
        return i, True

    def _grow(self) -> None:
        empty, size = self._empty, self._key_bytes
        old_table, old_columns = self._table, self._columns
        self._slots *= 2
        table = self._table = bytearray(self._slots * size)
        self._columns = [array("q", bytes(8 * self._slots)) for _ in old_columns]
        slots = self._slots
        for at in range(0, len(old_table), size):
            if old_table.startswith(empty, at):
                continue
            raw = old_table[at : at + size]
            i = int.from_bytes(raw[:8], "little") % slots
            while not table.startswith(empty, i * size):
                i = i + 1 if i + 1 < slots else 0
            table[i * size : (i + 1) * size] = raw
            for old, new in zip(old_columns, self._columns, strict=True):
                new[i] = old[at // size]


def _raw(oid: str | bytes) -> bytes:
    if isinstance(oid, bytes):
        return oid
    try:
        raw = bytes.fromhex(oid)
    except ValueError:
        raise ValueError(f"not an object id: {oid!r}") from None
    if len(raw) != ID_BYTES:
        raise ValueError(f"not an object id: {oid!r}")
    return raw
