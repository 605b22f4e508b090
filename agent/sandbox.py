"""The Docker sandbox where an agent's shell commands run.

One container per session, made by :meth:`Sandbox.start` and removed by
:meth:`Sandbox.close`. The project root is bind-mounted read-write at
``/workspace``; everything else is shut: no network unless asked, a read-only
root file system with a tmpfs ``/tmp``, all capabilities dropped,
``no-new-privileges``, memory and pids limits.

The container's PID 1 is a small shell loop that only sleeps, so commands run
with ``docker exec``. As PID 1 it is immune to ``kill -KILL -1`` from inside
the container (that is how a timed-out command and everything it started are
killed), and it reaps the orphans that commands leave behind, so zombies never
use up the pids limit.

Commands run as the invoking user's uid:gid, so files the agent writes in the
project belong to the user, not to root. No passwd entry is needed; ``HOME``
is ``/tmp``.

The docker SDK's ``exec_run`` has no timeout, so :meth:`Sandbox.run` does its
own: the command runs under ``timeout -s KILL`` in the container, and the host
reads the output with a deadline of its own and kills everything in the
container if that deadline passes. Output is bounded in memory: the head and
the tail are kept, the middle is cut with a marker line.

Images are never pulled (these machines have no registry access): a missing
image is an :class:`ImageMissing` error that names it.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import docker
import docker.errors
import requests.exceptions

from agent.errors import one_line
from objstore.errors import AgsError

WORKSPACE = "/workspace"
OUTPUT_LIMIT = 30_000
"""Bytes of a command's output kept by default (half from the head, half from the tail)."""

LABEL = "ags.sandbox"
"""Every sandbox container carries this label (value "1"); others name its project and owner."""

# PID 1 of the container: sleeps, reaps adopted orphans while waiting, exits on TERM.
_KEEPER = 'trap "exit 0" TERM; while :; do sleep 86400 & wait $!; done'

# How long past the in-container timeout the host waits before it kills on its
# own; dockerd holds an exec's stream open up to 2 s after the process exits.
_HOST_GRACE = 3.0
# After a kill, how long to wait for the stream to close before giving up on it.
_DRAIN = 2.0
# How often the host asks whether a command past its timeout has ended.
_POLL = 0.1


class SandboxError(AgsError):
    """The sandbox could not be made, or could not run a command."""


class DockerUnavailable(SandboxError):
    """No Docker engine answers (not running, wrong DOCKER_HOST, no permission)."""


class ImageMissing(SandboxError):
    """The sandbox image is not on the Docker engine, and ags does not pull images."""

    def __init__(self, image: str) -> None:
        super().__init__(
            f"the sandbox image {image!r} is not on the Docker engine and ags does not pull "
            "images: build or load it (docker build / docker load), or name another with "
            "AGS_IMAGE"
        )
        self.image = image


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command did.

    ``exit_code`` is None when the command was killed for passing its timeout
    (``timed_out``). ``truncated`` says the middle of ``output`` (stdout and
    stderr, interleaved as they came) was cut. ``duration`` is wall seconds.
    """

    exit_code: int | None
    output: str
    timed_out: bool
    truncated: bool
    duration: float = 0.0


def default_image() -> str:
    """The image a user's sandbox runs: ``$AGS_IMAGE``, else ``debian:bookworm-slim``."""
    return os.environ.get("AGS_IMAGE") or "debian:bookworm-slim"


def docker_host() -> str:
    """The engine address the docker SDK will use, for messages."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def connect(timeout: float = 60.0) -> docker.DockerClient:
    """A docker client that has answered a ping, else :class:`DockerUnavailable`."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise _unavailable(exc) from exc
    return client


def docker_available(timeout: float = 3.0) -> bool:
    """Whether a Docker engine answers at :func:`docker_host` (for skipping tests)."""
    try:
        connect(timeout).close()
    except DockerUnavailable:
        return False
    return True


def cut_marker(count: int, unit: str) -> str:
    """The line put where the middle of a long text was cut."""
    return f"\n[... {count} {unit} cut here by ags ...]\n"


def truncate_middle(text: str, limit: int) -> tuple[str, bool]:
    """``text`` with its middle cut to keep at most ``limit`` characters, and whether it was."""
    if len(text) <= limit:
        return text, False
    head = limit // 2
    tail = limit - head
    cut = len(text) - head - tail
    return text[:head] + cut_marker(cut, "characters") + text[len(text) - tail :], True


def remove_orphans(client: docker.DockerClient) -> int:
    """Remove the sandboxes that ags processes on this host left when they were
    killed (SIGKILL gives no chance to clean up); return how many went."""
    host, removed = socket.gethostname(), 0
    try:
        containers = client.containers.list(all=True, filters={"label": f"ags.host={host}"})
    except Exception:
        return 0  # tidying up must never stop a start
    for container in containers:
        try:
            pid = int(container.labels.get("ags.pid", ""))
        except ValueError:
            continue
        if LABEL not in container.labels or _alive(pid):
            continue
        with contextlib.suppress(Exception):
            container.remove(force=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Sandbox:
    """One session's container. Make it with :meth:`start`; use it as a context manager."""

    def __init__(
        self,
        client: docker.DockerClient,
        container: Any,
        project_root: Path,
        image: str,
        output_limit: int,
        owns_client: bool,
    ) -> None:
        self._client = client
        self._container = container
        self.project_root = project_root
        self.image = image
        self.output_limit = output_limit
        self._owns_client = owns_client
        self._closed = False

    @classmethod
    def start(
        cls,
        project_root: Path,
        image: str | None = None,
        network: bool = False,
        memory: str = "512m",
        pids: int = 256,
        *,
        tmp_size: str = "256m",
        read_only: bool = True,
        user: str | None = None,
        environment: dict[str, str] | None = None,
        session: str | None = None,
        output_limit: int = OUTPUT_LIMIT,
        client: docker.DockerClient | None = None,
    ) -> Sandbox:
        """Start a sandbox over ``project_root`` from ``image`` (default :func:`default_image`).

        ``user`` defaults to the invoking user's ``uid:gid``. ``environment``
        is added to the container's (``HOME=/tmp`` unless given). ``session``
        only labels the container. A ``client`` passed in stays the caller's.
        """
        root = Path(project_root).resolve()
        if not root.is_dir():
            raise SandboxError(f"project root {root} is not a directory")
        image = image or default_image()
        owns_client = client is None
        client = client or connect()
        remove_orphans(client)
        labels = {
            LABEL: "1",
            "ags.project": str(root),
            "ags.session": session or "",
            "ags.host": socket.gethostname(),
            "ags.pid": str(os.getpid()),
        }
        try:
            container = client.containers.create(
                image,
                ["sh", "-c", _KEEPER],
                network_mode="none" if not network else None,
                mem_limit=memory,
                pids_limit=pids,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                read_only=read_only,
                tmpfs={"/tmp": f"rw,exec,nosuid,nodev,size={tmp_size}"},
                volumes={str(root): {"bind": WORKSPACE, "mode": "rw"}},
                working_dir=WORKSPACE,
                user=user or _invoking_user(),
                environment={"HOME": "/tmp", **(environment or {})},
                labels=labels,
            )
        except docker.errors.ImageNotFound as exc:
            if owns_client:
                client.close()
            raise ImageMissing(image) from exc
        except Exception as exc:
            if owns_client:
                client.close()
            raise _docker_error(
                f"could not create a sandbox container from {image!r}", exc
            ) from exc
        sandbox = cls(client, container, root, image, output_limit, owns_client)
        try:
            container.start()
            probe = container.exec_run(["sh", "-c", "command -v timeout >/dev/null"])
            if probe.exit_code != 0:
                raise SandboxError(
                    f"the sandbox image {image!r} lacks a shell or `timeout`; "
                    "ags runs commands with sh -c under timeout"
                )
        except BaseException as exc:
            with contextlib.suppress(SandboxError):  # the start failure is the one to report
                sandbox.close()
            if isinstance(exc, SandboxError) or not isinstance(exc, Exception):
                raise
            raise _docker_error(f"could not start the sandbox from {image!r}", exc) from exc
        return sandbox

    @property
    def container_id(self) -> str:
        """The container's full id."""
        return str(self._container.id)

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, command: str, timeout: float) -> CommandResult:
        """Run ``sh -c command`` in /workspace; kill it and all it started after ``timeout`` s.

        Raises :class:`SandboxError` only when the sandbox itself fails (the
        container is gone, the engine stops answering); a failing command is a
        result with its exit code.
        """
        if self._closed:
            raise SandboxError("the sandbox is closed")
        seconds = max(1, math.ceil(timeout))
        argv = ["timeout", "-s", "KILL", str(seconds), "sh", "-c", command]
        api = self._client.api
        began = time.monotonic()
        try:
            exec_id = api.exec_create(self._container.id, argv, stdout=True, stderr=True)["Id"]
            stream = api.exec_start(exec_id, socket=True)
            sock = getattr(stream, "_sock", stream)  # socket.SocketIO wraps the real socket
            try:
                exit_code, timed_out, output = self._collect(exec_id, sock, began + seconds)
            finally:
                # The hijacked connection is never reused; closing only the wrapper
                # leaves the socket open until the response is garbage-collected.
                stream.close()
                sock.close()
            if exit_code is None and not timed_out:
                exit_code = self._exit_code(exec_id)
                # `timeout -s KILL` ends the command with 137 once its time is up.
                timed_out = exit_code == 137 and time.monotonic() >= began + seconds - 0.1
                if timed_out:
                    self._kill_all()  # what the killed shell started in the background
        except SandboxError:
            raise
        except Exception as exc:
            raise _docker_error("the sandbox could not run the command", exc) from exc
        except BaseException:
            # Ctrl-C: the command must not run on unwatched until its timeout.
            with contextlib.suppress(Exception):
                self._kill_all()
            raise
        text, truncated = output.text()
        return CommandResult(
            exit_code=None if timed_out else exit_code,
            output=text,
            timed_out=timed_out,
            truncated=truncated,
            duration=time.monotonic() - began,
        )

    def close(self) -> None:
        """Remove the container (forced). Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        try:
            self._container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except Exception as exc:
            raise _docker_error(
                f"could not remove sandbox container {self.container_id[:12]}", exc
            ) from exc
        finally:
            if self._owns_client:
                self._client.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except SandboxError:
            if exc is None:
                raise  # else the error already in flight is the one to see

    def _collect(
        self, exec_id: str, sock: Any, deadline: float
    ) -> tuple[int | None, bool, _HeadTail]:
        """Read an exec's output from its socket until it ends, or until the timeout's kill.

        Returns (exit code if learnt, timed out, output).
        """
        frames = _Frames(_HeadTail(self.output_limit))
        exit_code: int | None = None
        timed_out = False
        killed_at: float | None = None
        next_poll = deadline
        while True:
            now = time.monotonic()
            if killed_at is not None:
                if now - killed_at > _DRAIN:
                    break  # something still holds the stream; what came is what there is
            elif now >= deadline + _HOST_GRACE:
                timed_out = exit_code is None or exit_code == 137
                self._kill_all()
                killed_at = now
            elif exit_code is None and now >= next_poll:
                # Past the timeout: has `timeout` killed the shell? Its children may
                # still hold the stream open, so ask rather than wait for EOF.
                info = self._client.api.exec_inspect(exec_id)
                if not info["Running"]:
                    exit_code = info["ExitCode"]
                    if exit_code == 137:
                        timed_out = True
                        self._kill_all()
                        killed_at = now
                next_poll = now + _POLL
            pending = getattr(sock, "pending", None)
            if not (pending and pending()):
                ready, _, _ = select.select([sock], [], [], _POLL)
                if not ready:
                    continue
            try:
                chunk = sock.recv(65536)
            except (ConnectionError, TimeoutError):
                break
            if not chunk:
                break
            frames.feed(chunk)
        return exit_code, timed_out, frames.sink

    def _exit_code(self, exec_id: str) -> int | None:
        # The stream can close a moment before the engine records the exit.
        for _ in range(100):
            info = self._client.api.exec_inspect(exec_id)
            if not info["Running"]:
                code = info["ExitCode"]
                return int(code) if code is not None else None
            time.sleep(0.02)
        return None

    def _kill_all(self) -> None:
        """SIGKILL every process in the container but PID 1 (the keeper)."""
        self._container.exec_run(["sh", "-c", "kill -KILL -1 2>/dev/null; true"])


class _HeadTail:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_limit:  # trim now and then, not per chunk
                del self.tail[: len(self.tail) - self.tail_limit]

    def text(self) -> tuple[str, bool]:
        tail = bytes(self.tail[-self.tail_limit :]) if self.tail_limit else b""
        cut = self.total - len(self.head) - len(tail)
        if cut <= 0:
            return (bytes(self.head) + tail).decode("utf-8", errors="replace"), False
        return (
            self.head.decode("utf-8", errors="replace")
            + cut_marker(cut, "bytes of output")
            + tail.decode("utf-8", errors="replace"),
            True,
        )


class _Frames:
    """Splits docker's multiplexed exec stream (8-byte header, then payload) into a sink."""

    def __init__(self, sink: _HeadTail) -> None:
        self.sink = sink
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= 8:
            _, size = struct.unpack(">BxxxL", self._buffer[:8])
            if len(self._buffer) < 8 + size:
                return
            self.sink.add(bytes(self._buffer[8 : 8 + size]))
            del self._buffer[: 8 + size]


def _invoking_user() -> str:
    return f"{os.getuid()}:{os.getgid()}"


def _unavailable(exc: BaseException) -> DockerUnavailable:
    host = docker_host()
    if "Permission denied" in str(exc) or isinstance(exc, PermissionError):
        return DockerUnavailable(
            f"no permission to use the Docker engine at {host}: "
            "join the docker group or set DOCKER_HOST"
        )
    return DockerUnavailable(f"no Docker engine at {host}: start dockerd or set DOCKER_HOST")


def _docker_error(what: str, exc: BaseException) -> SandboxError:
    """One SandboxError for any failure of the engine, with the engine's reason on one line."""
    if isinstance(exc, requests.exceptions.ConnectionError):
        return _unavailable(exc)
    if isinstance(exc, docker.errors.NotFound):
        return SandboxError(f"{what}: the sandbox container is gone ({one_line(str(exc))})")
    if isinstance(exc, docker.errors.APIError):
        reason = exc.explanation or str(exc)
        return SandboxError(f"{what}: {one_line(str(reason))}")
    return SandboxError(f"{what}: {one_line(str(exc)) or type(exc).__name__}")
