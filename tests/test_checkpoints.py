"""Workspace checkpoints (issue 8 section 4): write_file and edit_file record each
file's content before and after on their tool result's node, and ``rewind --files``
puts it back. Run end to end: the installed ``ags`` script, a real Docker sandbox
for the tools, a scripted model server on 127.0.0.1, real files, real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from docker_fixture import owned_project
from model_server import FakeModelServer
from test_agent import AGS, ags, call, env_for, remove_containers, start_run, wait_for

from agent.tools import Toolbox
from objstore import FileChange, Store, check_store


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    p.mkdir()
    (p / "README.md").write_text("# demo\n")
    (p / "notes.txt").write_text("old notes\n")
    return owned_project(p)


def project_files(project: Path) -> dict[str, bytes | str]:
    """Every entry of the project: a file's bytes, a symlink's target."""
    out: dict[str, bytes | str] = {}
    for dirpath, _dirs, files in os.walk(project):
        for name in files:
            path = Path(dirpath, name)
            rel = str(path.relative_to(project))
            out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes()
    return out


def head(store_path: Path, sid: str) -> str | None:
    with Store.open(store_path) as s:
        return s.session(sid).head


THREE_EDITS = [
    call("write_file", path="new.txt", content="made by the agent\n"),
    call("edit_file", path="README.md", old="# demo", new="# changed by the agent"),
    call("write_file", path="notes.txt", content="new notes\n"),
]


def edit_session(env: dict[str, str], project: Path, server: FakeModelServer) -> str:
    """One turn whose three tool calls create new.txt and change README.md and
    notes.txt: nodes 1 user, 2 assistant, 3-5 tool results, 6 the answer."""
    server.add({"text": "Editing.", "tool_calls": THREE_EDITS}, {"text": "Done."})
    run = ags(env, project, "run", "edit the files", "--yes-tools", "--json")
    assert run.returncode == 0, run.stderr
    sid: str = json.loads(run.stdout)["session"]
    assert (project / "new.txt").read_text() == "made by the agent\n"
    return sid


def test_rewind_files_after_a_kill_puts_back_what_the_tools_changed(
    tmp_path, server, image, project
):
    store_path = tmp_path / "store"
    env = env_for(tmp_path, server, image)
    sid = edit_session(env, project, server)
    # A second turn is killed with SIGKILL while its shell command runs.
    server.add({"tool_calls": [call("shell", command="echo by shell > shell.txt; sleep 60")]})
    proc = start_run(env, project, "--resume", sid, "a long job", "--yes-tools")
    try:
        wait_for(lambda: (project / "shell.txt").exists())
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        remove_containers(project)
        proc.stdout.close()
        proc.stderr.close()

    done = ags(env, project, "rewind", sid, f"{sid}~7", "--files")
    assert done.returncode == 0, done.stderr
    assert "removed  new.txt" in done.stdout and "written  README.md" in done.stdout
    assert not (project / "new.txt").exists()
    assert (project / "README.md").read_text() == "# demo\n"
    assert (project / "notes.txt").read_text() == "old notes\n"
    # Shell commands are not recorded: what they did stays.
    assert (project / "shell.txt").read_text() == "by shell\n"
    with Store.open(store_path) as s:
        assert s.session(sid).messages == 1
        assert check_store(s).ok

    # The undo brings the agent's files back too.
    undo = ags(env, project, "rewind", sid, f"{sid}@{{1}}", "--files")
    assert undo.returncode == 0, undo.stderr
    assert (project / "new.txt").read_text() == "made by the agent\n"
    assert (project / "README.md").read_text() == "# changed by the agent\n"
    assert (project / "notes.txt").read_text() == "new notes\n"


def test_a_file_changed_by_hand_is_refused_then_forced(tmp_path, server, image, project):
    store_path = tmp_path / "store"
    env = env_for(tmp_path, server, image)
    sid = edit_session(env, project, server)
    (project / "notes.txt").write_text("my own notes, typed by hand\n")
    (project / "README.md").write_text("# changed by the agent\nand a line by hand\n")
    (project / "new.txt").unlink()  # already what the rewind wants: not in the way
    before, at = project_files(project), head(store_path, sid)

    refused = ags(env, project, "rewind", sid, f"{sid}~5", "--files")
    assert refused.returncode == 1
    err = refused.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("ags: 2 file(s) changed since the agent wrote them")
    assert "notes.txt (its content changed)" in err and "README.md (its content changed)" in err
    assert "new.txt" not in err
    assert "--force" in err
    assert project_files(project) == before and head(store_path, sid) == at

    forced = ags(env, project, "rewind", sid, f"{sid}~5", "--files", "--force")
    assert forced.returncode == 0, forced.stderr
    assert (project / "notes.txt").read_text() == "old notes\n"
    assert (project / "README.md").read_text() == "# demo\n"
    assert not (project / "new.txt").exists()
    assert head(store_path, sid) != at


def test_a_symlink_planted_where_a_file_was_is_refused_and_never_followed(
    tmp_path, server, image, project
):
    store_path = tmp_path / "store"
    env = env_for(tmp_path, server, image)
    sid = edit_session(env, project, server)
    outside = tmp_path / "outside.txt"
    outside.write_text("a file outside the project\n")
    (project / "README.md").unlink()
    (project / "README.md").symlink_to(outside)
    (project / "new.txt").unlink()
    (project / "new.txt").symlink_to(outside)
    before, at = project_files(project), head(store_path, sid)

    refused = ags(env, project, "rewind", sid, f"{sid}~5", "--files")
    assert refused.returncode == 1
    assert "README.md (a symlink is there now)" in refused.stderr
    assert "new.txt (a symlink is there now)" in refused.stderr
    assert project_files(project) == before and head(store_path, sid) == at
    assert outside.read_text() == "a file outside the project\n"

    forced = ags(env, project, "rewind", sid, f"{sid}~5", "--files", "--force")
    assert forced.returncode == 0, forced.stderr
    assert outside.read_text() == "a file outside the project\n"  # never written through
    assert not (project / "README.md").is_symlink()
    assert (project / "README.md").read_text() == "# demo\n"
    assert not (project / "new.txt").exists() and not (project / "new.txt").is_symlink()


def test_a_directory_symlinked_out_of_the_project_is_never_entered(
    tmp_path, server, image, project
):
    env = env_for(tmp_path, server, image)
    server.add(
        {"tool_calls": [call("write_file", path="sub/inner.txt", content="inside\n")]},
        {"text": "Done."},
    )
    run = ags(env, project, "run", "write sub/inner.txt", "--yes-tools", "--json")
    sid = json.loads(run.stdout)["session"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "inner.txt").write_text("inside\n")  # what the agent left, but outside
    (project / "sub" / "inner.txt").unlink()
    (project / "sub").rmdir()
    (project / "sub").symlink_to(elsewhere)
    for force, words in (
        ([], "sub/inner.txt (a symlink on its way leads out of the project)"),
        (
            ["--force"],
            "cannot put back 1 file(s): sub/inner.txt (a symlink on its way leads "
            "out of the project); nothing was changed",
        ),
    ):
        out = ags(env, project, "rewind", sid, f"{sid}~3", "--files", *force)
        assert out.returncode == 1 and words in out.stderr
        assert (elsewhere / "inner.txt").read_text() == "inside\n"
        assert (project / "sub").is_symlink()


def test_show_lists_the_files_a_node_changed_and_diff_shows_them(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    sid = edit_session(env, project, server)
    shown = ags(env, project, "show", f"{sid}~2")
    assert shown.returncode == 0, shown.stderr
    assert "files    1 changed" in shown.stdout and "changed  README.md" in shown.stdout
    created = ags(env, project, "show", f"{sid}~3", "--json")
    (change,) = json.loads(created.stdout)["files"]
    assert change["path"] == "new.txt" and change["before"] is None

    diff = ags(env, project, "diff", f"{sid}~5", sid, "--files")
    assert diff.returncode == 0, diff.stderr
    text = diff.stdout
    assert "--- a/README.md\n+++ b/README.md\n" in text
    assert "-# demo\n+# changed by the agent\n" in text
    assert "--- /dev/null\n+++ b/new.txt\n" in text and "+made by the agent" in text
    assert "-old notes\n+new notes\n" in text
    back = ags(env, project, "diff", sid, f"{sid}~5", "--files", "--json")
    assert {d["path"]: d["b"] is None for d in json.loads(back.stdout)}["new.txt"]

    # A binary file is named, not dumped.
    server.add(
        {"tool_calls": [call("write_file", path="blob.bin", content="a\u0000b\u001b[31m")]},
        {"text": "Done."},
    )
    more = ags(env, project, "run", "--resume", sid, "a binary", "--yes-tools")
    assert more.returncode == 0, more.stderr
    binary = ags(env, project, "diff", f"{sid}~3", sid, "--files")
    assert "Binary files /dev/null and b/blob.bin differ" in binary.stdout
    assert "\x1b" not in binary.stdout


def test_chat_rewind_with_files(tmp_path, server, image, project):
    env = env_for(tmp_path, server, image)
    sid = edit_session(env, project, server)
    script = "\\rewind 4 --files\n\\exit\n"
    proc = subprocess.run(
        [AGS, "chat", "--resume", sid], env=env, cwd=project, input=script,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "written  README.md" in proc.stdout and "undo: ags rewind" in proc.stdout
    assert (project / "README.md").read_text() == "# demo\n"  # node 2's answer: none of them
    assert not (project / "new.txt").exists()
    help_text = subprocess.run(
        [AGS, "chat"], env=env, cwd=project, input="\\help\n\\exit\n",
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert "\\rewind N [--files [--force]]" in help_text
    assert "cannot be undone" in help_text


def test_bad_rewind_input_is_one_line_and_changes_nothing(tmp_path, server, image, project):
    store_path = tmp_path / "store"
    env = env_for(tmp_path, server, image)
    sid = edit_session(env, project, server)
    before, at = project_files(project), head(store_path, sid)
    for args, words in (
        ([sid, "nonsense", "--files"], "nonsense"),
        ([sid, f"{sid}~99", "--files"], ""),
        ([sid, f"{sid}~1", "--force"], "--force only applies with --files"),
    ):
        out = ags(env, project, "rewind", *args)
        assert out.returncode != 0 and "Traceback" not in out.stderr
        assert words in out.stderr
        assert project_files(project) == before and head(store_path, sid) == at


# -- the toolbox itself, no sandbox needed ----------------------------------------


def test_the_file_tools_give_back_what_they_changed(tmp_path: Path) -> None:
    root = tmp_path / "p"
    root.mkdir()
    (root / "a.txt").write_bytes(b"one\n")
    with Toolbox(root, None, {}) as box:
        made = box.run("write_file", {"path": "dir/b.txt", "content": "new\n"})
        assert made.ok and made.files == {"dir/b.txt": (None, b"new\n")}
        edited = box.run("edit_file", {"path": "a.txt", "old": "one", "new": "two"})
        assert edited.files == {"a.txt": (b"one\n", b"two\n")}
        same = box.run("write_file", {"path": "a.txt", "content": "two\n"})
        assert same.ok and same.files == {}  # nothing changed, nothing to record
        failed = box.run("edit_file", {"path": "a.txt", "old": "absent", "new": "x"})
        assert not failed.ok and failed.files == {}
        (root / "link.txt").symlink_to("a.txt")
        through = box.run("write_file", {"path": "link.txt", "content": "three\n"})
        assert through.files == {"a.txt": (b"two\n", b"three\n")}  # the path written
        assert box.run("list_files", {}).files == {}


def test_store_records_what_an_in_process_agent_wrote(tmp_path: Path) -> None:
    """The loop hands the toolbox's changes to the store with the tool result."""
    from agent.loop import Agent
    from agent.models import make_client

    root = tmp_path / "p"
    root.mkdir()
    with FakeModelServer() as server, Store.open(tmp_path / "store") as store:
        server.add(
            {"tool_calls": [call("write_file", path="x.txt", content="x\n")]},
            {"text": "ok"},
        )
        sid = store.new_session(root=root)
        client = make_client("ollama", server.url, "gemma4")
        agent = Agent(store, sid, client, Toolbox(root, None, {}))
        agent.events.approve = lambda name, args: "yes"  # type: ignore[method-assign]
        try:
            agent.turn("write x")
        finally:
            agent.close()
            client.close()
        tool = next(e for e in store.log(sid) if e.message["role"] == "tool")
        (change,) = tool.node.files
        assert change == FileChange("x.txt", None, change.after)
        assert store.file_bytes(change.after) == b"x\n"


def test_a_directory_in_a_files_place_stops_even_a_forced_rewind_before_any_write(
    tmp_path: Path,
) -> None:
    from agent.checkpoints import rewind_with_files
    from objstore import InvalidInput

    root = tmp_path / "p"
    root.mkdir()
    (root / "a.txt").write_text("agent a\n")
    (root / "b.txt").mkdir()  # where the agent wrote b.txt, a directory now
    (root / "b.txt" / "keep").write_text("mine\n")
    with Store.open(tmp_path / "store") as store:
        sid = store.new_session(root=root)
        store.append(sid, {"role": "user", "content": "edit"})
        store.append(
            sid,
            {"role": "tool", "tool_call_id": "c", "name": "write_file", "content": "ok"},
            files={"a.txt": (b"a\n", b"agent a\n"), "b.txt": (None, b"agent b\n")},
        )
        at = store.session(sid).head
        with pytest.raises(InvalidInput, match=r"b\.txt \(a directory is there now\)"):
            rewind_with_files(store, sid, f"{sid}~1", force=True)
        assert (root / "a.txt").read_text() == "agent a\n"  # not written: nothing was
        assert (root / "b.txt" / "keep").read_text() == "mine\n"
        assert store.session(sid).head == at
