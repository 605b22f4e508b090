"""ConfinedFS on real files: what it reaches, what it refuses, what it leaves behind.

The race against a real sandbox swapping directories for symlinks is in
test_tools.py, where it drives the tools the model calls.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from hazards import deadline, deep_tree

from agent.confined import (
    MAX_DEPTH,
    ConfinedFS,
    Entry,
    FileTooLarge,
    NotRegularFile,
    OutsideRoot,
    Written,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "src").mkdir(parents=True)
    (r / "src" / "app.py").write_text("print(1)\n")
    (r / "README").write_text("hello\n")
    (tmp_path / "secret").write_text("SECRET\n")
    (tmp_path / "outside").mkdir()
    return r


@pytest.fixture
def fs(root: Path) -> Iterator[ConfinedFS]:
    with ConfinedFS(root, aliases=("/workspace",)) as f:
        yield f


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*ags-tmp*"))


# -- reaching what is inside


def test_reads_and_writes_inside(fs: ConfinedFS, root: Path) -> None:
    assert fs.read_bytes("src/app.py", 100) == b"print(1)\n"
    assert fs.read_bytes("/workspace/README", 100) == b"hello\n"
    assert fs.read_bytes(f"{root}/src/../README", 100) == b"hello\n"
    assert fs.read_bytes("/./workspace//src/./app.py", 100) == b"print(1)\n"
    assert fs.write_bytes("src/new.py", b"x = 1\n") == Written("src/new.py", created=True)
    assert fs.write_bytes("./src//new.py", b"x = 2\n") == Written("src/new.py", created=False)
    assert (root / "src" / "new.py").read_bytes() == b"x = 2\n"
    assert fs.write_bytes("a/b/c.txt", b"deep") == Written("a/b/c.txt", created=True)
    assert (root / "a" / "b" / "c.txt").read_bytes() == b"deep"
    assert leftovers(root) == []


def test_symlinks_that_stay_inside_are_followed(fs: ConfinedFS, root: Path) -> None:
    (root / "rel").symlink_to("src/app.py")
    (root / "abs-host").symlink_to(root / "src" / "app.py")  # the host's path of the root
    (root / "abs-sandbox").symlink_to("/workspace/src/app.py")  # made in the sandbox
    (root / "src" / "up").symlink_to("../README")
    (root / "dir-link").symlink_to("src")
    for name in ("rel", "abs-host", "abs-sandbox", "dir-link/app.py"):
        assert fs.read_bytes(name, 100) == b"print(1)\n", name
    assert fs.read_bytes("src/up", 100) == b"hello\n"
    assert fs.resolve("dir-link/app.py") == "src/app.py"
    # A write through a link replaces the target's content; the link stays a link.
    assert fs.write_bytes("rel", b"print(2)\n") == Written("src/app.py", created=False)
    assert (root / "rel").is_symlink()
    assert (root / "src" / "app.py").read_bytes() == b"print(2)\n"
    # A dangling link inside: the write makes its target.
    (root / "later").symlink_to("src/later.py")
    assert fs.write_bytes("later", b"ok") == Written("src/later.py", created=True)


@pytest.mark.parametrize(
    "path",
    [
        "..",
        "../secret",
        "src/../../secret",
        "/etc/passwd",
        "/workspace/../secret",
        "link-up/secret",
        "link-abs/secret",
        "link-file",
        "src/link-climb/secret",
        "chain/secret",
        "dangling-out",
    ],
)
def test_paths_that_leave_the_root_are_refused_for_every_operation(
    fs: ConfinedFS, root: Path, path: str
) -> None:
    outside = root.parent
    (root / "link-up").symlink_to("..")
    (root / "link-abs").symlink_to(outside)
    (root / "link-file").symlink_to(outside / "secret")
    (root / "src" / "link-climb").symlink_to("../..")
    (root / "chain").symlink_to("src/link-climb")
    (root / "dangling-out").symlink_to(outside / "outside" / "made-by-a-write")
    before = sorted(os.listdir(outside)), (outside / "secret").read_bytes()

    with pytest.raises(OutsideRoot):
        fs.read_bytes(path, 1000)
    with pytest.raises(OutsideRoot):
        fs.write_bytes(path, b"pwned")
    with pytest.raises(OutsideRoot):
        list(fs.walk(path, recursive=True, limit=100))

    assert (sorted(os.listdir(outside)), (outside / "secret").read_bytes()) == before
    assert os.listdir(outside / "outside") == []


def test_a_symlink_loop_is_an_error_not_a_hang(fs: ConfinedFS, root: Path) -> None:
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    with pytest.raises(OSError) as caught:
        fs.read_bytes("a", 10)
    assert caught.value.errno == errno.ELOOP
    assert caught.value.filename == "a"


# -- only regular files, bounded


def test_a_fifo_is_refused_at_once_not_opened(fs: ConfinedFS, root: Path) -> None:
    os.mkfifo(root / "pipe")
    (root / "to-pipe").symlink_to("pipe")
    with deadline(5):  # the old tools blocked here forever
        for path in ("pipe", "to-pipe"):
            with pytest.raises(NotRegularFile, match="is a FIFO"):
                fs.read_bytes(path, 10)
            with pytest.raises(NotRegularFile):
                fs.write_bytes(path, b"x")
    assert stat.S_ISFIFO((root / "pipe").lstat().st_mode)


def test_a_socket_is_refused(fs: ConfinedFS, root: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(root / "sock"))
        with pytest.raises(NotRegularFile, match="is a socket"):
            fs.read_bytes("sock", 10)


def test_a_directory_is_not_a_file(fs: ConfinedFS) -> None:
    with pytest.raises(IsADirectoryError):
        fs.read_bytes("src", 10)
    with pytest.raises(IsADirectoryError):
        fs.write_bytes("src", b"x")
    with pytest.raises(NotADirectoryError):
        list(fs.walk("README", recursive=False, limit=10))


def test_whole_file_reads_stop_at_the_limit(fs: ConfinedFS, root: Path) -> None:
    (root / "big").write_bytes(b"x" * 10_001)
    with pytest.raises(FileTooLarge) as caught:
        fs.read_bytes("big", 10_000)
    assert (caught.value.size, caught.value.limit) == (10_001, 10_000)
    assert fs.read_bytes("big", 10_001) == b"x" * 10_001


# -- writes


def test_a_write_keeps_the_mode_drops_set_id_bits_and_leaves_no_temp(
    fs: ConfinedFS, root: Path
) -> None:
    script = root / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o4751)
    fs.write_bytes("run.sh", b"#!/bin/sh\necho hi\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o751
    assert leftovers(root) == []


def test_a_failed_write_leaves_the_old_file_and_no_temp(fs: ConfinedFS, root: Path) -> None:
    (root / "taken").mkdir()
    (root / "taken" / "child").write_text("x")
    with pytest.raises(IsADirectoryError):
        fs.write_bytes("taken", b"y")
    with pytest.raises(NotADirectoryError):
        fs.write_bytes("README/inside", b"y")  # a file where a directory should be
    assert (root / "README").read_text() == "hello\n"
    assert leftovers(root) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root process changes owners")
def test_as_root_new_files_belong_to_the_roots_owner_and_replaced_ones_keep_theirs(
    root: Path,
) -> None:
    os.chown(root, 4242, 4343)
    (root / "theirs").write_text("a")
    os.chown(root / "theirs", 5000, 5001)
    with ConfinedFS(root) as fs:
        fs.write_bytes("made/here.txt", b"new")
        fs.write_bytes("theirs", b"b")
    for made in (root / "made", root / "made" / "here.txt"):
        assert (made.stat().st_uid, made.stat().st_gid) == (4242, 4343)
    theirs = (root / "theirs").stat()
    assert (theirs.st_uid, theirs.st_gid) == (5000, 5001)


def test_remove_takes_the_link_not_its_target(fs: ConfinedFS, root: Path) -> None:
    (root / "alias").symlink_to("README")
    fs.remove("alias")
    assert not (root / "alias").exists() and (root / "README").exists()
    fs.remove("src/app.py")
    assert not (root / "src" / "app.py").exists()
    with pytest.raises(FileNotFoundError):
        fs.remove("src/app.py")
    with pytest.raises(OutsideRoot):
        fs.remove("../secret")
    assert (root.parent / "secret").exists()


def test_kind(fs: ConfinedFS, root: Path) -> None:
    os.mkfifo(root / "pipe")
    assert [fs.kind(p) for p in ("README", "src", "pipe", "nothing", "src/nothing")] == [
        "file",
        "dir",
        "other",
        None,
        None,
    ]


# -- listings


def test_walk_is_sorted_depth_first_without_entering_symlinks(fs: ConfinedFS, root: Path) -> None:
    (root / ".git").mkdir()
    (root / "src" / "pkg").mkdir()
    (root / "src" / "pkg" / "mod.py").touch()
    (root / "src-link").symlink_to("src")
    entries = list(fs.walk(".", recursive=True, limit=100, skip=frozenset({".git"})))
    assert entries == [
        Entry("README", False),
        Entry("src", True),
        Entry("src/app.py", False),
        Entry("src/pkg", True),
        Entry("src/pkg/mod.py", False),
        Entry("src-link", False),
    ]
    assert list(fs.walk("src-link", recursive=False, limit=100)) == [
        Entry("src/app.py", False),
        Entry("src/pkg", True),
    ]


def test_walk_stops_at_its_limit_with_memory_bounded_by_it(fs: ConfinedFS, root: Path) -> None:
    many = root / "many"
    many.mkdir()
    for n in range(20_000):
        (many / f"f{n:05}").touch()
    tracemalloc.start()
    try:
        entries = list(fs.walk("many", recursive=False, limit=10))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert entries == [Entry(f"many/f{n:05}", False) for n in range(10)] + [None]
    assert peak < 200_000, f"listing 10 of 20,000 entries peaked at {peak} bytes"


def test_walk_of_a_very_deep_tree_neither_recurses_nor_runs_out_of_fds(
    fs: ConfinedFS, root: Path
) -> None:
    with deep_tree(root, MAX_DEPTH + 1200):  # deeper than Python's recursion limit
        entries = list(fs.walk(".", recursive=True, limit=5000))
    depths = [e.path.count("/") for e in entries if e is not None and e.path.startswith("d")]
    assert max(depths) == MAX_DEPTH - 1  # entered no deeper than MAX_DEPTH directories
