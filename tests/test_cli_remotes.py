"""``ags remote``: add (checked against a real SeaweedFS, s3rver and directories),
list, remove; bad input is one line and changes nothing."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import tree_snapshot
from s3_server import (  # noqa: F401
    S3Server,
    aws_env_fixture,
    free_ports,
    s3_env_fixture,
    s3rver_fixture,
    seaweedfs_fixture,
)

from cli.main import cli
from objstore import Store


@pytest.fixture
def store(tmp_path: Path) -> Path:
    Store.open(tmp_path / "store").close()
    return tmp_path / "store"


def ags(store: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", str(store), *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def refused(store: Path, *args: str, message: str) -> str:
    before = tree_snapshot(store)
    code, out, err = ags(store, *args)
    assert code == 1, (out, err)
    assert err.startswith("ags: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert tree_snapshot(store) == before
    return err


def config(store: Path) -> dict[str, object]:
    data = (store / "config.json").read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert stat.S_IMODE(os.stat(store / "config.json").st_mode) == 0o600
    value = json.loads(data)
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert data == canonical.encode() + b"\n"
    return value  # type: ignore[no-any-return]


def test_add_an_s3_remote_checked_against_seaweedfs(store: Path, s3_env: S3Server) -> None:
    bucket = s3_env.new_bucket()
    code, out, err = ags(
        store, "remote", "add", "origin", f"s3://{bucket}/team/ags/", "--endpoint",
        s3_env.endpoint + "/", "--region", "us-east-1",
    )  # fmt: skip
    assert code == 0, err
    assert "added remote origin" in out and "conditional writes are enforced" in out
    assert config(store) == {
        "version": 1,
        "remotes": {
            "origin": {
                "url": f"s3://{bucket}/team/ags",
                "endpoint": s3_env.endpoint,
                "region": "us-east-1",
            }
        },
    }
    assert s3_env.secret_key not in (store / "config.json").read_text()
    code, out, _ = ags(store, "remote")
    assert (code, out) == (0, "origin\n")
    code, out, _ = ags(store, "remote", "-v")
    assert out == f"origin  s3://{bucket}/team/ags  endpoint {s3_env.endpoint}  region us-east-1\n"
    code, out, _ = ags(store, "remote", "--json")
    assert json.loads(out) == [
        {"name": "origin", "url": f"s3://{bucket}/team/ags", "endpoint": s3_env.endpoint,
         "region": "us-east-1"}
    ]  # fmt: skip


def test_add_a_directory_remote_and_remove_it(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "usb").mkdir()
    monkeypatch.chdir(tmp_path)
    code, out, err = ags(store, "remote", "add", "usb", "usb")
    assert code == 0, err
    assert config(store)["remotes"] == {"usb": {"url": str(tmp_path / "usb")}}
    code, out, err = ags(store, "remote", "add", "disk", f"file://{tmp_path / 'usb'}")
    assert code == 0, err
    code, out, _ = ags(store, "remote")
    assert out == "disk\nusb\n"
    code, out, _ = ags(store, "remote", "remove", "usb")
    assert (code, out) == (0, f"removed remote usb ({tmp_path / 'usb'})\n")
    assert sorted(os.listdir(tmp_path / "usb")) == [".ags-locks", ".ags-tmp"]  # the check's own
    assert config(store)["remotes"] == {"disk": {"url": str(tmp_path / "usb")}}


def test_no_remotes(store: Path) -> None:
    assert ags(store, "remote", "-v")[:2] == (0, "")
    assert json.loads(ags(store, "remote", "--json")[1]) == []
    assert not (store / "config.json").exists()


def test_a_server_that_ignores_conditional_writes_is_refused_unless_no_check(
    store: Path, s3rver: S3Server, aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3rver.env().items():
        monkeypatch.setenv(name, value)
    bucket = s3rver.new_bucket()
    args = ("remote", "add", "fake", f"s3://{bucket}", "--endpoint", s3rver.endpoint)
    refused(store, *args, message="does not enforce conditional writes")
    code, out, err = ags(store, *args, "--no-check")
    assert code == 0, err
    assert "checked" not in out
    assert list(config(store)["remotes"]) == ["fake"]  # type: ignore[call-overload]


def test_what_the_check_refuses(store: Path, s3_env: S3Server, tmp_path: Path) -> None:
    refused(store, "remote", "add", "o", "s3://no-such-bucket", "--endpoint", s3_env.endpoint,
            message="bucket no-such-bucket does not exist")  # fmt: skip
    (port,) = free_ports(1)
    refused(store, "remote", "add", "o", "s3://bucket", "--endpoint", f"http://127.0.0.1:{port}",
            message="cannot reach")  # fmt: skip
    refused(store, "remote", "add", "o", str(tmp_path / "not-there"), message="no such directory")
    assert not (tmp_path / "not-there").exists()


def test_a_directory_of_other_things_is_refused_and_left_as_it_was(
    store: Path, tmp_path: Path
) -> None:
    """A mistyped path (a folder of one's own files) is no remote: ``remote add`` says so
    before its check writes anything there, and adds nothing."""
    folder = tmp_path / "documents"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    refused(store, "remote", "add", "o", str(folder), message="holds other things (notes.txt)")
    assert os.listdir(folder) == ["notes.txt"]
    assert not (store / "config.json").exists()


def test_what_is_refused_before_anything_is_sent(
    store: Path, aws_env: Path, tmp_path: Path
) -> None:
    cases = [
        (["bad/name", "s3://bucket"], "bad remote name"),
        ([".hidden", "s3://bucket"], "bad remote name"),
        (["o", "s3://Bad_Bucket"], "bad bucket name"),
        (["o", "s3://key:secret@bucket"], "no credentials in a remote URL"),
        (["o", "s3://bucket", "--endpoint", "http://key:secret@host:9000"],
         "no credentials in the endpoint URL"),
        (["o", "s3://bucket", "--endpoint", "ftp://host"], "bad endpoint"),
        (["o", "s3://bucket", "--endpoint", "http://[::1"], "bad endpoint"),
        (["o", "s3://bucket", "--endpoint", "http://host:99999"], "the port is not 0-65535"),
        (["o", "file://[::1"], "names a path on this machine"),
        (["o", str(tmp_path / "a-file")], "a-file: not a directory"),
        (["o", "s3://bucket/../up"], "bad prefix"),
        (["o", "https://example.com/x"], "unsupported remote URL"),
        (["o", str(tmp_path), "--region", "eu-west-1"], "are for s3:// remotes"),
        (["o", ""], "needs a URL"),
    ]  # fmt: skip
    (tmp_path / "a-file").write_text("mine\n")
    for args, message in cases:
        err = refused(store, "remote", "add", *args, message=message)
        assert "key:secret" not in err


def test_a_name_is_added_once(store: Path, tmp_path: Path) -> None:
    (tmp_path / "usb").mkdir()
    assert ags(store, "remote", "add", "usb", str(tmp_path / "usb"))[0] == 0
    refused(store, "remote", "add", "usb", str(tmp_path / "usb"), message="exists already")
    refused(store, "remote", "remove", "nothing", message="no remote named 'nothing'")


def test_a_config_file_from_a_newer_ags_is_refused(store: Path) -> None:
    (store / "config.json").write_bytes(b'{"remotes":{},"version":2}\n')
    refused(store, "remote", message="has version 2; this ags reads up to 1")
    (store / "config.json").write_bytes(b"{not json\n")
    refused(store, "remote", message="config.json is not JSON")


def test_settings_this_ags_does_not_know_are_kept(store: Path, tmp_path: Path) -> None:
    (store / "config.json").write_bytes(b'{"later":{"x":1},"remotes":{},"version":1}\n')
    (tmp_path / "usb").mkdir()
    assert ags(store, "remote", "add", "usb", str(tmp_path / "usb"))[0] == 0
    assert config(store)["later"] == {"x": 1}


def test_remote_commands_need_a_store(tmp_path: Path) -> None:
    code, _, err = ags(tmp_path / "nothing", "remote")
    assert code == 1 and "no store at" in err
    assert not (tmp_path / "nothing").exists()


def test_every_remote_subcommand_has_an_example() -> None:
    group = cli.get_command(click.Context(cli), "remote")
    for name in group.commands:  # type: ignore[attr-defined]
        result = CliRunner().invoke(cli, ["remote", name, "--help"])
        assert result.exit_code == 0 and "Example" in result.output, name


def test_a_push_or_pull_naming_no_remote_says_so_and_lists_the_remotes(
    store: Path, tmp_path: Path
) -> None:
    (tmp_path / "usb").mkdir()
    (tmp_path / "disk").mkdir()
    for name in ("usb", "disk"):
        assert ags(store, "remote", "add", name, str(tmp_path / name), "--no-check")[0] == 0
    with Store.open(store) as s:
        sid = s.new_session(title="one")
        s.append(sid, {"role": "user", "content": "hi"})
    message = "no remote named 'nosuch'; remotes: disk, usb"
    refused(store, "push", "nosuch", "--all", message=message)
    refused(store, "push", "nosuch", sid, message=message)
    refused(store, "pull", "nosuch", sid, message=message)
    refused(store, "push", "--delete", "nosuch", sid, message=message)
    # a session named first is no remote name: the default remote is asked for
    refused(store, "push", sid, sid, message="name the remote: disk, usb")
    refused(store, "push", "nosuch", message="no remote, session or tag named 'nosuch'")
    refused(store, "push", sid, message="name the remote: disk, usb")


def test_summaries_count_in_the_singular_for_one(store: Path, tmp_path: Path) -> None:
    (tmp_path / "usb").mkdir()
    assert ags(store, "remote", "add", "usb", str(tmp_path / "usb"))[0] == 0
    with Store.open(store) as s:
        sid = s.new_session(title="one")
    code, out, err = ags(store, "push", "usb", sid)  # an empty session: no object to send
    assert code == 0, err
    assert "0 objects in 0 packs," in out
    with Store.open(store) as s:
        s.append(sid, {"role": "user", "content": "hi"})
    code, out, err = ags(store, "push", "usb", sid)
    assert code == 0, err
    assert " in 1 pack, " in out and "1 packs" not in out


def test_push_delete_takes_tags_and_refuses_what_names_nothing(store: Path, tmp_path: Path) -> None:
    (tmp_path / "usb").mkdir()
    assert ags(store, "remote", "add", "usb", str(tmp_path / "usb"))[0] == 0
    with Store.open(store) as s:
        sid = s.new_session(title="one")
        s.append(sid, {"role": "user", "content": "hi"})
        s.tag("v1", sid)
    assert ags(store, "push", "usb", sid, "tags/v1")[0] == 0
    refused(store, "push", "--delete", "usb", "nosuch", message="names no session or tag")
    refused(store, "push", "--delete", "usb", "tags/a b", message="names no session or tag")
    code, out, err = ags(store, "push", "--delete", "usb", "tags/v1")
    assert code == 0 and out.startswith("deleted") and "tags/v1" in out, err
    cell = json.loads((tmp_path / "usb" / "refs" / "tags" / "v1").read_bytes())
    assert cell == {"generation": 2, "value": None}
    code, _out, err = ags(store, "push", "--delete", "usb", "tags/v1")
    assert code == 1 and "no such ref" in err
