"""Docker for the tests: skip when no engine answers, fail instead when it must.

``.ci/run`` starts dockerd, builds the test image and sets ``AGS_REQUIRE_DOCKER=1``,
so in CI a missing engine or image is a failure, not a quiet skip.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import docker.errors
import pytest

from agent.sandbox import DockerUnavailable, connect, docker_host

TEST_IMAGE = os.environ.get("AGS_TEST_IMAGE") or "ags-sandbox:test"

PROJECT_OWNER = (4242, 4242)
"""Who owns a test project when the tests run as root, as a person's project would be."""


@functools.cache
def _problem() -> str | None:
    try:
        client = connect(timeout=5)
    except DockerUnavailable:
        return f"no Docker engine answers at {docker_host()}"
    try:
        client.images.get(TEST_IMAGE)
    except docker.errors.ImageNotFound:
        return f"the test image {TEST_IMAGE} is missing (bash .ci/docker-up builds it)"
    finally:
        client.close()
    return None


def require_docker() -> str:
    """The test image's name once the engine answers and has it; else skip, or fail if required."""
    problem = _problem()
    if problem is not None:
        if os.environ.get("AGS_REQUIRE_DOCKER") == "1":
            pytest.fail(f"{problem}, and AGS_REQUIRE_DOCKER=1")
        pytest.skip(problem)
    return TEST_IMAGE


def owned_project(path: Path) -> Path:
    """``path`` (and all under it) given to a normal user when the tests run as root.

    A sandbox never runs as uid 0; over a project that root owns it runs as
    ``nobody`` and cannot write there. A person's project belongs to them, and
    the sandbox then runs as its owner: that is the case these tests want.
    """
    if os.geteuid() == 0:
        for where, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(where, name), *PROJECT_OWNER)
        os.chown(path, *PROJECT_OWNER)
    return path


def expected_user() -> tuple[int, int]:
    """The uid:gid a sandbox over an :func:`owned_project` runs as."""
    return PROJECT_OWNER if os.geteuid() == 0 else (os.geteuid(), os.getegid())
