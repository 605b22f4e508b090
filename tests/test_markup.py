"""Untrusted text as HTML (agent/markup.py): only what the allow-list names survives."""

from __future__ import annotations

from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.markup import code_html, markdown_html, sanitize, text_html

TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "s", "code",
    "pre", "blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td",
    "span",
}  # fmt: skip
ATTRIBUTES = {"href", "title", "start", "class", "rel"}


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, attrs))


def elements(fragment: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    parser = _Elements()
    parser.feed(fragment)
    return parser.found


def check_allowed(fragment: str) -> None:
    for tag, attrs in elements(fragment):
        assert tag in TAGS, (tag, fragment)
        for name, value in attrs:
            assert name in ATTRIBUTES, (name, fragment)
            if name == "href":
                assert value is not None
                scheme = value.split(":", 1)[0].lower() if ":" in value.split("/")[0] else ""
                assert scheme in ("", "http", "https", "mailto"), (value, fragment)


PIECES = [
    "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[a](javascript:alert(1))",
    "[b](jAvAsCrIpT:alert(1))", "[c](data:text/html;base64,PHNjcmlwdD4=)", "![i](http://x/y.png)",
    "<a href=javascript:x>r</a>", "```\n", "```html\n", "`", "*", "_", "<", ">", "&", '"', "'",
    "\n", "\n\n", "| a | b |\n|---|---|\n", "> ", "- ", "1. ", "[x]: javascript:alert(1)\n",
    "[x]", "<svg onload=alert(1)>", "<style>*{}</style>", "&#106;avascript:", "\u202e", "\x1b",
    "<!-- c -->", "<details open ontoggle=alert(1)>", "[d](<javascript:x>)", "](", ")",
    "<span class=marker>", "<code class=language-x>", "http://ok.example/", "~~s~~",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES) | st.text(max_size=8), max_size=30))
def test_markdown_of_any_text_is_on_the_allow_list(parts: list[str]) -> None:
    html = markdown_html("".join(parts))
    check_allowed(html)
    assert "\u202e" not in html and "\x1b" not in html


def test_markdown_keeps_what_people_write() -> None:
    html = markdown_html("**bold** [docs](https://example.com/x) `code`\n\n```python\nx = 1\n```")
    assert "<strong>bold</strong>" in html
    assert '<a href="https://example.com/x" rel="noopener noreferrer nofollow">docs</a>' in html
    assert '<span class="n">x</span>' in html and "<code>code</code>" in html


def test_markdown_shows_hostile_markup_as_text() -> None:
    html = markdown_html("<img src=x onerror=alert(1)> [a](javascript:alert(1)) ![i](http://e/p)")
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<img" not in html and 'href="javascript' not in html
    assert '<a href="http://e/p" rel="noopener noreferrer nofollow">image: i</a>' in html


def test_the_sanitiser_drops_what_the_list_does_not_name() -> None:
    dirty = (
        '<p onclick="x" style="color:red" class="marker">a</p><span class="k evil">b</span>'
        '<a href="javascript:x" target="_blank">c</a><iframe src="/"></iframe><b>d</b>'
    )
    clean = sanitize(dirty)
    assert clean == ('<p>a</p><span class="k">b</span><a rel="noopener noreferrer nofollow">c</a>d')


def test_code_and_one_line_text_are_escaped_and_visible() -> None:
    assert code_html("<b>\x1b[1m</b>") == "<pre>&lt;b&gt;\\x1b[1m&lt;/b&gt;</pre>"
    highlighted = code_html("<script>", "html")
    assert "<script" not in highlighted and '<span class="nt">script</span>' in highlighted
    assert text_html('a\nb <i> "\u202e"') == "a\\nb &lt;i&gt; &quot;\\u202e&quot;"
