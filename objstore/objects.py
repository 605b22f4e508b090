"""Objects: their ids and their stored (encoded) form (docs/FORMAT.md 4).

An object is a ``kind`` and a ``body`` of bytes. Its id is the BLAKE3-256 hex
digest of ``kind + b"\\0" + body``: the uncompressed content, so compression,
dictionaries or packs never change an id. The stored form (one format byte,
then the payload) is used byte for byte in loose files and pack records; a
format byte this code does not know is refused: a reader never guesses.

No body is bigger than ``limits.MAX_OBJECT_BYTES``: ``stored_form`` refuses to
write one, and ``decode`` never decompresses more than that, whatever a
(damaged) frame header claims, so a bad frame costs an error, not the memory
it asks for.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any, Final

import blake3
import zstandard

from .errors import CorruptObject, InvalidName, LimitExceeded
from .limits import MAX_OBJECT_BYTES

KINDS: Final = frozenset({"blob", "node", "file"})  # "file": raw bytes (FORMAT.md 4.3)
_KIND_NAMES: Final = {kind.encode("ascii"): kind for kind in KINDS}
ID_HEX_LEN: Final = 64
ID_RE: Final = re.compile(r"[0-9a-f]{64}")
FORMAT_ZSTD: Final = 0x01
_FORMAT_ZSTD_BYTE: Final = bytes((FORMAT_ZSTD,))
ZSTD_LEVEL: Final = 3
LIVE_LEVEL: Final = 1
"""The zstd level of the objects over LIVE_RAW_BYTES that an append writes to its
handle's pack: compressed again, together, when the pack is sealed (FORMAT.md 5.5), so
only the live pack's size sees it. Its nodes and journal records are not compressed at
all (``stored_raw``)."""
LIVE_RAW_BYTES: Final = 8 * 1024
"""Objects an append writes to its live pack up to this size (content) are not compressed
either (``stored_raw``): level 1 took 5.3 us of CPU for a ~1.1 KB message where
``stored_raw`` takes 0.7, and it let go of the interpreter lock, a switch of threads for
a leader writing the appends of several (combining.py). The live pack grows faster
(about 1.96 KB an append where it was 1.21) and is sealed that much more often."""
# The longest kind ("blob", "node", "file"; "ref" for pack journal records) + NUL + a body.
MAX_CONTENT_BYTES: Final = len("node") + 1 + MAX_OBJECT_BYTES
_READ_CHUNK: Final = 1 << 20

# zstandard's compressors and decompressors must not be used by two threads at
# once (the interpreter crashes): each thread gets its own, one per use.
_per_thread = threading.local()


def thread_compressor(use: str = "object", **options: Any) -> zstandard.ZstdCompressor:
    """This thread's compressor for ``use`` (made with ``options`` the first time)."""
    made: dict[str, zstandard.ZstdCompressor] = _per_thread.__dict__.setdefault("c", {})
    if use not in made:
        made[use] = zstandard.ZstdCompressor(**(options or {"level": ZSTD_LEVEL}))
    return made[use]


def thread_decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor."""
    made: zstandard.ZstdDecompressor | None = getattr(_per_thread, "d", None)
    if made is None:
        made = _per_thread.d = zstandard.ZstdDecompressor()
    return made


def check_id(object_id: str) -> str:
    """Return ``object_id`` if it is a full object id, else raise InvalidName."""
    if type(object_id) is not str or not ID_RE.fullmatch(object_id):
        raise InvalidName(f"not an object id: {object_id!r}")
    return object_id


def object_id(kind: str, body: bytes) -> str:
    return content_id(content_of(kind, body))


def content_of(kind: str, body: bytes) -> bytes:
    """What an object's id is the hash of, and its stored form compresses."""
    return kind.encode("ascii") + b"\0" + body


def content_id(content: bytes) -> str:
    return blake3.blake3(content).hexdigest()


def stored_form(kind: str, body: bytes) -> bytes:
    """The bytes a loose file or pack record holds for an object (InvalidInput for a
    body over the size limit: no such object is ever written)."""
    return stored_content(kind, content_of(kind, body))


def stored_content(kind: str, content: bytes, level: int = ZSTD_LEVEL) -> bytes:
    """``stored_form`` of the object whose ``content_of`` is ``content``, compressed at
    zstd ``level``."""
    _check_size(kind, content)
    compressor = thread_compressor() if level == ZSTD_LEVEL else _leveled(level)
    return _FORMAT_ZSTD_BYTE + compressor.compress(content)


def stored_raw(kind: str, content: bytes) -> bytes:
    """``stored_content`` whose zstd frame holds ``content`` as it is, in raw blocks
    (RFC 8878, 3.1.1.2): for the records a seal drops (journal records) or
    compresses again with the rest of its pack (nodes). On a ~300-byte node it
    takes 0.2 us where level 1 takes 3.0 (level -1: 1.2), and, unlike the
    compressor, it never lets go of the interpreter lock: a leader writing the
    appends of several threads (combining.py) that did lost it to them twice an
    append, and waited to get it back."""
    _check_size(kind, content)
    size = len(content)
    if size < 256:  # frame header: single segment, the content size in 1, 2 or 4 bytes
        head = _RAW_MAGIC + b"\x20" + size.to_bytes(1, "little")
    elif size < 256 + 0x10000:
        head = _RAW_MAGIC + b"\x60" + (size - 256).to_bytes(2, "little")
    else:
        head = _RAW_MAGIC + b"\xa0" + size.to_bytes(4, "little")
    if size <= _RAW_BLOCK:  # one block (any message, node or journal record of an append)
        return b"".join((_FORMAT_ZSTD_BYTE, head, (size << 3 | 1).to_bytes(3, "little"), content))
    parts = [_FORMAT_ZSTD_BYTE, head]
    for at in range(0, size, _RAW_BLOCK):
        block = content[at : at + _RAW_BLOCK]
        last = at + _RAW_BLOCK >= size
        parts += ((len(block) << 3 | last).to_bytes(3, "little"), block)  # type 0: raw
    return b"".join(parts)


_RAW_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_RAW_BLOCK: Final = 128 * 1024  # the largest block a frame may hold


def _check_size(kind: str, content: bytes) -> None:
    size = len(content) - len(kind) - 1
    if size > MAX_OBJECT_BYTES:
        raise LimitExceeded(
            f"a {kind} of {size:,} bytes is over the limit of one object "
            f"({MAX_OBJECT_BYTES:,} bytes)",
            "too large",
        )


def _leveled(level: int) -> zstandard.ZstdCompressor:
    return thread_compressor(f"level {level}", level=level)


def stored_as_is(content: bytes) -> bytes:
    """A stored form holding ``content`` unchecked: how a damaged object found in a
    block is kept when packs are merged, for fsck to report."""
    return _FORMAT_ZSTD_BYTE + thread_compressor().compress(content)


def encode(kind: str, body: bytes, level: int = ZSTD_LEVEL) -> tuple[str, bytes]:
    """Return ``(id, stored form)`` of an object (compressed at zstd ``level``)."""
    content = content_of(kind, body)
    return content_id(content), stored_content(kind, content, level)


def decode(oid: str, stored: bytes, kinds: frozenset[str] = KINDS) -> tuple[str, bytes]:
    """Return ``(kind, body)`` of a stored object, verified against its id."""
    if stored[:1] != _FORMAT_ZSTD_BYTE:
        why = f"unknown format byte 0x{stored[0]:02x}" if stored else "it is empty"
        raise CorruptObject(oid, why)
    return verified(oid, _decompressed(oid, memoryview(stored)[1:]), kinds)


def decode_many(stored: Iterable[tuple[str, bytes]]) -> dict[str, tuple[str, bytes]]:
    """``(kind, body)`` of each ``(id, stored form)`` that decodes and verifies, as
    ``decode`` gives it, by id, in one loop for the many small objects of a context;
    one that does not is left out, for ``decode`` to say what is wrong with it."""
    decompress, size_of = thread_decompressor().decompress, zstandard.frame_content_size
    found: dict[str, tuple[str, bytes]] = {}
    for oid, form in stored:
        if form[:1] != _FORMAT_ZSTD_BYTE:
            continue
        frame = memoryview(form)[1:]
        try:
            if not 0 <= size_of(frame) <= MAX_CONTENT_BYTES:
                continue  # no size in the header, or too big: ``decode`` reads it with care
            content = decompress(frame)
        except zstandard.ZstdError:
            continue
        if blake3.blake3(content).hexdigest() != oid:
            continue
        kind, _, body = content.partition(b"\0")
        name = _KIND_NAMES.get(kind)
        if name is not None:
            found[oid] = (name, body)
    return found


def unverified_content(stored: bytes) -> bytes:
    """The ``kind + NUL + body`` a stored form holds, NOT checked against any id: for
    a quick look only (which ref a journal record names), never for a value."""
    if stored[:1] != _FORMAT_ZSTD_BYTE:
        raise CorruptObject("?", "unknown format byte")
    return _decompressed("?", memoryview(stored)[1:])


def verified(oid: str, content: bytes, kinds: frozenset[str] = KINDS) -> tuple[str, bytes]:
    """``(kind, body)`` of an object's content ``kind + NUL + body``, checked against its
    id (a block pack holds contents, FORMAT.md 5.5)."""
    if blake3.blake3(content).hexdigest() != oid:
        raise CorruptObject(oid, "its content does not hash to its id")
    kind, _, body = content.partition(b"\0")
    text = kind.decode("ascii", "replace")
    if text not in kinds:
        raise CorruptObject(oid, f"unknown kind {text!r}")
    return text, body


def _decompressed(oid: str, frame: memoryview) -> bytes:
    """The content of one zstd frame, never more than MAX_CONTENT_BYTES of it."""
    try:
        size = zstandard.frame_content_size(frame)
        if size > MAX_CONTENT_BYTES:
            raise CorruptObject(
                oid, f"its zstd frame claims {size:,} bytes, over the limit of an object"
            )
        if size >= 0:  # the one-shot decompressor allocates what the header says
            return thread_decompressor().decompress(frame)
        # No size in the header (ags writes one, other writers may not): read in
        # chunks, so the limit, not the frame, decides what is allocated.
        chunks: list[bytes] = []
        total = 0
        with thread_decompressor().stream_reader(frame, read_across_frames=False) as reader:
            while chunk := reader.read(_READ_CHUNK):
                total += len(chunk)
                if total > MAX_CONTENT_BYTES:
                    raise CorruptObject(oid, "its zstd frame holds more than an object may")
                chunks.append(chunk)
        return b"".join(chunks)
    except zstandard.ZstdError as e:
        raise CorruptObject(oid, f"zstd: {e}") from None


def content_size(stored: bytes) -> int | None:
    """The size of ``kind + NUL + body`` as the zstd frame header records it (None if
    the header does not say), read without decompressing."""
    if stored[:1] != _FORMAT_ZSTD_BYTE:
        return None
    try:
        size = zstandard.frame_content_size(stored[1:])
    except zstandard.ZstdError:
        return None
    return size if size >= 0 else None
