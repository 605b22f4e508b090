"""What ``ags`` loads to start: a command imports what it needs, not what every other
command needs (cli/app.py COMMAND_MODULES, objstore/__init__.py).

Each check runs ``ags`` in a fresh interpreter against a real store and reads
``sys.modules`` after the command ran: behaviour, not timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from cli.app import COMMAND_MODULES
from cli.main import cli
from objstore import Store

# The agent stack, S3, the web server and what they pull in.
HEAVY = ("boto3", "botocore", "docker", "starlette", "uvicorn", "jinja2", "httpx", "rich",
         "prompt_toolkit", "agent.loop", "objstore.remote", "objstore.exchange",
         "objstore.gc", "objstore.fsck")  # fmt: skip

RUN = """
import json, sys
sys.argv = ["ags", *sys.argv[1:]]
from cli.main import main
try:
    main()
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def modules_after(store: Path, *args: str) -> set[str]:
    """The modules loaded by ``ags --store STORE ARGS``, which must succeed."""
    done = subprocess.run([sys.executable, "-c", RUN, "--store", str(store), *args],
                          capture_output=True, text=True, check=True)  # fmt: skip
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, None), done.stderr
    return set(report["modules"])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("startup") / "store"
    with Store.open(path) as s:
        sid = s.new_session(title="startup")
        for i in range(3):
            s.append(sid, {"role": "user", "content": f"message {i}"})
    return path, sid


@pytest.mark.parametrize(
    "args",
    [
        ["ls"],
        ["sessions", "--json"],
        ["log", "{sid}", "-n", "20"],
        ["show", "{sid}"],
        ["log", "{sid}", "--oneline"],
    ],  # fmt: skip
)
def test_reading_commands_load_neither_the_agent_stack_nor_s3_nor_the_web_server(
    store: tuple[Path, str], args: list[str]
) -> None:
    path, sid = store
    loaded = modules_after(path, *(a.format(sid=sid) for a in args))
    assert "objstore.store" in loaded  # it did read the store
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY)
    assert heavy == []


def test_ls_loads_only_the_module_of_its_own_command(store: tuple[Path, str]) -> None:
    loaded = modules_after(store[0], "ls")
    others = set(COMMAND_MODULES.values()) - {COMMAND_MODULES["ls"]}
    assert sorted(others & loaded) == []


def test_the_table_of_command_modules_is_what_the_modules_define() -> None:
    """Every command a module registers is in COMMAND_MODULES under that module, and
    every entry names a command its module registers."""
    for module in set(COMMAND_MODULES.values()):
        __import__(module)
    defined = {
        name: sys.modules[command.callback.__module__].__name__
        for name, command in cli.commands.items()
        if command.callback is not None and name != "init"
    }
    assert defined == COMMAND_MODULES


def test_help_lists_every_command_and_each_one_runs(store: tuple[Path, str]) -> None:
    ctx = click.Context(cli)
    assert set(COMMAND_MODULES) <= set(cli.list_commands(ctx))
    assert cli.get_command(ctx, "no-such-command") is None
    for args in (["--help"], ["remote", "--help"], ["fsck"]):
        done = subprocess.run([sys.executable, "-m", "cli.main", "--store", str(store[0]), *args],
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
    listed = subprocess.run([sys.executable, "-m", "cli.main", "--help"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    for name in COMMAND_MODULES:
        assert f"  {name}" in listed, name
