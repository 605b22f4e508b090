"""Markdown as it streams in: each finished block printed once, for good; the
block being written shown in a live region and re-rendered as it grows.

Re-rendering the whole answer for every token would cost O(answer) a token
and redraw what is done (and an answer taller than the screen cannot be
redrawn at all). A top-level block is finished once the next one has started:
markdown-it says where each block begins, and nothing written after a block
changes how it renders (a link reference defined later aside). So only the
current block is rendered again, and only complete lines decide where blocks
begin: a partial line can look like what it is not yet (``#`` before
``#hashtag`` is an empty heading; ``-`` under a paragraph underlines it).

The live part shows at most ``height`` lines, the last ones: a block taller
than the screen (a long code block) scrolls inside the region and is printed
whole when it is done. Of a code block that long only the last lines are
rendered while it streams, so a 600-line block costs a screenful a frame.

The text fed in must already be made visible (``output.visible``): this
module renders Markdown, and Markdown never interprets rich markup
(``[bold]`` prints as itself) or emoji codes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final

from markdown_it import MarkdownIt
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.markdown import Markdown
from rich.segment import Segment

CODE_THEME: Final = "monokai"
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*\n")


def markdown(source: str) -> Markdown:
    """``source`` as rich renders it here: links written out as ``text (url)``, never
    a terminal hyperlink whose target the reader cannot see."""
    return Markdown(source, code_theme=CODE_THEME, hyperlinks=False)


class MarkdownStream:
    """One answer's Markdown, fed as it streams; ``print`` puts finished blocks
    above the live region. Render the stream itself (it is a rich renderable)
    to show the block being written."""

    def __init__(
        self,
        print_block: Callable[[RenderableType], None],
        height: int = 20,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
        *,
        spaced: bool = False,
    ) -> None:
        self._print = print_block
        self.height = height
        self._guard = guard  # held while a block moves from the live part to the printed one
        self._open = ""  # what is not printed yet: the current block and the partial line
        self._printed = spaced  # a block is printed: the next one comes after a blank line
        self._rule = False  # the last block printed was a horizontal rule
        self._parser = MarkdownIt().enable("strikethrough").enable("table")  # as rich parses

    @property
    def pending(self) -> str:
        return self._open

    def feed(self, text: str) -> None:
        """Add streamed text; print the blocks it finished."""
        self._open += text
        if "\n" not in text:
            return
        complete, _, partial = self._open.rpartition("\n")
        if _unclosed_fence(complete):
            return  # a code block being written: nothing in it can end a block but its fence
        lines = complete.split("\n")
        blocks = [
            token
            for token in self._parser.parse(complete + "\n")
            if token.level == 0 and token.nesting >= 0 and token.map is not None
        ]
        if len(blocks) < 2:
            return
        cut = blocks[-1].map[0] if blocks[-1].map else 0
        with self._guard():
            self._open = "\n".join(lines[cut:]) + "\n" + partial
            self._show("\n".join(lines[:cut]), rule=blocks[-2].type == "hr")

    def finish(self) -> None:
        """Print what is left: the answer is complete, or stopped."""
        with self._guard():
            rest, self._open = self._open, ""
            if rest.strip():
                self._show(rest)

    def _show(self, source: str, *, rule: bool = False) -> None:
        """Print ``source`` for good; ``rule``: it ends with a horizontal rule."""
        spaced = self._spaced()
        self._printed, self._rule = True, rule
        self._print(_Block(source, spaced=spaced))

    def _spaced(self) -> bool:
        """Whether the next block comes after a blank line: after another block,
        except after a rule (which rich draws with no blank line under it)."""
        return self._printed and not self._rule

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        source, spaced = self._open, self._spaced()  # the stream may be fed meanwhile
        if not source.strip():
            return
        height = max(self.height, 3)
        block = _Block(_window(source, height), spaced=spaced)
        yield from _joined(block.lines(console, options)[-height:])


class _Block:
    """Markdown source rendered as one block of the answer: after a blank line
    when another came before it. (Rendered alone, a list or a table starts with
    a blank line of its own, which rich drops between blocks: dropped here too.)"""

    def __init__(self, source: str, *, spaced: bool) -> None:
        self.source = source
        self.spaced = spaced

    def lines(self, console: Console, options: ConsoleOptions) -> list[list[Segment]]:
        lines = console.render_lines(markdown(self.source), options.update(height=None), pad=False)
        while lines and not "".join(segment.text for segment in lines[0]):
            del lines[0]
        return [[], *lines] if self.spaced else lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from _joined(self.lines(console, options))


def _joined(lines: list[list[Segment]]) -> Iterator[Segment]:
    for line in lines:
        yield from line
        yield Segment.line()


def _unclosed_fence(text: str) -> bool:
    """``text`` is a fenced code block whose closing fence has not come yet."""
    opened = _FENCE.match(text + "\n")
    if opened is None:
        return False
    marker = opened.group(1)
    closing = re.compile(rf"^ {{0,3}}{marker[0]}{{{len(marker)},}}\s*$", re.M)
    return closing.search(text, opened.end()) is None


def _window(source: str, height: int) -> str:
    """The part of ``source`` worth rendering for a live view ``height`` lines tall:
    of a code block still open, its fence and last lines (the rest is printed
    when the block is done); anything else whole."""
    opened = _FENCE.match(source)
    if opened is None or not _unclosed_fence(source.rstrip("\n")):
        return source
    code = source[opened.end() :].split("\n")
    if len(code) <= height:
        return source
    return opened.group(0) + "\n".join(code[-height:])
