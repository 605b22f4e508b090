"""Fuzzing with hypothesis: whatever comes in, ags answers with an AgsError or does the
job; never a traceback, never a half-written store, memory in proportion to the input.

* import: documents built to the export schema (a real chain of nodes and blobs
  with correct ids and links), then mutated as a value (a field replaced,
  removed or added, an id changed, a body nested deep) or as bytes (cut,
  flipped, spliced);
* the spec parser and resolver, on text shaped like specs and on any text;
* the object decoder on random bytes and on damaged stored forms, and the
  node and blob parsers on what decodes.

Deterministic in CI (``derandomize``) and sized to run in well under a minute.
"""

from __future__ import annotations

import contextlib
import io
import json
import tracemalloc
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema  # noqa: F401  (imported here, not inside the measured import)
import pytest
from conftest import tree_snapshot
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from objstore import AgsError, CorruptObject, Store, canonical, objects
from objstore.exchange import import_document, read_document
from objstore.limits import MAX_DEPTH
from objstore.nodes import parse_node
from objstore.specs import parse_spec

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],  # fmt: skip
)

# -- documents built to the schema ---------------------------------------------------

KEYS = st.text(max_size=6)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=12,
)
TIMES = st.builds(
    lambda y, mo, d, h, mi, s, frac: f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{frac}Z",
    st.integers(1, 9999), st.integers(0, 13), st.integers(0, 32), st.integers(0, 24),
    st.integers(0, 60), st.integers(0, 61), st.sampled_from(["", ".5", ".123", ".123456789"]),
)  # fmt: skip
REAL_TIMES = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(3000, 1, 1)).map(
    lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
)
MESSAGES = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"]), "content": JSON},
    optional={"tool_calls": st.lists(JSON, max_size=2), "name": st.text(max_size=8)},
)


def _object(kind: str, body: Any) -> dict[str, Any]:
    return {"id": objects.object_id(kind, canonical.dumps(body)), "kind": kind, "body": body}


@st.composite
def documents(draw: st.DrawFn, times: st.SearchStrategy[str] = REAL_TIMES) -> dict[str, Any]:
    """An export document to the schema: a chain of message nodes, maybe a compaction,
    states. Valid with real ``times``; TIMES gives some that are no date."""
    objs: list[dict[str, Any]] = []
    parent = None
    state = None
    count = 0
    node_ids: list[str] = []
    for message in draw(st.lists(MESSAGES, min_size=0, max_size=5)):
        blob = _object("blob", message)
        if draw(st.booleans()):
            new_state = _object("blob", draw(st.dictionaries(KEYS, JSON, max_size=3)))
            objs.append(new_state)
            state = new_state["id"]
        count += 1
        meta = draw(st.dictionaries(KEYS, JSON, max_size=2))
        body: dict[str, Any] = {"type": "message", "parent": parent, "state": state,
                                "messages": count, "meta": meta, "message": blob["id"]}  # fmt: skip
        if draw(st.integers(0, 5)) == 0 and parent is not None:
            summary = _object("blob", {"role": "user", "content": draw(st.text(max_size=30))})
            objs.append(summary)
            body = {"type": "compaction", "parent": parent, "state": state, "messages": count - 1,
                    "meta": {}, "summary": summary["id"], "kept": node_ids[-1:]}  # fmt: skip
            count -= 1
        node = _object("node", body)
        objs += [blob, node]
        node_ids.append(node["id"])
        parent = node["id"]
    session = None
    if draw(st.booleans()):
        session = {
            "id": draw(st.sampled_from(["0" * 32, "1" * 32, "ab" * 16])),
            "title": draw(st.none() | st.text(max_size=40)),
            "created": draw(times),
            "updated": draw(times),
            "messages": count,
            "root": draw(st.none() | st.just("/src/app")),
            "model": draw(st.none() | st.text(max_size=10)),
            "archived_at": draw(st.none() | times),
            "forked_from": draw(st.none() | st.just({"session": None, "node": parent})),
        }
    objs = draw(st.permutations(objs))
    return {"format": "ags-export", "version": 1, "exported_at": draw(times),
            "head": parent, "session": session, "objects": objs}  # fmt: skip


def _paths(value: Any) -> list[tuple[Any, ...]]:
    """Every path (a tuple of keys and indexes) into a JSON value, the root included."""
    out: list[tuple[Any, ...]] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        out.append(path)
        if isinstance(item, dict):
            stack += [(v, (*path, k)) for k, v in item.items()]
        elif isinstance(item, list):
            stack += [(v, (*path, i)) for i, v in enumerate(item)]
    return out


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


@st.composite
def mutated_documents(draw: st.DrawFn) -> bytes:
    doc = draw(documents(TIMES))
    for _ in range(draw(st.integers(0, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        how = draw(st.sampled_from(["replace", "delete", "add", "deep", "id", "duplicate"]))
        if not path:
            if how == "replace":
                doc = draw(JSON)
            continue
        holder = _at(doc, path[:-1])
        key = path[-1]
        if how == "replace":
            holder[key] = draw(JSON)
        elif how == "deep":
            holder[key] = nested(draw(st.sampled_from([MAX_DEPTH - 3, MAX_DEPTH, 985, 5000])))
        elif how == "id" and isinstance(holder[key], str) and holder[key]:
            text = holder[key]
            i = draw(st.integers(0, len(text) - 1))
            holder[key] = text[:i] + draw(st.sampled_from("0af\x00é\x1b")) + text[i + 1 :]
        elif how == "delete":
            del holder[key]
        elif how == "add" and isinstance(holder, dict):
            holder[draw(KEYS)] = draw(JSON)
        elif how == "duplicate" and isinstance(holder, list):
            holder.append(holder[key])
    try:
        data = json.dumps(doc, allow_nan=False).encode()
    except (RecursionError, ValueError):
        data = b"[" * 5000
    if draw(st.integers(0, 3)) == 0:  # damage the bytes too
        cut = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(["truncate", "flip", "splice"]))
        if how == "truncate":
            data = data[:cut]
        elif how == "flip" and data:
            at = min(cut, len(data) - 1)
            data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
        else:
            data = data[:cut] + draw(st.binary(max_size=20)) + data[cut:]
    return data


@pytest.fixture(scope="module")
def import_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "store"
    Store.open(path).close()
    return path


@settings(FUZZ, max_examples=300)
@given(data=mutated_documents())
def test_import_of_any_document_imports_or_refuses_cleanly(import_store: Path, data: bytes):
    with Store.open(import_store) as s:
        before = tree_snapshot(import_store)
        tracemalloc.start()
        try:
            result = import_document(s, read_document(io.BytesIO(data)))
        except AgsError:
            refused = True
        else:
            refused = False
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        event("refused" if refused else "imported")
        if refused:
            assert tree_snapshot(import_store) == before  # nothing written
        elif result.head is not None:  # what got in reads back whole
            list(s.log(result.head))
            s.context(result.head)
    # Parsing and checking cost a bounded multiple of the input, never more.
    assert peak < 200 * len(data) + 8 * 1024 * 1024


@settings(FUZZ, max_examples=100)
@given(doc=documents())
def test_a_valid_document_always_imports_and_round_trips(tmp_path: Path, doc: dict[str, Any]):
    from objstore.exchange import export_session

    path = tmp_path / "rt"
    with Store.open(path) as s:
        result = import_document(s, doc, new_session=True)
        assert result.head == doc["head"]
        if result.head is not None:
            again = export_session(s, result.head)
            assert {o["id"] for o in again["objects"]} <= {o["id"] for o in doc["objects"]}


# -- specs ---------------------------------------------------------------------------

SPEC_TEXT = st.text(alphabet="0123456789abcdefHEADsionstg/~@{}^.-_ \x00\x1b", max_size=40)


@pytest.fixture(scope="module")
def spec_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("specs") / "store"
    with Store.open(path) as s:
        for title in ("a", "b"):
            sid = s.new_session(title=title)
            for i in range(5):
                s.append(sid, {"role": "user", "content": f"{title}{i}"})
            s.rewind(sid, f"{sid}~2")
            s.tag(f"t/{title}", sid)
        s.fork(f"{sid}~1")
    return path


@settings(FUZZ, max_examples=400)
@given(text=SPEC_TEXT | st.text(max_size=600))
def test_any_spec_resolves_or_is_a_clear_error(spec_store: Path, text: str):
    with contextlib.suppress(AgsError):
        parse_spec(text)
    with Store.open(spec_store) as s:
        for lookup in (s.target, s.node_id, s.session_id, s.reflog, s.context):
            with contextlib.suppress(AgsError):
                lookup(text)


# -- the object decoder --------------------------------------------------------------


@settings(FUZZ, max_examples=400)
@given(data=st.binary(max_size=300))
def test_random_bytes_never_decode_into_anything_but_corrupt_object(data: bytes):
    oid = objects.object_id("blob", data)
    for stored in (data, b"\x01" + data):
        with contextlib.suppress(CorruptObject):
            objects.decode(oid, stored)


@st.composite
def damaged_stored_forms(draw: st.DrawFn) -> tuple[str, str, bytes]:
    kind = draw(st.sampled_from(["blob", "node"]))
    body = canonical.dumps(draw(JSON))
    oid, stored = objects.encode(kind, body)
    damage = draw(st.lists(st.tuples(st.integers(0, len(stored) - 1), st.integers(1, 255)),
                           max_size=3))  # fmt: skip
    data = bytearray(stored)
    for at, mask in damage:
        data[at] ^= mask
    cut = draw(st.none() | st.integers(0, len(data)))
    return oid, kind, bytes(data[:cut] if cut is not None else data)


@settings(FUZZ, max_examples=400)
@given(case=damaged_stored_forms())
def test_a_damaged_stored_form_is_corrupt_or_the_original(case: tuple[str, str, bytes]):
    oid, kind, stored = case
    try:
        got_kind, body = objects.decode(oid, stored)
    except CorruptObject:
        return
    assert got_kind == kind and objects.object_id(kind, body) == oid  # verified, so unchanged
    try:
        if kind == "node":
            parse_node(oid, body)
        else:
            canonical.loads(body)
    except CorruptObject:
        pass
    except ValueError:
        assert kind == "blob"


@settings(FUZZ, max_examples=300)
@given(body=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_any_node_body_parses_or_is_corrupt(body: bytes):
    with contextlib.suppress(CorruptObject):
        parse_node("0" * 64, body)
