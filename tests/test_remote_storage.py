"""A remote's storage, on a real SeaweedFS and in a real directory: the same tests
for both backends, then what only one of them has (errors, credentials, modes)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import read_only_mount
from s3_server import (  # noqa: F401
    S3Server,
    aws_env_fixture,
    free_ports,
    s3_env_fixture,
    s3rver_fixture,
    seaweedfs_fixture,
)

from objstore import InvalidInput
from objstore.remote import (
    AccessDenied,
    BadRemote,
    BucketMissing,
    Cell,
    ConditionalWritesIgnored,
    DamagedRemoteKey,
    KeyMissing,
    NoCredentials,
    RemoteError,
    RemoteStorage,
    RemoteUnreachable,
    SwapFailed,
    directory,
)
from objstore.remote.directory import DirectoryStorage
from objstore.remote.s3 import S3Storage
from objstore.remote.storage import PROBE_PREFIX


@pytest.fixture(params=["directory", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RemoteStorage]:
    if request.param == "directory":
        (tmp_path / "remote").mkdir()
        backend: RemoteStorage = DirectoryStorage(tmp_path / "remote")
    else:
        server: S3Server = request.getfixturevalue("s3_env")
        backend = S3Storage(server.new_bucket(), "team/ags", endpoint=server.endpoint)
    with backend:
        yield backend


# -- write once, read, list, delete ---------------------------------------------


def test_put_new_writes_a_key_once_and_never_replaces_it(storage: RemoteStorage) -> None:
    assert storage.put_new("packs/pack-1.pack", b"first") is True
    assert storage.put_new("packs/pack-1.pack", b"second") is False
    assert storage.get("packs/pack-1.pack") == b"first"


def test_get_and_head_of_a_missing_key(storage: RemoteStorage) -> None:
    with pytest.raises(KeyMissing, match="no key refs/nothing"):
        storage.get("refs/nothing")
    assert storage.head("refs/nothing") is None


def test_head_gives_size_etag_and_the_age(storage: RemoteStorage) -> None:
    before = datetime.now(UTC) - timedelta(seconds=2)  # LastModified has 1 s resolution
    storage.put_new("packs/a", b"x" * 1000)
    info = storage.head("packs/a")
    assert info is not None
    assert (info.key, info.size) == ("packs/a", 1000)
    assert info.etag
    assert before <= info.modified <= datetime.now(UTC) + timedelta(seconds=2)
    assert info.modified.tzinfo is not None


def test_list_pages_through_every_key_once(
    storage: RemoteStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("objstore.remote.s3.LIST_PAGE", 7)  # 40 keys: 6 pages
    keys = [f"refs/sessions/{i:04x}" for i in range(37)] + ["refs/a-b", "refs/a/b", "refsx"]
    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(lambda k: storage.put_new(k, k.encode()), keys))
    listed = [info.key for info in storage.list("refs/")]
    # Each once; the order is the server's (SeaweedFS puts refs/a/b before refs/a-b).
    assert sorted(listed) == sorted(k for k in keys if k.startswith("refs/"))
    assert len(listed) == len(set(listed)) == 39
    assert sorted(i.key for i in storage.list("refs/sessions/001")) == [
        f"refs/sessions/{i:04x}" for i in range(16, 32)
    ]
    assert [(i.key, i.size) for i in storage.list("refsx")] == [("refsx", 5)]
    assert list(storage.list("nothing/")) == []


def test_a_directory_remote_lists_in_byte_order(tmp_path: Path) -> None:
    storage = DirectoryStorage(tmp_path)
    for key in ("r/a/b", "r/a-b", "r/b", "r/a0"):
        storage.put_new(key, b"x")
    assert [i.key for i in storage.list("r/")] == ["r/a-b", "r/a/b", "r/a0", "r/b"]


def test_delete_removes_keys_and_ignores_absent_ones(storage: RemoteStorage) -> None:
    for k in ("packs/1", "packs/2", "packs/3"):
        storage.put_new(k, b"x")
    storage.delete("packs/1", "packs/3", "packs/never-there")
    assert [i.key for i in storage.list("packs/")] == ["packs/2"]
    storage.delete("packs/2")
    assert list(storage.list()) == []
    assert storage.put_new("packs/2", b"again")  # its "directory" comes back


@pytest.mark.parametrize(
    "key", ["", "/abs", "a//b", "a/", "../up", "a/../b", ".hidden", "a/.b", "a b", "é", "a\0b"]
)
def test_keys_that_are_not_keys_are_refused_before_anything_is_sent(
    storage: RemoteStorage, key: str
) -> None:
    with pytest.raises(BadRemote, match="bad remote key"):
        storage.put_new(key, b"x")
    for op in (storage.get, storage.head, storage.read_cell, storage.delete):
        with pytest.raises(BadRemote):
            op(key)


# -- compare-and-swap cells -----------------------------------------------------------


def test_a_cell_is_created_then_swapped_generation_by_generation(storage: RemoteStorage) -> None:
    empty = storage.read_cell("refs/s")
    assert (empty.generation, empty.value, empty.exists) == (0, None, False)
    one = storage.swap(empty, {"target": "n1"})
    assert (one.generation, one.value) == (1, {"target": "n1"})
    assert storage.read_cell("refs/s") == one
    two = storage.swap(one, {"target": "n2"})
    assert storage.read_cell("refs/s") == two
    assert two.generation == 2
    assert storage.get("refs/s") == b'{"generation":2,"value":{"target":"n2"}}\n'


def test_a_swap_from_a_stale_read_fails_and_says_what_is_there(storage: RemoteStorage) -> None:
    first = storage.swap(storage.read_cell("refs/s"), "a")
    winner = storage.swap(first, "b")
    with pytest.raises(SwapFailed) as lost:
        storage.swap(first, "c")
    assert lost.value.current == winner
    assert storage.read_cell("refs/s").value == "b"


def test_two_creates_of_one_cell_one_wins(storage: RemoteStorage) -> None:
    empty = storage.read_cell("refs/new")
    storage.swap(empty, "mine")
    with pytest.raises(SwapFailed) as lost:
        storage.swap(empty, "theirs")
    assert lost.value.current is not None and lost.value.current.value == "mine"


def test_a_body_back_at_an_old_value_does_not_let_a_stale_swap_through(
    storage: RemoteStorage,
) -> None:
    """A -> B -> A: S3 etags are content hashes, so without the generation in the
    body the last write would have the first one's etag, and a writer still
    holding the first read would win a swap it must lose."""
    a = storage.swap(storage.read_cell("refs/s"), "A")
    b = storage.swap(a, "B")
    a_again = storage.swap(b, "A")
    assert a_again.etag != a.etag
    with pytest.raises(SwapFailed):
        storage.swap(a, "C")
    assert storage.read_cell("refs/s") == a_again


def test_a_swap_whose_write_landed_before_a_retry_is_a_success(storage: RemoteStorage) -> None:
    """The client's first attempt lands, its answer is lost, the retry is refused
    (412): reading the key back shows the swap's own body, so it succeeded."""
    empty = storage.read_cell("refs/s")
    storage.put_new("refs/s", b'{"generation":1,"value":"mine"}\n')  # the first attempt
    done = storage.swap(empty, "mine")
    assert (done.generation, done.value) == (1, "mine")
    storage.swap(done, "next")  # and its etag is the real one


def test_a_key_that_is_not_a_cell_is_damage(storage: RemoteStorage) -> None:
    for key, body in [("refs/a", b"not json"), ("refs/b", b'{"generation":0,"value":1}'),
                      ("refs/c", b'{"value":1}'), ("refs/d", b'{"generation":1}')]:  # fmt: skip
        storage.put_new(key, body)
        with pytest.raises(DamagedRemoteKey, match=f"{key} is not a cell"):
            storage.read_cell(key)


def test_a_cell_value_must_be_json(storage: RemoteStorage) -> None:
    with pytest.raises(InvalidInput, match="not a JSON number"):
        storage.swap(storage.read_cell("refs/s"), {"nan": float("nan")})
    assert storage.head("refs/s") is None


# -- the connect-time check -----------------------------------------------------------


def test_check_passes_where_conditional_writes_are_enforced(storage: RemoteStorage) -> None:
    storage.check()
    assert list(storage.list(PROBE_PREFIX)) == []  # the scratch keys are gone


def test_a_server_that_ignores_conditional_writes_is_refused(
    s3rver: S3Server, aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """s3rver (npm) takes If-None-Match: * and If-Match and ignores both: a real
    server of the kind the check exists for."""
    for name, value in s3rver.env().items():
        monkeypatch.setenv(name, value)
    bucket = s3rver.new_bucket()
    with S3Storage(bucket, endpoint=s3rver.endpoint) as storage:
        with pytest.raises(ConditionalWritesIgnored, match="If-None-Match: \\* write of one key"):
            storage.check()
        assert list(storage.list()) == []  # the scratch key is gone


# -- S3: where credentials come from, and what goes wrong --------------------------------


def test_a_write_cut_off_after_its_headers_leaves_no_key(s3_env: S3Server) -> None:
    """A writer killed between a PUT's headers and its body (botocore waits for
    ``100 Continue`` there): SeaweedFS stored an empty object from such a request
    unless it carries the body's MD5, and an empty pack or cell reads as damage. The
    request ags makes, sent without its body, leaves nothing."""

    class Stop(Exception):
        pass

    with S3Storage(s3_env.new_bucket(), endpoint=s3_env.endpoint) as storage:
        made: list[tuple[str, dict[str, str]]] = []

        def keep_and_stop(request: Any, **_: Any) -> None:
            made.append((request.url, {k: _text(v) for k, v in request.headers.items()}))
            raise Stop  # nothing goes on the wire

        storage._client.meta.events.register("before-send.s3.PutObject", keep_and_stop)
        for key, body in (("packs/a-pack", b"a pack" * 1000), ("refs/a-cell", b'{"a": 1}')):
            with pytest.raises(Stop):
                storage.put_new(key, body)
        storage._client.meta.events.unregister("before-send.s3.PutObject", keep_and_stop)
        for url, headers in made:
            where = urlsplit(url)
            headers.pop("Expect", None)
            with socket.create_connection((where.hostname or "", where.port or 80)) as s:
                request = f"PUT {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\n"
                request += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                s.sendall(request.encode() + b"\r\n")  # and no body: the sender is gone
                s.shutdown(socket.SHUT_WR)
                s.recv(4096)  # the server's answer, whatever it is
        assert storage.head("packs/a-pack") is None
        assert storage.head("refs/a-cell") is None
        storage.put_new("packs/a-pack", b"a pack" * 1000)  # and the real write goes in
        assert storage.get("packs/a-pack") == b"a pack" * 1000


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def test_credentials_from_a_profile_in_the_shared_credentials_file(
    seaweedfs: S3Server, aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (aws_env / "credentials").write_text(
        f"[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n"
        f"[team]\naws_access_key_id = {seaweedfs.access_key}\n"
        f"aws_secret_access_key = {seaweedfs.secret_key}\n"
    )
    monkeypatch.setenv("AWS_PROFILE", "team")
    with S3Storage(seaweedfs.new_bucket(), endpoint=seaweedfs.endpoint) as storage:
        storage.check()


def test_credentials_from_home_aws_credentials(
    seaweedfs: S3Server, aws_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = {seaweedfs.access_key}\n"
        f"aws_secret_access_key = {seaweedfs.secret_key}\n"
    )
    with S3Storage(seaweedfs.new_bucket(), endpoint=seaweedfs.endpoint) as storage:
        storage.check()


def test_the_region_comes_from_the_remote_then_the_environment_then_the_profile(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (aws_env / "config").write_text("[default]\nregion = eu-north-1\n")
    assert S3Storage("b").region == "eu-north-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-2")
    assert S3Storage("b").region == "eu-west-2"
    monkeypatch.setenv("AWS_REGION", "eu-west-3")  # what AWS's other SDKs and CLI read
    assert S3Storage("b").region == "eu-west-3"
    assert S3Storage("b", region="ap-south-1").region == "ap-south-1"


def test_no_credentials_anywhere(seaweedfs: S3Server, aws_env: Path) -> None:
    storage = S3Storage(seaweedfs.new_bucket(), endpoint=seaweedfs.endpoint)
    with storage, pytest.raises(NoCredentials, match="AWS_ACCESS_KEY_ID .* ~/.aws/credentials"):
        storage.check()


def test_a_profile_that_does_not_exist(
    seaweedfs: S3Server, aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_PROFILE", "nobody")
    with pytest.raises(NoCredentials, match="nobody"):
        S3Storage("bucket", endpoint=seaweedfs.endpoint)


def test_a_wrong_secret_is_access_denied_and_never_printed(
    s3_env: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_env.new_bucket()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    with S3Storage(bucket, endpoint=s3_env.endpoint) as storage:
        for attempt in (storage.check, lambda: storage.get("refs/x")):
            with pytest.raises(AccessDenied, match="access denied") as denied:
                attempt()
            assert "not-the-secret-at-all" not in str(denied.value)
            assert s3_env.access_key not in str(denied.value)
            assert "\n" not in str(denied.value)


def test_credentials_that_may_only_read_fail_the_check_on_the_first_write(
    s3_env: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from s3_server import READER_KEY, READER_SECRET

    bucket = s3_env.new_bucket()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", READER_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READER_SECRET)
    with S3Storage(bucket, endpoint=s3_env.endpoint) as storage:
        assert list(storage.list()) == []  # reading is allowed
        with pytest.raises(AccessDenied, match="while writing probe/"):
            storage.check()  # the error of the write, not of the clean-up after it
        with pytest.raises(AccessDenied, match="deleting packs/x: AccessDenied"):
            storage.delete("packs/x")


def test_a_cell_made_by_hand_with_a_bad_key_is_refused(storage: RemoteStorage) -> None:
    with pytest.raises(BadRemote, match="bad remote key"):
        storage.swap(Cell("../outside", 0, None, None), "x")


def test_a_missing_bucket(s3_env: S3Server) -> None:
    with S3Storage("no-such-bucket-here", endpoint=s3_env.endpoint) as storage:
        with pytest.raises(BucketMissing, match="bucket no-such-bucket-here does not exist"):
            storage.check()
        with pytest.raises(BucketMissing):
            storage.put_new("packs/x", b"x")
        with pytest.raises(BucketMissing):
            list(storage.list())


def test_an_endpoint_that_is_down(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    (port,) = free_ports(1)
    storage = S3Storage("bucket", endpoint=f"http://127.0.0.1:{port}")
    with storage, pytest.raises(RemoteUnreachable, match=f"cannot reach http://127.0.0.1:{port}"):
        storage.check()


# -- the directory backend -------------------------------------------------------------


def test_a_directory_remote_that_is_not_there_is_not_made(tmp_path: Path) -> None:
    """A USB disk that is not mounted: nothing may be written to the disk below."""
    storage = DirectoryStorage(tmp_path / "usb" / "ags")
    with pytest.raises(BucketMissing, match="no such directory"):
        storage.check()
    with pytest.raises(BucketMissing):
        storage.put_new("packs/x", b"x")
    with pytest.raises(BucketMissing):
        storage.swap(Cell("refs/s", 0, None, None), "x")
    with pytest.raises(BucketMissing):
        storage.read_cell("refs/s")
    assert not (tmp_path / "usb").exists()


def test_a_directory_remote_that_is_a_file_says_so(tmp_path: Path) -> None:
    """``ags clone FILE`` said "FILE: no such directory" of a file that is there."""
    (tmp_path / "notes").write_text("mine\n")
    storage = DirectoryStorage(tmp_path / "notes")
    for op in (storage.check, lambda: storage.read_cell("refs/s"), lambda: storage.get("x")):
        with pytest.raises(BucketMissing, match="notes: not a directory$"):
            op()
    assert (tmp_path / "notes").read_text() == "mine\n"


def test_a_directory_remote_is_private_and_keeps_its_own_files_out_of_listings(
    tmp_path: Path,
) -> None:
    root = tmp_path / "remote"
    root.mkdir()
    storage = DirectoryStorage(root)
    storage.put_new("packs/p", b"x")
    storage.swap(storage.read_cell("refs/s"), 1)
    assert [i.key for i in storage.list()] == ["packs/p", "refs/s"]
    assert stat.S_IMODE(os.stat(root / "packs" / "p").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(root / "packs").st_mode) == 0o700
    assert sorted(os.listdir(root)) == [".ags-locks", ".ags-tmp", "packs", "refs"]
    assert os.listdir(root / ".ags-tmp") == []


def test_reading_a_directory_remote_writes_nothing(tmp_path: Path) -> None:
    """So a remote on a read-only disk (or someone else's) can be fetched from."""
    root = tmp_path / "remote"
    (root / "packs").mkdir(parents=True)
    (root / "packs" / "p").write_bytes(b"x")
    storage = DirectoryStorage(root)
    assert storage.get("packs/p") == b"x"
    assert storage.head("packs/p") is not None
    assert storage.read_cell("refs/s").generation == 0
    assert [i.key for i in storage.list()] == ["packs/p"]
    assert os.listdir(root) == ["packs"]


# -- requests counted where they leave the process -------------------------------------


def test_requests_and_bytes_are_counted_on_the_wire(s3_env: S3Server) -> None:
    """What phase 2 counts to show that a push of one message costs O(1) requests."""
    with S3Storage(s3_env.new_bucket(), "p", endpoint=s3_env.endpoint) as storage:
        stats = storage.stats
        storage.check()  # HEAD bucket; 4 conditional PUTs; GET; DeleteObjects
        assert stats.requests == 7
        sent = stats.bytes_sent
        storage.put_new("packs/a", b"x" * 10_000)
        assert (stats.requests, stats.bytes_sent - sent) == (8, 10_000)
        cell = storage.swap(storage.read_cell("refs/s"), "n1")  # GET, PUT
        storage.swap(cell, "n2")  # PUT
        assert stats.requests == 11
        received = stats.bytes_received
        assert storage.get("packs/a") == b"x" * 10_000
        assert (stats.requests, stats.bytes_received - received) == (12, 10_000)


def test_a_directory_remote_counts_its_file_operations(tmp_path: Path) -> None:
    storage = DirectoryStorage(tmp_path)
    storage.put_new("packs/a", b"x" * 100)
    storage.get("packs/a")
    storage.swap(storage.read_cell("refs/s"), 1)
    assert (storage.stats.requests, storage.stats.bytes_sent) == (4, 100 + 27)
    assert storage.stats.bytes_received == 100


def test_a_directory_remote_on_a_read_only_disk_can_be_read_not_written(tmp_path: Path) -> None:
    """A read-only bind mount: a real read-only file system, which root cannot write either."""

    source = tmp_path / "disk"
    (source / "packs").mkdir(parents=True)
    (source / "packs" / "p").write_bytes(b"x")
    with read_only_mount(source, tmp_path / "ro") as mounted:
        storage = DirectoryStorage(mounted)
        assert storage.get("packs/p") == b"x"
        assert storage.read_cell("refs/s").generation == 0
        assert [i.key for i in storage.list()] == ["packs/p"]
        with pytest.raises(RemoteError, match="not writable"):
            storage.check()
        with pytest.raises(RemoteError, match="not writable"):
            storage.put_new("packs/q", b"y")


def test_directory_writes_beside_deletes_of_neighbours_never_fail(tmp_path: Path) -> None:
    """A delete prunes the "directory" it emptied; a write of a neighbouring key that
    meets it gone makes it again, however often the two cross."""
    root = tmp_path / "remote"
    root.mkdir()
    errors: list[BaseException] = []

    def churn(me: int) -> None:
        with DirectoryStorage(str(root)) as storage:
            for i in range(300):
                key = f"probe/t{me}-{i}"
                try:
                    storage.put_new(key, b"x")
                    storage.delete(key)
                except BaseException as e:  # noqa: BLE001 - collected for the assert
                    errors.append(e)
                    return

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_directory_write_outlasts_prunes_that_cross_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race above made to happen: a neighbour's delete prunes the "directory" a
    write has just made, before the write renames into it (every other time while
    the write is still making it), several times in a row. The write lands, durable
    in its directory; a write that loses every try fails in one RemoteError and
    leaves no temporary file behind."""
    root = tmp_path / "remote"
    root.mkdir()
    real_open = directory._Folders._open
    crossings = [0]

    def made_then_pruned(folders: directory._Folders, part: str, make: bool) -> int | None:
        fd = real_open(folders, part, make)
        if crossings[0] and fd is not None and make:
            crossings[0] -= 1
            os.rmdir(part, dir_fd=folders.fds[-1])  # the neighbour's prune
            if crossings[0] % 2:
                os.close(fd)
                raise FileNotFoundError(2, "No such file or directory", part)
        return fd  # (of a folder removed: a rename into it fails as the prune's did)

    monkeypatch.setattr(directory._Folders, "_open", made_then_pruned)
    with DirectoryStorage(str(root)) as storage:
        crossings[0] = 6
        assert storage.put_new("probe/a", b"landed")
        assert crossings[0] == 0 and storage.get("probe/a") == b"landed"
        crossings[0] = directory.PRUNE_RACE_TRIES
        with pytest.raises(RemoteError, match="No such file or directory"):
            storage.put_new("other/b", b"lost")
    assert not (root / "other").exists() and os.listdir(root / ".ags-tmp") == []


def test_a_directory_listing_beside_deletes_in_another_process_never_fails(
    tmp_path: Path,
) -> None:
    """A key deleted between the listing's scan and its stat is left out, as S3 leaves
    out a key deleted while it lists: remote gc lists ``probe/`` while a push's check
    deletes its scratch keys there (this raised "No such file or directory")."""
    root = tmp_path / "remote"
    root.mkdir()
    churn = (
        "import secrets, sys, time\n"
        "from objstore.remote.directory import DirectoryStorage\n"
        "s = DirectoryStorage(sys.argv[1])\n"
        "end = time.monotonic() + float(sys.argv[2])\n"
        "while time.monotonic() < end:\n"
        "    keys = [f'probe/{secrets.token_hex(16)}' for _ in range(5)]\n"
        "    for k in keys:\n"
        "        s.put_new(k, b'x')\n"
        "    s.delete(*keys)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", churn, str(root), "4"], cwd=Path(__file__).parent.parent
    )
    listings = 0
    try:
        with DirectoryStorage(root) as storage:
            while proc.poll() is None:
                list(storage.list(PROBE_PREFIX))  # RemoteError before the fix
                listings += 1
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode in (0, -9) and listings > 1000
