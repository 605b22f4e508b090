"""The format's limits (objstore/limits.py, FORMAT.md 3.1) at every entrance.

Too deep, too big or from the future: refused with one clear line (or, for
times, clamped), nothing written, memory bounded by the limit, and a value
that got in before the limits existed breaks only what holds it.
"""

from __future__ import annotations

import io
import json
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import zstandard
from click.testing import CliRunner
from conftest import tree_snapshot

from cli.main import cli
from objstore import CorruptObject, InvalidInput, Store, canonical, objects
from objstore import exchange as exchange_module
from objstore.exchange import BadExport, export_session, import_document, read_document
from objstore.limits import (
    DOCUMENT_DEPTH,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_INDEXED_CHARS,
    MAX_OBJECT_BYTES,
    NestingTooDeep,
    check_json_text,
    depth_exceeds,
    parse_json,
)
from objstore.search import SearchIndex
from objstore.store import META_DEPTH


def nested(depth: int, leaf: Any = "leaf") -> Any:
    """``leaf`` inside ``depth`` lists, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def ags(store: Path, *args: str, input: bytes | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", str(store), *args], input=input,
                                catch_exceptions=False)  # fmt: skip
    return result.exit_code, result.stdout, result.stderr


def one_line_error(code: int, err: str) -> str:
    assert code == 1 and err.startswith("ags: ") and err.count("\n") == 1, err
    return err


# -- nesting ---------------------------------------------------------------------


def test_depth_is_counted_in_containers_without_recursion():
    assert not depth_exceeds("x", 0) and not depth_exceeds({}, 1) and depth_exceeds({}, 0)
    assert not depth_exceeds({"a": [1, {"b": 2}]}, 3) and depth_exceeds({"a": [{"b": []}]}, 3)
    assert depth_exceeds(nested(100_000), MAX_DEPTH)  # no RecursionError at any depth
    assert parse_json(json.dumps(nested(MAX_DEPTH))) == nested(MAX_DEPTH)
    for depth in (MAX_DEPTH + 1, 985, 5000, 200_000):
        with pytest.raises(NestingTooDeep):
            parse_json("[" * depth + "]" * depth)


def test_append_takes_the_deepest_message_allowed_and_refuses_one_more(tmp_path):
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        deepest = {"role": "user", "content": nested(MAX_DEPTH - 1)}
        s.append(sid, deepest)
        assert s.context(sid) == [deepest]
        before = tree_snapshot(tmp_path / "s")
        for message, state, meta in [
            ({"role": "user", "content": nested(MAX_DEPTH)}, None, None),
            ({"role": "user", "content": nested(985)}, None, None),  # the message
            ({"role": "user", "content": "x"}, {"deep": nested(MAX_DEPTH)}, None),
            ({"role": "user", "content": "x"}, None, {"deep": nested(META_DEPTH)}),
        ]:
            with pytest.raises(
                InvalidInput, match=f"nested deeper than {MAX_DEPTH - (meta is not None)} levels"
            ):  # noqa: E501
                s.append(sid, message, state=state, meta=meta)
        with pytest.raises(InvalidInput, match="nested deeper"):
            s.compact(sid, {"role": "user", "content": nested(5000)})
        assert tree_snapshot(tmp_path / "s") == before
        s.append(sid, {"role": "user", "content": "x"}, meta={"deep": nested(META_DEPTH - 1)})


def _store_as_an_older_ags_would(s: Store, sid: str, message: dict[str, Any], monkeypatch) -> None:
    """Append ``message`` with the nesting check off, as ags did before it had one."""
    with monkeypatch.context() as m:
        m.setattr(canonical, "check_json", lambda *a, **k: None)
        s.append(sid, message)


def test_a_message_stored_too_deep_breaks_only_its_own_session(tmp_path, monkeypatch):
    path = tmp_path / "s"
    with Store.open(path) as s:
        good = s.new_session(title="good")
        s.append(good, {"role": "user", "content": "the needle is here"})
        bad = s.new_session(title="bad")
        s.append(bad, {"role": "user", "content": "the needle is here too"})
        _store_as_an_older_ags_would(s, bad, {"role": "user", "content": nested(400)}, monkeypatch)
    code, out, err = ags(path, "search", "needle")
    assert code == 0
    assert "the [needle] is here" in out and "too" not in out
    assert err.count("\n") == 1 and f"session {bad} skipped" in err and "nested deeper" in err
    one_line_error(*ags(path, "log", bad)[::2])
    code, out, _ = ags(path, "log", good)
    assert code == 0 and "the needle is here" in out
    code, out, _ = ags(path, "fsck")
    assert code == 1 and "nested deeper than" in out


# -- import ----------------------------------------------------------------------


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    with Store.open(tmp_path / "source") as s:
        sid = s.new_session(title="source")
        s.append(sid, {"role": "user", "content": "hello"})
        s.append(sid, {"role": "assistant", "content": "hi"})
        return tmp_path / "target", export_session(s, sid)


def test_import_of_a_document_nested_5000_deep_is_one_line_and_changes_nothing(exported, tmp_path):
    target, doc = exported
    Store.open(target).close()
    before = tree_snapshot(target)
    text = json.dumps(doc)
    deep = text.replace('"content": "hello"', '"content": ' + "[" * 5000 + "]" * 5000)
    err = one_line_error(*ags(target, "import", "-", input=deep.encode())[::2])
    assert f"nested deeper than an export document may be ({DOCUMENT_DEPTH} levels" in err
    just_over = text.replace('"content": "hello"', '"content": ' + json.dumps(nested(MAX_DEPTH)))
    err = one_line_error(*ags(target, "import", "-", input=just_over.encode())[::2])
    assert "nested deeper than an export document may be" in err
    assert tree_snapshot(target) == before
    # A document handed over parsed (the library) is checked where the body is.
    with Store.open(target) as s, pytest.raises(BadExport) as caught:
        import_document(s, json.loads(just_over))
    i = next(i for i, o in enumerate(doc["objects"]) if o["body"].get("content") == "hello")
    where = f"$.objects[{i}].body.content" + "[0]" * (MAX_DEPTH - 1)  # the 101st container
    assert str(caught.value) == f"{where}: nested deeper than {MAX_DEPTH} levels, the limit"
    assert tree_snapshot(target) == before


def test_import_refuses_an_object_over_the_size_limit(exported):
    target, doc = exported
    blob = next(o for o in doc["objects"] if o["body"].get("content") == "hello")
    blob["body"]["content"] = "x" * MAX_OBJECT_BYTES
    with Store.open(target) as s:
        before = tree_snapshot(target)
        with pytest.raises(BadExport, match=r"body: [\d,]+ bytes, over the limit of one object"):
            import_document(s, doc)
        assert tree_snapshot(target) == before


def test_import_reads_no_more_than_the_document_limit(tmp_path, monkeypatch):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(2 * MAX_DOCUMENT_BYTES)  # sparse: 2 GiB that cost nothing
    started = time.monotonic()
    code, _, err = ags(tmp_path / "s", "import", str(big))
    assert code == 1 and "over 1,073,741,824 bytes, the limit of a document" in err
    assert time.monotonic() - started < 5  # refused by its size, not read

    class Endless(io.RawIOBase):  # a pipe that never ends
        served = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            buffer[:] = b" " * len(buffer)
            self.served += len(buffer)
            return len(buffer)

    limit = 3 * 1024 * 1024
    monkeypatch.setattr(exchange_module, "MAX_DOCUMENT_BYTES", limit)
    stream = Endless()
    with pytest.raises(BadExport, match="the limit of a document"):
        read_document(io.BufferedReader(stream), "stdin")
    assert stream.served <= limit + 1 + io.DEFAULT_BUFFER_SIZE


def test_future_times_are_clamped_on_import_and_do_not_win_continue(exported, tmp_path):
    from agent.resume import choose_session

    target, doc = exported
    project = tmp_path / "project"
    project.mkdir()
    doc["session"].update(created="2999-01-01T00:00:00Z", updated="2999-12-31T23:59:59.999999Z",
                          root=str(project))  # fmt: skip
    with Store.open(target) as s:
        before = time.time()
        imported = import_document(s, doc).session
        mine = s.new_session(title="mine", root=project)
        s.append(mine, {"role": "user", "content": "my latest work"})
        info = s.session(imported)
        assert info.created == info.updated and info.updated <= s.session(mine).updated
        assert time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(before)) <= info.updated
        assert [r.id for r in s.sessions()] == [mine, imported]
        chosen = choose_session(s, resume=None, continue_latest=True, project=str(project))
        assert chosen.session == mine


@pytest.mark.parametrize("when", ["2026-13-01T00:00:00Z", "2026-02-30T10:00:00.5Z"])
def test_a_time_that_is_no_date_is_refused(exported, when):
    target, doc = exported
    doc["session"]["updated"] = when
    with (
        Store.open(target) as s,
        pytest.raises(BadExport, match=r"\$.session.updated: .* is not a real time"),
    ):  # noqa: E501
        import_document(s, doc)


def test_imported_times_are_normalised_to_the_store_format(exported):
    target, doc = exported
    doc["session"].update(created="2020-01-02T03:04:05Z", updated="2020-01-02T03:04:05.123456Z")
    with Store.open(target) as s:
        info = s.session(import_document(s, doc).session)
    assert (info.created, info.updated) == ("2020-01-02T03:04:05.000Z", "2020-01-02T03:04:05.123Z")


@pytest.mark.parametrize("root", ["relative/path", "/x\0y", ""])
def test_a_project_root_that_is_no_absolute_path_is_refused(exported, root):
    """Both were imported as they were, and listed by ls (the NUL as \\x00)."""
    target, doc = exported
    doc["session"]["root"] = root
    with Store.open(target) as s, pytest.raises(BadExport, match=r"\$.session.root: "):
        import_document(s, doc)


def test_a_time_before_the_year_1000_keeps_four_digits_and_comes_back(exported, tmp_path):
    """Year 1 was written as ``1-01-01T...``: an export ags's own import refused."""
    target, doc = exported
    doc["session"].update(created="0001-01-01T00:00:00Z", updated="0999-12-31T23:59:59.5Z")
    with Store.open(target) as s:
        sid = import_document(s, doc).session
        info = s.session(sid)
        assert (info.created, info.updated) == (
            "0001-01-01T00:00:00.000Z",
            "0999-12-31T23:59:59.500Z",
        )
        again = export_session(s, sid)
    with Store.open(tmp_path / "other") as s:
        assert s.session(import_document(s, again).session).created == info.created


def test_export_refuses_a_document_import_would_refuse(exported, monkeypatch):
    _, doc = exported
    monkeypatch.setattr(exchange_module, "MAX_DOCUMENT_BYTES", 500)
    with pytest.raises(InvalidInput, match="over the limit of an export document"):
        exchange_module.encode_document(doc)


# -- size of one object, and the decoder -------------------------------------------


def test_append_refuses_a_message_over_the_object_limit(tmp_path):
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        before = tree_snapshot(tmp_path / "s")
        with pytest.raises(InvalidInput, match=r"message: [\d,]+ bytes, over the limit"):
            s.append(sid, {"role": "user", "content": "x" * MAX_OBJECT_BYTES})
        with pytest.raises(InvalidInput, match="over the limit of one object"):
            s.objects.put("blob", b'"' + b"x" * MAX_OBJECT_BYTES + b'"')
        assert tree_snapshot(tmp_path / "s") == before


def _frame_claiming(size: int, payload: bytes) -> bytes:
    """A stored form whose zstd frame header says the content is ``size`` bytes."""
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(payload))
    descriptor = frame[4]
    assert descriptor >> 6 in (0, 1)  # a 1- or 2-byte content size field, as for small content
    single = descriptor & 0x20
    header = 5 + (0 if single else 1) + [0, 1, 2, 4][descriptor & 3]
    old_field = 1 if descriptor >> 6 == 0 else 2
    new = bytes([descriptor & 0x3F | 0xC0])  # an 8-byte content size field
    return b"\x01" + bytes(frame[:4]) + new + bytes(frame[5:header]) + size.to_bytes(8, "little") \
        + bytes(frame[header + old_field :])  # fmt: skip


def test_a_frame_that_claims_any_size_is_a_corrupt_object_not_a_memory_error(tmp_path):
    oid, stored = objects.encode("blob", b'"hello"')
    for claim in (2**62, MAX_OBJECT_BYTES + 1024):
        with pytest.raises(CorruptObject, match=f"{oid} is corrupt: its zstd frame claims"):
            objects.decode(oid, _frame_claiming(claim, b'blob\0"hello"'))


def test_a_damaged_frame_header_in_a_pack_is_named_by_log_and_fsck(tmp_path):
    path = tmp_path / "s"
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": "hello"})
        head = s.node_id(sid)
    pack = next((path / "objects" / "pack").glob("*.pack"))
    data = bytearray(pack.read_bytes())
    # The first record's payload: the zstd frame of the block of nodes, which the
    # sealing writer writes before the messages' (FORMAT.md 5.5).
    at = 8 + 37
    assert data[at : at + 4] == b"\x28\xb5\x2f\xfd"
    data[at + 4] |= 0xC0  # one flipped byte: the frame header now has an 8-byte size field
    claim = zstandard.frame_content_size(bytes(data[at:]))
    assert claim > MAX_OBJECT_BYTES  # what the damaged header says, read from the bytes after it
    pack.write_bytes(bytes(data))
    for args in (["log", sid], ["fsck"]):
        code, out, err = ags(path, *args)
        assert code == 1 and "claims" in out + err, (out, err)
        assert head in out + err, (out, err)
        assert "MemoryError" not in out + err


def test_a_frame_without_a_content_size_is_read_and_bounded():
    oid = objects.object_id("blob", b'"hello"')
    plain = zstandard.ZstdCompressor(write_content_size=False)
    unsized = b"\x01" + plain.compress(b'blob\0"hello"')
    assert zstandard.frame_content_size(unsized[1:]) == -1
    assert objects.decode(oid, unsized) == ("blob", b'"hello"')
    # 2 GiB of zeros in 64 KB, with no size in the header: refused, reading only up to the limit.
    script = textwrap.dedent("""
        import resource, zstandard
        from objstore import CorruptObject, objects
        chunks = zstandard.ZstdCompressor(write_content_size=False).compressobj()
        frame = b"".join([chunks.compress(b"blob\\0" + bytes(1 << 20)) for _ in range(2048)])
        frame += chunks.flush()
        try:
            objects.decode("0" * 64, b"\\x01" + frame)
        except CorruptObject as e:
            print(e)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    message, peak_mb = proc.stdout.splitlines()
    assert "holds more than an object may" in message, proc.stderr
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    assert int(peak_mb) < 700, (peak_mb, baseline)  # the limit's worth, not 2 GiB


# -- search ------------------------------------------------------------------------


def test_search_indexes_a_bounded_amount_of_each_message(tmp_path):
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        filler = "word " * (MAX_INDEXED_CHARS // 5)
        s.append(sid, {"role": "tool", "content": "beginning " + filler + " farbeyond"})
        with SearchIndex(s) as index:
            index.refresh()
            assert len(index.search("beginning")) == 1
            assert index.search("farbeyond") == []
            sql = "SELECT max(length(ags_unzstd(text))) FROM blobs"
            (longest,) = index._db.execute(sql).fetchone()
    assert longest == MAX_INDEXED_CHARS


# -- the model clients and the tools -----------------------------------------------


def test_tool_arguments_nested_too_deep_are_kept_raw_and_the_tool_refuses_them(tmp_path):
    from agent.messages import ARGUMENTS_DEPTH, tool_call
    from agent.tools import Toolbox

    raw = "{" + '"a":{' * 5000 + "}" * 5001
    call = tool_call("c1", "shell", raw)
    assert call["arguments"] == {} and call["arguments_raw"] == raw
    deep_object = {"command": nested(ARGUMENTS_DEPTH)}
    call = tool_call("c2", "shell", deep_object)
    assert call["arguments"] == {} and json.loads(call["arguments_raw"]) == deep_object
    assert tool_call("c3", "shell", {"command": nested(ARGUMENTS_DEPTH - 1)})["arguments"]
    outcome = Toolbox(tmp_path, None, {}).run("shell", raw)
    assert not outcome.ok and "nested deeper than" in outcome.content


def test_a_reply_nested_5000_deep_is_a_protocol_error(tmp_path):
    from model_server import FakeModelServer

    from agent.errors import ModelError
    from agent.models import make_client

    deep = "[" * 5000 + "]" * 5000
    with FakeModelServer() as server:
        server.add({"error": {"status": 500, "body": '{"error": ' + deep + "}"}},
                   {"error": {"status": 400, "body": '{"error": ' + deep + "}"}})  # fmt: skip
        client = make_client("ollama", server.url, "gemma4")
        client.retry = type(client.retry)(attempts=1)
        with pytest.raises(ModelError) as caught:
            client.chat([{"role": "user", "content": "hi"}], None, None, None)
        assert "\n" not in str(caught.value)
        with pytest.raises(ModelError):
            client.chat([{"role": "user", "content": "hi"}], None, None, None)
        client.close()


def _run_ags(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    ags_script = str(Path(sys.executable).with_name("ags"))
    return subprocess.run([ags_script, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)  # fmt: skip


def test_ags_run_survives_tool_arguments_nested_5000_deep(tmp_path):
    """OpenAI style (arguments as a string): the call is kept raw and the tool refuses it;
    Ollama style (arguments as an object inside the line): one line, exit 1."""
    import os
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    from docker_fixture import require_docker
    from model_server import FakeModelServer

    image = require_docker()
    project = tmp_path / "project"
    project.mkdir()
    raw = "{" + '"a":{' * 5000 + "}" * 5001
    base_env = {**os.environ, "AGS_STORE": str(tmp_path / "store"), "AGS_IMAGE": image}
    base_env.pop("OLLAMA_HOST", None)
    with FakeModelServer(flavor="vllm", models=("qwen3",)) as server:
        server.add({"tool_calls": [{"name": "shell", "arguments_raw": raw}]}, {"text": "gave up"})
        env = {**base_env, "AGS_BASE_URL": server.url, "AGS_PROVIDER": "openai"}
        proc = _run_ags(env, project, "run", "go", "--model", "qwen3", "--yes-tools", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    sid = json.loads(proc.stdout)["session"]
    with Store.open(tmp_path / "store") as s:
        newest_first = [e.message for e in s.log(sid)]
    call, result = newest_first[2], newest_first[1]
    assert call["tool_calls"][0]["arguments_raw"] == raw
    assert "nested deeper than" in result["content"]

    line = ('{"model":"gemma4","message":{"role":"assistant","content":"","tool_calls":'
            '[{"function":{"name":"shell","arguments":' + "[" * 5000 + "]" * 5000 + '}}]},'
            '"done":true,"done_reason":"stop"}\n').encode()  # fmt: skip

    class DeepOllama(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/api/chat":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Content-Length", str(len(line)))
            self.end_headers()
            self.wfile.write(line)

        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), DeepOllama)
    Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        proc = _run_ags({**base_env, "AGS_BASE_URL": url}, project, "run", "go", "--yes-tools")
    finally:
        httpd.shutdown()
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "is not JSON (nested deeper than" in proc.stderr


@pytest.mark.parametrize(
    "text",
    [
        b"[9223372036854775808]",  # 2**63: the first integer orjson reads as a float
        b'{"a": -9223372036854775809, "b": "x"}',
        b'[1, {"deep": [123456789012345678901234567890]}]',
        "[18446744073709551616]",  # 2**64, as str
    ],
)
def test_integers_beyond_64_bits_are_read_exactly(text: bytes | str) -> None:
    assert parse_json(text) == json.loads(text)
    assert all(type(n) is int for n in _numbers(parse_json(text)))


def _numbers(value: object) -> list[object]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return [value] if isinstance(value, int | float) else []


def test_fsck_s_quick_check_of_a_blob_refuses_exactly_what_a_read_refuses():
    """fsck checks each blob with ``check_json_text``, which builds no exact value:
    it must accept and refuse the very texts ``parse_json`` does."""
    deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    texts = [
        b'{"a": 1}',
        b"[" * MAX_DEPTH + b"]" * MAX_DEPTH,  # at the limit
        deep,
        b'{"s": "' + b"[" * 300 + b'"}',  # brackets in a string open nothing
        b'{"big": 123456789012345678901234567890}',  # beyond 64 bits: read exactly
        b"NaN",  # the standard parser's, not orjson's
        b'"\\ud800"',  # a lone surrogate escaped
        b'{"a": }',
        b"",
        b"\xff",
        b'{"a": 1} x',
    ]
    for text in texts:
        try:
            parse_json(text)
        except ValueError as e:
            with pytest.raises(ValueError) as raised:
                check_json_text(text)
            assert type(raised.value) is type(e), text
        else:
            check_json_text(text)


def test_huge_as_text_reads_what_the_standard_parser_with_its_rule_reads():
    """Importers read other programs' lines with ``huge_as_text``: orjson first, the
    standard parser (a number no double holds kept as its text, NaN and Infinity
    refused) for what orjson passes on. Both ways give the same values."""

    def standard(text: bytes) -> Any:
        def finite(t: str) -> float | str:
            return t if float(t) in (float("inf"), float("-inf")) else float(t)

        def refuse(name: str) -> Any:
            raise ValueError(name)

        return json.loads(text, parse_float=finite, parse_constant=refuse)

    texts = [
        b'{"a": [1, 2.5, -0.0, "x"], "b": {"c": null, "d": true}}',
        b'{"n": 1e400, "m": -1e400, "k": 1.5}',
        b'{"big": 123456789012345678901234567890, "f": 1e300}',
        b'{"s": "\\ud83d\\ude00", "t": "\\u00e9"}',
        b'{"lone": "\\ud800"}',
        b"[1e16, 0.1, 12345678901234567890.5]",
    ]
    for text in texts:
        value = parse_json(text, 500, huge_as_text=True)
        assert value == standard(text) and repr(value) == repr(standard(text)), text
    assert parse_json(b'{"n": 1e400}', huge_as_text=True) == {"n": "1e400"}
    for refused in (b'{"n": NaN}', b"[Infinity]", b"-Infinity", b'{"a": }'):
        with pytest.raises(ValueError):
            parse_json(refused, 500, huge_as_text=True)
    deep = b"[" * 501 + b"]" * 501
    with pytest.raises(NestingTooDeep):
        parse_json(deep, 500, huge_as_text=True)
    # Past the depth the quick walk looks at, within the limit: read, numbers exact.
    for inner in (b"1", b"123456789012345678901234567890"):
        text = b"[" * 300 + inner + b"]" * 300
        value = parse_json(text, 500, huge_as_text=True)
        for _ in range(300):
            (value,) = value
        assert value == int(inner)
    with pytest.raises(TypeError):
        parse_json(b"1", huge_as_text=True, parse_float=float)
