"""The limits of the format, defined once: how deep a JSON value may nest, how big
one object and one export document may be, and how much of a message search
indexes (FORMAT.md section 3.1 says why each is what it is).

Every entrance checks them: ``Store.append`` and the other writers (through
``canonical.check_json`` and ``objects.stored_form``), import (the document's
size before it is read, its nesting while it is parsed, each object's size),
every read of an object (``objects.decode`` caps decompression, and
``canonical.loads`` refuses a body nested too deep), and the model clients'
parse of replies and tool arguments (``parse_json``). Code that walks a JSON
value recursively (the JSON encoder, search's text extraction, printing) can
then rely on a depth far below Python's recursion limit.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import orjson

from .errors import NestingTooDeep

MAX_DEPTH: Final = 100
"""Containers (objects and arrays) nested in one stored JSON value: ``"x"`` is 0,
``{}`` 1, ``{"a": [1]}`` 2. Chat messages nest about 6 deep; Ruby's JSON parser
refuses beyond 100 by default, serde_json beyond 128."""

MAX_OBJECT_BYTES: Final = 128 * 1024 * 1024
"""Bytes of one object's canonical body (a message, a summary, a state, a node).
Model APIs refuse whole requests smaller than this (Anthropic: 32 MB; OpenAI:
50 MB of images, about 67 MB as base64), so a message above it was never sent
to a model; one with many base64-encoded images fits."""

MAX_DOCUMENT_BYTES: Final = 1024 * 1024 * 1024
"""Bytes of one export document. Import reads at most this much (and checks it in
memory, about 2.5 times its size at the peak); export refuses to write a bigger one."""

DOCUMENT_DEPTH: Final = MAX_DEPTH + 3
"""Nesting of an export document: an object's body sits 3 containers deep
(the document, ``objects``, the object)."""

MAX_FILE_PATH_BYTES: Final = 4096
"""UTF-8 bytes of one path a node's ``files`` names (Linux's PATH_MAX); each part of
it at most ``MAX_FILE_NAME_BYTES`` (NAME_MAX), so any recorded path can be made again."""

MAX_FILE_NAME_BYTES: Final = 255

MAX_FILES_PER_NODE: Final = 1000
"""Paths in one node's ``files``: a tool call changes one file or a few; a node
naming more is not one ags writes, and the bound keeps a node small to read."""

MAX_INDEXED_CHARS: Final = 1024 * 1024
"""Characters of one message's text that search indexes (the start of it).
Search's cost per hit (a snippet re-reads the text) is bounded by this, not by
the largest message in the store."""


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests containers deeper than ``limit``. Iterative,
    so any depth is measured without recursion."""
    stack: list[tuple[Any, int]] = []
    if type(value) is dict or type(value) is list:
        stack.append((value, 1))
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        for sub in item.values() if type(item) is dict else item:
            if type(sub) is dict or type(sub) is list:
                stack.append((sub, depth + 1))
    return False


def parse_json(
    text: str | bytes, max_depth: int = MAX_DEPTH, *, huge_as_text: bool = False, **options: Any
) -> Any:
    """``json.loads`` that refuses nesting beyond ``max_depth`` with NestingTooDeep.

    The standard parser recurses once per level and gives up, with a
    RecursionError, at a depth that depends on the caller's own stack; so
    anything deeper than it reaches is refused the same way as anything deeper
    than ``max_depth`` that it did reach. ``options`` go to ``json.loads``.

    Without options, orjson parses first (about four times faster: reading a
    long context is mostly parsing); it gives the same values as the standard
    parser for every text it accepts, and what it refuses (nesting beyond its own
    limit) goes to the standard parser, which accepts or refuses it as always.
    orjson reads an integer beyond 64 bits as a float, so a value holding a float
    that big is read again by the standard parser.

    ``huge_as_text``: for files of other programs, which may hold anything. A number
    no double holds (``1e400``) is kept as its text, not read as an infinity the
    store refuses, and ``NaN`` and ``Infinity`` are refused (ValueError). orjson
    still parses first: it refuses all three, which then go to the standard parser.
    """
    value: Any
    if huge_as_text:
        if options:
            raise TypeError("parse_json: huge_as_text takes no other options")
        options = _HUGE_AS_TEXT  # for the standard parser, when orjson passes the text on
    if options and not huge_as_text:
        value = _standard(text, max_depth, options)
    else:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            value = _standard(text, max_depth, options)
        else:
            # One walk checks both the nesting and what orjson may get wrong: it
            # costs less than counting brackets in the text, and a context is
            # thousands of short texts. (It recurses: a limit beyond what it can walk
            # is walked up to there, and only a value nested deeper than that, a
            # rare one, is looked at again below.)
            found = _unusual(value, min(max_depth, _WALK_DEPTH - 1))
            if found == BIG_FLOAT:  # perhaps an integer beyond 64 bits: read it exactly
                return _standard(text, max_depth, options)
            if found == 0:
                return value
            if max_depth < _WALK_DEPTH:
                raise NestingTooDeep(max_depth)
            if _holds_a_big_float(value):
                value = _standard(text, max_depth, options)
    # Nesting cannot be deeper than the number of containers opened: most texts
    # open fewer than the limit, and need no walk.
    opened = (
        text.count(b"[") + text.count(b"{")
        if isinstance(text, bytes)
        else text.count("[") + text.count("{")
    )
    if opened > max_depth and depth_exceeds(value, max_depth):
        raise NestingTooDeep(max_depth)
    return value


def check_json_text(text: bytes, max_depth: int = MAX_DEPTH) -> None:
    """Raise what ``parse_json(text, max_depth)`` would raise, if anything, faster: for
    fsck, which checks that every blob of a store can be read but needs no value.

    Whether a text is read does not depend on integers beyond 64 bits (``parse_json``
    only reads those again, exactly), so orjson accepting the text and its nesting
    being within ``max_depth`` decide; the nesting is walked only when the text opens
    more containers than that."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        parse_json(text, max_depth)  # the standard parser decides, and says why
        return
    if text.count(b"[") + text.count(b"{") > max_depth and depth_exceeds(value, max_depth):
        raise NestingTooDeep(max_depth)


def read_exactly(text: bytes) -> bool:
    """Whether orjson alone reads ``text`` as ``parse_json`` does, with no walk: it is
    JSON, nests at most MAX_DEPTH deep, and holds no number orjson reads inexactly (an
    integer beyond 64 bits, which it makes a float, or a float that big, which cannot
    be told from one). What a block's writer checks before it claims so (FORMAT.md
    5.5), and what fsck checks of a block that claims it."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return _unusual(value, MAX_DEPTH) == 0


def value_read_exactly(value: Any) -> bool:
    """``read_exactly`` for a value orjson has read already: nothing deeper than
    MAX_DEPTH and no number it could have read inexactly."""
    return _unusual(value, MAX_DEPTH) == 0


def unusual(value: Any) -> int:
    """What one walk of a value orjson has read finds: TOO_DEEP if it nests deeper
    than MAX_DEPTH (``depth_exceeds``), else BIG_FLOAT if it holds a number orjson
    may have read inexactly (not ``value_read_exactly``), else 0. For fsck, which
    asks both of every blob."""
    return _unusual(value, MAX_DEPTH)


def parse_json_many(texts: list[bytes], max_depth: int = MAX_DEPTH) -> list[Any]:
    """``[parse_json(t, max_depth) for t in texts]``, with less work per text for the
    common case (a context is thousands of short texts): a text orjson cannot read,
    or whose value needs a second look, goes through ``parse_json`` itself."""
    if max_depth >= _WALK_DEPTH:
        return [parse_json(text, max_depth) for text in texts]
    try:
        values = [orjson.loads(text) for text in texts]
    except orjson.JSONDecodeError:
        return [parse_json(text, max_depth) for text in texts]
    # One walk of the whole list (which holds each value one level down), then one of
    # each value only if something was found.
    if _unusual(values, max_depth + 1):
        return [
            parse_json(text, max_depth) if _unusual(value, max_depth) else value
            for text, value in zip(texts, values, strict=True)
        ]
    return values


_BIG: Final = float(2**63)
BIG_FLOAT: Final = 1
TOO_DEEP: Final = 2
# ``_unusual`` recurses once per level, up to ``max_depth`` + 1 calls deep: a limit
# at or beyond this is checked by the iterative walks instead.
_WALK_DEPTH: Final = 200


def _unusual(value: Any, max_depth: int, depth: int = 0) -> int:
    """TOO_DEEP if ``value`` nests containers deeper than ``max_depth`` (``depth``
    containers already around it), else BIG_FLOAT if it holds a float of at least
    2**63 in size (what orjson makes of an integer beyond 64 bits), else 0."""
    kind = type(value)
    if kind is dict:
        items = value.values()
    elif kind is list:
        items = value
    else:
        return BIG_FLOAT if kind is float and not -_BIG < value < _BIG else 0
    depth += 1
    if depth > max_depth:
        return TOO_DEEP
    found = 0
    for item in items:  # only containers recurse: a context is millions of items
        kind = type(item)
        if kind is dict or kind is list:
            inner = _unusual(item, max_depth, depth)
            if inner == TOO_DEEP:
                return inner
            found = found or inner
        elif kind is float and not -_BIG < item < _BIG:
            found = BIG_FLOAT
    return found


def _holds_a_big_float(value: Any) -> bool:
    """Whether a parsed value holds a float of at least 2**63 in size (what orjson
    makes of an integer beyond 64 bits). Iterative, like ``depth_exceeds``."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float and not -_BIG < item < _BIG:
            return True
    return False


def _finite_or_text(text: str) -> float | str:
    value = float(text)
    return value if value not in (math.inf, -math.inf) else text


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_HUGE_AS_TEXT: Final[dict[str, Any]] = {
    "parse_float": _finite_or_text,
    "parse_constant": _no_constant,
}


def _standard(text: str | bytes, max_depth: int, options: dict[str, Any]) -> Any:
    try:
        return json.loads(text, **options)
    except RecursionError:
        raise NestingTooDeep(max_depth) from None
