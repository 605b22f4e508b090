"""The peer stores the bench compares with: zettcode's session store and LangGraph's
``SqliteSaver``, installed from PyPI into a virtual environment of their own.

The environment lives under the user's cache directory (``$XDG_CACHE_HOME`` or
``~/.cache``, then ``ags-bench/peers-venv``), never in the project's, so the
peers' dependencies cannot change what ags runs with. It is made once, by
``uv venv`` and ``uv pip install``; once it holds its marker file the bench
uses it as it is and needs no network. A peer that cannot be installed or
fails a workload is reported (a dash in its column and a note that says why),
never a crash. Each workload runs in a child process of that environment
(bench/peer_driver.py).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .conversations import Message

PACKAGES = ("zettcode", "langgraph", "langgraph-checkpoint-sqlite")
PEERS = ("zettcode", "langgraph")
LABELS = {"zettcode": "zettcode", "langgraph": "LangGraph"}
DRIVER = Path(__file__).with_name("peer_driver.py")
MARKER = "ags-bench-peers.json"
INSTALL_TIMEOUT_S = 900


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ags-bench"


@dataclass(frozen=True, slots=True)
class PeerPython:
    """The peers' interpreter, or why there is none."""

    python: Path | None
    versions: dict[str, str]
    problem: str = ""


_skipped: list[str] = []  # why the peers are not run at all, if they are not


def skip_peers(why: str) -> None:
    """Run no peer in this process (``--no-peers``): their cells are dashes."""
    _skipped.append(why)


def reset() -> None:
    """Forget what an earlier run in this process decided or measured."""
    _skipped.clear()
    _results.clear()
    peer_python.cache_clear()


@functools.cache
def peer_python() -> PeerPython:
    """The peers' environment, made (with the network) if it is not there yet."""
    if _skipped:
        return PeerPython(None, {}, _skipped[0])
    venv = cache_dir() / "peers-venv"
    python = venv / "bin" / "python"
    marker = venv / MARKER
    if marker.exists() and python.exists():
        return PeerPython(python, json.loads(marker.read_text()))
    uv = shutil.which("uv")
    if uv is None:
        return PeerPython(None, {}, "uv is not on PATH, so the peers could not be installed")
    shutil.rmtree(venv, ignore_errors=True)
    steps = [
        [uv, "venv", "--quiet", "--python", "3.11", str(venv)],
        [uv, "pip", "install", "--quiet", "--python", str(python), *PACKAGES],
        [uv, "pip", "list", "--python", str(python), "--format", "json"],
    ]
    out = ""
    for step in steps:
        try:
            done = subprocess.run(
                step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return PeerPython(None, {}, f"could not install {', '.join(PACKAGES)}: {e}")
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            shutil.rmtree(venv, ignore_errors=True)
            return PeerPython(None, {}, f"could not install {', '.join(PACKAGES)}: {last}")
        out = done.stdout
    versions = {p["name"]: p["version"] for p in json.loads(out) if p["name"] in PACKAGES}
    marker.write_text(json.dumps(versions))
    return PeerPython(python, versions)


@dataclass(frozen=True, slots=True)
class PeerResult:
    """What one peer did on one workload: values, or why it has none."""

    seconds: float | None = None
    bytes: int | None = None
    count: int | None = None
    problem: str = ""


_results: dict[tuple[str, str, str, int], PeerResult] = {}


def run_peer(
    peer: str,
    workload: str,
    messages: list[Message],
    where: Path,
    *,
    key: str,
    runs: int = 5,
    budget_s: float = 240,
) -> PeerResult:
    """Run one workload (``appends`` or ``resume``, see peer_driver.py) with one peer.
    Results are kept for the run by ``key`` (what the messages are), so two rows
    built from one workload run it once."""
    memo = (peer, workload, key, len(messages))
    if memo in _results:
        return _results[memo]
    env = peer_python()
    if env.python is None:
        return PeerResult(problem=env.problem)
    job = {
        "peer": peer,
        "workload": workload,
        "dir": str(where / f"{peer}-{workload}"),
        "messages": messages,
        "runs": runs,
        "budget_s": budget_s,
    }
    stderr = ""
    try:
        done = subprocess.run(
            [str(env.python), str(DRIVER)],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            timeout=budget_s + 600,
            check=False,
        )
        stderr = done.stderr
        answer: dict[str, Any] = json.loads(done.stdout or "{}")
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        answer = {"gave_up": str(e)}
    finally:
        shutil.rmtree(where / f"{peer}-{workload}", ignore_errors=True)
    if "seconds" not in answer:
        why = answer.get("gave_up") or (stderr.strip().splitlines() or ["no answer"])[-1]
        result = PeerResult(problem=f"{LABELS[peer]} {workload}: {why}")
    else:
        result = PeerResult(answer["seconds"], answer.get("bytes"), answer.get("count"))
    _results[memo] = result
    return result


def versions_note() -> str:
    env = peer_python()
    if env.python is None:
        return f"peers: none ({env.problem})"
    shown = ", ".join(f"{name} {version}" for name, version in sorted(env.versions.items()))
    return f"peers: {shown}, in {env.python.parent.parent}"


def peer_values(
    results: dict[str, PeerResult], value: Any
) -> tuple[tuple[tuple[str, float | None], ...], list[str]]:
    """A row's peer cells (``value(result)``, None where a peer has none) and the
    problems to note."""
    cells = []
    problems = []
    for peer in PEERS:
        result = results.get(peer)
        if result is None or result.problem:
            cells.append((peer, None))
            if result is not None:
                problems.append(result.problem)
        else:
            cells.append((peer, value(result)))
    return tuple(cells), problems
