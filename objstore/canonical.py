"""Canonical JSON: the one byte form of a JSON value that ids are computed on.

Sorted keys, no insignificant white space, UTF-8, non-ASCII characters as
themselves (not ``\\u`` escapes). The same value always gives the same bytes,
so the same message gets the same id in any session on any machine.

Only values that survive a JSON round trip exactly are accepted: dicts with
string keys, lists, strings, ints, finite floats, booleans and None. A tuple,
a non-string key, NaN or a lone surrogate would come back different, so it is
refused instead of silently changed. So is a value nested deeper than
``limits.MAX_DEPTH``, when writing and when reading.

The canonical form is the one Python's ``json`` module writes with these
options. orjson writes the same bytes, eight times faster, for every value
without a float (it spells exponents its own way: ``1e16`` where ``json``
writes ``1e+16``), but takes up to eight times the output's size in memory
while it writes; ``dumps`` takes it for a small value its caller knows holds
no float (``check_json`` says so: ``fast``), and ``json`` for the rest and for
what orjson refuses (an integer past 64 bits, a lone surrogate, very deep
nesting).
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import orjson

from .errors import InvalidInput, LimitExceeded
from .limits import MAX_DEPTH, parse_json, parse_json_many

_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


def check_json(value: Any, where: str = "value", max_depth: int = MAX_DEPTH) -> bool:
    """Raise InvalidInput if ``value`` would not come back exactly from JSON, or nests
    containers deeper than ``max_depth``; return whether ``dumps`` may write it
    ``fast``: no float, and less than FAST_TEXT characters of text."""
    try:
        return _weight(value, max_depth) < FAST_TEXT
    except _Unsound:
        pass
    except RecursionError:  # max_depth above what the interpreter's stack allows
        pass
    _name_fault(value, where, max_depth)
    raise AssertionError("_weight and _name_fault disagree")  # pragma: no cover


class _Unsound(Exception):
    """``_weight`` found something wrong; ``_name_fault`` says what and where."""


def _weight(item: Any, room: int) -> int:
    """The characters of text in ``item``, plus FAST_TEXT for each float; raises
    _Unsound for anything ``check_json`` refuses, containers allowed ``room`` levels.

    Called once an append for each message, its meta and its journal record, so
    it is written for speed: no path is built (``_name_fault`` builds one, only
    for a value found wrong), and strings, the usual leaves, are taken inline."""
    kind = type(item)
    if kind is str:
        return len(item)
    if kind is dict:
        if not room:
            raise _Unsound
        room -= 1
        weight = 0
        for key, sub in item.items():
            if type(key) is not str:
                raise _Unsound
            sub_kind = type(sub)
            if sub_kind is str:
                weight += len(key) + len(sub)
            elif sub_kind is int or sub_kind is bool or sub is None:
                weight += len(key)
            else:
                weight += len(key) + _weight(sub, room)
        return weight
    if kind is list:
        if not room:
            raise _Unsound
        room -= 1
        weight = 0
        for sub in item:
            sub_kind = type(sub)
            if sub_kind is str:
                weight += len(sub)
            elif not (sub_kind is int or sub_kind is bool or sub is None):
                weight += _weight(sub, room)
        return weight
    if kind is float:
        if not math.isfinite(item):
            raise _Unsound
        return FAST_TEXT
    if item is None or kind is bool or kind is int:
        return 0
    raise _Unsound


def _name_fault(value: Any, where: str, max_depth: int) -> None:
    """Raise the InvalidInput (or LimitExceeded) naming what ``_weight`` refused, and
    where: the first fault found walking ``value``."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        kind = type(item)
        if kind is str:
            continue
        if (kind is dict or kind is list) and depth == max_depth:
            raise LimitExceeded(
                f"{path}: nested deeper than {max_depth} levels, the limit", "nested too deeply"
            )
        if kind is dict:
            for key, sub in item.items():
                if type(key) is not str:
                    raise InvalidInput(f"{path}: key {key!r} is not a string")
                stack.append((sub, f"{path}.{key}", depth + 1))
        elif kind is list:
            stack.extend((sub, f"{path}[{i}]", depth + 1) for i, sub in enumerate(item))
        elif kind is float:
            if not math.isfinite(item):
                raise InvalidInput(f"{path}: {item!r} is not a JSON number")
        elif item is None or kind is bool or kind is int:
            continue
        else:
            raise InvalidInput(f"{path}: {kind.__name__} is not a JSON type")


FAST_TEXT: Final = 64 * 1024
"""Characters of text up to which ``dumps`` may take orjson (a message is a few KB)."""
_SORTED: Final = orjson.OPT_SORT_KEYS


def dumps(value: Any, where: str = "value", *, fast: bool = False) -> bytes:
    """The canonical bytes of a JSON value that passed ``check_json``; ``fast`` when
    ``check_json`` said so (the module doc says why)."""
    return encode(value, where, fast=fast)[0]


def encode(value: Any, where: str = "value", *, fast: bool = False) -> tuple[bytes, bool]:
    """``dumps``, and whether orjson wrote the bytes: then they hold no float and no
    integer beyond 64 bits, so orjson alone reads them back exactly (within the
    nesting ``check_json`` allowed: ``limits.read_exactly``)."""
    if fast:
        try:
            return orjson.dumps(value, option=_SORTED), True
        except orjson.JSONEncodeError:
            pass  # json writes it, or names what is wrong with it
    try:
        return _encoder.encode(value).encode("utf-8"), False
    except UnicodeEncodeError:
        raise InvalidInput(
            f"{where}: text holds a lone surrogate, which UTF-8 cannot store"
        ) from None


def loads(data: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON bytes (UTF-8). Raises ValueError, as ``json.loads`` does, also for
    a value nested deeper than ``max_depth`` (``limits.NestingTooDeep``)."""
    return parse_json(data, max_depth)


def loads_many(texts: list[bytes], max_depth: int = MAX_DEPTH) -> list[Any]:
    """``[loads(t) for t in texts]``, faster (``limits.parse_json_many``)."""
    return parse_json_many(texts, max_depth)
