"""The Docker sandbox where an agent's shell commands run.

One container per session, made by :meth:`Sandbox.start` and removed by
:meth:`Sandbox.close`. The project root is bind-mounted read-write at
``/workspace``; everything else is shut: no network unless asked, a read-only
root file system with a tmpfs ``/tmp``, all capabilities dropped,
``no-new-privileges``, and limits on memory, processes and CPU
(:class:`Limits`; ``AGS_SANDBOX_MEMORY``, ``AGS_SANDBOX_PIDS`` and
``AGS_SANDBOX_CPUS`` change the defaults).

The container's PID 1 is a small shell loop that only sleeps, so commands run
with ``docker exec``. As PID 1 it is immune to ``kill -KILL -1`` from inside
the container, and it reaps the orphans that commands leave behind, so
zombies never use up the pids limit.

**Each command ends with everything it started.** It runs under a wrapper
shell: ``timeout -s KILL N sh -c COMMAND``, then ``kill -KILL -1``. The
kill is a shell builtin, so it needs no free process slot: a command that
filled the pids limit (300 background sleeps against a limit of 256) is
cleaned up all the same, and the next command starts in an empty container.
Background processes therefore do not outlive the command that started them;
``kill -1`` reaches daemons that left the process group or session too,
since everything in the container runs as one uid. Commands run one at a
time. Should the container still be unusable (it stopped: its PID 1 was
OOM-killed; a kill after Ctrl-C could not start), the next command restarts
it first and its result says so (:attr:`CommandResult.notice`); a command
that could not start in a stopped container is run in the new one.

**Who the commands run as** (:func:`sandbox_user`): never uid 0. When ags
runs as a normal user, as that user's uid:gid, so what the sandbox writes in
the project belongs to the person. When ags runs as root, as the project
directory's owner if that is not root (the person whose project it is). For
a project that root owns, as ``nobody`` (65534:65534): such a sandbox can read
what is world-readable but cannot write the project (the file tools, which
run in ags itself, still can), and a shell result that failed with
"Permission denied" says why (:meth:`Sandbox.write_note`). No passwd entry is
needed; ``HOME`` is ``/tmp``.

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
import re
import select
import socket
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

# The sandbox's errors live with every other agent error; callers import them here too.
from agent.errors import DockerUnavailable as DockerUnavailable
from agent.errors import ImageMissing as ImageMissing
from agent.errors import SandboxError as SandboxError
from agent.errors import one_line

WORKSPACE = "/workspace"
OUTPUT_LIMIT = 30_000
"""Bytes of a command's output kept by default (half from the head, half from the tail)."""

_N = TypeVar("_N", int, float)

LABEL = "ags.sandbox"
"""Every sandbox container carries this label (value "1"); others name its project and owner."""

NOBODY = (65534, 65534)
"""The uid:gid of a sandbox over a root-owned project run by root (see :func:`sandbox_user`)."""

# PID 1 of the container: sleeps, reaps adopted orphans while waiting, exits on TERM.
_KEEPER = 'trap "exit 0" TERM; while :; do sleep 86400 & wait $!; done'
# Every command: $0 is its timeout in seconds, $1 the command. `kill` is the
# shell's builtin: it needs no process slot, and kill(-1) spares the caller and PID 1.
# The wrapper's own stderr goes to /dev/null and the command's to the original
# (fd 3), and the command runs as a job waited for: so the "Killed" a shell
# prints for a child that died of a signal never reaches the output.
_WRAPPER = (
    'exec 3>&2 2>/dev/null; timeout -s KILL "$0" sh -c "$1" 2>&3 3>&- & wait $!; '
    "status=$?; kill -KILL -1; exit $status"
)

# How long past the in-container timeout the host waits before it kills on its
# own; dockerd holds an exec's stream open up to 2 s after the process exits.
_HOST_GRACE = 3.0
# After a kill, how long to wait for the stream to close before giving up on it.
_DRAIN = 2.0
# How often the host asks whether a command past its timeout has ended.
_POLL = 0.1
# A command killed by SIGKILL may have died with its container: the engine
# records the container's stop a moment after the command's end.
_STOPPING = 0.5


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command did.

    ``exit_code`` is None when the command was killed for passing its timeout
    (``timed_out``). ``truncated`` says the middle of ``output`` (stdout and
    stderr, interleaved as they came) was cut. ``duration`` is wall seconds.
    ``notice`` says the sandbox was restarted, before or after this command,
    and why.
    """

    exit_code: int | None
    output: str
    timed_out: bool
    truncated: bool
    duration: float = 0.0
    notice: str | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """What one sandbox may use: memory (docker's form: ``512m``, ``2g``),
    processes, and CPUs (``1.5`` is one and a half cores' time)."""

    memory: str
    pids: int
    cpus: float

    @classmethod
    def from_env(
        cls, memory: str | None = None, pids: int | None = None, cpus: float | None = None
    ) -> Limits:
        """The limits given, else ``AGS_SANDBOX_MEMORY`` / ``_PIDS`` / ``_CPUS``,
        else 512m, 256 processes, and half the machine's cores (at least one).

        A value out of range is a :class:`SandboxError` naming it.
        """
        env = os.environ
        cores = os.cpu_count() or 1
        if memory is None:
            memory = env.get("AGS_SANDBOX_MEMORY") or "512m"
        if not re.fullmatch(r"[0-9]+[bkmgBKMG]?", memory) or _memory_bytes(memory) < 16 << 20:
            raise SandboxError(
                f"sandbox memory {memory!r} is not a size of at least 16m (like 512m or 2g)"
            )
        if pids is None:
            pids = _number(env.get("AGS_SANDBOX_PIDS"), "AGS_SANDBOX_PIDS", int)
            if pids is None:
                pids = 256
        if not 16 <= pids <= 1_000_000:
            raise SandboxError(f"sandbox pids limit {pids} is not between 16 and 1000000")
        if cpus is None:
            cpus = _number(env.get("AGS_SANDBOX_CPUS"), "AGS_SANDBOX_CPUS", float)
            if cpus is None:
                cpus = max(1.0, cores / 2)
        if not 0.01 <= cpus <= cores:
            raise SandboxError(
                f"sandbox CPUs {cpus:g} is not between 0.01 and {cores}, the cores this machine has"
            )
        return cls(memory, pids, cpus)


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


def sandbox_user(project_root: Path, euid: int | None = None) -> tuple[int, int]:
    """The uid:gid a sandbox over ``project_root`` runs as, for a process whose
    effective uid is ``euid`` (default: this one's). Never uid 0; the module
    docstring says why each case is what it is."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return euid, os.getegid()
    owner = os.stat(project_root)
    if owner.st_uid != 0:
        return owner.st_uid, owner.st_gid
    return NOBODY


class Sandbox:
    """One session's container. Make it with :meth:`start`; use it as a context manager."""

    def __init__(
        self,
        client: docker.DockerClient,
        config: dict[str, Any],
        project_root: Path,
        image: str,
        output_limit: int,
        owns_client: bool,
    ) -> None:
        self._client = client
        self._config = config  # containers.create's arguments, for a restart
        self._container: Any = None
        self.project_root = project_root
        self.image = image
        self.output_limit = output_limit
        self._owns_client = owns_client
        self._closed = False
        self._broken: str | None = None  # why the next command must restart the container
        uid, gid = (int(n) for n in str(config["user"]).split(":"))
        self.user = (uid, gid)
        """The uid:gid commands run as (see :func:`sandbox_user`)."""
        self._root_stat = os.stat(project_root)

    @classmethod
    def start(
        cls,
        project_root: Path,
        image: str | None = None,
        network: bool = False,
        memory: str | None = None,
        pids: int | None = None,
        *,
        cpus: float | None = None,
        tmp_size: str = "256m",
        read_only: bool = True,
        user: tuple[int, int] | None = None,
        environment: dict[str, str] | None = None,
        session: str | None = None,
        output_limit: int = OUTPUT_LIMIT,
        client: docker.DockerClient | None = None,
    ) -> Sandbox:
        """Start a sandbox over ``project_root`` from ``image`` (default :func:`default_image`).

        ``memory``, ``pids`` and ``cpus`` default as :meth:`Limits.from_env`
        says. ``user`` (uid, gid) defaults to :func:`sandbox_user`; uid 0 is
        refused. ``environment`` is added to the container's (``HOME=/tmp``
        unless given). ``session`` only labels the container. A ``client``
        passed in stays the caller's.
        """
        root = Path(project_root).resolve()
        if not root.is_dir():
            raise SandboxError(f"project root {root} is not a directory")
        limits = Limits.from_env(memory, pids, cpus)
        uid, gid = user if user is not None else sandbox_user(root)
        if uid == 0:
            raise SandboxError("the sandbox never runs as uid 0: give another uid")
        image = image or default_image()
        config: dict[str, Any] = {
            "image": image,
            "command": ["sh", "-c", _KEEPER],
            "network_mode": "none" if not network else None,
            "mem_limit": limits.memory,
            "pids_limit": limits.pids,
            "nano_cpus": round(limits.cpus * 1e9),
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": read_only,
            "tmpfs": {"/tmp": f"rw,exec,nosuid,nodev,size={tmp_size}"},
            "volumes": {str(root): {"bind": WORKSPACE, "mode": "rw"}},
            "working_dir": WORKSPACE,
            "user": f"{uid}:{gid}",
            "environment": {"HOME": "/tmp", **(environment or {})},
            "labels": {
                LABEL: "1",
                "ags.project": str(root),
                "ags.session": session or "",
                "ags.host": socket.gethostname(),
                "ags.pid": str(os.getpid()),
            },
        }
        owns_client = client is None
        client = client or connect()
        remove_orphans(client)
        sandbox = cls(client, config, root, image, output_limit, owns_client)
        try:
            sandbox._launch()
        except BaseException:
            with contextlib.suppress(SandboxError):  # the start failure is the one to report
                sandbox.close()
            raise
        return sandbox

    @property
    def container_id(self) -> str:
        """The container's full id (a new one after a restart)."""
        return str(self._container.id)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def can_write_project(self) -> bool:
        """Whether the sandbox's uid may write the project root, by its mode bits."""
        uid, gid = self.user
        st = self._root_stat
        if st.st_uid == uid:
            return bool(st.st_mode & stat.S_IWUSR)
        if st.st_gid == gid:
            return bool(st.st_mode & stat.S_IWGRP)
        return bool(st.st_mode & stat.S_IWOTH)

    def write_note(self) -> str:
        """Why commands cannot write the project, for a result that failed on it."""
        uid, gid = self.user
        st = self._root_stat
        note = (
            f"the sandbox runs as uid {uid}:{gid} and the project root belongs to uid "
            f"{st.st_uid} (mode {stat.S_IMODE(st.st_mode):o}), so commands cannot write there"
        )
        if (uid, gid) == NOBODY and st.st_uid == 0:
            note += (
                "; ags runs as root and root owns the project, and the sandbox never runs as "
                "root. write_file and edit_file can still change files; for commands to, the "
                "project must belong to a normal user"
            )
        return note

    def run(self, command: str, timeout: float) -> CommandResult:
        """Run ``sh -c command`` in /workspace; kill it and all it started after ``timeout`` s.

        Whatever the command left running is killed when it ends. Raises
        :class:`SandboxError` only when the sandbox itself fails (the engine
        stops answering, a restart fails); a failing command is a result with
        its exit code.
        """
        if self._closed:
            raise SandboxError("the sandbox is closed")
        notice = self._restart(self._broken) if self._broken else None
        seconds = max(1, math.ceil(timeout))
        argv = ["sh", "-c", _WRAPPER, str(seconds), command]
        api = self._client.api
        began = time.monotonic()
        try:
            try:
                exec_id = api.exec_create(self._container.id, argv, stdout=True, stderr=True)["Id"]
                stream = api.exec_start(exec_id, socket=True)
            except docker.errors.APIError:
                stopped = self._stopped()
                if stopped is None:
                    raise
                # It never started: run it in a fresh container.
                notice = self._restart(stopped)
                began = time.monotonic()
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
            if exit_code != 0 and not timed_out:
                stopped = self._stopped(wait=_STOPPING if exit_code in (None, 137) else 0.0)
                if stopped is not None:
                    notice = self._restart(f"{stopped} during this command")
        except SandboxError:
            raise
        except Exception as exc:
            raise _docker_error("the sandbox could not run the command", exc) from exc
        except BaseException:
            # Ctrl-C: the command must not run on unwatched until its timeout.
            self._kill_all()
            raise
        text, truncated = output.text()
        return CommandResult(
            exit_code=None if timed_out else exit_code,
            output=text,
            timed_out=timed_out,
            truncated=truncated,
            duration=time.monotonic() - began,
            notice=notice,
        )

    def close(self) -> None:
        """Remove the container (forced). Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._container is not None:
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

    def _launch(self) -> None:
        """Create and start a container from the config, and check it can run commands."""
        image = self.image
        try:
            self._container = self._client.containers.create(**self._config)
        except docker.errors.ImageNotFound as exc:
            raise ImageMissing(image) from exc
        except Exception as exc:
            raise _docker_error(
                f"could not create a sandbox container from {image!r}", exc
            ) from exc
        try:
            self._container.start()
            probe = self._container.exec_run(["sh", "-c", "command -v timeout >/dev/null"])
        except Exception as exc:
            raise _docker_error(f"could not start the sandbox from {image!r}", exc) from exc
        if probe.exit_code != 0:
            raise SandboxError(
                f"the sandbox image {image!r} lacks a shell or `timeout`; "
                "ags runs commands with sh -c under timeout"
            )

    def _restart(self, reason: str) -> str:
        """Replace the container with a fresh one; the notice for the model."""
        old, self._container = self._container, None
        with contextlib.suppress(Exception):
            old.remove(force=True)
        try:
            self._launch()
        except SandboxError as exc:
            self._broken = reason  # try again at the next command
            raise SandboxError(
                f"the sandbox failed ({reason}) and could not restart: {exc}"
            ) from exc
        self._broken = None
        return (
            f"the sandbox was restarted: {reason}; processes started before and files in /tmp "
            "are gone, the project is as it was"
        )

    def _stopped(self, wait: float = 0.0) -> str | None:
        """Why the container no longer runs commands, or None while it does
        (asking again for up to ``wait`` seconds)."""
        until = time.monotonic() + wait
        while True:
            try:
                self._container.reload()
            except docker.errors.NotFound:
                return "its container was removed"
            state = self._container.attrs.get("State", {})
            if not state.get("Running"):
                break
            if time.monotonic() >= until:
                return None
            time.sleep(_POLL / 2)
        if state.get("OOMKilled"):
            return "its container stopped (out of memory)"
        return f"its container stopped (exit code {state.get('ExitCode')})"

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
                        killed_at = now  # the wrapper has killed the rest on its way out
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
        """SIGKILL every process in the container but PID 1 (the keeper). Should
        that fail, the next command restarts the container instead."""
        try:
            done = self._container.exec_run(["sh", "-c", "kill -KILL -1 2>/dev/null; true"])
            failed = done.exit_code != 0
        except Exception:
            failed = True
        if failed:
            self._broken = "the processes of an interrupted command could not be killed"


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
    """Splits docker's multiplexed exec stream (8-byte header, then payload) into a sink.

    Payload goes to the sink as it arrives: a header may announce any size, and
    only the header is ever buffered.
    """

    def __init__(self, sink: _HeadTail) -> None:
        self.sink = sink
        self._header = bytearray()
        self._left = 0  # payload bytes of the current frame still to come

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._left:
                take = view[: self._left]
                self.sink.add(bytes(take))
                self._left -= len(take)
                view = view[len(take) :]
                continue
            need = 8 - len(self._header)
            self._header += view[:need]
            view = view[need:]
            if len(self._header) == 8:
                _, self._left = struct.unpack(">BxxxL", self._header)
                self._header.clear()


def _number(raw: str | None, name: str, kind: type[_N]) -> _N | None:
    if raw is None or not raw.strip():
        return None
    try:
        return kind(raw)
    except ValueError:
        raise SandboxError(f"{name}={raw!r} is not a number") from None


def _memory_bytes(size: str) -> int:
    units = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    unit = size[-1].lower()
    return int(size[:-1]) * units[unit] if unit in units else int(size)


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
