"""``ags serve`` over plain HTTP: the guard (Host header, token, anti-CSRF, origin,
read-only), the headers of every response, paging, exports, errors.

The server is a real process on a free loopback port (tests/web_server.py);
requests are made with httpx, so each check sees exactly what was sent.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import cast

import anyio
import httpx
import pytest
from click.testing import CliRunner

from agent.transcript import SHOWN_CHARS
from cli.main import cli
from objstore import Node, SessionInfo, Store
from tests.web_server import REPO, Server, ags_serve
from tests.web_store import Demo, build_demo_store
from web.guard import Guard, is_loopback, needs_token
from web.history import steps_back
from web.live import MAX_WATCHERS, Watchers
from web.site import ServerPaths


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Demo, Path]]:
    root = tmp_path_factory.mktemp("guard")
    demo = build_demo_store(root / "store")
    with ags_serve(root / "store") as server:
        yield server, demo, root / "store"


def client(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.base, timeout=30)


def csrf_of(c: httpx.Client, path: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', c.get(path).text)
    assert found
    return found.group(1)


def title(store: Path, sid: str) -> str | None:
    with Store.open(store) as s:
        return s.session(sid).title


def test_a_host_name_the_server_does_not_answer_to_is_refused(
    site: tuple[Server, Demo, Path],
) -> None:
    server, _, _ = site
    with client(server) as c:
        # DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1.
        refused = c.get("/", headers={"host": f"evil.example:{server.port}"})
        assert refused.status_code == 421
        assert "Fix the failing build" not in refused.text
        assert c.get("/", headers={"host": "127.0.0.1"}).status_code == 421  # another port
        assert c.get("/", headers={"host": f"localhost:{server.port}"}).status_code == 200
        assert c.get("/").status_code == 200


def test_every_response_carries_a_strict_content_security_policy(
    site: tuple[Server, Demo, Path],
) -> None:
    server, demo, _ = site
    with client(server) as c:
        for path in ("/", f"/s/{demo.main}", "/static/app.js", "/nowhere", f"/s/{'0' * 32}"):
            r = c.get(path)
            csp = r.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src 'self'" in csp
            assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
            assert r.headers["x-content-type-options"] == "nosniff"
        assert c.get("/nowhere").status_code == 404
        assert c.get(f"/s/{'0' * 32}").status_code == 404
        page = c.get(f"/s/{demo.main}").text
        assert "<script>" not in page and " on" not in re.sub(r">[^<]*<", "><", page)


def test_a_session_page_asked_for_by_a_short_id_redirects_to_its_whole_id(
    site: tuple[Server, Demo, Path],
) -> None:
    server, demo, _ = site
    with client(server) as c:
        r = c.get(f"/s/{demo.main[:12]}?view=context")
        assert r.status_code == 308
        assert r.headers["location"] == f"/s/{demo.main}?view=context"
        assert c.get(r.headers["location"]).status_code == 200
        assert c.get(f"/s/{demo.main[:12]}/graph").status_code == 404  # the page itself only
        gone = c.get("/s/0000000000")
        assert gone.status_code == 404 and "matches &#39;0000000000&#39;" in gone.text
        assert c.get("/s/D9CF").status_code == 404  # not an id at all: no lookup


def test_a_change_needs_the_pages_csrf_token_and_origin(
    site: tuple[Server, Demo, Path],
) -> None:
    server, demo, store = site
    path = f"/s/{demo.main}/title"
    with client(server) as c, client(server) as other:
        token = csrf_of(c, f"/s/{demo.main}")
        for data, headers in [
            ({"title": "x"}, {}),  # no token
            ({"title": "x", "csrf": "0" * 64}, {}),  # a guess
            ({"title": "x", "csrf": csrf_of(other, f"/s/{demo.main}")}, {}),  # another browser's
            ({"title": "x", "csrf": token}, {"origin": "http://evil.example"}),
            ({"title": "x", "csrf": token}, {"origin": f"http://127.0.0.1:{server.port + 1}"}),
            ({"title": "x", "csrf": token}, {"sec-fetch-site": "cross-site"}),
        ]:
            r = c.post(path, data=data, headers=headers)
            assert r.status_code == 403, (data, headers)
            assert title(store, demo.main) == "Fix the failing build"
        r = c.post(path, content=json.dumps({"title": "x", "csrf": token}),
                   headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 403
        r = c.post(path, data={"title": "Renamed over HTTP", "csrf": token},
                   headers={"origin": server.base})  # fmt: skip
        assert r.status_code == 303 and r.headers["location"].startswith(f"/s/{demo.main}")
        assert title(store, demo.main) == "Renamed over HTTP"
        c.post(path, data={"title": "Fix the failing build", "csrf": token})


def test_a_bad_change_is_one_line_on_a_page_and_changes_nothing(
    site: tuple[Server, Demo, Path],
) -> None:
    server, demo, store = site
    with client(server) as c:
        token = csrf_of(c, f"/s/{demo.main}")
        r = c.post(f"/s/{demo.main}/tag", data={"csrf": token, "name": "bad name!"})
        assert r.status_code == 400 and "bad tag name" in r.text
        r = c.post(f"/s/{demo.main}/title", data={"csrf": token, "title": "x" * 1001})
        assert r.status_code == 400 and "at most 1000 characters" in r.text
        r = c.post(f"/s/{demo.main}/title", data={"csrf": token, "title": "a\x00b"})
        # what is wrong, not a length the title is far from
        assert r.status_code == 400 and "cannot hold a NUL" in r.text, r.text
        r = c.post(f"/s/{demo.main}/fork", data={"csrf": token, "node": "f" * 64})
        assert r.status_code == 400 and "not in the history" in r.text
        r = c.post(f"/s/{demo.main}/delete", data={"csrf": token})
        assert r.status_code == 400 and "confirmation" in r.text
        with Store.open(store) as s:
            assert s.session(demo.main).title == "Fix the failing build"
            assert s.tags() == {}
            assert len(s.sessions(include_archived=True)) == 4


def test_a_search_with_no_words_is_a_400_that_says_so(site: tuple[Server, Demo, Path]) -> None:
    """``/search?q="`` answered 200, saying "the search query is empty" of a quote."""
    server, _, _ = site
    with client(server) as c:
        for typed in ('"', '""', '"""'):
            r = c.get("/search", params={"q": typed})
            assert r.status_code == 400, typed
            assert re.findall(r'<p class="error">([^<]*)</p>', r.text) == [
                "the search query has no words to search for"
            ]
        for typed in ("NEAR(", "fix*", "-x", "col:x", "( )", "^"):  # searched as words
            assert c.get("/search", params={"q": typed}).status_code == 200


def test_a_title_sent_back_as_its_field_showed_it_is_left_as_it_is(tmp_path: Path) -> None:
    """The rename and fork fields show a title's control characters made visible
    (``\\t``): "rename" and "fork here" clicked without an edit stored those escapes
    as the new title."""
    odd = "routes\tand \x1b[1mconfig\u202e"
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session(title=odd)
        node = s.append(sid, {"role": "user", "content": "hi"})
    with ags_serve(tmp_path / "s") as server, client(server) as c:
        fields = {}
        for path in (f"/s/{sid}", f"/s/{sid}/at/{node}"):
            page = c.get(path).text
            found = re.search(r'<input type="text" name="title" value="([^"]*)"', page)
            assert found, page
            fields[path] = html.unescape(found.group(1))
            assert fields[path] == "routes\\tand \\x1b[1mconfig\\u202e"
        token = csrf_of(c, f"/s/{sid}")
        r = c.post(f"/s/{sid}/title", data={"csrf": token, "title": fields[f"/s/{sid}"]})
        assert r.status_code == 303
        r = c.post(
            f"/s/{sid}/fork",
            data={"csrf": token, "node": node, "title": fields[f"/s/{sid}/at/{node}"]},
        )
        assert r.status_code == 303
        fork = r.headers["location"].split("/s/")[1].split("?")[0]
        r = c.post(f"/s/{sid}/title", data={"csrf": token, "title": "routes and config"})
        assert r.status_code == 303
    with Store.open(tmp_path / "s") as s:
        assert s.session(fork).title == odd
        assert s.session(sid).title == "routes and config"  # an edit is taken
        assert [e.reason for e in s.reflog(sid)] == ["title"]  # the unedited one: no change


def test_pages_of_sessions_filter_by_project_and_state(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as s, s.batch():
        for i in range(120):
            sid = s.new_session(title=f"session {i:03d}", root="/a" if i % 3 else "/b")
            s.append(sid, {"role": "user", "content": f"number {i}"})
    with ags_serve(tmp_path / "s") as server, client(server) as c:
        first = c.get("/").text
        assert "120 sessions" in first and "page 1 of 3" in first
        assert first.count('<tr class="archived">') == 0
        assert len(re.findall(r"<tr>", first)) == 51  # the header and 50 rows
        last = c.get("/", params={"page": "3"}).text
        assert len(re.findall(r"<tr>", last)) == 21
        assert "session 000" in last and "session 119" not in last
        only_b = c.get("/", params={"project": "/b"}).text
        assert "40 sessions" in only_b and "session 001" not in only_b
        assert c.get("/", params={"page": "99"}).status_code == 200  # the last page
        assert c.get("/", params={"page": "x", "state": "?"}).status_code == 200


def test_exports_download_what_ags_export_writes(site: tuple[Server, Demo, Path]) -> None:
    server, demo, _ = site
    with client(server) as c:
        doc = c.get(f"/s/{demo.main}/export/json")
        assert doc.headers["content-disposition"].startswith("attachment;")
        assert doc.json()["format"] == "ags-export"
        md = c.get(f"/s/{demo.main}/export/md")
        assert md.text.startswith("# Fix the failing build")
        page = c.get(f"/s/{demo.main}/export/html")
        assert "attachment" in page.headers["content-disposition"]
        assert "default-src 'none'" in page.text
        assert c.get(f"/s/{demo.main}/export/exe").status_code == 404


def test_read_only_shows_and_changes_nothing(tmp_path: Path) -> None:
    demo = build_demo_store(tmp_path / "s")
    with ags_serve(tmp_path / "s", "--read-only") as server, client(server) as c:
        page = c.get(f"/s/{demo.main}").text
        assert 'method="post"' not in page and "read-only" in page
        for path in ("archive", "title", "fork", "delete", "tag"):
            r = c.post(f"/s/{demo.main}/{path}", data={"csrf": "x", "title": "t", "name": "n"})
            assert r.status_code == 403 and "read-only" in r.text
        assert c.get(f"/s/{demo.main}/delete").status_code == 400
        with Store.open(tmp_path / "s") as s:
            assert not s.session(demo.main).archived


def test_the_token_is_needed_for_every_request(tmp_path: Path) -> None:
    build_demo_store(tmp_path / "s")
    with ags_serve(tmp_path / "s", "--token") as server, client(server) as c:
        token = server.url.split("?token=", 1)[1]
        wrong = token[:-1] + ("y" if token.endswith("x") else "x")  # never the token itself
        for path in ("/", "/static/app.js", "/search?q=fix", f"/?token={wrong}"):
            r = c.get(path)
            assert r.status_code == 403 and "token" in r.text
        # A path that reads as another site ("//host") is brought back to this one.
        r = c.get(f"/%2F%2Fevil.example?token={token}")
        assert r.status_code == 303 and r.headers["location"] == "/evil.example"
        r = c.get(f"/?token={token}")
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert c.get("/").status_code == 200  # the cookie now
        assert "Fix the failing build" in c.get("/").text


def test_off_loopback_a_token_is_always_asked() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.3.2.1") and is_loopback("::1")
    assert is_loopback("localhost") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    assert not is_loopback("::") and not is_loopback("example.com")
    assert needs_token("0.0.0.0", asked=False) and needs_token("10.1.2.3", asked=False)
    assert not needs_token("127.0.0.1", asked=False) and needs_token("127.0.0.1", asked=True)
    lan = Guard("192.168.1.5", 8765, "t" * 32)
    assert lan.allowed_host("192.168.1.5:8765") and lan.allowed_host("127.0.0.1:8765")
    assert not lan.allowed_host("evil.example:8765") and not lan.allowed_host("192.168.1.5")
    everywhere = Guard("0.0.0.0", 8765, "t" * 32)
    assert everywhere.allowed_host("my-laptop.local:8765")  # the token guards it
    assert everywhere.first_url() == f"http://127.0.0.1:8765/?token={'t' * 32}"
    assert Guard("::1", 80, None).first_url() == "http://[::1]:80/"


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        Store.open(tmp_path / "s").close()
        result = CliRunner().invoke(
            cli, ["--store", str(tmp_path / "s"), "serve", "--port", str(port)]
        )
    assert result.exit_code == 1
    assert (
        result.output.strip()
        .splitlines()[-1]
        .startswith(f"ags: cannot listen on 127.0.0.1 port {port}")
    )


def test_an_empty_host_is_refused_not_every_interface(tmp_path: Path) -> None:
    """``--host ""`` listened on every interface and said "listening on , not only this
    machine" under an address of 127.0.0.1."""
    Store.open(tmp_path / "s").close()
    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "s"), "serve", "--host", ""])
    assert result.exit_code == 2
    assert "give an address (0.0.0.0 for every interface)" in result.output


def next_event(lines: Iterator[str]) -> tuple[str, str]:
    """The next named event of a server-sent event stream: (event, data)."""
    kind, data = "", ""
    for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and kind:
            return kind, data
    raise AssertionError("the stream ended")


def test_live_events_append_reload_and_gone(site: tuple[Server, Demo, Path]) -> None:
    server, _, store = site
    with Store.open(store) as s:
        sid = s.new_session(title="watched")
        s.append(sid, {"role": "user", "content": "one"})
        head = s.session(sid).head
    with client(server) as c, c.stream("GET", f"/s/{sid}/events?since={head}") as events:
        assert events.headers["content-type"].startswith("text/event-stream")
        lines = events.iter_lines()
        with Store.open(store) as s:
            s.append(sid, {"role": "assistant", "content": "two *words*"})
        kind, data = next_event(lines)
        update = json.loads(data)
        assert kind == "update" and update["messages"] == 2 and update["replace"] == []
        assert len(update["append"]) == 1 and "<em>words</em>" in update["append"][0]
        with Store.open(store) as s:  # a compaction changes what the model saw: reload
            s.compact(sid, "short", keep=1)
        assert next_event(lines)[0] == "reload"
    with client(server) as c, c.stream("GET", f"/s/{sid}/events?since={head}") as events:
        lines = events.iter_lines()
        assert next_event(lines)[0] == "reload"  # the page is behind by a compaction
    with Store.open(store) as s:
        head = s.session(sid).head
        s.rewind(sid, f"{sid}~1")
    with client(server) as c, c.stream("GET", f"/s/{sid}/events?since={head}") as events:
        assert next_event(events.iter_lines())[0] == "reload"  # moved back, not forward
    with Store.open(store) as s:
        head = s.session(sid).head
    with client(server) as c, c.stream("GET", f"/s/{sid}/events?since={head}") as events:
        lines = events.iter_lines()
        with Store.open(store) as s:
            s.delete(sid)
        assert next_event(lines)[0] == "gone"


def test_a_long_text_is_cut_on_the_page_and_linked_whole(tmp_path: Path) -> None:
    """Each text of an entry is shown up to SHOWN_CHARS: a message of many MB made a page
    of as many MB. The rest is a link away: the whole entry, as plain text."""
    long = "".join(f"line {i:07d} <b>x</b>\n" for i in range(SHOWN_CHARS // 10))
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session(title="long")
        said = s.append(sid, {"role": "assistant", "content": long})
        call = {"id": "c1", "name": "write_file", "arguments": {"path": "a.txt", "content": long}}
        asked = s.append(sid, {"role": "assistant", "content": "", "tool_calls": [call]})
        ran = s.append(sid, {"role": "tool", "tool_call_id": "c1", "content": long})
        s.append(sid, {"role": "user", "content": "short"})
    more = f"{len(long) - SHOWN_CHARS:,} more characters"
    with ags_serve(tmp_path / "s") as server, client(server) as c:
        page = c.get(f"/s/{sid}").text
        assert len(page) < 4 * SHOWN_CHARS * 2  # three texts cut, escaped
        assert page.count(more) == 2  # the message and the output; the call's is its JSON
        assert page.count(" more characters: <a href=") == 3
        links = re.findall(r'<a href="(/text/[0-9a-f]{64})">the whole entry as text</a>', page)
        assert sorted(links) == sorted(f"/text/{n}" for n in (said, asked, ran))
        assert "line 0000000 &lt;b&gt;x&lt;/b&gt;" in page and "short" in page
        for node, shown in ((said, long), (asked, json.dumps(long)), (ran, long)):
            whole = c.get(f"/text/{node}")
            assert whole.status_code == 200
            assert whole.headers["content-type"] == "text/plain; charset=utf-8"
            assert shown in whole.text  # the call's arguments as the JSON they are
        assert '"path": "a.txt"' in c.get(f"/text/{asked}").text
        at = c.get(f"/s/{sid}/at/{said}").text
        assert more in at and f'href="/text/{said}"' in at
        assert c.get(f"/text/{'0' * 64}").status_code == 404
        assert c.get("/text/nothex").status_code == 404
        # The id of a message (a blob) is no node: said so, not that the store is corrupt.
        with Store.open(tmp_path / "s") as s:
            blob = s.node(said).content
        r = c.get(f"/text/{blob}")
        assert r.status_code == 404 and f"no node {blob}" in r.text and "corrupt" not in r.text
        assert c.get(f"/s/{sid}/at/{'0' * 64}").status_code == 404


def test_an_error_page_names_no_path_of_the_server(tmp_path: Path) -> None:
    """``/diff?a=HEAD`` said "nothing is checked out for /the/server/directory", and a
    search index that cannot be opened named the store's path."""
    store = tmp_path / "s"
    demo = build_demo_store(store)
    with ags_serve(store) as server, client(server) as c:
        secret_places = (str(REPO), str(store), str(tmp_path), str(Path.home()))
        for spec in ("HEAD", "HEAD~1", "HEAD@{1}"):
            r = c.get("/diff", params={"a": spec, "b": demo.main})
            assert r.status_code == 404
            assert f"{spec}: nothing is checked out" in r.text
            assert not [p for p in secret_places if p in r.text], r.text
        index = store / "cache" / "search.sqlite"
        index.parent.mkdir(exist_ok=True)
        index.unlink(missing_ok=True)
        index.mkdir()  # the index cannot be opened: the store's error names its file
        r = c.get("/search", params={"q": "tests"})
        assert "cannot use the search index &lt;store&gt;/cache/search.sqlite" in r.text
        assert not [p for p in secret_places if p in r.text], r.text


def test_a_server_path_is_hidden_where_it_ends_not_inside_another_name(tmp_path: Path) -> None:
    paths = ServerPaths.of(tmp_path / "store")
    assert paths.hide(f"no store at {tmp_path}/store (init)") == "no store at <store> (init)"
    assert paths.hide(f"'{tmp_path}/store/refs/x': gone") == "'<store>/refs/x': gone"
    assert paths.hide(f"{tmp_path}/store2 is not a store") == f"{tmp_path}/store2 is not a store"
    assert paths.hide(f"nothing is checked out for {Path.cwd()}") == (
        "nothing is checked out for <server directory>"
    )
    assert paths.hide("a path of a session: /src/app") == "a path of a session: /src/app"


def note_of(page: str) -> str | None:
    found = re.search(r'<p class="note" role="status">(.*?)</p>', page, re.S)
    return found.group(1) if found else None


def test_a_page_shows_only_the_notes_the_app_made(tmp_path: Path) -> None:
    """``?note=`` was shown as given: a link could make the site say anything."""
    demo = build_demo_store(tmp_path / "s")
    with ags_serve(tmp_path / "s") as server, client(server) as c:
        main = f"/s/{demo.main}"
        for path, params in [
            ("/", {"note": "your sessions were deleted: ring us on +1 555 0100"}),
            (main, {"note": "Your session expired, log in at phish.example"}),
            (main, {"note": "archived"}),  # it is not
            (main, {"note": "forked"}),  # it is no fork
            (main, {"note": "tagged", "tag": "call-555-0100"}),  # no such tag
            (main, {"note": "tagged", "tag": "<b>x</b>"}),
            ("/", {"note": "deleted", "session": demo.main[:12]}),  # it is still there
            ("/", {"note": "deleted", "session": "ring us on 555 0100"}),
            ("/", {"note": "renamed"}),  # a note of another page
        ]:
            r = c.get(path, params=params)
            assert r.status_code == 200 and note_of(r.text) is None, (path, params)
            assert not [w for w in ("ring us", "phish", "call-555") if w in r.text]
        # The notes the changes themselves lead to are shown.
        token = csrf_of(c, main)
        said = {}
        for action, data in [
            ("title", {"title": "Renamed over HTTP"}),
            ("tag", {"name": "before-retry"}),
            ("archive", {}),
            ("unarchive", {}),
            ("fork", {}),
            ("delete", {"confirm": "yes"}),
        ]:
            r = c.post(f"{main}/{action}", data={"csrf": token, **data})
            assert r.status_code == 303, (action, r.text)
            said[action] = note_of(c.get(r.headers["location"]).text)
        assert said == {
            "title": "Renamed",
            "tag": "Tagged: before-retry",
            "archive": "Archived: hidden from the list until unarchived",
            "unarchive": "Unarchived",
            "fork": "Forked: this is the new session",
            "delete": f"Deleted: session {demo.main[:12]}",
        }


def test_control_characters_of_a_search_are_left_out_not_put_in_the_page(
    site: tuple[Server, Demo, Path],
) -> None:
    """A NUL (or an escape, a bidi override) of ``?q=`` landed in the search box."""
    server, _, _ = site
    with client(server) as c:
        r = c.get("/search", params={"q": "\x00ass\x1b[31mert\u202e\x7f\ttests\n"})
        assert r.status_code == 200
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", r.text)
        boxes = re.findall(r'<input type="search" name="q"[^>]*value="([^"]*)"', r.text)
        assert boxes == ["ass[31mert tests", "ass[31mert tests"]
        assert "Control characters in the search were left out." in r.text
        found = c.get("/search", params={"q": "\x00assert\x00"}).text  # searched without
        assert 'value="assert"' in found and "<mark>assert</mark>" in found
        # A tab or a line break is a space, and needs no word.
        plain = c.get("/search", params={"q": "failing\tbuild"}).text
        assert 'value="failing build"' in plain and "left out" not in plain


def test_a_message_of_another_session_is_not_shown_or_tagged_under_this_one(
    tmp_path: Path,
) -> None:
    """``/s/A/at/<a node of C>`` showed C's message under A's title, and a tag posted
    to A with C's node was made."""
    demo = build_demo_store(tmp_path / "s")
    with Store.open(tmp_path / "s") as s:
        hostile = s.session(demo.hostile).head
        main_head = s.session(demo.main).head  # after the point the fork left main
    assert hostile and main_head
    with ags_serve(tmp_path / "s") as server, client(server) as c:
        token = csrf_of(c, f"/s/{demo.main}")
        for sid, node in ((demo.main, hostile), (demo.fork, main_head)):
            r = c.get(f"/s/{sid}/at/{node}")
            assert r.status_code == 404 and f"has no message {node[:12]}" in r.text
            assert "__pwned" not in r.text and "Now run them again" not in r.text
            r = c.post(f"/s/{sid}/tag", data={"csrf": token, "name": "elsewhere", "node": node})
            assert r.status_code == 400 and "not in the history" in r.text
            r = c.post(f"/s/{sid}/fork", data={"csrf": token, "node": node})
            assert r.status_code == 400 and "not in the history" in r.text
        with Store.open(tmp_path / "s") as s:
            assert s.tags() == {} and len(s.sessions(include_archived=True)) == 4
        # A message the fork shares with main is in the history of both.
        for sid in (demo.main, demo.fork):
            r = c.get(f"/s/{sid}/at/{demo.fork_node}")
            assert r.status_code == 200 and "I will fix it." in r.text
        r = c.post(
            f"/s/{demo.fork}/tag", data={"csrf": token, "name": "shared", "node": demo.fork_node}
        )
        assert r.status_code == 303
        with Store.open(tmp_path / "s") as s:
            assert s.tags() == {"shared": demo.fork_node}


class NodeReads:
    """A store whose node reads are counted."""

    def __init__(self, store: Store) -> None:
        self.store, self.reads = store, 0

    def node(self, node_id: str) -> Node:
        self.reads += 1
        return self.store.node(node_id)


def test_finding_a_message_in_a_long_history_stops_where_it_can(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as s, s.batch():
        long = s.new_session(title="long")
        nodes = [s.append(long, {"role": "user", "content": f"m{i}"}) for i in range(500)]
        short = s.new_session(title="short")
        s.append(short, {"role": "user", "content": "only"})
        s.compact(long, "summary", keep=0)
        after = s.append(long, {"role": "user", "content": "after"})
        head = s.session(long).head
        reads = NodeReads(s)
        steps = [steps_back(cast(Store, reads), head, n) for n in (after, nodes[-1], nodes[0])]
        assert steps == [0, 2, 501]  # the compaction is a step too
        assert reads.reads == 1 + (1 + 2) + (1 + 501)  # the node, then the walk to it
        reads.reads = 0
        assert steps_back(cast(Store, reads), s.session(short).head, nodes[250]) is None
        assert reads.reads == 2  # the node, then a head already below its count
        assert steps_back(cast(Store, reads), head, "0" * 64) is None


def test_live_streams_beyond_the_limit_are_refused_and_pages_still_answer(
    tmp_path: Path,
) -> None:
    """300 open live streams, each looking at the store every 0.5 s in the worker
    threads pages need, took most of a core and slowed every page. A server holds
    MAX_WATCHERS; one more is answered 503 (its page works, without live updates)."""
    demo = build_demo_store(tmp_path / "s")
    with Store.open(tmp_path / "s") as s:
        head = s.session(demo.main).head
    limits = httpx.Limits(max_connections=MAX_WATCHERS + 10)
    with (
        ags_serve(tmp_path / "s") as server,
        httpx.Client(base_url=server.base, timeout=30, limits=limits) as c,
        ExitStack() as streams,
    ):
        path = f"/s/{demo.main}/events?since={head}"
        opened = [streams.enter_context(c.stream("GET", path)) for _ in range(MAX_WATCHERS)]
        assert {r.status_code for r in opened} == {200}
        with c.stream("GET", path) as refused:  # (a stream, if let in, never ends)
            assert refused.status_code == 503
            assert f"{MAX_WATCHERS} pages are watching sessions live" in refused.read().decode()
            assert "text/event-stream" not in refused.headers["content-type"]
        assert c.get(f"/s/{demo.main}").status_code == 200  # pages are not held up
        opened[0].close()  # a page closed: its place is free again (once the server sees it)
        for _ in range(100):
            with c.stream("GET", path) as again:
                if again.status_code == 200:
                    break
            time.sleep(0.05)
        assert again.status_code == 200


def test_every_stream_waits_for_one_shared_look_at_the_store(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as s:
        sessions = [s.new_session(title=f"watched {i}") for i in range(3)]
    watchers = Watchers(tmp_path / "s", limit=10)
    seen: list[list[object]] = [[] for _ in range(10)]

    async def watch(i: int, sid: str) -> None:
        for _ in range(3):
            seen[i].append(await watchers.next_look(sid))

    async def main() -> None:
        numbers = [watchers.join(sessions[i % 3]) for i in range(10)]
        assert watchers.join(sessions[0]) is None  # over the limit
        async with anyio.create_task_group() as tasks:
            for i in range(10):
                tasks.start_soon(watch, i, sessions[i % 3])
            while watchers.looks < 1:
                await anyio.sleep(0.01)
            with Store.open(tmp_path / "s") as s:  # another process writes, deletes
                s.append(sessions[1], {"role": "user", "content": "new"})
                s.delete(sessions[2])
        for number in numbers:
            assert number is not None
            watchers.leave(number)
        assert watchers.streams == 0

    anyio.run(main)
    assert watchers.looks == 3  # one look a tick for the ten streams, not ten
    assert all(isinstance(info, SessionInfo) and info.messages == 0 for info in seen[0])
    assert [info.messages for info in seen[1] if isinstance(info, SessionInfo)] == [0, 1, 1]
    assert isinstance(seen[2][0], SessionInfo) and seen[2][1:] == [None, None]  # gone


def test_a_store_removed_under_the_server_is_not_made_again(tmp_path: Path) -> None:
    """Each page opened the store with ``create=True``: once the store was gone, the
    next page made a new, empty one where it was and showed "No sessions"."""
    demo = build_demo_store(tmp_path / "s")
    with ags_serve(tmp_path / "s") as server, client(server) as c:
        with Store.open(tmp_path / "s") as s:
            head = s.session(demo.main).head
        with c.stream("GET", f"/s/{demo.main}/events?since={head}") as events:
            assert events.status_code == 200
            shutil.rmtree(tmp_path / "s")
            lines = list(events.iter_lines())  # the stream ends: the store cannot be read
            assert "event: update" not in lines
        r = c.get("/")
        assert r.status_code == 400 and "no store at &lt;store&gt;" in r.text
        assert str(tmp_path) not in r.text
        assert c.get(f"/s/{demo.main}/events?since={head}").status_code == 400
    assert not (tmp_path / "s").exists()


def test_ctrl_c_with_live_pages_open_stops_the_server_without_a_traceback(
    tmp_path: Path,
) -> None:
    """uvicorn waits for open responses before it stops, then cancels them: each live
    stream printed a CancelledError traceback. The streams end when the server is told
    to stop, so it stops at once, quietly."""
    demo = build_demo_store(tmp_path / "s")
    with Store.open(tmp_path / "s") as s:
        head = s.session(demo.main).head  # what the page shows: its stream stays open
    with (
        ags_serve(tmp_path / "s") as server,
        httpx.Client(base_url=server.base, timeout=30) as c,
        ExitStack() as streams,
    ):
        path = f"/s/{demo.main}/events?since={head}"
        opened = [streams.enter_context(c.stream("GET", path)) for _ in range(3)]
        assert {r.status_code for r in opened} == {200}
        time.sleep(1.5)  # (the streams have looked at the store)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGINT)
        server.proc.send_signal(signal.SIGINT)  # as `uv run` passes the terminal's on
        assert server.proc.wait(10) == 130
        took = time.monotonic() - started
        for stream in opened:  # each ends as a stream does, not cut off
            assert "retry: 2000" in "".join(stream.iter_text())
    said = "".join(server.stderr)
    assert "Traceback" not in said and "CancelledError" not in said, said
    assert took < 1.0, took  # (uvicorn's graceful wait is 1 s, then it cancels)
