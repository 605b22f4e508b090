"""Ref specs as a user types them, parsed (resolution lives in Store.lookup).

Grammar::

    spec   := base [ "@{" N "}" ] { "~" [N] }
    base   := "HEAD" | "sessions/" ID-OR-PREFIX | "tags/" NAME
            | HEX-PREFIX (4 to 64 hex digits: a session id or a node id)
            | NAME (a tag)

``~N`` walks N nodes back (``~`` alone is ``~1``); ``@{N}`` is the Nth
previous value of the base ref in its reflog, ``@{0}`` being the current one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from .errors import SpecError

_SUFFIX: Final = re.compile(r"@\{(\d+)\}|~(\d*)")
MIN_PREFIX: Final = 4
HEX_PREFIX: Final = re.compile(rf"[0-9a-f]{{{MIN_PREFIX},64}}")


@dataclass(frozen=True, slots=True)
class Spec:
    text: str
    base: str
    reflog: int | None  # N of @{N}, if given
    back: int  # total of the ~N steps

    @property
    def is_plain(self) -> bool:
        """True if the spec is just a name, with no ``@{N}`` or ``~N``."""
        return self.reflog is None and self.back == 0


def parse_spec(text: str) -> Spec:
    if type(text) is not str or not text or "\0" in text:
        raise SpecError(f"bad spec: {text!r}")
    if len(text) > 500:
        raise SpecError(f"bad spec {text[:40]!r}...: {len(text):,} characters, over 500")
    cut = min((i for i in (text.find("@{"), text.find("~")) if i >= 0), default=len(text))
    base, rest = text[:cut], text[cut:]
    if not base:
        raise SpecError(f"bad spec {text!r}: nothing before {rest[:2]!r}")
    reflog: int | None = None
    back = 0
    pos = 0
    while pos < len(rest):
        m = _SUFFIX.match(rest, pos)
        if m is None:
            raise SpecError(f"bad spec {text!r}: cannot read {rest[pos:]!r}")
        if m.group(1) is not None:
            if reflog is not None or back:
                raise SpecError(f"bad spec {text!r}: @{{N}} must come right after the name")
            reflog = int(m.group(1))
        else:
            back += int(m.group(2) or 1)
        pos = m.end()
    return Spec(text, base, reflog, back)
