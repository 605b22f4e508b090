"""Untrusted text as HTML a browser can show safely: Markdown, code, plain text.

Everything a session holds was written by a model, a tool or an imported
file, so every function here treats its input as hostile. Three defences,
each enough on its own for the ways in:

1. Hidden characters are made visible first (``control_chars.visible``): a bidi
   override or an escape sequence is shown as ``\\u202e`` or ``\\x1b``.
2. Markdown is parsed with raw HTML off (markdown-it-py, CommonMark): a tag in
   a message is text, never markup; only the parser makes elements, and it
   refuses ``javascript:``, ``vbscript:``, ``file:`` and ``data:`` links.
   Images become links, so a message never makes the page fetch anything.
3. What the parser made is cleaned by an allow-list (nh3, the binding of the
   Rust sanitiser ammonia): only the tags, attributes, classes and URL schemes
   named below survive; everything else is dropped, whatever it is called. A
   block-list would have to know every dangerous name; an allow-list has to
   know only the harmless ones.

Code in fences is highlighted by Pygments into ``<span>`` elements whose class
names are Pygments' own token classes (the allow-list keeps those and no
other); ``HIGHLIGHT_CSS`` styles them.
"""

from __future__ import annotations

import html
from functools import lru_cache
from typing import Any, Final

import nh3
from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.token import STANDARD_TYPES
from pygments.util import ClassNotFound

from .control_chars import visible

HIGHLIGHT_LINES_MAX: Final = 2_000  # longer code is shown plain: highlighting is costly
HIGHLIGHT_CHARS_MAX: Final = 200_000  # so is code of fewer, longer lines
MARKDOWN_CHARS_MAX: Final = 1_000_000
"""Longer text is shown as it is, escaped in a ``pre``, not rendered as Markdown: the
parser takes about a second a MB (an export of a 128 MiB message took minutes)."""
_TOKEN_CLASSES: Final = frozenset(c for c in STANDARD_TYPES.values() if c)
_TAGS: Final = frozenset(
    {"p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "s", "code",
     "pre", "blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td",
     "span"}
)  # fmt: skip
_ATTRIBUTES: Final = {"a": {"href", "title"}, "ol": {"start"}}
_CLASSES: Final = {"span": set(_TOKEN_CLASSES)}
_SCHEMES: Final = frozenset({"http", "https", "mailto"})
_FORMATTER: Final = HtmlFormatter(nowrap=True)


def _image_as_link(
    renderer: RendererHTML, tokens: list[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    """An image is shown as a link to it: a page that loads nothing a message names."""
    token = tokens[idx]
    src = str(token.attrGet("src") or "")
    alt = renderer.renderInlineAsText(token.children or [], options, env) or src
    return f'<a href="{html.escape(src)}">image: {html.escape(alt)}</a>'


def _highlight(code: str, lang: str, _attrs: Any) -> str:
    return code_spans(code, lang) or ""


def _parser() -> MarkdownIt:
    parser = MarkdownIt(
        "commonmark",
        {"html": False, "linkify": False, "typographer": False, "highlight": _highlight},
    ).enable(["table", "strikethrough"])
    parser.add_render_rule("image", _image_as_link)
    return parser


_MARKDOWN: Final = _parser()


def sanitize(fragment: str) -> str:
    """``fragment`` with every element, attribute, class and URL scheme not on the
    allow-list removed; links get ``rel="noopener noreferrer nofollow"``."""
    return nh3.clean(
        fragment,
        tags=set(_TAGS),
        attributes={k: set(v) for k, v in _ATTRIBUTES.items()},
        allowed_classes={k: set(v) for k, v in _CLASSES.items()},
        url_schemes=set(_SCHEMES),
        link_rel="noopener noreferrer nofollow",
        strip_comments=True,
    )


def markdown_html(text: str) -> str:
    """Message text rendered as Markdown, sanitised (see the module's docstring); text
    over MARKDOWN_CHARS_MAX as it is (``code_html``)."""
    if len(text) > MARKDOWN_CHARS_MAX:
        return code_html(text)
    return sanitize(_MARKDOWN.render(visible(text, multiline=True)))


@lru_cache(maxsize=64)
def _lexer(lang: str) -> Lexer | None:
    try:
        return get_lexer_by_name(lang, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def code_spans(code: str, lang: str) -> str | None:
    """``code`` highlighted as ``lang``: escaped text in Pygments' ``<span>`` elements,
    to put in a ``<pre>``; None for an unknown language or code too long to colour.
    The caller makes hidden characters visible first."""
    lexer = _lexer(lang.strip().lower()[:40]) if lang.strip() else None
    if lexer is None or len(code) > HIGHLIGHT_CHARS_MAX or code.count("\n") > HIGHLIGHT_LINES_MAX:
        return None
    return str(highlight(code, lexer, _FORMATTER))


def code_html(code: str, lang: str = "") -> str:
    """A block of code or output as ``<pre>``: highlighted when ``lang`` is known."""
    shown = visible(code, multiline=True)
    spans = code_spans(shown, lang) if lang else None
    return f"<pre>{spans if spans is not None else html.escape(shown)}</pre>"


def text_html(text: str) -> str:
    """One line of untrusted text (a title, a name, a path) as escaped HTML."""
    return html.escape(visible(text))


def _highlight_css() -> str:
    """The token colours of Pygments' default style, and monokai's for a dark page;
    only the token rules (a style's own background would fight the page's)."""

    def tokens(style: str) -> str:
        css = HtmlFormatter(style=style).get_style_defs("pre")
        return "\n".join(line for line in css.splitlines() if line.startswith("pre ."))

    return f"{tokens('default')}\n@media (prefers-color-scheme:dark){{\n{tokens('monokai')}\n}}\n"


HIGHLIGHT_CSS: Final = _highlight_css()
