"""The Docker sandbox, against a real engine (see docker_fixture for when these skip)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from docker_fixture import require_docker

from agent.sandbox import (
    DockerUnavailable,
    ImageMissing,
    Sandbox,
    SandboxError,
    docker_available,
    truncate_middle,
)


@pytest.fixture(scope="module")
def image() -> str:
    return require_docker()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("project")


@pytest.fixture(scope="module")
def sandbox(image: str, project: Path) -> Iterator[Sandbox]:
    with Sandbox.start(project, image, session="test-session") as box:
        yield box


def test_the_sandbox_sees_the_project_and_its_writes_land_on_the_host(
    sandbox: Sandbox, project: Path
) -> None:
    (project / "hello.txt").write_text("from the host\n")
    result = sandbox.run("pwd; cat hello.txt; echo 'from the sandbox' > made.txt", timeout=10)
    assert result.exit_code == 0, result.output
    assert result.output == "/workspace\nfrom the host\n"
    made = project / "made.txt"
    assert made.read_text() == "from the sandbox\n"
    # The command ran as the invoking user, so the file is the user's.
    assert (made.stat().st_uid, made.stat().st_gid) == (os.getuid(), os.getgid())


def test_exit_code_and_both_streams_come_back(sandbox: Sandbox) -> None:
    result = sandbox.run("echo out; echo err >&2; exit 3", timeout=10)
    assert result.exit_code == 3
    assert sorted(result.output.splitlines()) == ["err", "out"]
    assert not result.timed_out and not result.truncated


def test_there_is_no_network(sandbox: Sandbox) -> None:
    interfaces = sandbox.run("ls /sys/class/net", timeout=10)
    assert interfaces.output.split() == ["lo"]
    began = time.monotonic()
    fetch = sandbox.run("wget -q -T 3 -O- http://192.0.2.1/ || nc -w 3 192.0.2.1 80", timeout=10)
    assert fetch.exit_code not in (0, None), fetch.output
    assert time.monotonic() - began < 5  # refused at once, not after a connect timeout


def test_nothing_outside_workspace_and_tmp_is_writable(sandbox: Sandbox) -> None:
    for where in ("/", "/etc", "/bin", "/usr"):
        result = sandbox.run(f"touch {where}/ags-was-here", timeout=10)
        assert result.exit_code != 0, f"{where} is writable: {result.output}"
    scratch = sandbox.run("echo ok > /tmp/scratch && cat /tmp/scratch", timeout=10)
    assert scratch.exit_code == 0 and scratch.output == "ok\n"


def test_a_command_past_its_timeout_is_killed_with_all_it_started(sandbox: Sandbox) -> None:
    began = time.monotonic()
    result = sandbox.run("sleep 300 & echo started; sleep 300; echo never", timeout=1)
    took = time.monotonic() - began
    assert result.timed_out
    assert result.exit_code is None
    assert result.output == "started\n"
    assert took < 3.5, f"timeout reported after {took:.1f} s"
    left = sandbox.run("ps -o args", timeout=10)
    assert "sleep 300" not in left.output


def test_huge_output_keeps_head_and_tail_and_says_how_much_was_cut(sandbox: Sandbox) -> None:
    result = sandbox.run("seq 1 1000000", timeout=30)
    assert result.exit_code == 0
    assert result.truncated
    total = sum(len(f"{n}\n") for n in range(1, 1_000_001))
    cut = total - sandbox.output_limit
    assert f"\n[... {cut} bytes of output cut here by ags ...]\n" in result.output
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("999999\n1000000\n")
    assert len(result.output) < sandbox.output_limit + 100


def test_the_container_is_locked_down(sandbox: Sandbox) -> None:
    client = docker.from_env()
    try:
        attrs = client.containers.get(sandbox.container_id).attrs
    finally:
        client.close()
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["ReadonlyRootfs"] is True
    assert host["PidsLimit"] == 256
    assert host["Memory"] == 512 * 1024 * 1024
    assert attrs["Config"]["User"] == f"{os.getuid()}:{os.getgid()}"
    assert attrs["Config"]["Labels"]["ags.sandbox"] == "1"
    assert attrs["Config"]["Labels"]["ags.session"] == "test-session"


def test_close_removes_the_container_and_can_be_repeated(image: str, tmp_path: Path) -> None:
    box = Sandbox.start(tmp_path, image)
    container_id = box.container_id
    box.close()
    box.close()
    client = docker.from_env()
    try:
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(container_id)
    finally:
        client.close()
    with pytest.raises(SandboxError, match="closed"):
        box.run("true", timeout=5)


def test_a_missing_image_is_named_and_not_pulled(image: str, tmp_path: Path) -> None:
    with pytest.raises(ImageMissing, match="ags-no-such-image:0"):
        Sandbox.start(tmp_path, "ags-no-such-image:0")


def test_no_engine_is_a_one_line_error_that_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"unix://{tmp_path}/no-docker.sock"
    monkeypatch.setenv("DOCKER_HOST", dead)
    assert not docker_available()
    with pytest.raises(DockerUnavailable) as caught:
        Sandbox.start(tmp_path, "any-image")
    assert str(caught.value) == f"no Docker engine at {dead}: start dockerd or set DOCKER_HOST"


def test_truncate_middle_keeps_both_ends() -> None:
    assert truncate_middle("short", 10) == ("short", False)
    text, cut = truncate_middle("a" * 50 + "b" * 50, 20)
    assert cut
    assert text == "a" * 10 + "\n[... 80 characters cut here by ags ...]\n" + "b" * 10
