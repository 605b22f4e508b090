"""How the files a node changed are printed: one line per file for ``ags show``,
a unified diff for ``ags diff --files`` (binary files named, not dumped)."""

from __future__ import annotations

import difflib

from objstore import FileChange, FileDelta, Store

from .output import style, visible

_SNIFF = 8192  # bytes looked at for a NUL, as git does, to call content binary


def change_word(before: str | None, after: str | None) -> str:
    """``created``, ``deleted`` or ``changed``: what happened to a file between two contents."""
    if before is None:
        return "created"
    return "deleted" if after is None else "changed"


def change_lines(changes: tuple[FileChange, ...]) -> list[str]:
    """The files a node changed, one line each."""
    return [visible(f"  {change_word(c.before, c.after):<8} {c.path}") for c in changes]


def delta_lines(store: Store, delta: FileDelta) -> list[str]:
    """A unified diff of one file from its content at ``a`` to that at ``b``."""
    old = store.file_bytes(delta.a) if delta.a is not None else None
    new = store.file_bytes(delta.b) if delta.b is not None else None
    name_a = "/dev/null" if old is None else f"a/{delta.path}"
    name_b = "/dev/null" if new is None else f"b/{delta.path}"
    head = [style(visible(f"--- {name_a}"), bold=True), style(visible(f"+++ {name_b}"), bold=True)]
    text_old, text_new = _text(old), _text(new)
    if text_old is None or text_new is None:
        return [visible(f"Binary files {name_a} and {name_b} differ")]
    lines = []
    for line in difflib.unified_diff(
        text_old.splitlines(), text_new.splitlines(), lineterm="", n=3
    ):
        if line.startswith(("---", "+++")):
            continue
        shown = visible(line)
        if line.startswith("@@"):
            shown = style(shown, fg="cyan")
        elif line.startswith("+"):
            shown = style(shown, fg="green")
        elif line.startswith("-"):
            shown = style(shown, fg="red")
        lines.append(shown)
    return head + lines


def _text(data: bytes | None) -> str | None:
    """The content as text ("" for no file), or None if it is binary."""
    if data is None:
        return ""
    if b"\0" in data[:_SNIFF]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
