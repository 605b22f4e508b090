"""A real LLM server for the tests: llama-cpp-python's OpenAI-compatible server
with the SmolLM2-135M-Instruct GGUF, on a free loopback port.

``.ci/llm-up`` installs both (once per machine) and writes ``llm.env``, which
sets ``AGS_LLM_PYTHON`` (the venv's python) and ``AGS_LLM_GGUF`` (the model
file). Without them the tests that need the server skip, unless
``AGS_REQUIRE_LLM=1`` (``.ci/run`` sets it), which makes them fail instead.
What the server sends is in docs/PROTOCOLS.md section 3.6.

The fixtures ``plain_llm`` and ``tools_llm`` give a server's base URL; use them
with ``from llm_server import plain_llm_fixture  # noqa: F401``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

MODEL = "smollm2"
READY_WITHIN = 120.0  # seconds; ~2 s on an idle machine, much more under a parallel build


def require_llm() -> tuple[str, str]:
    """(python, gguf) of the installed server; else skip, or fail if required."""
    python = os.environ.get("AGS_LLM_PYTHON", "")
    gguf = os.environ.get("AGS_LLM_GGUF", "")
    problem = None
    if not python or not gguf:
        problem = "AGS_LLM_PYTHON and AGS_LLM_GGUF are not set (.ci/llm-up writes llm.env)"
    elif not Path(python).is_file() or not Path(gguf).is_file():
        problem = f"the LLM server is not installed ({python}, {gguf})"
    if problem is not None:
        if os.environ.get("AGS_REQUIRE_LLM") == "1":
            pytest.fail(f"{problem}, and AGS_REQUIRE_LLM=1")
        pytest.skip(problem)
    return python, gguf


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class LLMServer:
    url: str
    process: subprocess.Popen[bytes]


@contextmanager
def llm_server(log: Path, n_ctx: int, chat_format: str | None = None) -> Iterator[LLMServer]:
    """A started server; stopped on the way out (SIGTERM, then SIGKILL)."""
    python, gguf = require_llm()
    port = _free_port()
    command = [
        python, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
    ]  # fmt: skip
    if chat_format:
        command += ["--chat_format", chat_format]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(process, url, log)
        yield LLMServer(url, process)
    finally:
        stop(process)


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_WITHIN
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the LLM server exited ({process.returncode}):\n{tail}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the LLM server at {url} was not ready after {READY_WITHIN:.0f} s")


def stop(process: subprocess.Popen[bytes], signum: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(signum)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@pytest.fixture(scope="session", name="plain_llm")
def plain_llm_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The model's own chat template (it ignores tools) and a 512-token window,
    small enough to overflow in two short turns."""
    log = tmp_path_factory.mktemp("llm") / "plain.log"
    with llm_server(log, n_ctx=512) as server:
        yield server.url


@pytest.fixture(scope="session", name="tools_llm")
def tools_llm_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """chatml-function-calling: tools are rendered into the prompt (about 1,000
    tokens for ags's), and called when the request sets a tool_choice."""
    log = tmp_path_factory.mktemp("llm") / "tools.log"
    with llm_server(log, n_ctx=2048, chat_format="chatml-function-calling") as server:
        yield server.url
