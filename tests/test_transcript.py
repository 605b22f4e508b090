"""Transcripts for people: ``ags export --format md|html`` (agent/transcript.py)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from click.testing import CliRunner

from agent.markup import MARKDOWN_CHARS_MAX
from agent.transcript import _fence, _longest_backticks
from cli.main import cli
from objstore import Store

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)> ``` </details> & &amp;'


def build(path: Path) -> tuple[str, str]:
    with Store.open(path) as s:
        sid = s.new_session(title=f"hostile {HOSTILE}", root="/src/app", model="m1")
        s.append(sid, {"role": "user", "content": f"please {HOSTILE}"})
        s.append(sid, {"role": "assistant", "content": "", "thinking": HOSTILE,
                       "tool_calls": [{"id": "c1", "name": "shell",
                                       "arguments": {"command": HOSTILE}}]})  # fmt: skip
        long_output = "\n".join(f"line {i} {HOSTILE}" for i in range(40))
        s.append(sid, {"role": "tool", "tool_call_id": "c1", "name": "shell",
                       "content": long_output})  # fmt: skip
        s.append(sid, {"role": "tool", "tool_call_id": "c2", "name": "shell", "content": "ok"})
        s.compact(sid, f"summary {HOSTILE}", keep=0)
        s.append(sid, {"role": "assistant", "content": "after the compaction"})
        fork = s.fork(sid, title="the fork")
        s.append(fork, {"role": "user", "content": "a new direction"})
    return sid, fork


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += attrs

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def export(store: Path, spec: str, fmt: str) -> str:
    result = CliRunner().invoke(cli, ["--store", str(store), "export", spec, "--format", fmt])
    assert result.exit_code == 0, result.output
    return result.output


def test_html_is_self_contained_and_hostile_text_is_inert(tmp_path: Path) -> None:
    sid, fork = build(tmp_path / "s")
    page = export(tmp_path / "s", fork, "html")
    parsed = _Collect()
    parsed.feed(page)
    assert "script" not in parsed.tags and "img" not in parsed.tags
    # Only the page's own markup: no attribute that loads or runs anything.
    names = {name for name, _ in parsed.attrs}
    assert names <= {
        "lang", "charset", "name", "content", "http-equiv", "class", "id", "open", "href",
        "data-node", "data-call", "datetime", "title",
    }  # fmt: skip
    assert all(v and v.startswith("#n-") for k, v in parsed.attrs if k == "href")
    assert not re.search(r"https?://", page)
    assert "default-src 'none'" in page
    text = "".join(parsed.text)
    assert HOSTILE in text  # shown as text, whole
    assert 'name="viewport"' in page and "max-width" in page


def test_html_folds_long_tool_output_and_marks_compaction_and_fork(tmp_path: Path) -> None:
    sid, fork = build(tmp_path / "s")
    page = export(tmp_path / "s", fork, "html")
    assert re.search(r"<details><summary>output of c1: 40 lines", page)
    assert "<pre>ok</pre>" in page  # short output stays open
    assert "Compaction" in page and "summary &lt;script&gt;" in page
    assert page.index("Compaction") < page.index('id="fork"') < page.index("a new direction")
    own = export(tmp_path / "s", sid, "html")
    assert 'id="fork"' not in own


def test_markdown_transcript(tmp_path: Path) -> None:
    sid, fork = build(tmp_path / "s")
    md = export(tmp_path / "s", fork, "md")
    assert md.startswith("# the fork\n")
    assert "### user" in md and "### tool result: shell `c1`" in md
    assert "**tool call** `shell` `c1`" in md
    assert "## Compaction" in md
    assert "**Fork point**" in md
    # Message text sits in fences longer than any backtick run inside it.
    block = md[md.index("please") - 40 : md.index("please")]
    assert "````text" in block
    assert (
        md.index("after the compaction") < md.index("**Fork point**") < md.index("a new direction")
    )


def test_export_to_file_and_json_stays_the_default(tmp_path: Path) -> None:
    sid, _ = build(tmp_path / "s")
    out = tmp_path / "t.html"
    result = CliRunner().invoke(
        cli, ["--store", str(tmp_path / "s"), "export", sid, "--format", "html", "-o", str(out)]
    )
    assert result.exit_code == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert export(tmp_path / "s", sid, "json").lstrip().startswith("{")
    plain = CliRunner().invoke(cli, ["--store", str(tmp_path / "s"), "export", sid])
    assert '"format": "ags-export"' in plain.output


def test_html_lists_the_files_a_tool_result_changed(tmp_path: Path) -> None:
    """Issue 13: under a tool result, the files its node says the call changed."""
    path = tmp_path / "s"
    with Store.open(path) as s:
        sid = s.new_session(root=str(tmp_path))
        s.append(sid, {"role": "user", "content": "edit"})
        calls = [{"id": "c1", "name": "write_file",
                  "arguments": {"path": "a.txt", "content": "x"}}]  # fmt: skip
        s.append(sid, {"role": "assistant", "content": "", "tool_calls": calls})
        s.append(
            sid,
            {"role": "tool", "tool_call_id": "c1", "name": "write_file", "content": "done"},
            files={"a.txt": (None, b"x"), f"d/{HOSTILE.replace('/', '|')}": (b"1", b"2")},
        )
        s.append(sid, {"role": "tool", "tool_call_id": "zz", "name": "edit_file",
                       "content": "stray"}, files={"gone.txt": (b"old", None)})  # fmt: skip
    page = export(path, sid, "html")
    parsed = _Collect()
    parsed.feed(page)
    assert "script" not in parsed.tags and "img" not in parsed.tags
    lists = re.findall(r'<ul class="files-changed">(.*?)</ul>', page)
    assert len(lists) == 2  # under the call's result, and under the stray result
    assert '<span class="change">created</span> <code>a.txt</code>' in lists[0]
    assert '<span class="change">changed</span> <code>d/&lt;script&gt;' in lists[0]
    assert '<span class="change">deleted</span> <code>gone.txt</code>' in lists[1]
    markdown = export(path, sid, "md")
    assert "- created `a.txt`" in markdown and "- deleted `gone.txt`" in markdown


def test_markdown_shows_tool_calls_in_the_openai_shape(tmp_path: Path) -> None:
    """A call stored as OpenAI sends it (``function``, arguments as JSON text) keeps its
    name and arguments in the Markdown, as the HTML page shows them."""
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        function = {"name": "read_file", "arguments": '{"path": "src/app.py"}'}
        call = {"id": "c9", "type": "function", "function": function}
        s.append(sid, {"role": "assistant", "content": "", "tool_calls": [call]})
    md = export(tmp_path / "s", sid, "md")
    assert "**tool call** `read_file` `c9`" in md
    assert '{"path": "src/app.py"}' in md


def test_fences_outrun_any_backtick_run_in_the_text() -> None:
    for longest in (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 1000):
        text = "a `b` ``c`` " + "`" * longest + " d"
        assert _longest_backticks(text) == max(longest, 2)
        fence = _fence(text)
        assert fence[0] == "`" * max(3, max(longest, 2) + 1)
    assert _longest_backticks("no ticks") == 0
    assert _longest_backticks("`") == 1


def test_a_huge_message_exports_whole_as_text_not_markdown(tmp_path: Path) -> None:
    """Past MARKDOWN_CHARS_MAX, text is shown escaped in a ``pre``: all of it, inert."""
    huge = ("# not a heading " + HOSTILE + "\n") * (MARKDOWN_CHARS_MAX // 90 + 1)
    assert len(huge) > MARKDOWN_CHARS_MAX
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session()
        s.append(sid, {"role": "assistant", "content": huge})
        s.append(sid, {"role": "user", "content": "# a heading"})
    page = export(tmp_path / "s", sid, "html")
    assert "<h1>a heading</h1>" in page  # a short message is still Markdown
    assert "<h1>not a heading" not in page
    assert page.count("# not a heading &lt;script&gt;") == huge.count("# not a heading")
    parsed = _Collect()
    parsed.feed(page)
    assert "script" not in parsed.tags and "img" not in parsed.tags
    md = export(tmp_path / "s", sid, "md")
    assert huge in md
