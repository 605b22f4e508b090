"""Canonical JSON (objstore/canonical.py, FORMAT.md 3): the fast encoder writes the
very bytes Python's ``json`` writes, for every value it is given, so no id changes."""

from __future__ import annotations

import json
import random
import tracemalloc
from typing import Any

import pytest

from objstore import InvalidInput, Store, canonical, objects
from objstore.limits import MAX_DEPTH

REFERENCE = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


def reference(value: Any) -> bytes:
    return REFERENCE.encode(value).encode("utf-8")


def fast(value: Any) -> bytes:
    """``dumps`` as a caller that checked the value takes it."""
    return canonical.dumps(value, fast=canonical.check_json(value))


def test_every_character_is_written_as_json_writes_it_in_values_and_keys() -> None:
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for i in range(0, len(chars), 256):
        text = "".join(chars[i : i + 256])
        value = {text: [text, f'"{text}\\', {text[:2]: text[-2:]}]}
        assert fast(value) == reference(value), f"characters from U+{ord(chars[i]):04X}"
    for c in chars[:0x800]:  # each alone, as key and value: escapes differ one by one
        assert fast({c: c}) == reference({c: c}), f"U+{ord(c):04X}"


def _value(rnd: random.Random, depth: int = 0) -> Any:
    pick = rnd.randrange(8 if depth < 5 else 5)
    if pick == 0:
        return rnd.choice([0, 1, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 10**30])
    if pick == 1:
        return rnd.choice([True, False, None, 0.5, 1e16, 1.5e-7, -0.0, 123456789.125, 1e300])
    if pick in (2, 3):
        return "".join(chr(rnd.choice([rnd.randrange(0x80), rnd.randrange(0xE000, 0x110000)]))
                       for _ in range(rnd.randrange(6)))  # fmt: skip
    if pick == 4:
        return rnd.randrange(-(10**6), 10**6)
    if pick in (5, 6):
        return {_value(rnd, 9) if False else chr(rnd.randrange(0x20, 0x3000)) * rnd.randrange(3):
                _value(rnd, depth + 1) for _ in range(rnd.randrange(5))}  # fmt: skip
    return [_value(rnd, depth + 1) for _ in range(rnd.randrange(5))]


def test_random_values_with_floats_and_huge_integers_are_written_as_json_writes_them() -> None:
    rnd = random.Random(11)
    for _ in range(20_000):
        value = _value(rnd)
        assert fast(value) == reference(value), repr(value)


def test_floats_and_long_text_go_to_json() -> None:
    for number in (1e16, 1.5e-7, 1e300, 0.1):
        assert canonical.check_json({"x": [number]}) is False
        assert fast({"x": [number]}) == reference({"x": [number]})
    assert canonical.check_json({"x": [1, "1e16", None]}) is True
    long = {"k" * 10: "y" * canonical.FAST_TEXT}
    assert canonical.check_json(long) is False
    assert fast(long) == reference(long)


def test_a_big_value_is_written_in_about_its_own_size() -> None:
    """orjson takes several times its output's size while it writes: not for big text."""
    value = {"role": "tool", "content": [{"type": "text", "text": "y" * 2_000_000}]}
    tracemalloc.start()
    try:
        out = fast(value)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out == reference(value)
    assert peak < 3 * len(out), f"peak {peak:,} for {len(out):,} bytes"


def test_deep_values_and_lone_surrogates_fall_back_to_json() -> None:
    deep: list[Any] = []
    inner = deep
    for _ in range(MAX_DEPTH - 1):  # deeper than orjson writes
        inner.append([])
        inner = inner[0]
    assert fast(deep) == reference(deep)
    with pytest.raises(InvalidInput, match="lone surrogate"):
        canonical.dumps({"x": "\ud800"}, fast=True)


def test_messages_and_nodes_keep_the_bytes_json_gives_them(tmp_path) -> None:
    plain = {"role": "user", "content": "naïve \u2028 \x7f \x1f café", "n": 2**63 - 1}
    odd = {**plain, "n": 2**64, "t": 1e16}
    with Store.open(tmp_path / "s") as store:
        sid = store.new_session()
        for message, meta in ((plain, None), (odd, None), (plain, {"cost": 1.5e-7, "n": 2**70})):
            node_id = store.append(sid, message, meta=meta)
            node = store.node(node_id)
            assert node.content == objects.object_id("blob", reference(message))
            _kind, body = store.objects.get(node_id)
            assert body == reference(json.loads(body))  # the node's bytes: json's own


class _Text(str):
    """A str subclass: a JSON round trip gives back a plain str."""


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"a": [1, {"b": (1, 2)}]}, "value.a[1].b: tuple"),
        ({"a": {"b": float("nan")}}, "value.a.b: nan"),
        ({"a": [{1: "x"}]}, "value.a[0]: key 1"),
        ({"a": [b"x"]}, "value.a[0]: bytes"),
        ({"a": {"b": _Text("x")}}, "value.a.b: _Text"),
        ({"a": [[True, None, float("-inf")]]}, "value.a[0][2]: -inf"),
    ],
)
def test_a_value_json_would_change_is_refused_naming_where(value: Any, named: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        canonical.check_json(value)
    assert str(refused.value).startswith(named)


def test_nesting_is_allowed_up_to_the_limit_and_refused_past_it() -> None:
    def nested(levels: int) -> Any:
        value: Any = "leaf"
        for i in range(levels):
            value = {"k": value} if i % 2 else [value]
        return value

    assert canonical.check_json(nested(MAX_DEPTH)) is True
    with pytest.raises(InvalidInput, match="nested deeper than"):
        canonical.check_json(nested(MAX_DEPTH + 1))
    assert canonical.check_json(nested(3), max_depth=3) is True
    with pytest.raises(InvalidInput, match="nested deeper than 2 levels"):
        canonical.check_json(nested(3), max_depth=2)
