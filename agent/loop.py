"""The agent loop: a model, tools, and a session in the store, turn by turn.

What it promises:

* every message is appended the moment it is complete, and the session's
  writer lock is held for as long as the loop runs;
* the agent state (scratchpad, todos, retry and tool counts, token usage, the
  summary calls' included) rides on the assistant message of every model
  call and on the last result of every tool batch, so it is checkpointed at
  tool-batch and turn boundaries (unchanged state is the same object);
* a tool call left without a result (a crash, an interrupt) gets an explicit
  "outcome unknown" result on resume, as a real node; tools are never replayed;
* compaction runs at COMPACT_AT of the context budget, or when asked; a failed
  or non-shrinking summary changes nothing; a context that still does not fit
  stops the loop with a clear message, never drops history;
* the system prompt comes from the current configuration and is never stored.

Approvals live in this object only: never stored, never restored.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final

from objstore import AgsError, SessionArchived, Store

from .errors import ContextTooLong, ModelError
from .messages import context_call_ids, unanswered_calls, with_unique_call_ids
from .models import ModelClient, ModelReply
from .tools import TOOLS, Toolbox, tool_schemas

TOOL_SCHEMAS: Final = tool_schemas()
TOOL_SCHEMAS_TEXT: Final = json.dumps(TOOL_SCHEMAS)  # counted into every prompt's size
COMPACT_AT: Final = 0.8
MAX_STEPS: Final = 40  # model calls in one turn before the loop gives the turn back
SUMMARY_PREFIX: Final = "Summary of the conversation so far (earlier turns were compacted):\n\n"
UNKNOWN_OUTCOME: Final = (
    "[ags] The outcome of this tool call is unknown: the agent stopped (a crash or an "
    "interrupt) before its result was recorded. It was not run again. Check the workspace "
    "before retrying it."
)

SYSTEM_PROMPT: Final = """\
You are a careful coding agent. The user's project is mounted at /workspace in a \
sandbox; use the tools to read, change and run things there. Prefer small, verified \
steps: read before you edit, run the tests after. Keep notes in the scratchpad and a \
todo list for longer work. When a tool result says its outcome is unknown, check the \
workspace before doing that step again. Answer concisely."""

SUMMARY_PROMPT: Final = """\
Summarise the conversation above so that the work can continue from the summary alone: \
the user's goals and constraints, decisions made and why, files changed, commands run \
and their results, open problems and next steps. Keep exact names, paths and numbers. \
Do not call tools."""


class ContextFull(AgsError):
    """The context does not fit the model even after compaction."""


def default_state() -> dict[str, Any]:
    return {
        "scratchpad": "",
        "todos": [],
        "retries": 0,
        "tool_calls": {},
        "usage": {"prompt_tokens": 0, "completion_tokens": 0},
    }


def estimate_tokens(messages: list[dict[str, Any]], extra: str = "") -> int:
    """A cheap token count: four characters a token, as servers roughly count English."""
    chars = sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) + len(extra)
    return chars // 4


class Interrupts:
    """Ctrl-C (or SIGTERM) lands only where it is safe to stop: inside a model call
    or a tool run. Arriving anywhere else (in the middle of an append) it is held
    and raised at the start of the next model call or tool run, so an interrupt
    never leaves a half-done write for this process to trip over."""

    def __init__(self) -> None:
        self.armed = False
        self.pending = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        self.pending = True

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals only reach the main thread
            return
        previous = {
            sig: signal.signal(sig, self._handler) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt
        self.armed = True
        try:
            yield
        finally:
            self.armed = False


class AgentEvents:
    """What the loop tells the person watching, and asks them. The defaults are silent
    and refuse every mutating tool (a script without --yes-tools)."""

    def text(self, fragment: str) -> None:
        """A piece of the model's answer as it streams."""

    def notice(self, message: str) -> None:
        """Something the user should know: a retry, a compaction, a refusal."""

    def tool_started(self, name: str, arguments: Any) -> None: ...

    def tool_finished(self, name: str, content: str, ok: bool) -> None: ...

    def approve(self, name: str, arguments: Any) -> str:
        """'yes', 'no' or 'always' (for the rest of this session's run)."""
        return "no"


@dataclass(frozen=True, slots=True)
class TurnResult:
    reply: str  # the last assistant text
    done_reason: str | None
    model_calls: int
    tool_calls: int
    stopped: str | None  # None: the model finished; else why the loop stopped early


class Agent:
    """One session being worked on. Holds its writer lock until ``close``."""

    def __init__(
        self,
        store: Store,
        session: str,
        client: ModelClient,
        toolbox: Toolbox,
        events: AgentEvents | None = None,
        *,
        max_context_tokens: int | None = None,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        self.store = store
        self.sid = store.lock(session)  # SessionBusy names the other process
        if store.session(self.sid).archived:
            store.release(self.sid)
            raise SessionArchived(self.sid)
        self.client = client
        self.toolbox = toolbox
        self.events = events or AgentEvents()
        self.max_context_tokens = max_context_tokens
        self.system_prompt = system_prompt
        self.state = {**default_state(), **store.state(self.sid)}
        self.toolbox.state = self.state
        self._always: set[str] = set()
        self.interrupts = Interrupts()

    def close(self) -> None:
        self.store.release(self.sid)

    # -- recovery --------------------------------------------------------------

    def recover(self) -> int:
        """Give the tool calls that the context ends with and that have no result
        an explicit 'outcome unknown' result; return how many. Nothing is run again.

        Only the last batch can be open: the loop answers every call before the
        next model call. An open call further back (a session written before
        results were matched by position) cannot be answered by an append; the
        prompt answers it instead (``_prompt``)."""
        context = self.store.context(self.sid)
        missing = [call for last, call in unanswered_calls(context) if last == len(context) - 1]
        for i, call in enumerate(missing):
            last = i == len(missing) - 1
            self._append(
                _tool_message(call, UNKNOWN_OUTCOME),
                state=last,
                meta={"recovered": True},
            )
        if missing:
            self.events.notice(
                f"{len(missing)} tool call(s) had no result (the last run stopped early); "
                "they are marked 'outcome unknown' and were not run again"
            )
        return len(missing)

    # -- a turn ----------------------------------------------------------------

    def turn(self, text: str) -> TurnResult:
        """The user says ``text``; the model answers, calling tools until it is done."""
        with self.interrupts.installed():
            return self._turn(text)

    def _turn(self, text: str) -> TurnResult:
        self._append({"role": "user", "content": text})
        if self.store.session(self.sid).title is None:
            self.store.set_title(self.sid, " ".join(text.split())[:60])
        reply = ""
        done_reason: str | None = None
        tool_calls = 0
        for step in range(1, MAX_STEPS + 1):
            try:
                answer = self._ask_model()
            except KeyboardInterrupt:
                return TurnResult(reply, None, step, tool_calls, "interrupted")
            done_reason = answer.done_reason
            reply = str(answer.message.get("content") or "")
            calls = answer.message.get("tool_calls") or []
            if not calls:
                return TurnResult(reply, done_reason, step, tool_calls, None)
            tool_calls += len(calls)
            if not self._run_tools(calls):
                return TurnResult(reply, done_reason, step, tool_calls, "interrupted")
        self.events.notice(f"stopped after {MAX_STEPS} model calls in one turn")
        return TurnResult(reply, done_reason, MAX_STEPS, tool_calls, "too many steps")

    def _ask_model(self) -> ModelReply:
        """One model call over the current context; its answer is appended when complete.

        Interrupted mid-stream, the text so far is kept as an interrupted answer."""
        messages = self._make_room()
        streamed: list[str] = []

        def on_text(fragment: str) -> None:
            streamed.append(fragment)
            self.events.text(fragment)

        def on_retry(reason: str) -> None:
            streamed.clear()  # a retried stream starts over: nothing is kept twice
            self._count_retry(reason)

        try:
            try:
                with self.interrupts.interruptible():
                    answer = self.client.chat(messages, TOOL_SCHEMAS, on_text, on_retry)
            except ContextTooLong:
                if not self.compact(automatic=True):
                    raise
                with self.interrupts.interruptible():
                    answer = self.client.chat(self._prompt(), TOOL_SCHEMAS, on_text, on_retry)
        except KeyboardInterrupt:
            partial = "".join(streamed)
            if partial:
                self._append(
                    {"role": "assistant", "content": partial},
                    state=True,
                    meta={"interrupted": True, "model": self.client.model},
                )
            raise
        # The ids a server gives can repeat (a restarted counter) or be missing;
        # the ones stored and sent back are unique in the context.
        answer = dataclasses.replace(
            answer, message=with_unique_call_ids(answer.message, context_call_ids(messages))
        )
        self._add_usage(answer)
        self._append(answer.message, state=True, meta=_reply_meta(answer))
        return answer

    def _run_tools(self, calls: list[dict[str, Any]]) -> bool:
        """Run one batch of tool calls, appending each result; False if interrupted."""
        for i, call in enumerate(calls):
            last = i == len(calls) - 1
            name = str(call.get("name"))
            arguments: Any = call.get("arguments_raw", call.get("arguments"))
            try:
                content, ok = self._run_one(name, arguments)
            except KeyboardInterrupt:
                self._append(
                    _tool_message(call, "[ags] Interrupted by the user. If it had started, "
                                  "it was stopped and its effects may be partial."),
                    state=not calls[i + 1 :],
                )  # fmt: skip
                for rest in calls[i + 1 :]:
                    self._append(
                        _tool_message(rest, "[ags] Not run: the user interrupted the turn."),
                        state=rest is calls[-1],
                    )
                return False
            counts = self.state.setdefault("tool_calls", {})
            counts[name] = int(counts.get(name, 0)) + 1
            self._append(_tool_message(call, content), state=last, meta={"ok": ok})
        return True

    def _run_one(self, name: str, arguments: Any) -> tuple[str, bool]:
        spec = TOOLS.get(name)
        if spec is not None and spec.mutating and name not in self._always:
            with self.interrupts.interruptible():
                answer = self.events.approve(name, arguments)
            if answer == "always":
                self._always.add(name)
            elif answer != "yes":
                self.events.tool_finished(name, "declined", False)
                return "[ags] The user declined to run this tool call.", False
        self.events.tool_started(name, arguments)
        with self.interrupts.interruptible():
            outcome = self.toolbox.run(name, arguments)
        self.events.tool_finished(name, outcome.content, outcome.ok)
        return outcome.content, outcome.ok

    # -- context and compaction ------------------------------------------------

    def _prompt(self) -> list[dict[str, Any]]:
        system = {"role": "system", "content": self.system_prompt}
        return [system, *_answered(self.store.context(self.sid))]

    def context_tokens(self) -> int:
        return self._tokens(self._prompt())

    @staticmethod
    def _tokens(prompt: list[dict[str, Any]]) -> int:
        return estimate_tokens(prompt, TOOL_SCHEMAS_TEXT)

    def _make_room(self) -> list[dict[str, Any]]:
        """The prompt for the next model call: compacted first at COMPACT_AT of the
        budget; ContextFull if it still does not fit."""
        prompt = self._prompt()
        budget = self.max_context_tokens
        if budget is None or self._tokens(prompt) < COMPACT_AT * budget:
            return prompt
        if self.compact(automatic=True):
            prompt = self._prompt()
        used = self._tokens(prompt)
        if used >= budget:
            raise ContextFull(
                f"the context needs about {used} tokens and the limit is "
                f"{budget}, even after compaction: raise "
                "--max-context-tokens, or fork an earlier point (ags fork SESSION~N)"
            )
        return prompt

    def compact(self, focus: str | None = None, *, automatic: bool = False) -> bool:
        """Summarise the turns before the current one; return whether the context shrank.

        Keeps the current complete user/tool turn verbatim (from the last user
        message on). A failed summary call, or one that does not shrink the
        context, changes nothing.
        """
        context = self.store.context(self.sid)
        start = max(
            (i for i, m in enumerate(context) if isinstance(m, dict) and m.get("role") == "user"),
            default=0,
        )
        older, kept = context[:start], context[start:]
        if not older:
            self.events.notice("nothing to compact: the context is the current turn alone")
            return False
        ask = SUMMARY_PROMPT + (f"\nFocus on: {focus}" if focus else "")
        request = [
            {"role": "system", "content": self.system_prompt},
            *older,
            {"role": "user", "content": ask},
        ]
        try:
            with self.interrupts.interruptible():  # Ctrl-C: no summary, nothing changed
                answer = self.client.chat(request, None, None, self._count_retry)
        except ModelError as e:
            self.events.notice(f"compaction failed, nothing changed: {e}")
            return False
        self._add_usage(answer)  # summary calls count too, even when not used
        summary_text = str(answer.message.get("content") or "").strip()
        summary = {"role": "user", "content": SUMMARY_PREFIX + summary_text}
        before = estimate_tokens(context)
        after = estimate_tokens([summary, *kept])
        if not summary_text or after >= before:
            self.events.notice(
                f"the summary did not shrink the context ({before} -> {after} tokens); "
                "nothing changed"
            )
            return False
        meta = {**_reply_meta(answer), "automatic": automatic, "focus": focus}
        self.store.compact(self.sid, summary, keep=len(kept), state=self.state, meta=meta)
        self.events.notice(f"compacted: about {before} -> {after} tokens")
        return True

    # -- bookkeeping -----------------------------------------------------------

    def _count_retry(self, reason: str) -> None:
        self.state["retries"] = int(self.state.get("retries", 0)) + 1
        self.events.notice(f"retrying the model call: {reason}")

    def _add_usage(self, answer: ModelReply) -> None:
        usage = self.state.setdefault("usage", {"prompt_tokens": 0, "completion_tokens": 0})
        usage["prompt_tokens"] = int(usage.get("prompt_tokens", 0)) + (
            answer.usage.prompt_tokens or 0
        )
        usage["completion_tokens"] = int(usage.get("completion_tokens", 0)) + (
            answer.usage.completion_tokens or 0
        )

    def _append(
        self, message: dict[str, Any], *, state: bool = False, meta: dict[str, Any] | None = None
    ) -> str:
        return self.store.append(
            self.sid, message, state=self.state if state else None, meta=meta or {}
        )

    def rewind(self, steps: int) -> str:
        """Move the session back ``steps`` messages; the state there comes back too."""
        node = self.store.rewind(self.sid, f"{self.sid}~{steps}")
        self.state.clear()
        self.state.update({**default_state(), **self.store.state(self.sid)})
        return node


def _answered(context: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The context with an 'outcome unknown' result after every call that has none.

    OpenAI-compatible servers refuse a call without its result. ``recover``
    stores those results for the batch the context ends with; an open call
    further back (stored before results were matched by position) is answered
    here, in the request only.
    """
    missing = unanswered_calls(context)
    if not missing:
        return context
    answered: list[dict[str, Any]] = []
    for i, message in enumerate(context):
        answered.append(message)
        answered += [_tool_message(call, UNKNOWN_OUTCOME) for last, call in missing if last == i]
    return answered


def _tool_message(call: dict[str, Any], content: str) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": str(call.get("id")),
        "name": str(call.get("name")),
        "content": content,
    }


def _reply_meta(answer: ModelReply) -> dict[str, Any]:
    return {
        "model": answer.model,
        "usage": {
            "prompt_tokens": answer.usage.prompt_tokens,
            "completion_tokens": answer.usage.completion_tokens,
        },
        "duration": round(answer.duration, 3),
        "request_id": answer.request_id,
        "done_reason": answer.done_reason,
    }
