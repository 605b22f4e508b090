"""Token counts: what a server reported, estimates where it said nothing, and the
running totals the agent state keeps.

Two jobs, one source of numbers:

* **How big is a prompt?** ``TokenCounter.count`` takes the server's count of
  the prompt it was last sent plus its reply, and estimates only the messages
  added since. Estimates divide characters by ``chars_per_token``: 4 until a
  server reports a count, then calibrated on its counts (digits and code take
  about twice as many tokens as English). The calibration never goes above 4
  characters a token, and a count never lowers the estimate: Ollama reports
  only the tokens its prompt cache did not hold, and some chat templates drop
  the tool definitions, so a low count can mean "not all of it was counted".
  Too high a count makes compaction come early; too low lets a server trim
  the context silently (docs/PROTOCOLS.md 1.6).
* **What did the calls cost?** ``add_usage`` adds one model call to the
  state's ``usage``: the server's counts where it gave them, and where it gave
  none (llama-cpp-python in a stream) the call is counted as unreported, with
  an estimate kept apart, so that ``ags info`` can say which is which.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Final

from .messages import Message, Usage

CHARS_PER_TOKEN: Final = 4.0
MIN_CHARS_PER_TOKEN: Final = 1.0

USAGE_FIELDS: Final = (
    "prompt_tokens",  # sums of what servers reported
    "completion_tokens",
    "calls",  # model calls, summaries included
    "unreported_calls",  # calls whose server sent no counts
    "estimated_prompt_tokens",  # estimates for those calls only
    "estimated_completion_tokens",
)


def empty_usage() -> dict[str, Any]:
    return dict.fromkeys(USAGE_FIELDS, 0)


def prompt_chars(messages: Sequence[Any], extra: str = "") -> int:
    """The characters a prompt takes: its messages as JSON, and ``extra`` (tool schemas)."""
    return sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) + len(extra)


class TokenCounter:
    """Counts prompts in tokens, from the server's counts where it gave them."""

    def __init__(self, chars_per_token: float = CHARS_PER_TOKEN) -> None:
        self.chars_per_token = _clamped(chars_per_token)
        self._counted: list[Message] = []  # what the last reported count covers
        self._count = 0

    def estimate(self, messages: Sequence[Any], extra: str = "") -> int:
        return math.ceil(prompt_chars(messages, extra) / self.chars_per_token)

    def count(self, prompt: Sequence[Any], extra: str = "") -> int:
        """Tokens of ``prompt`` (with ``extra`` sent beside it): the server's count
        of the part it has seen, plus an estimate of the rest; never below the
        estimate of the whole."""
        whole = self.estimate(prompt, extra)
        seen = len(self._counted)
        if seen and list(prompt[:seen]) == self._counted:
            return max(whole, self._count + self.estimate(prompt[seen:]))
        return whole

    def observe(self, prompt: Sequence[Any], extra: str, reply: Message, usage: Usage) -> None:
        """Learn from a reply to ``prompt``: calibrate, and remember the count."""
        if not usage.prompt_tokens:
            return
        self.chars_per_token = _clamped(prompt_chars(prompt, extra) / usage.prompt_tokens)
        self._counted = [*prompt, reply]
        self._count = usage.prompt_tokens + (usage.completion_tokens or 0)

    def forget(self) -> None:
        """The context changed under the count (a compaction, a rewind)."""
        self._counted, self._count = [], 0


def _clamped(chars_per_token: float) -> float:
    return round(min(max(chars_per_token, MIN_CHARS_PER_TOKEN), CHARS_PER_TOKEN), 3)


def add_usage(
    totals: dict[str, Any], usage: Usage, prompt_estimate: int, completion_estimate: int
) -> None:
    """Add one model call to the state's ``usage`` totals (in place)."""
    for name in USAGE_FIELDS:
        totals[name] = int(totals.get(name) or 0)
    totals["calls"] += 1
    if usage.reported:
        totals["prompt_tokens"] += usage.prompt_tokens or 0
        totals["completion_tokens"] += usage.completion_tokens or 0
        return
    totals["unreported_calls"] += 1
    totals["estimated_prompt_tokens"] += usage.prompt_tokens or prompt_estimate
    totals["estimated_completion_tokens"] += usage.completion_tokens or completion_estimate


def usage_meta(usage: Usage, prompt_estimate: int, completion_estimate: int) -> dict[str, Any]:
    """The ``usage`` (and, for a call the server did not count, ``usage_estimate``)
    of a model call's node meta: null where the server sent nothing."""
    meta: dict[str, Any] = {
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
        }
    }
    if not usage.reported:
        meta["usage_estimate"] = {
            "prompt_tokens": prompt_estimate,
            "completion_tokens": completion_estimate,
        }
    return meta


def spent_tokens(totals: dict[str, Any]) -> tuple[int, int]:
    """(tokens the servers counted, tokens estimated for the calls they did not
    count), prompts and replies together, over the model calls in ``totals``."""
    counted = int(totals.get("prompt_tokens") or 0) + int(totals.get("completion_tokens") or 0)
    estimated = int(totals.get("estimated_prompt_tokens") or 0) + int(
        totals.get("estimated_completion_tokens") or 0
    )
    return counted, estimated


def describe_usage(totals: dict[str, Any]) -> str:
    """``totals`` in words, saying which counts are the server's and which estimated."""
    calls = int(totals.get("calls") or 0)
    unreported = int(totals.get("unreported_calls") or 0)
    counted = f"{totals.get('prompt_tokens', 0)} in, {totals.get('completion_tokens', 0)} out"
    if not unreported:
        return counted  # every call counted by the server (older states do not count calls)
    estimated = (
        f"about {totals.get('estimated_prompt_tokens', 0)} in, "
        f"{totals.get('estimated_completion_tokens', 0)} out estimated"
    )
    if unreported >= calls:
        return f"not reported by the server ({_calls(calls)}; {estimated})"
    return (
        f"{counted} as the server counted {calls - unreported} of {_calls(calls)}; "
        f"{unreported} not reported ({estimated})"
    )


def _calls(n: int) -> str:
    return f"{n} model call" if n == 1 else f"{n} model calls"
