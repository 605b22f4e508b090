"""``ags serve`` in a real Chromium: what a person does with the session browser.

Each test drives the system Chromium (Playwright) against ``ags serve`` run as
a real process on a free loopback port, over a store built for it
(tests/web_store.py), and saves screenshots of the pages it visits under its
temporary folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from objstore import Store
from tests.web_server import Server, ags_serve, chromium
from tests.web_store import HOSTILE_TITLE, Demo, build_demo_store

WAIT_MS = 15_000  # a live update shows within a second; the machine may be busy


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Demo, Path]]:
    root = tmp_path_factory.mktemp("web")
    demo = build_demo_store(root / "store")
    with ags_serve(root / "store") as server:
        yield server, demo, root / "store"


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.problems = []  # uncaught script errors: none expected
    pg.on("pageerror", lambda e: pg.problems.append(str(e)))
    yield pg
    context.close()


def shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)


def test_list_search_and_a_hit_that_opens_its_tool_result(
    site: tuple[Server, Demo, Path], page: Any, tmp_path: Path
) -> None:
    server, demo, _ = site
    page.goto(server.url)
    shot(page, tmp_path, "list")
    rows = page.locator("table.sessions tbody tr")
    titles = rows.locator("td:first-child a").all_inner_texts()
    # Newest first; the archived session is not listed until asked for.
    assert titles[:2] == [HOSTILE_TITLE.replace("\u202e", "\\u202e"), "Try a different fix"]
    assert "An old experiment" not in titles
    assert "gemma4" in rows.nth(1).inner_text() and "/src/app" in rows.nth(1).inner_text()
    page.select_option("select[name=state]", "archived")
    page.click("form.filters button")
    assert (
        page.locator("table.sessions tbody tr").all_inner_texts()[0].startswith("An old experiment")
    )

    page.fill("nav.top input[name=q]", "assert")
    page.press("nav.top input[name=q]", "Enter")
    page.wait_for_selector("ol.hits li")
    shot(page, tmp_path, "search")
    hit = page.locator("ol.hits li").filter(has_text="Fix the failing build")
    assert hit.locator("mark").first.inner_text() == "assert"
    hit.locator("a.hit").click()
    # The hit is a tool result, folded into its call: the link unfolds it.
    result = page.locator(f"#n-{demo.result_node[:12]}")
    result.wait_for(state="visible")
    assert "1 failed" in result.inner_text()
    assert page.url.endswith(f"/s/{demo.main}#n-{demo.result_node[:12]}")
    assert not page.problems


def test_transcript_markdown_tool_calls_compaction_and_the_model_view(
    site: tuple[Server, Demo, Path], page: Any, tmp_path: Path
) -> None:
    server, demo, _ = site
    page.goto(f"{server.base}/s/{demo.main}")
    shot(page, tmp_path, "transcript")
    entries = page.locator("#entries")
    # Markdown: bold text and a highlighted code block.
    assert entries.locator("strong", has_text="tests").count() == 1
    assert entries.locator("pre code span.k", has_text="def").count() == 1
    assert entries.locator("table td", has_text="passed").count() == 1
    # A tool call folds its result away; expanding it shows both.
    call = entries.locator("details.call[data-call=call_1]")
    assert "shell" in call.locator("summary").inner_text()
    assert not call.locator(".result").is_visible()
    call.locator("summary").click()
    assert call.locator(".result").is_visible()
    assert "1 failed" in call.locator(".result pre").inner_text()
    shot(page, tmp_path, "transcript-tool-open")
    # Time and tokens per message; the file a call changed.
    assert "1,234 in · 56 out" in entries.inner_text()
    write = entries.locator("details.call[data-call=call_2] summary")
    assert "changes app.py" in write.inner_text()
    # The compaction is marked, and what it took out of the model's view is dimmed.
    assert entries.locator("section.compaction").count() == 1
    assert entries.locator(".outside").count() == 3  # two tool results sit inside their calls
    assert "the 5 dimmed entries" in page.locator("p.help").inner_text()
    page.click("nav.views >> text=what the model saw")
    page.wait_for_url("**view=context")
    shot(page, tmp_path, "transcript-context")
    texts = page.locator("#entries > *").all_inner_texts()
    assert len(texts) == 3 and texts[0].startswith("Compaction")
    assert "Now run them again" in texts[1]
    assert not page.problems


def test_fork_graph_leads_to_the_fork_and_diff_shows_both_sides(
    site: tuple[Server, Demo, Path], page: Any, tmp_path: Path
) -> None:
    server, demo, _ = site
    page.goto(f"{server.base}/s/{demo.main}")
    page.click("text=fork graph")
    page.wait_for_selector("svg.forks")
    shot(page, tmp_path, "graph")
    labels = page.locator("svg.forks text").all_text_contents()
    assert any(t.startswith("Fix the failing build · 7 messages") for t in labels)
    assert any(t.startswith("Try a different fix · 5 messages") for t in labels)
    page.locator(f"svg.forks a.fork-point[data-fork='{demo.fork}']").click()
    page.wait_for_url(f"**/s/{demo.fork}#fork")
    assert page.locator("h1").inner_text() == "Try a different fix"
    marker = page.locator("#fork")
    assert marker.is_visible()
    # The fork point sits after the message it was forked at, before the fork's own.
    html = page.locator("#entries").inner_html()
    assert html.index(f"n-{demo.fork_node[:12]}") < html.index('id="fork"')
    assert html.index('id="fork"') < html.index("operator.add")

    page.goto(f"{server.base}/s/{demo.main}/graph")
    page.click("text=compare")
    page.wait_for_selector(".sides")
    shot(page, tmp_path, "diff")
    sides = page.locator(".sides > section")
    assert "1 own entry" in sides.nth(1).inner_text()
    assert "operator.add" in sides.nth(1).inner_text()
    assert "Now run them again" in sides.nth(0).inner_text()
    assert not page.problems


def test_rename_persists_and_fork_at_a_message(
    site: tuple[Server, Demo, Path], page: Any, tmp_path: Path
) -> None:
    server, demo, store = site
    page.goto(f"{server.base}/s/{demo.fork}")
    page.fill("input[name=title]", "Operator approach")
    page.click("button:has-text('rename')")
    page.wait_for_url("**note=renamed")
    assert page.locator("h1").inner_text() == "Operator approach"
    page.reload()
    assert page.locator("h1").inner_text() == "Operator approach"
    with Store.open(store) as s:
        assert s.session(demo.fork).title == "Operator approach"

    first = page.locator("#entries article").first
    first.locator("a.act").click()
    page.fill("input[name=title]", "From the start")
    page.click("button:has-text('fork here')")
    page.wait_for_url("**note=forked")
    new = page.url.split("/s/", 1)[1].split("?", 1)[0]
    with Store.open(store) as s:
        info = s.session(new)
        assert info.title == "From the start" and info.messages == 1
        assert info.forked_from == {"session": demo.fork, "node": s.node_id(f"{demo.main}~7")}
    shot(page, tmp_path, "forked")
    assert not page.problems


def test_archive_tag_and_delete_with_confirmation(tmp_path: Path, page: Any) -> None:
    demo = build_demo_store(tmp_path / "store")
    with ags_serve(tmp_path / "store") as server:
        page.goto(f"{server.base}/s/{demo.main}")
        page.fill("input[name=name]", "before-retry")
        page.click("button:has-text('tag the head')")
        page.wait_for_url("**note=tagged*")
        page.click("button:has-text('archive')")
        page.wait_for_url("**note=archived")
        assert page.locator("button:has-text('unarchive')").is_visible()
        with Store.open(tmp_path / "store") as s:
            assert s.session(demo.main).archived
            assert s.tags()["before-retry"] == s.session(demo.main).head
        page.click("button:has-text('unarchive')")
        page.wait_for_url("**note=unarchived")
        page.click("text=delete…")
        shot(page, tmp_path, "delete-confirm")
        with Store.open(tmp_path / "store") as s:  # asking changed nothing
            assert s.session(demo.main).title == "Fix the failing build"
        page.click("button:has-text('delete this session')")
        page.wait_for_url("**note=deleted*")
        assert "Fix the failing build" not in page.locator("table.sessions").inner_text()
        with Store.open(tmp_path / "store") as s:
            assert demo.main not in {r.id for r in s.sessions(include_archived=True)}
        assert not page.problems


def test_a_message_another_process_appends_appears_live(
    site: tuple[Server, Demo, Path], page: Any, tmp_path: Path
) -> None:
    server, demo, store = site
    with Store.open(store) as s:
        sid = s.new_session(title="live one", root="/src/live")
        s.append(sid, {"role": "user", "content": "start"})
    page.goto(f"{server.base}/s/{sid}")
    page.locator("#live").wait_for(state="visible")
    writer = (
        "import sys, json\n"
        "from objstore import Store\n"
        "with Store.open(sys.argv[1]) as s:\n"
        "    for m in json.loads(sys.argv[3]):\n"
        "        s.append(sys.argv[2], m)\n"
    )

    def append(*messages: dict[str, Any]) -> None:
        subprocess.run(
            [sys.executable, "-c", writer, str(store), sid, json.dumps(messages)], check=True
        )

    append(
        {"role": "assistant", "content": "Looking *now*.",
         "tool_calls": [{"id": "c9", "name": "shell", "arguments": {"command": "ls"}}]},
    )  # fmt: skip
    page.locator("#entries em", has_text="now").wait_for()
    assert page.locator("#messages").inner_text() == "2"
    call = page.locator("details.call[data-call=c9]")
    call.locator("summary").click()
    assert "no result" in call.locator("summary").inner_text()
    # The result lands after its call: it is shown inside the call, still unfolded.
    append({"role": "tool", "tool_call_id": "c9", "name": "shell", "content": "README.md"})
    page.locator("details.call[data-call=c9] .result pre", has_text="README.md").wait_for()
    assert page.locator("details.call[data-call=c9]").get_attribute("open") is not None
    assert page.locator("#entries > article").count() == 2
    append({"role": "assistant", "content": "Done."})
    page.locator("#entries article", has_text="Done.").wait_for()
    shot(page, tmp_path, "live")
    assert not page.problems


def test_hostile_content_renders_inert(
    site: tuple[Server, Demo, Path], page: Any, tmp_path: Path
) -> None:
    server, demo, _ = site
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text) if m.type == "error" else None)
    for path in (f"/s/{demo.hostile}", "/", "/search?q=pwned"):
        page.goto(server.base + path)
        for details in page.locator("details").all():
            details.locator("summary").first.click()  # fires any ontoggle there would be
        page.mouse.move(300, 300)
        shot(page, tmp_path, "hostile" + path.replace("/", "-").replace("?", "-"))
        assert page.evaluate("window.__pwned") is None
        found = page.evaluate(
            """() => {
              const all = [...document.querySelectorAll('*')];
              return {
                scripts: [...document.scripts].map(s => s.getAttribute('src')),
                handlers: all.flatMap(el => [...el.attributes]
                  .filter(a => a.name.toLowerCase().startsWith('on')).map(a => a.name)),
                hrefs: [...document.querySelectorAll('[href]')].map(a => a.getAttribute('href')),
                loaders: [...document.querySelectorAll('img,iframe,object,embed,svg image,'
                  + 'style,link:not([rel=stylesheet]),form[action^="/s/x"]')].length,
              };
            }"""
        )
        assert found["scripts"] == ["/static/app.js"]
        assert found["handlers"] == []
        assert found["loaders"] == 0
        for href in found["hrefs"]:
            assert href.startswith(("/", "#", "http://127.0.0.1:9/", "?")), href
            assert "javascript" not in href.lower() and not href.lower().startswith("data:")
    page.goto(f"{server.base}/s/{demo.hostile}")
    # Shown as text, whole: the title, the tags, the bidi override made visible.
    assert page.locator("h1").inner_text() == HOSTILE_TITLE.replace("\u202e", "\\u202e")
    text = page.locator("#entries").inner_text()
    assert "<script>window.__pwned = 1</script>" in text
    assert "\\u202eevil\\u202c" in text and "\\x1b[31mred" in text
    assert "\u202e" not in text and "\x1b" not in text
    # The page loaded only itself: the image in the message became a link.
    assert all(u.startswith(server.base) for u in requests), requests
    assert page.locator("a", has_text="image: pixel").count() == 3  # message, reply, thinking
    assert not violations, violations
    assert not page.problems


class _EvilPage(BaseHTTPRequestHandler):
    """Another site (another port of 127.0.0.1): it posts to the server in the
    visitor's browser as soon as it loads."""

    target = ""

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        body = (
            f'<form id=f method=post action="{self.target}">'
            '<input name=title value="pwned"><input name=csrf value="guess"></form>'
            "<script>document.getElementById('f').submit()</script>"
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_form_posted_from_another_site_changes_nothing(
    site: tuple[Server, Demo, Path], page: Any, tmp_path: Path
) -> None:
    server, demo, store = site
    with Store.open(store) as s:
        before = s.session(demo.main).title
    _EvilPage.target = f"{server.base}/s/{demo.main}/title"
    page.goto(server.url)  # the visitor has the server's cookies
    evil = ThreadingHTTPServer(("127.0.0.1", 0), _EvilPage)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        with page.expect_navigation(url=f"{server.base}/s/{demo.main}/title"):
            page.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
        assert "another site" in page.content() or "out of date" in page.content()
        shot(page, tmp_path, "csrf-refused")
    finally:
        evil.shutdown()
    with Store.open(store) as s:
        assert s.session(demo.main).title == before


def test_the_token_goes_into_a_cookie_and_out_of_the_address(tmp_path: Path, page: Any) -> None:
    demo = build_demo_store(tmp_path / "store")
    with ags_serve(tmp_path / "store", "--token", "--read-only") as server:
        assert "?token=" in server.url
        response = page.goto(server.base + "/")
        assert response.status == 403
        page.goto(server.url)
        assert page.url == server.base + "/"  # the token left the address bar
        assert page.locator("table.sessions tbody tr").count() == 3
        page.goto(f"{server.base}/s/{demo.main}")
        # Read-only: nothing on the page can change the store.
        assert page.locator("form[method=post]").count() == 0
        assert page.locator("a.act").count() == 0
        assert page.locator(".badge", has_text="read-only").is_visible()
        shot(page, tmp_path, "read-only")
