"""Random changes to JSON values, for the tests that feed ags damaged or strange
input: a field replaced by a value of another type (a list where a type name was, a
number where a message was, nesting up to 995 deep), removed, wrapped or doubled."""

from __future__ import annotations

import random
from typing import Any

_ODD = [None, True, False, 0, -1, 2**64, 2**80, -(2**70), 1.5, 1e308, "", "x", "\u0000",
        "\U0001f600", "a" * 5000, "../../etc/passwd", "2026-13-45T99:99:99Z", "null", "{}",
        [], {}, [[]], {"": None}]  # fmt: skip
_KEYS = ["type", "role", "content", "text", "id", "name", "parts", "toolCalls", "status"]


def odd_value(rng: random.Random, depth: int = 0) -> Any:
    """A value a field seldom holds: a scalar of any type, a small list or object of
    them, or a value nested 99 to 995 deep."""
    r = rng.random()
    if r < 0.1 and depth < 3:
        return [odd_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if r < 0.2 and depth < 3:
        return {rng.choice(_KEYS): odd_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if r < 0.23:
        value: Any = "deep"
        for _ in range(rng.choice([99, 101, 150, 900, 995])):
            value = [value] if rng.random() < 0.5 else {"content": value}
        return value
    return rng.choice(_ODD)


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) in ``value``, down to 40 levels."""
    out = [(path, value)]
    if len(path) < 40 and isinstance(value, dict | list):
        for key, sub in value.items() if isinstance(value, dict) else enumerate(value):
            out += _places(sub, (*path, key))
    return out


def mutated(rng: random.Random, value: Any) -> Any:
    """``value`` with one to three of its fields replaced, removed, wrapped or doubled."""
    for _ in range(rng.randint(1, 3)):
        path, old = rng.choice(_places(value))
        op = rng.random()
        new = odd_value(rng) if op < 0.6 else [old, old] if op < 0.7 else {"wrapped": old}
        if not path:
            value = new
            continue
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        if 0.8 <= op < 0.9:
            parent.pop(path[-1])
        else:
            parent[path[-1]] = new
    return value
