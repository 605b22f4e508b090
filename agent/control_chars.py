"""The characters that can drive a terminal or hide and reorder text, made visible.

Text from a session (titles, messages, tool output, names, metadata) is
written by whoever wrote the session: a model, a tool, an imported file.
Every place that shows it to a person, the command line (cli/output.py) and
the session browser (web/) alike, passes it through ``visible`` first, so a
control character is shown as an escape a person can read, never obeyed.
"""

from __future__ import annotations

import re
from typing import Final

# C0 and C1 controls and DEL (tab and newline are added per use), and the format
# characters that reorder or hide text: bidi embeddings, overrides, isolates and
# marks (the "Trojan Source" set), zero-width spaces and joiners that join
# nothing, the BOM, interlinear annotations, invisible operators and the tag
# characters that spell hidden ASCII. ZWJ and ZWNJ stay: scripts and emoji need them.
_HIDDEN: Final = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u061c\u180e\u200b\u200e\u200f\u202a-\u202e"
    "\u2028\u2029\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
HIDDEN_IN_LINE: Final = re.compile(f"[\t\n{_HIDDEN}]")
HIDDEN_IN_BODY: Final = re.compile(f"[{_HIDDEN}]")  # newlines and tabs kept
_NAMED: Final = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str, *, multiline: bool = False) -> str:
    """``text`` safe to show: every control or hidden character as an escape
    (``\\x1b``, ``\\r``, ``\\u202e``), the way Python writes it in a string.
    ``multiline`` keeps newlines and tabs, for a body shown over several lines;
    otherwise they are escaped too, so one field stays on one line."""
    return (HIDDEN_IN_BODY if multiline else HIDDEN_IN_LINE).sub(_escape, text)
