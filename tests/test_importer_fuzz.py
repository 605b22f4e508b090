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

import pytest
from click.testing import CliRunner
from json_mutations import mutated, odd_value

from agent.importers import import_sessions
from cli.main import cli
from objstore import AgsError, Store

FIXTURES = Path(__file__).with_name("fixtures")
SOURCES = sorted(
    [("claude-code", p) for p in (FIXTURES / "claude-code").rglob("*.jsonl")]
    + [("codex", p) for p in (FIXTURES / "codex").rglob("*.jsonl")]
    + [("gemini", p) for p in (FIXTURES / "gemini").rglob("*.json*")]
)


def _linesmutated(rng: random.Random, text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    out = []
    for line in lines:
        try:
            out.append(json.dumps(mutated(rng, json.loads(line))) if rng.random() < 0.3 else line)
        except ValueError:
            out.append(line)
    if rng.random() < 0.1:
        rng.shuffle(out)
    for _ in range(rng.randint(0, 3)):
        op, i = rng.random(), rng.randrange(len(out))
        if op < 0.2:
            out[i] = json.dumps(odd_value(rng))
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
            text = _linesmutated(rng, text)
        else:
            text = json.dumps(mutated(rng, json.loads(text)))
    except (RecursionError, ValueError):  # too deep for json.dumps, or a value made circular
        return None
    path = folder / source.relative_to(FIXTURES / tool)
    path.parent.mkdir(parents=True)
    path.write_text(text, errors="surrogatepass")
    return tool, path


@pytest.mark.parametrize("seed", range(150))
def test_a_damaged_session_file_imports_or_fails_cleanly(tmp_path: Path, seed: int) -> None:
    # The first of the seed's tries whose mutation can be written as JSON.
    made = next(m for k in range(20) if (m := _damaged_file(seed * 20 + k, tmp_path / "src")))
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
