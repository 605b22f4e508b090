"""The importers on damaged and strange session files: whatever a file holds, each
file imports (its bad lines reported as problems) or fails as a whole with a clear
reason; never an exception out of ``import_sessions``, and a second import of the same
file changes nothing it should not.

The files are the fixtures of tests/test_importers.py, mutated by a seeded random
generator: fields replaced by a value of another type (a list where a type name was,
a number where a message was), removed, wrapped or duplicated; lines replaced by other
JSON, duplicated, shuffled, cut, bit-flipped; parent links turned into cycles; values
nested up to 995 deep. Before, a type name that was a list, a ``message`` that was a
number, a Gemini ``parts`` or ``toolCalls`` of another type, or a record nested 995
deep raised TypeError, AttributeError or RecursionError through ``ags import``."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.importers import import_sessions
from cli.main import cli
from objstore import AgsError, Store

FIXTURES = Path(__file__).with_name("fixtures")
SOURCES = sorted(
    [("claude-code", p) for p in (FIXTURES / "claude-code").rglob("*.jsonl")]
    + [("codex", p) for p in (FIXTURES / "codex").rglob("*.jsonl")]
    + [("gemini", p) for p in (FIXTURES / "gemini").rglob("*.json*")]
)
_ODD = [None, True, False, 0, -1, 2**64, 2**80, -(2**70), 1.5, 1e308, "", "x", "\u0000",
        "\U0001f600", "a" * 5000, "../../etc/passwd", "2026-13-45T99:99:99Z", "null", "{}",
        [], {}, [[]], {"": None}]  # fmt: skip
_KEYS = ["type", "role", "content", "text", "id", "name", "parts", "toolCalls", "status"]


def _odd_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if r < 0.1 and depth < 3:
        return [_odd_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if r < 0.2 and depth < 3:
        return {rng.choice(_KEYS): _odd_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
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


def _mutated(rng: random.Random, value: Any) -> Any:
    """``value`` with one to three of its fields replaced, removed, wrapped or doubled."""
    for _ in range(rng.randint(1, 3)):
        path, old = rng.choice(_places(value))
        op = rng.random()
        new = _odd_value(rng) if op < 0.6 else [old, old] if op < 0.7 else {"wrapped": old}
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


def _lines_mutated(rng: random.Random, text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    out = []
    for line in lines:
        try:
            out.append(json.dumps(_mutated(rng, json.loads(line))) if rng.random() < 0.3 else line)
        except ValueError:
            out.append(line)
    if rng.random() < 0.1:
        rng.shuffle(out)
    for _ in range(rng.randint(0, 3)):
        op, i = rng.random(), rng.randrange(len(out))
        if op < 0.2:
            out[i] = json.dumps(_odd_value(rng))
        elif op < 0.35:
            out.insert(i, out[rng.randrange(len(out))])
        elif op < 0.5:
            data = bytearray(out[i].encode())
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            out[i] = data.decode("utf-8", "replace")
        elif op < 0.7:  # a parent link into a cycle, or to a later record
            try:
                here, there = json.loads(out[i]), json.loads(out[rng.randrange(len(out))])
            except ValueError:
                continue
            if isinstance(here, dict) and isinstance(there, dict) and "uuid" in there:
                here[rng.choice(["parentUuid", "logicalParentUuid", "uuid"])] = there["uuid"]
                out[i] = json.dumps(here)
        elif op < 0.85:
            out[i] = out[i][: rng.randrange(len(out[i]) + 1)]
        else:
            out.append(out[i][: rng.randrange(len(out[i]) + 1)])
    return "\n".join(out) + "\n"


def _damaged_file(seed: int, folder: Path) -> tuple[str, Path] | None:
    """A fixture, mutated by ``seed``, written under ``folder``; None if the mutation
    cannot be written as JSON."""
    rng = random.Random(seed)
    tool, source = rng.choice(SOURCES)
    text = source.read_bytes().decode("utf-8", "replace")
    try:
        if source.suffix == ".jsonl":
            text = _lines_mutated(rng, text)
        else:
            text = json.dumps(_mutated(rng, json.loads(text)))
    except (RecursionError, ValueError):  # too deep for json.dumps, or a value made circular
        return None
    path = folder / source.relative_to(FIXTURES / tool)
    path.parent.mkdir(parents=True)
    path.write_text(text, errors="surrogatepass")
    return tool, path


@pytest.mark.parametrize("seed", range(150))
def test_a_damaged_session_file_imports_or_fails_cleanly(tmp_path: Path, seed: int) -> None:
    made = _damaged_file(seed, tmp_path / "src")
    if made is None:
        return
    tool, path = made
    with Store.open(tmp_path / "store") as store:
        try:
            first = import_sessions(store, tool, [path])
        except AgsError:
            return  # refused as a whole, with a message of its own
        again = import_sessions(store, tool, [path])
        assert [row.status for row in again] == [
            "failed" if row.status == "failed" else "unchanged" for row in first
        ]
        for session in store.sessions(include_archived=True):
            store.context(session.id)


def test_ags_import_reports_a_damaged_file_without_a_traceback(tmp_path: Path) -> None:
    folder = tmp_path / "claude"
    shutil.copytree(FIXTURES / "claude-code", folder)
    path = folder / "-home-ana-app" / "11111111-1111-4111-8111-111111111111.jsonl"
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines[:8]]  # the file's first turns
    assistant = next(r for r in records if r.get("type") == "assistant")
    assistant["message"] = 5  # a number where the message was
    records[-1]["type"] = ["user"]  # a list where a type name was
    deep = "[" * 995 + "]" * 995  # deeper than the importers' walks could go
    path.write_text("\n".join([*map(json.dumps, records), deep]) + "\n")
    result = CliRunner().invoke(
        cli, ["--store", str(tmp_path / "s"), "import", "--from", "claude-code", str(path)]
    )
    assert result.exit_code == 0 and result.exception is None, result.output
    assert f"line {len(records) + 1}: nested too deeply to read, kept as text" in result.output
    with Store.open(tmp_path / "s") as store:
        sessions = store.sessions()
        assert sessions and all(store.context(s.id) for s in sessions)
