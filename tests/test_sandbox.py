"""The Docker sandbox, against a real engine (see docker_fixture for when these skip)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from docker_fixture import expected_user, owned_project, require_docker

from agent.sandbox import (
    NOBODY,
    DockerUnavailable,
    ImageMissing,
    Limits,
    Sandbox,
    SandboxError,
    docker_available,
    sandbox_user,
    truncate_middle,
)


@pytest.fixture(scope="module")
def image() -> str:
    return require_docker()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return owned_project(tmp_path_factory.mktemp("project"))


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
    # The command ran as the project's person, so the file is theirs.
    assert (made.stat().st_uid, made.stat().st_gid) == expected_user() == sandbox.user


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
    assert host["NanoCpus"] == round(Limits.from_env().cpus * 1e9)
    assert attrs["Config"]["User"] == "{}:{}".format(*expected_user())
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


# -- a command ends with all it started


def test_background_processes_end_with_their_command(sandbox: Sandbox) -> None:
    began = time.monotonic()
    result = sandbox.run("sleep 300 & setsid sleep 301 & echo started", timeout=30)
    took = time.monotonic() - began
    assert result.exit_code == 0 and result.output == "started\n"
    assert took < 3, f"the command took {took:.1f} s: the background sleeps held it open"
    left = sandbox.run("ps -o args", timeout=10)
    assert "sleep 30" not in left.output


def test_filling_the_pids_limit_does_not_wedge_the_sandbox(image: str, project: Path) -> None:
    with Sandbox.start(project, image, pids=256) as box:
        box.run("for i in $(seq 300); do sleep 1000 & done; echo filled", timeout=60)
        after = box.run("echo still works; ps -o args", timeout=10)
        assert after.exit_code == 0 and after.output.startswith("still works\n")
        assert "sleep 1000" not in after.output.splitlines()
        # Nearly full, by a command that times out: the clean-up after it works too.
        slow = box.run("for i in $(seq 250); do sleep 1000 & done; exec sleep 1000", timeout=3)
        assert slow.timed_out
        again = box.run("ps -o args", timeout=10)
        assert "sleep 1000" not in again.output.splitlines()
        assert again.exit_code == 0 and again.notice is None


def test_a_stopped_container_is_restarted_and_the_result_says_so(image: str, project: Path) -> None:
    with Sandbox.start(project, image) as box:
        first = box.container_id
        box.run("echo in tmp > /tmp/scratch", timeout=10)
        client = docker.from_env()
        try:
            client.containers.get(first).kill()  # as when the kernel OOM-kills its PID 1
            result = box.run("test -e /tmp/scratch && echo kept || echo gone", timeout=10)
            assert result.exit_code == 0
            assert result.output == "gone\n"  # a fresh container, with a fresh /tmp
            assert result.notice is not None
            assert result.notice.startswith("the sandbox was restarted: its container stopped")
            assert "files in /tmp are gone" in result.notice
            assert box.container_id != first
            with pytest.raises(docker.errors.NotFound):
                client.containers.get(first)
        finally:
            client.close()


def test_a_container_that_stops_during_a_command_is_restarted_after_it(
    image: str, project: Path
) -> None:
    with Sandbox.start(project, image) as box:
        first = box.container_id
        client = docker.from_env()
        try:
            killer = threading.Timer(1.0, lambda: client.containers.get(first).kill())
            killer.start()
            result = box.run("sleep 20", timeout=30)
            killer.join()
        finally:
            client.close()
        assert result.exit_code != 0
        assert result.notice is not None and "during this command" in result.notice
        assert box.run("echo fine", timeout=10).output == "fine\n"


# -- limits


def test_cpu_use_is_limited(image: str, project: Path) -> None:
    with Sandbox.start(project, image, cpus=0.2) as box:
        client = docker.from_env()
        try:
            container = client.containers.get(box.container_id)
            assert container.attrs["HostConfig"]["NanoCpus"] == 200_000_000

            def cpu_seconds() -> float:
                stats = container.stats(stream=False, one_shot=True)
                return float(stats["cpu_stats"]["cpu_usage"]["total_usage"]) / 1e9

            before = cpu_seconds()
            box.run("for i in 1 2; do (while :; do :; done) & done; sleep 3", timeout=10)
            used = cpu_seconds() - before
        finally:
            client.close()
    # Two busy loops for 3 s: up to 6 CPU-seconds unlimited, 0.6 at 0.2 of a core.
    assert used < 1.0, f"the sandbox used {used:.2f} CPU-seconds in 3 s"


def test_limits_come_from_the_environment_and_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cores = os.cpu_count() or 1
    assert Limits.from_env() == Limits("512m", 256, max(1.0, cores / 2))
    monkeypatch.setenv("AGS_SANDBOX_CPUS", "0.5")
    monkeypatch.setenv("AGS_SANDBOX_MEMORY", "1g")
    monkeypatch.setenv("AGS_SANDBOX_PIDS", "64")
    assert Limits.from_env() == Limits("1g", 64, 0.5)
    assert Limits.from_env(memory="256m", pids=100, cpus=1) == Limits("256m", 100, 1)
    for name, value, says in [
        ("AGS_SANDBOX_CPUS", "lots", "AGS_SANDBOX_CPUS='lots' is not a number"),
        ("AGS_SANDBOX_CPUS", "0", "sandbox CPUs 0 is not between 0.01 and"),
        ("AGS_SANDBOX_CPUS", str(cores + 1), f"is not between 0.01 and {cores}"),
        ("AGS_SANDBOX_PIDS", "3", "sandbox pids limit 3 is not between 16 and"),
        ("AGS_SANDBOX_MEMORY", "lots", "sandbox memory 'lots' is not a size"),
        ("AGS_SANDBOX_MEMORY", "1m", "sandbox memory '1m' is not a size of at least 16m"),
    ]:
        with monkeypatch.context() as env:
            env.setenv(name, value)
            with pytest.raises(SandboxError) as caught:
                Limits.from_env()
            assert says in str(caught.value)


# -- who the commands run as


def test_who_the_sandbox_runs_as(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    roots = tmp_path / "roots"
    roots.mkdir()
    # A normal user's ags: that user, whoever owns the project.
    assert sandbox_user(roots, euid=1000) == (1000, os.getegid())
    if os.geteuid() == 0:
        os.chown(theirs, 4321, 4322)
        os.chown(roots, 0, 0)
        # Root's ags: the project's owner, or nobody for a project root owns.
        assert sandbox_user(theirs, euid=0) == (4321, 4322)
        assert sandbox_user(roots, euid=0) == NOBODY


def test_uid_0_is_refused(image: str, tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="never runs as uid 0"):
        Sandbox.start(tmp_path, image, user=(0, 0))


@pytest.mark.skipif(os.geteuid() != 0, reason="ags must run as root for this case")
def test_over_a_project_root_owns_the_sandbox_is_nobody_and_cannot_write(
    image: str, tmp_path: Path
) -> None:
    project = tmp_path / "root-owned"
    project.mkdir(mode=0o755)
    project.chmod(0o755)
    (project / "notes.txt").write_text("readable\n")
    (project / "notes.txt").chmod(0o644)
    with Sandbox.start(project, image) as box:
        assert box.user == NOBODY and not box.can_write_project
        read = box.run("id -u; cat notes.txt", timeout=10)
        assert read.output == "65534\nreadable\n"
        write = box.run("touch made.txt", timeout=10)
        assert write.exit_code != 0 and "Permission denied" in write.output
        assert box.write_note() == (
            "the sandbox runs as uid 65534:65534 and the project root belongs to uid 0 "
            "(mode 755), so commands cannot write there; ags runs as root and root owns the "
            "project, and the sandbox never runs as root. write_file and edit_file can still "
            "change files; for commands to, the project must belong to a normal user"
        )
    assert not (project / "made.txt").exists()
