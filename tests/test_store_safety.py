"""A store another user could tamper with: planted symbolic links, other owners,
loose modes, and exports written where they must not go.

Real files and real links: each test plants a link at one kind of store file,
pointing at a "victim" file outside the store, runs what would write or read
through it, and checks that ags refused and the victim is untouched. Tests
that need a second user run as root (as the tests do here) and chown.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3
import pytest
from click.testing import CliRunner

from cli.main import cli
from objstore import Store, StoreFormatError, UnsafeStore
from objstore.files import atomic_write, write_private_file
from objstore.fsck import check_store
from objstore.search import SearchIndex

VICTIM_TEXT = b"the victim's own file\n"
OTHER_UID = 4242

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM_TEXT)
    return path


def store_with_session(path: Path) -> tuple[str, str]:
    """A closed store with one session of two messages and a sealed pack; (sid, head)."""
    with Store.open(path) as s:
        sid = s.new_session(title="private")
        s.append(sid, {"role": "user", "content": "my secret plan"})
        head = s.append(sid, {"role": "assistant", "content": "noted"})
    return sid, head


def plant(at: Path, target: Path) -> None:
    """Replace whatever is at ``at`` with a symbolic link to ``target``."""
    at.parent.mkdir(parents=True, exist_ok=True)
    if at.exists() or at.is_symlink():
        at.unlink()
    at.symlink_to(target)


def stripe(ref: str) -> str:
    return f"ref-{blake3.blake3(ref.encode()).digest()[0]:02x}"


def append_one(path: Path, sid: str) -> None:
    with Store.open(path) as s:
        s.append(sid, {"role": "user", "content": "one more"})


def retitle(path: Path, sid: str) -> None:
    with Store.open(path) as s:
        s.set_title(sid, "renamed")


def search(path: Path, _sid: str) -> None:
    with Store.open(path) as s, SearchIndex(s) as index:
        index.search("secret")


def repack(path: Path, _sid: str) -> None:
    with Store.open(path) as s:
        s.objects.repack()


def read_everything(path: Path, sid: str) -> None:
    with Store.open(path) as s:
        s.session(sid)
        list(s.log(sid))


def first_pack(path: Path) -> Path:
    return next((path / "objects" / "pack").glob("*.pack"))


# (kind of file, where to plant relative to the store given the session id, what to run)
PLANTS: list[tuple[str, Callable[[Path, str], Path], Callable[[Path, str], None]]] = [
    ("ref stripe lock", lambda p, sid: p / "locks" / stripe(f"sessions/{sid}"), append_one),
    ("writer lock", lambda p, sid: p / "locks" / "sessions" / sid, append_one),
    ("recovery lock", lambda p, sid: p / "locks" / "recovery", read_everything),
    ("repack lock", lambda p, sid: p / "locks" / "repack", repack),
    ("reflog", lambda p, sid: p / "logs" / "sessions" / sid, retitle),  # appends write none
    ("ref", lambda p, sid: p / "refs" / "sessions" / sid, append_one),
    ("store marker", lambda p, sid: p / "ags-store.json", read_everything),
    ("pack", lambda p, sid: first_pack(p), read_everything),
    ("pack index", lambda p, sid: first_pack(p).with_suffix(".idx"), read_everything),
    (
        "unsealed pack",
        lambda p, sid: p / "objects" / "pack" / f"pack-{'ab' * 16}.pack",
        read_everything,
    ),  # fmt: skip
    ("search index", lambda p, sid: p / "cache" / "search.sqlite", search),
    ("search index journal", lambda p, sid: p / "cache" / "search.sqlite-wal", search),
]


@pytest.mark.parametrize(("kind", "where", "run"), PLANTS, ids=[p[0] for p in PLANTS])
def test_a_planted_link_is_refused_and_never_followed(
    tmp_path: Path,
    victim: Path,
    kind: str,
    where: Callable[[Path, str], Path],
    run: Callable[[Path, str], None],
) -> None:
    path = tmp_path / "store"
    sid, _head = store_with_session(path)
    search(path, sid)  # the cache exists, so that its files can be replaced
    link = where(path, sid)
    plant(link, victim)
    with pytest.raises(UnsafeStore, match="symbolic link"):
        run(path, sid)
    assert victim.read_bytes() == VICTIM_TEXT
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644 & ~0o022  # not chmodded either
    assert link.is_symlink(), "ags must not replace what it refuses to follow"


def test_a_planted_loose_object_is_refused(tmp_path: Path, victim: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as s:
        oid = s.objects.put("blob", b'"loose"', pack=False)
    loose = path / "objects" / oid[:2] / oid[2:]
    plant(loose, victim)
    with Store.open(path) as s, pytest.raises(UnsafeStore):
        s.objects.get(oid)
    assert victim.read_bytes() == VICTIM_TEXT


def test_a_planted_temporary_file_is_never_written_through(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temporary names are random; with a known one, the link is not opened."""
    path = tmp_path / "store"
    sid, _head = store_with_session(path)
    monkeypatch.setattr("objstore.files.secrets.token_hex", lambda n: "0" * (2 * n))
    plant(path / "tmp" / f"{os.getpid()}-{'0' * 16}", victim)
    with Store.open(path) as s, pytest.raises(OSError):
        s.set_title(sid, "renamed")  # a full ref update writes its new file in tmp/
    assert victim.read_bytes() == VICTIM_TEXT


def test_the_cli_refuses_a_planted_link_in_one_line(tmp_path: Path, victim: Path) -> None:
    path = tmp_path / "store"
    sid, _head = store_with_session(path)
    plant(path / "logs" / "sessions" / sid, victim)
    result = CliRunner().invoke(cli, ["--store", str(path), "title", sid, "x"])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "symbolic link" in result.stderr and "Traceback" not in result.stderr
    assert victim.read_bytes() == VICTIM_TEXT


@pytest.mark.parametrize("shared", [False, True], ids=["private", "shared"])
@pytest.mark.parametrize(
    "folder", ["objects", "objects/pack", "refs/sessions", "refs/remotes", "logs", "tmp"]
)
def test_a_folder_of_the_layout_that_is_a_link_is_refused_on_open(
    tmp_path: Path, folder: str, shared: bool
) -> None:
    """A file is opened with O_NOFOLLOW, which guards only its last part: a pack
    written into ``objects/pack -> elsewhere`` went elsewhere. The store is refused
    before anything is read or written, shared on purpose or not; the store folder
    itself may be a link (where a user keeps it is theirs to choose)."""
    path = tmp_path / "store"
    sid, _head = store_with_session(path)
    elsewhere = tmp_path / "elsewhere"
    (path / folder).mkdir(mode=0o700, exist_ok=True)  # (refs/remotes: made by a fetch)
    (path / folder).rename(elsewhere)
    (path / folder).symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.rglob("*"))
    for args in (["sessions"], ["title", sid, "renamed"], ["fsck"]):
        result = CliRunner().invoke(
            cli,
            ["--store", str(path), *args],
            env={"AGS_ALLOW_SHARED_STORE": "1" if shared else ""},
        )
        assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
        assert f"{folder} is a symbolic link" in result.stderr
    assert sorted(p.name for p in elsewhere.rglob("*")) == before
    (path / folder).unlink()
    elsewhere.rename(path / folder)
    outer = tmp_path / "outer"
    outer.symlink_to(path)
    with Store.open(outer) as s:
        assert s.session(sid).title == "private"


# -- who owns the store -------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("which", ["", "refs/sessions", "locks", "objects/pack"])
def test_a_store_another_user_owns_is_refused(tmp_path: Path, which: str) -> None:
    path = tmp_path / "store"
    sid, _head = store_with_session(path)
    os.chown(path / which, OTHER_UID, -1)
    with pytest.raises(UnsafeStore, match=f"belongs to uid {OTHER_UID}, not to you"):
        Store.open(path)
    result = CliRunner().invoke(cli, ["--store", str(path), "sessions"])
    assert result.exit_code == 1
    assert "AGS_ALLOW_SHARED_STORE=1" in result.stderr
    assert result.stderr.count("\n") == 1
    with Store.open(path, allow_shared=True) as s:  # knowingly
        assert s.session(sid).title == "private"


@pytest.mark.parametrize("which", ["", "refs", "logs", "tmp", "cache"])
@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777], ids=["0770", "0707", "1777"])
def test_a_store_others_can_write_to_is_refused(
    tmp_path: Path, which: str, mode: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    sid, _head = store_with_session(path)
    (path / which).mkdir(exist_ok=True)
    os.chmod(path / which, mode)
    with pytest.raises(UnsafeStore, match="other users can write to"):
        Store.open(path)
    monkeypatch.setenv("AGS_ALLOW_SHARED_STORE", "1")
    with Store.open(path) as s:
        s.append(sid, {"role": "user", "content": "shared on purpose"})


def test_a_shared_folder_that_is_no_store_is_named_so(tmp_path: Path) -> None:
    """A mistyped --store (/, /tmp, a project) that others can write to is said to be no
    store, not refused with advice to chmod -R all of it; nothing is made in it."""
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    os.chmod(folder, 0o1777)
    with pytest.raises(StoreFormatError, match="is not empty and is not an ags store"):
        Store.open(folder)
    result = CliRunner().invoke(cli, ["--store", str(folder), "ls"])
    assert result.exit_code == 1
    assert result.stderr == f"ags: {folder} is not empty and is not an ags store\n"
    assert os.listdir(folder) == ["notes.txt"]


def test_a_store_others_can_only_read_opens_and_fsck_warns(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store_with_session(path)
    for dirpath, dirs, files in os.walk(path):  # what an older ags left under umask 022
        for d in dirs:
            os.chmod(Path(dirpath, d), 0o755)
        for f in files:
            os.chmod(Path(dirpath, f), 0o644)
    os.chmod(path, 0o755)
    with Store.open(path) as s:
        report = check_store(s)
    assert report.ok
    (warning,) = report.warnings
    assert "can be read by other users" in warning and f"chmod -R go-rwx {path}" in warning
    result = CliRunner().invoke(cli, ["--store", str(path), "fsck"])
    assert result.exit_code == 0
    assert "ags: warning:" in result.stderr


def test_fsck_reports_links_and_files_others_can_write(tmp_path: Path, victim: Path) -> None:
    path = tmp_path / "store"
    sid, _head = store_with_session(path)
    os.chmod(path / "refs" / "sessions" / sid, 0o666)
    (path / "refs" / "tags").mkdir(exist_ok=True)
    plant(path / "refs" / "tags" / "planted", victim)
    with Store.open(path) as s:
        report = check_store(s)
    found = {(p.where, p.what.split(" (")[0]) for p in report.problems}
    assert (f"refs/sessions/{sid}", "other users can write to it") in found
    assert any(w == "refs/tags/planted" and "symbolic link" in what for w, what in found)


# -- modes ----------------------------------------------------------------------------


WORKLOAD = """
import sys
from objstore import Store
from objstore.search import SearchIndex
with Store.open(sys.argv[1]) as s:
    sid = s.new_session(title="t", root="/src")
    for i in range(40):
        s.append(sid, {"role": "user", "content": f"message {i}"}, state={"i": i})
    s.compact(sid, "summary", keep=2)
    fork = s.fork(f"{sid}~3")
    s.append(fork, {"role": "user", "content": "forked"})
    s.tag("t1", sid)
    s.checkout(sid, root="/src")
    s.archive(fork)
    s.objects.put("blob", b'"loose"', pack=False)
    with SearchIndex(s) as index:
        index.search("message")
"""


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o002, 0o077], ids=["000", "022", "002", "077"])
def test_everything_is_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "deep" / "store"
    subprocess.run(
        [sys.executable, "-c", f"import os; os.umask({umask}); exec({WORKLOAD!r})", str(path)],
        check=True,
    )
    seen_files = 0
    for dirpath, dirs, files in os.walk(path):
        for d in dirs:
            assert stat.S_IMODE(os.lstat(Path(dirpath, d)).st_mode) == 0o700, d
        for f in files:
            st = os.lstat(Path(dirpath, f))
            assert stat.S_ISREG(st.st_mode)
            assert stat.S_IMODE(st.st_mode) == 0o600, f"{dirpath}/{f}"
            seen_files += 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert seen_files > 10
    assert (path / "cache" / "search.sqlite").exists()
    assert list((path / "locks" / "sessions").iterdir()), "writer lock files checked too"


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_export_to_a_file_is_0600_and_replaces_a_regular_file(
    tmp_path: Path, umask_022: None
) -> None:
    path = tmp_path / "store"
    sid, _head = store_with_session(path)
    out = tmp_path / "out.json"
    out.write_text("old")
    os.chmod(out, 0o644)
    result = CliRunner().invoke(cli, ["--store", str(path), "export", sid, "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert b"my secret plan" in out.read_bytes()
    new = tmp_path / "new.json"
    result = CliRunner().invoke(cli, ["--store", str(path), "export", sid, "-o", str(new)])
    assert result.exit_code == 0
    assert stat.S_IMODE(new.stat().st_mode) == 0o600


def test_export_to_dash_is_stdout_and_a_missing_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-o -`` wrote a file named ``-``, and ``-o nodir/x.json`` made the folder."""
    path = tmp_path / "store"
    sid, _head = store_with_session(path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["--store", str(path), "export", sid, "-o", "-"])
    assert result.exit_code == 0 and b"my secret plan" in result.stdout_bytes
    missing = tmp_path / "nodir" / "x.json"
    result = CliRunner().invoke(cli, ["--store", str(path), "export", sid, "-o", str(missing)])
    assert result.exit_code == 1
    assert result.stderr == f"ags: cannot write {missing}: no folder {missing.parent}\n"
    under_a_file = tmp_path / "store" / "ags-store.json" / "x.json"  # a file for a folder
    result = CliRunner().invoke(cli, ["--store", str(path), "export", sid, "-o", str(under_a_file)])
    assert result.exit_code == 1
    assert result.stderr == (
        f"ags: cannot write {under_a_file}: {under_a_file.parent} is not a folder\n"
    )
    result = CliRunner().invoke(cli, ["--store", str(path), "export", sid, "-o", ""])
    assert result.exit_code == 2 and "give a file name, or - for stdout" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


@pytest.mark.parametrize("what", ["fifo", "symlink", "device"])
def test_export_refuses_a_fifo_a_symlink_or_a_device(
    tmp_path: Path, victim: Path, what: str
) -> None:
    path = tmp_path / "store"
    sid, _head = store_with_session(path)
    out = tmp_path / "out.json"
    if what == "fifo":
        os.mkfifo(out)
    elif what == "symlink":
        out.symlink_to(victim)
    else:
        out = Path("/dev/null")
    before = os.lstat(out)
    result = CliRunner().invoke(cli, ["--store", str(path), "export", sid, "-o", str(out)])
    assert result.exit_code == 1
    expected = {"fifo": "a FIFO", "symlink": "a symbolic link", "device": "a character device"}
    assert f"it is {expected[what]}" in result.stderr
    assert result.stderr.count("\n") == 1
    after = os.lstat(out)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert victim.read_bytes() == VICTIM_TEXT
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "no temporary file left"


def test_write_private_file_leaves_nothing_behind_when_refusing(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(Exception, match="FIFO"):
        write_private_file(fifo, b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_an_export_killed_before_its_rename_leaves_a_file_the_next_export_removes(
    tmp_path: Path,
) -> None:
    """A writer killed between its write and its rename cannot remove its temporary
    file. It is named after the target and the writer's process, and the next write
    to that target removes those whose process has ended, and only those."""
    out = tmp_path / "session.json"
    ended = subprocess.Popen(["true"])
    ended.wait()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        left = tmp_path / f".session.json.{ended.pid}-0123456789abcdef.tmp"
        under_way = tmp_path / f".session.json.{sleeper.pid}-0123456789abcdef.tmp"
        other_target = tmp_path / f".notes.json.{ended.pid}-0123456789abcdef.tmp"
        for path in (left, under_way, other_target):
            path.write_bytes(b'{"half": ')
        write_private_file(out, b"{}")
        assert out.read_bytes() == b"{}"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [out.name, under_way.name, other_target.name]
        )
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_atomic_write_refused_at_its_rename_leaves_no_temporary_file(tmp_path: Path) -> None:
    """Where the rename fails (a directory in the way, a folder the user cannot write
    to), the temporary file goes too: before, each such write left one in tmp/."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "in-the-way").mkdir()
    (tmp_path / "in-the-way" / "keep").write_text("x")
    with pytest.raises(OSError):
        atomic_write(tmp_path / "tmp", tmp_path / "in-the-way", b"data")
    assert os.listdir(tmp_path / "tmp") == []
    assert os.listdir(tmp_path / "in-the-way") == ["keep"]
