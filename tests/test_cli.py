"""The ``ags`` command line, through click's CliRunner and through the installed script.

Every command runs both ways; bad input must give one line on stderr, a
non-zero exit, and leave the store byte-for-byte as it was.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import store_with_damaged_message, tree_snapshot

from cli.main import cli
from objstore import SessionArchived, Store

AGS = str(Path(sys.executable).with_name("ags"))  # the console script uv installed


@dataclass
class World:
    path: Path
    a: str  # "alpha": user/assistant/tool turns and a compaction
    b: str  # a fork of alpha~4 with two messages of its own
    c: str  # archived
    fork_point: str


def build_world(path: Path) -> World:
    with Store.open(path) as s:
        a = s.new_session(title="alpha", root="/src/a", model="gemma4")
        s.append(a, {"role": "user", "content": "please list the files"})
        s.append(
            a,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "call_1", "name": "shell", "arguments": {"command": "ls"}}],
            },
            meta={"usage": {"prompt_tokens": 30, "completion_tokens": 7}},
        )
        s.append(a, {"role": "tool", "tool_call_id": "call_1", "name": "shell",
                     "content": "README.md\nsetup.py\n"})  # fmt: skip
        for i in range(8):
            s.append(a, {"role": "user", "content": f"question {i} about the zebra-{i}"})
            s.append(a, {"role": "assistant", "content": f"answer {i}"})
        s.compact(a, "we discussed eight questions about zebras", keep=2)
        s.append(a, {"role": "user", "content": "after the summary"})
        fork_point = s.node_id(f"{a}~4")
        b = s.fork(f"{a}~4", title="beta")
        s.append(b, {"role": "user", "content": "a different direction: giraffes"})
        s.append(b, {"role": "assistant", "content": "giraffes it is"})
        c = s.new_session(title="gamma")
        s.append(c, {"role": "user", "content": "old work"})
        s.archive(c)
        s.tag("checkpoint", f"{a}~2")
    return World(path, a, b, c, fork_point)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return build_world(tmp_path / "store")


def ags(world: World, *args: str, input: str | bytes | None = None) -> tuple[int, str, str]:
    """Run through CliRunner; return (exit code, stdout, stderr)."""
    result = CliRunner().invoke(
        cli, ["--store", str(world.path), *args], input=input, catch_exceptions=False
    )
    return result.exit_code, result.stdout, result.stderr


def ags_process(world: World, *args: str, input: bytes | None = None, cwd: Path | None = None):
    env = {**os.environ, "AGS_STORE": str(world.path)}
    env.pop("NO_COLOR", None)
    return subprocess.run(
        [AGS, *args], input=input, capture_output=True, env=env, cwd=cwd, timeout=60
    )


# -- every command, both ways ---------------------------------------------------

# (arguments, text the output must contain); {a}, {b}, {c} become session ids.
COMMANDS = [
    (["sessions"], "alpha"),
    (["ls", "--all"], "gamma [archived]"),
    (["sessions", "--archived", "--json"], '"title": "gamma"'),
    (["log", "{a}", "--oneline"], "compaction: we discussed eight questions"),
    (["log", "{a}", "-n", "3"], "after the summary"),
    (["log", "{a}", "--context", "--oneline"], "user: we discussed eight questions"),
    (["log", "{a}", "--json", "-n", "1"], '"content": "after the summary"'),
    (["log", "--graph", "--all"], "beta"),
    (["show", "{a}~1"], "we discussed eight questions"),
    (["show", "{a}~19", "--json"], '"command": "ls"'),
    (["fork", "{a}~2", "--title", "delta"], ""),
    (["tag", "v1", "{b}"], "v1 -> "),
    (["tags"], "checkpoint"),
    (["tags", "--json"], '"checkpoint"'),
    (["title", "{b}", "beta prime"], "beta prime"),
    (["info", "{a}"], "forked from: -"),
    (["info", "{b}", "--json"], '"unique_stored_bytes"'),
    (["archive", "{b}"], "archived"),
    (["unarchive", "{c}"], "unarchived"),
    (["reflog", "{c}"], "archive"),
    (["diff", "{a}", "{b}"], "giraffes it is"),
    (["du"], "dedup"),
    (["du", "--json"], '"logical_bytes"'),
    (["fsck"], "ok"),
    (["gc", "--dry-run"], "objects would be swept: 0"),
    (["export", "{b}"], '"format": "ags-export"'),
    (["delete", "{b}", "--yes"], "deleted session"),
    (["rewind", "{a}", "{a}~3"], "undo: ags rewind"),
    (["search", "zebra-3"], "[zebra-3]"),
    (["search", "zebras", "--role", "summary", "--json"], '"is_summary": true'),
    (["search", "giraffes", "--session", "{b}"], "giraffes"),
]


def fill(args: list[str], world: World) -> list[str]:
    return [x.format(a=world.a, b=world.b, c=world.c) for x in args]


@pytest.mark.parametrize("args,expected", COMMANDS, ids=[" ".join(c[0]) for c in COMMANDS])
def test_command_through_clirunner(world, args, expected):
    code, out, err = ags(world, *fill(args, world))
    assert code == 0, err
    assert expected in out + err


@pytest.mark.parametrize("args,expected", COMMANDS, ids=[" ".join(c[0]) for c in COMMANDS])
def test_command_through_the_installed_script(world, args, expected):
    proc = ags_process(world, *fill(args, world))
    assert proc.returncode == 0, proc.stderr
    assert expected in (proc.stdout + proc.stderr).decode()
    assert b"\x1b[" not in proc.stdout  # not a terminal: no colour


def test_every_command_has_help_with_an_example():
    runner = CliRunner()
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):  # loads each command's module
        command = cli.get_command(ctx, name)
        assert command is not None, name
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0, name
        assert "Example" in result.output, f"{name} --help has no example"
        assert command.help


# -- bad input changes nothing ------------------------------------------------


def assert_refused(world: World, args: list[str], message: str, input=None) -> str:
    before = tree_snapshot(world.path)
    code, out, err = ags(world, *args, input=input)
    assert code != 0
    assert err.startswith("ags: ") or err.startswith("Usage:") or "Error:" in err, err
    assert message in err, err
    assert "Traceback" not in err
    assert tree_snapshot(world.path) == before
    return err


SPEC_COMMANDS = [
    ["log", "{x}"], ["show", "{x}"], ["fork", "{x}"], ["checkout", "{x}"], ["tag", "t", "{x}"],
    ["title", "{x}", "new"], ["info", "{x}"], ["archive", "{x}"], ["unarchive", "{x}"],
    ["delete", "{x}", "--yes"], ["export", "{x}"], ["diff", "{x}", "{x}"],
    ["rewind", "{x}", "{x}~1"], ["reflog", "{x}"], ["search", "zebra", "--session", "{x}"],
]  # fmt: skip


@pytest.mark.parametrize("args", SPEC_COMMANDS, ids=[c[0] for c in SPEC_COMMANDS])
def test_unknown_spec_is_refused_and_changes_nothing(world, args):
    assert_refused(world, [x.format(x="0000dead") for x in args], "0000dead")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--resume", "0000dead"], "no session, node or tag matches '0000dead'"),
        (["--resume", "{a}", "--continue"], "--resume and --continue exclude each other"),
    ],
    ids=["unknown", "both"],
)
def test_run_names_a_bad_resume_before_the_sandbox(world, monkeypatch, args, message):
    """Before, a missing sandbox image (or Docker engine) was all these said."""
    monkeypatch.setenv("AGS_IMAGE", "ags-test-no-such-image:0")
    assert_refused(world, ["run", "hi", *(a.format(a=world.a) for a in args)], message)


def test_a_very_long_spec_or_tag_name_is_not_echoed_whole(world):
    """A 100,000-character spec was echoed whole: 100 KB of error on stderr."""
    err = assert_refused(world, ["log", "x" * 100_000], "100,000 characters, over 500")
    assert len(err) < 200
    err = assert_refused(world, ["tag", "t" * 300, world.a], "300 characters, over 200")
    assert len(err) < 200
    assert_refused(world, ["tag", "a.lock", world.a], "no .lock at the end")


def test_tag_delete_with_a_spec_is_refused_not_ignored(world):
    assert_refused(world, ["tag", "-d", "nothing", world.a], "takes only the NAME")


def test_log_context_with_graph_is_refused(world):
    assert_refused(world, ["log", "--context", "--graph", world.a], "exclude each other")


def test_a_store_under_a_file_is_named_so(tmp_path):
    (tmp_path / "afile").write_text("x")
    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "afile" / "sub"), "init"])
    assert result.exit_code == 1
    assert result.stderr == f"ags: {tmp_path / 'afile' / 'sub'}: a part of its path is a file\n"
    # A file named by AGS_STORE: said so, not blamed on --store (click's check did)
    result = CliRunner().invoke(cli, ["ls"], env={"AGS_STORE": str(tmp_path / "afile")})
    assert result.exit_code == 1
    assert result.stderr == f"ags: {tmp_path / 'afile'} is a file, not an ags store\n"


def test_a_store_path_that_is_no_directory_gets_no_chmod_advice(tmp_path):
    """A file others may write to (/dev/null) was refused with "run chmod -R go-rwx"
    on it, and a FIFO was called "a part of its path is a file"."""
    shared = tmp_path / "shared"
    shared.write_text("x")
    shared.chmod(0o666)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, what in [(shared, "is a file"), (fifo, "is no directory"), ("/dev/null", "is no")]:
        for command in ("ls", "init"):
            result = CliRunner().invoke(cli, ["--store", str(path), command])
            assert result.exit_code == 1
            assert result.stderr.startswith(f"ags: {path} {what}"), result.stderr
            assert "chmod" not in result.stderr and result.stderr.count("\n") == 1
    assert stat.S_IMODE(shared.stat().st_mode) == 0o666 and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_prefix_too_short_says_how_long_one_must_be(world):
    assert_refused(world, ["log", world.a[:3]], "an id prefix needs at least 4 digits")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["log", "-n", "abc"], "ags: Invalid value for '-n': 'abc' is not a valid integer"),
        (["export", "{a}", "--format", "xml"], "'xml' is not one of 'json', 'md', 'html'."),
        (["fork"], "ags: Missing argument 'SPEC'. (see 'cli fork -h')"),
        (["remote", "bogus"], "ags: No such command 'bogus'. (see 'cli remote -h')"),
        (["lgo"], "ags: No such command 'lgo'."),
        (["--bogus"], "ags: No such option '--bogus'. (see 'cli -h')"),
    ],
)
def test_a_bad_option_or_argument_is_one_line_and_status_2(world, args, message):
    """click wrote four lines for these (the usage, a hint, a blank, the error) where
    every other error of ags is one. (CliRunner names the program "cli".)"""
    before = tree_snapshot(world.path)
    code, out, err = ags(world, *fill(args, world))
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and message in err, err
    assert err.startswith("ags: ") and err.endswith(" -h')\n"), err
    assert tree_snapshot(world.path) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", ""], "say what to do"),
        (["run", "   "], "say what to do"),
        (["run", "hi", "--model", ""], "--model: give a name"),
        (["chat", "--image", ""], "--image: give a name"),
        (["run", "hi", "--resume", ""], "--resume: give a session, node or tag"),
        (["chat", "--base-url", ""], "--base-url: give an http:// or https:// URL"),
        (["search", "zebra", "--session", ""], "bad spec: ''"),
    ],
    ids=["prompt", "blank", "model", "image", "resume", "base-url", "search-session"],
)
def test_an_empty_prompt_name_spec_or_url_is_refused(world, args, message):
    """Each was sent on: an empty prompt to the model, an empty name to the engines.
    An empty --resume started a new session, an empty --base-url used the default
    server, and search --session "" searched every session."""
    assert_refused(world, args, message)


HUGE = "9" * 23  # past any 64-bit integer


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["log", "{a}~" + HUGE], "history is only"),
        (["fork", "{a}~" + HUGE], "history is only"),
        (["log", "-n", HUGE, "{a}"], "is not in the range"),
        (["search", "zebra", "-n", HUGE], "is not in the range"),
        (["gc", "--archived-older-than", HUGE + "d"], "is longer than 1,000 years"),
        (["gc", "--reflog-older-than", "1e308d", "--dry-run"], "is longer than 1,000 years"),
        (["gc", "--archived-older-than", "infd"], "is longer than 1,000 years"),
        (["gc", "--grace", "nanm"], "is not a duration"),
    ],
    ids=["log~N", "fork~N", "log-n", "search-n", "retention", "reflog-age", "inf", "nan"],
)
def test_numbers_past_any_limit_are_refused_in_one_line(world, args, message):
    """Before, each of these raised out of the CLI with a traceback (islice, SQLite and
    the time functions take no integer past 64 bits; inf and NaN slipped through
    the duration parser)."""
    assert_refused(world, [a.format(a=world.a) for a in args], message)


@pytest.fixture(scope="module")
def crowded(tmp_path_factory) -> tuple[Path, str, str]:
    """A store where two sessions share a 4-digit prefix, the shortest a user may type."""
    path = tmp_path_factory.mktemp("crowded") / "store"
    seen: dict[str, str] = {}
    with Store.open(path) as s:
        while True:
            sid = s.new_session()
            s.append(sid, {"role": "user", "content": sid})
            if sid[:4] in seen:
                return path, seen[sid[:4]], sid
            seen[sid[:4]] = sid


@pytest.mark.parametrize("args", SPEC_COMMANDS, ids=[c[0] for c in SPEC_COMMANDS])
def test_ambiguous_prefix_lists_the_candidates(crowded, args):
    path, x, y = crowded
    world = World(path, x, y, x, "")
    err = assert_refused(world, [a.format(x=x[:4]) for a in args], "ambiguous")
    assert x in err and y in err


def test_delete_without_yes_says_what_would_go(world):
    err = assert_refused(world, ["delete", world.b], "add --yes")
    assert "beta" in err
    assert "19 messages" in err  # alpha's first 17, then two of its own


def test_an_archived_session_refuses_writes_until_unarchived(world):
    err = assert_refused(world, ["rewind", world.c, f"{world.c}~0"], "archived")
    assert "unarchive" in err
    with Store.open(world.path) as s, pytest.raises(SessionArchived):
        s.append(world.c, {"role": "user", "content": "more"})
    assert ags(world, "unarchive", world.c)[0] == 0
    with Store.open(world.path) as s:
        s.append(world.c, {"role": "user", "content": "more"})


def test_search_finds_compacted_history_and_refuses_an_empty_query(world):
    code, out, _ = ags(world, "search", "please list", "--json")
    hits = json.loads(out)
    # Compaction took this message out of alpha's context; it is still found, in both
    # sessions whose history holds it.
    assert {h["session"] for h in hits} == {world.a, world.b}
    assert_refused(world, ["search", "  "], "empty")
    assert_refused(world, ["search", '""'], "no words")


def test_usage_errors_are_one_line_too(world):
    assert_refused(world, ["sessions", "--all", "--archived"], "exclude each other")
    assert_refused(world, ["gc", "--grace", "soon"], "not a duration")
    assert_refused(world, ["gc", "--grace", "1m"], "at least 10 minutes")


def test_not_a_store_is_refused_without_traceback(tmp_path):
    not_a_store = tmp_path / "mine"
    not_a_store.mkdir()
    (not_a_store / "notes.txt").write_text("keep me")
    proc = subprocess.run(
        [AGS, "--store", str(not_a_store), "sessions"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("ags: ") and proc.stderr.count("\n") == 1
    assert sorted(p.name for p in not_a_store.iterdir()) == ["notes.txt"]


# -- HEAD, rewind, graph ------------------------------------------------------------


def test_checkout_and_status_per_project(world, tmp_path):
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    proc = ags_process(world, "checkout", world.a, cwd=project)
    assert proc.returncode == 0, proc.stderr
    status = ags_process(world, "status", cwd=project / "sub").stdout.decode()
    assert f"on session {world.a}" in status and "alpha" in status
    ags_process(world, "checkout", f"{world.a}~3", cwd=project)
    status = ags_process(world, "status", "--json", cwd=project).stdout
    head = json.loads(status)["head"]
    assert head["session"] is None and head["node"]
    elsewhere = ags_process(world, "status", cwd=tmp_path).stdout.decode()
    assert "nothing checked out" in elsewhere


def test_status_of_a_checked_out_session_since_deleted_says_so(tmp_path):
    """status said "nothing checked out here" where log said HEAD names a deleted session."""
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session(title="gone")
        s.append(sid, {"role": "user", "content": "hi"})
    world = World(tmp_path / "s", sid, sid, sid, "")
    project = tmp_path / "project"
    project.mkdir()
    assert ags_process(world, "checkout", sid, cwd=project).returncode == 0
    assert ags_process(world, "delete", sid, "--yes", cwd=project).returncode == 0
    for command in ("status", "log"):
        proc = ags_process(world, command, cwd=project)
        assert proc.returncode == 1
        assert proc.stderr.decode() == f"ags: HEAD names session {sid}, which no longer exists\n"


def test_rewind_and_undo_with_the_reflog(world):
    with Store.open(world.path) as s:
        head = s.session(world.a).head
        back = s.node_id(f"{world.a}~2")
    assert ags(world, "rewind", world.a, f"{world.a}~2")[0] == 0
    with Store.open(world.path) as s:
        assert s.session(world.a).head == back
    assert ags(world, "rewind", world.a, f"{world.a}@{{1}}")[0] == 0
    with Store.open(world.path) as s:
        assert s.session(world.a).head == head
    assert_refused(world, ["rewind", world.a, world.b], "not in the history")


def test_reflog_numbers_only_the_moves_as_at_n_counts_them(world):
    """The listing numbered every line, so after a rewind and a title the rewind
    showed as @{2} while S@{2} was refused ("has moved only 1 times")."""
    with Store.open(world.path) as s:
        head = s.session(world.a).head
    assert ags(world, "rewind", world.a, f"{world.a}~2")[0] == 0
    assert ags(world, "title", world.a, "renamed")[0] == 0
    lines = ags(world, "reflog", world.a)[1].splitlines()
    title, rewind = lines[0], lines[1]
    assert "title" in title and not title.startswith("@{")
    assert rewind.startswith(f"@{{1}}  {head[:12]} -> ") and "rewind" in rewind
    assert ags(world, "show", f"{world.a}@{{1}}", "--json")[1].count(head) >= 1


def test_head_reflog_shows_session_ids_uncut(world, tmp_path):
    """A HEAD that names a session showed as sessions/3f2, three digits of its id."""
    project = tmp_path / "project"
    project.mkdir()
    for sid in (world.a, world.b):
        assert ags_process(world, "checkout", sid, cwd=project).returncode == 0
    out = ags_process(world, "reflog", "HEAD", cwd=project).stdout.decode()
    assert out.startswith(f"@{{1}}  sessions/{world.a[:12]} -> sessions/{world.b[:12]}  ")


def test_graph_draws_forks_under_their_source(world):
    code, out, _ = ags(world, "log", "--graph", "--all")
    lines = out.splitlines()
    alpha = next(i for i, line in enumerate(lines) if "alpha" in line)
    beta = next(i for i, line in enumerate(lines) if "beta" in line)
    assert beta > alpha and lines[beta].startswith("| * ")
    assert world.fork_point[:12] in lines[beta]
    code, out, _ = ags(world, "log", "--graph", world.b, "--json")
    tree = json.loads(out)
    assert tree[0]["session"] == world.a and tree[0]["forks"][0]["session"] == world.b


def test_log_context_shows_only_what_the_model_sees(world):
    _, full, _ = ags(world, "log", world.a, "--json")
    _, context, _ = ags(world, "log", world.a, "--context", "--json")
    contents = [m["content"] for m in json.loads(context)]
    assert contents[-1] == "we discussed eight questions about zebras"  # oldest last
    assert "please list the files" not in contents
    assert any(e.get("message", {}).get("content") == "please list the files"
               for e in json.loads(full))  # fmt: skip


def test_colour_never_with_no_color(world, monkeypatch):
    from cli import output

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert output.color_enabled()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not output.color_enabled()
    assert output.style("x", fg="red") == "x"


# -- export / import -------------------------------------------------------------


def export_doc(world: World, spec: str) -> dict:
    code, out, err = ags(world, "export", spec)
    assert code == 0, err
    return json.loads(out)


def test_export_import_round_trip_keeps_ids_and_history(world, tmp_path):
    doc = export_doc(world, world.b)
    other = World(tmp_path / "other", "", "", "", "")
    out_file = tmp_path / "b.json"
    assert ags(world, "export", world.b, "-o", str(out_file))[0] == 0
    assert json.loads(out_file.read_text())["head"] == doc["head"]
    code, out, err = ags(other, "import", str(out_file))
    assert code == 0, err
    assert f"created: session {world.b}" in out
    with Store.open(world.path) as s1, Store.open(other.path) as s2:
        assert [e.id for e in s1.log(world.b)] == [e.id for e in s2.log(world.b)]
        assert s1.context(world.b) == s2.context(world.b)
        assert s2.session(world.b).title == "beta"
    # Idempotent: the second import changes nothing at all.
    before = tree_snapshot(other.path)
    code, out, _ = ags(other, "import", "-", input=out_file.read_bytes())
    assert code == 0 and "unchanged" in out
    assert tree_snapshot(other.path) == before
    assert ags(other, "fsck")[0] == 0


def test_import_fast_forwards_a_session_that_moved_on(world, tmp_path):
    early = export_doc(world, f"{world.a}~3")
    late = export_doc(world, world.a)
    other = World(tmp_path / "other", "", "", "", "")
    assert ags(other, "import", "-", input=json.dumps(early))[0] == 0
    code, out, _ = ags(other, "import", "-", input=json.dumps(late))
    assert code == 0 and "fast-forward" in out
    with Store.open(other.path) as s:
        assert s.session(world.a).head == late["head"]
        assert s.session(world.a).messages == late["session"]["messages"]


def test_import_refuses_a_diverged_session_unless_new(world, tmp_path):
    doc = export_doc(world, world.a)
    with Store.open(world.path) as s:
        s.rewind(world.a, f"{world.a}~2")
        s.append(world.a, {"role": "user", "content": "another way"})
    assert_refused(world, ["import", "-"], "different history", input=json.dumps(doc))
    code, out, _ = ags(world, "import", "--new-session", "-", input=json.dumps(doc))
    assert code == 0 and "created" in out


def _bad_documents(doc: dict) -> dict[str, tuple[bytes, str]]:
    """Broken export files and the words their error must contain."""
    text = json.dumps(doc)
    altered = json.loads(text)
    blob = next(i for i, o in enumerate(altered["objects"]) if o["kind"] == "blob")
    altered["objects"][blob]["body"]["content"] = "tampered"
    dangling = json.loads(text)
    node = next(i for i, o in enumerate(dangling["objects"]) if o["body"].get("parent"))
    parent = dangling["objects"][node]["body"]["parent"]
    dangling["objects"] = [o for o in dangling["objects"] if o["id"] != parent]
    newer = {**json.loads(text), "version": 3}
    schema = json.loads(text)
    del schema["objects"][0]["kind"]
    long_title = json.loads(text)
    long_title["session"]["title"] = "T" * 100_000
    return {
        "trailing data": ((text + "\ngarbage").encode(), "something follows the document"),
        "huge integer": (
            text.replace('"messages": ', '"messages": ' + "9" * 5_001, 1).encode(),
            "an integer of too many digits",
        ),
        "long title": (json.dumps(long_title).encode(), "$.session.title: 'TTTT"),
        "truncated": (text[: len(text) // 2].encode(), "truncated"),
        "not json": (b"this is not json", "not valid JSON"),
        "empty": (b"", "truncated"),
        "wrong version": (json.dumps(newer).encode(), "version 3"),
        "altered message": (json.dumps(altered).encode(), f"$.objects[{blob}]"),
        "dangling parent": (json.dumps(dangling).encode(), "parent: names"),
        "schema": (json.dumps(schema).encode(), "$.objects[0]"),
        "not an export": (b'{"hello": 1}', "not an ags export"),
        "binary": (b"\xff\xfe\x00", "not UTF-8"),
    }


@pytest.mark.parametrize(
    "case",
    ["truncated", "not json", "empty", "wrong version", "altered message", "dangling parent",
     "schema", "not an export", "binary", "trailing data", "huge integer", "long title"],
)  # fmt: skip
def test_a_bad_export_file_changes_nothing_and_names_the_place(world, tmp_path, case):
    doc = export_doc(world, world.a)
    data, words = _bad_documents(doc)[case]
    bad = tmp_path / "bad.json"
    bad.write_bytes(data)
    other = World(tmp_path / "other", "", "", "", "")
    Store.open(other.path).close()
    for target in (world, other):  # a store that has the session, and one that has nothing
        assert_refused(target, ["import", str(bad)], words)
    proc = ags_process(world, "import", "-", input=data)
    assert proc.returncode == 1 and proc.stderr.decode().count("\n") == 1
    assert len(proc.stderr) < 400  # no value quoted whole (a 100 KB title was)


def test_export_schema_is_published_in_docs():
    docs = Path(__file__).parent.parent / "docs" / "export.schema.json"
    schema = json.loads(docs.read_text())
    assert schema["properties"]["format"] == {"const": "ags-export"}


# -- fsck and gc ------------------------------------------------------------------


def test_fsck_lists_a_damaged_object_and_fails(tmp_path):
    path = tmp_path / "store"
    _sid, blob, _pack = store_with_damaged_message(path, "x" * 500)
    world = World(path, "", "", "", "")
    code, out, err = ags(world, "fsck")
    assert code == 1
    assert blob in out and "corrupt" in out
    code, out, _ = ags(world, "fsck", "--json")
    assert code == 1 and json.loads(out)["problems"][0]["where"] == blob


def test_fsck_finds_a_missing_link(tmp_path):
    path = tmp_path / "store"
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": "one"})
        s.append(sid, {"role": "user", "content": "two"})
        first = s.node_id(f"{sid}~1")
    # Rebuild the store without the first node: the second names a missing parent.
    with Store.open(path) as s:
        keep = {o for o in s.objects.ids() if o != first}
        s.objects.sweep(float("inf"), lambda: keep)
    code, out, _ = ags(World(path, "", "", "", ""), "fsck")
    assert code == 1 and f"parent names missing {first}" in out


def age_store(path: Path, seconds: float) -> None:
    """Make every sealed pack look written ``seconds`` ago."""
    for p in (path / "objects" / "pack").iterdir():
        st = p.stat()
        os.utime(p, (st.st_atime - seconds, st.st_mtime - seconds))


def test_gc_drops_old_archived_sessions_and_sweeps_what_nothing_reaches(world):
    with Store.open(world.path) as s:
        c_objects = {s.node_id(world.c), s.node(s.node_id(world.c)).content}
    age_store(world.path, 7200)
    dry = json.loads(ags(world, "gc", "--archived-older-than", "0", "--dry-run", "--json")[1])
    assert dry["sessions_dropped"] == [world.c] and dry["objects_swept"] == 2
    code, out, err = ags(world, "gc", "--archived-older-than", "0", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["sessions_dropped"] == [world.c]
    assert report["objects_swept"] == 2 and report["bytes_freed"] > 0
    with Store.open(world.path) as s:
        left = set(s.objects.ids())
        assert not c_objects & left
        assert [e.id for e in s.log(world.a)]  # the rest reads fine
    assert ags(world, "fsck")[0] == 0


def test_repack_merges_the_small_packs_and_keeps_every_message(tmp_path, monkeypatch):
    """``ags repack`` merges until repack.py's policy is met; every message reads after,
    and a second run finds nothing to merge."""
    from objstore import repack as repack_policy

    path = tmp_path / "store"
    monkeypatch.setattr(repack_policy, "MAX_PACKS", 1000)  # no merge as each handle closes
    sids = []
    for run in range(12):  # each handle seals a block pack of its own
        with Store.open(path) as s, s.batch():
            sids.append(s.new_session(title=f"run {run}"))
            for i in range(50):
                s.append(sids[-1], {"role": "user", "content": f"run {run} message {i}"})
    monkeypatch.undo()
    world = World(path, "", "", "", "")
    code, out, err = ags(world, "repack", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["packs_before"] == 12 and report["packs_after"] <= 8
    assert report["packs_merged"] > 12 - report["packs_after"]
    with Store.open(path) as s:
        assert [len(s.context(sid)) for sid in sids] == [50] * 12
    code, out, _err = ags(world, "repack")
    left = report["packs_after"]
    assert (code, out) == (0, f"packs: {left} (none to merge, or another process is repacking)\n")
    assert ags(world, "fsck")[0] == 0


def test_gc_keeps_young_objects_and_what_reflogs_reach(world):
    with Store.open(world.path) as s:
        s.delete(world.b)
    # Young: nothing is swept, whatever is unreachable.
    assert json.loads(ags(world, "gc", "--json")[1])["objects_swept"] == 0
    age_store(world.path, 7200)
    # Old, but the deleted session's reflog still reaches its objects.
    assert json.loads(ags(world, "gc", "--json")[1])["objects_swept"] == 0
    with Store.open(world.path) as s:
        assert s.target(f"sessions/{world.b}@{{1}}").node  # recoverable
    report = json.loads(ags(world, "gc", "--reflog-older-than", "0", "--json")[1])
    assert report["reflog_entries_expired"] > 0 and report["objects_swept"] == 4
    assert ags(world, "fsck")[0] == 0


WRITER = """
import sys
from objstore import Store
path, sid, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Store.open(path) as s:
    print("ready", flush=True)  # the old packs are mapped now
    sys.stdin.readline()
    for i in range(n):
        # The same contents the deleted session held: every write finds an old copy,
        # one that gc has swept or is about to sweep.
        s.append(sid, {"role": "user", "content": f"message {i % 200}"})
"""


def test_gc_beside_a_concurrent_writer_loses_nothing(tmp_path):
    path = tmp_path / "store"
    with Store.open(path) as s:
        old = s.new_session()
        for i in range(200):
            s.append(old, {"role": "user", "content": f"message {i}"})
        s.delete(old)
        live = s.new_session()
    age_store(path, 7200)
    world = World(path, live, "", "", "")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), live, "400"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline() == "ready\n"
    gc_args = ("gc", "--reflog-older-than", "0", "--grace", "10m", "--json")
    code, out, err = ags(world, *gc_args)  # sweeps every old copy the writer has mapped
    assert code == 0, err
    assert json.loads(out)["objects_swept"] == 400
    writer.stdin.write("go\n")
    writer.stdin.flush()
    while writer.poll() is None:
        code, out, err = ags(world, *gc_args)
        assert code == 0, err
    assert writer.returncode == 0
    with Store.open(path) as s:
        log = list(s.log(live))
        assert len(log) == 400
        contents = [e.message["content"] for e in log][::-1]
        assert contents == [f"message {i % 200}" for i in range(400)]
    code, out, _ = ags(world, "fsck")
    assert code == 0, out


def test_log_shows_the_start_of_a_huge_message_and_show_all_of_it(tmp_path):
    from cli.history import LOG_TEXT_CHARS

    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        text = "start " + "word " * LOG_TEXT_CHARS + "the end"
        s.append(sid, {"role": "user", "content": text})
        node = s.node_id(sid)
    world = World(tmp_path / "s", sid, sid, sid, node)
    code, out, _ = ags(world, "log", sid)
    assert code == 0 and "start word" in out and "the end" not in out
    assert f"... ({len(text) - LOG_TEXT_CHARS:,} more characters; ags show {node[:12]})" in out
    code, out, _ = ags(world, "show", sid)
    assert code == 0 and text in out


def test_a_spec_that_names_a_directory_of_tags_is_no_tag(world):
    """Found by tests/test_fuzz.py: refs/tags/a is a directory once tag a/b exists."""
    assert ags(world, "tag", "a/b", world.a)[0] == 0
    for spec, error in [
        ("a", "no session, node or tag matches 'a' (an id prefix needs at least 4 digits)"),
        ("a/b/c", "no session, node or tag matches 'a/b/c'"),  # a/b is a file
        ("tags/a", "no tag a"),
        ("checkpoint/x", "no session, node or tag matches 'checkpoint/x'"),
    ]:
        code, _, err = ags(world, "log", spec)
        assert code == 1 and err == f"ags: {error}\n", err
