"""Where a store comes from: ``ags init``, or the first command that writes.

A mistyped ``--store`` must not silently make a new, empty store: every
command that only reads (or changes what exists) says there is none.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from objstore import Store, StoreMissing
from objstore.exchange import export_session


def ags(store: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", str(store), *args])
    assert "Traceback" not in result.stderr
    return result.exit_code, result.stdout, result.stderr


NEEDS_A_STORE = [
    ["sessions"],
    ["log", "abcd"],
    ["show", "abcd"],
    ["search", "anything"],
    ["fork", "abcd"],
    ["checkout", "abcd"],
    ["status"],
    ["tags"],
    ["tag", "t", "abcd"],
    ["title", "abcd", "x"],
    ["archive", "abcd"],
    ["delete", "abcd", "--yes"],
    ["reflog", "abcd"],
    ["export", "abcd"],
    ["gc"],
    ["fsck"],
    ["du"],
    ["info", "abcd"],
    ["diff", "abcd", "ef01"],
]


@pytest.mark.parametrize("args", NEEDS_A_STORE, ids=[" ".join(a) for a in NEEDS_A_STORE])
def test_a_missing_store_is_named_and_not_created(tmp_path: Path, args: list[str]) -> None:
    typo = tmp_path / "stroe"
    code, _out, err = ags(typo, *args)
    assert code == 1
    assert err == f"ags: no store at {typo} (ags init creates one)\n"
    assert not typo.exists()


def test_init_creates_a_private_store_once(tmp_path: Path) -> None:
    path = tmp_path / "new"
    code, out, _err = ags(path, "init")
    assert code == 0 and out == f"initialized an empty ags store at {path}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert json.loads((path / "ags-store.json").read_bytes()) == {
        "format": "ags-store",
        "version": 2,
    }
    code, out, _err = ags(path, "init")
    assert code == 0 and out == f"an ags store is already at {path}\n"
    code, out, err = ags(path, "sessions")
    assert (code, err) == (0, "")


def test_init_makes_an_empty_directory_private(tmp_path: Path) -> None:
    path = tmp_path / "made-by-hand"
    path.mkdir(mode=0o755)
    assert ags(path, "init")[0] == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_init_refuses_a_directory_that_holds_other_things(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    code, _out, err = ags(tmp_path, "init")
    assert code == 1 and err == f"ags: {tmp_path} is not empty and is not an ags store\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_import_creates_a_missing_store_and_says_so(tmp_path: Path) -> None:
    with Store.open(tmp_path / "source") as s:
        sid = s.new_session(title="moved")
        s.append(sid, {"role": "user", "content": "hello"})
        doc = export_session(s, sid)
    file = tmp_path / "session.json"
    file.write_text(json.dumps(doc))
    path = tmp_path / "fresh"
    code, out, err = ags(path, "import", str(file))
    assert code == 0, err
    assert err == f"ags: created a new store at {path}\n"
    assert out.startswith("created: session")
    code, _out, err = ags(path, "import", str(file))
    assert (code, err) == (0, "")  # it exists now: nothing more to say


def test_the_library_creates_unless_told_not_to(tmp_path: Path) -> None:
    with pytest.raises(StoreMissing, match="ags init creates one"):
        Store.open(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()
    with Store.open(tmp_path / "absent") as s:
        assert s.sessions() == []
