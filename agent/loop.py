"""The agent loop: a model, tools, and a session in the store, turn by turn.

What it promises:

* a turn's question is stored together with the first answer to it: a turn
  that fails before the model answers (server down, a bad URL, a context
  that does not fit) writes nothing, so a failed turn never leaves an
  unanswered message behind for every later turn to trip over (and a run
  on a new session or a fork that fails leaves no session). An interrupt
  keeps the question, and the partial answer if any: the user stopped it,
  nothing failed;
* after that, every message is appended the moment it is complete, and the
  session's writer lock is held for as long as the loop runs;
* the agent state (scratchpad, todos, retry and tool counts, token usage, the
  summary calls' included) rides on the assistant message of every model
  call and on the last result of every tool batch, so it is checkpointed at
  tool-batch and turn boundaries (unchanged state is the same object);
* a tool call left without a result (a crash, an interrupt) gets an explicit
  "outcome unknown" result on resume, as a real node; tools are never replayed;
* a reply cut off by the output limit (``length``) ends the turn early: its
  tool calls are answered "not run", never run;
* compaction runs at COMPACT_AT of the context budget, or when asked; a failed
  or non-shrinking summary changes nothing; a context that still does not fit
  stops the loop with a clear message, never drops history; a budget that
  the system prompt and tools (and the turn compaction must keep) already
  fill is refused before any summary call;
* the system prompt comes from the current configuration and is never stored.

Why the question waits for the answer instead of being rolled back on a
failure: a rollback would move the head back and leave a reflog entry per
failed turn (and a session made only to be deleted), and a crash between
the append and the rollback would still leave the unanswered message. The
cost is that a question being answered when the process is killed is not
kept; the person who typed it still has it.

Approvals live in this object only: never stored, never restored.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final

from objstore import InvalidInput, SessionArchived, Store

from .checkpoints import Restored, rewind_with_files
from .errors import ContextTooLong, ModelError
from .messages import (
    CallIdFilter,
    Message,
    context_call_ids,
    unanswered_calls,
    with_unique_call_ids,
)
from .models import ModelClient, ModelReply
from .tokens import CHARS_PER_TOKEN, TokenCounter, add_usage, empty_usage, usage_meta
from .tools import TOOLS, FileChanges, Toolbox, tool_schemas

TOOL_SCHEMAS: Final = tool_schemas()
TOOL_SCHEMAS_TEXT: Final = json.dumps(TOOL_SCHEMAS)  # counted into every prompt's size
COMPACT_AT: Final = 0.8
MIN_ROOM: Final = 256  # tokens a budget must leave for the conversation beyond the fixed part
MAX_STEPS: Final = 40  # model calls in one turn before the loop gives the turn back
SUMMARY_PREFIX: Final = "Summary of the conversation so far (earlier turns were compacted):\n\n"
UNKNOWN_OUTCOME: Final = (
    "[ags] The outcome of this tool call is unknown: the agent stopped (a crash or an "
    "interrupt) before its result was recorded. It was not run again. Check the workspace "
    "before retrying it."
)
CUT_OFF_CALL: Final = (
    "[ags] Not run: the reply was cut off by the output limit (finish reason 'length') "
    "before it was complete, so this call may be incomplete."
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


def default_state() -> dict[str, Any]:
    return {
        "scratchpad": "",
        "todos": [],
        "retries": 0,
        "tool_calls": {},
        "usage": empty_usage(),  # agent/tokens.py
    }


class Interrupts:
    """Ctrl-C (or SIGTERM, or SIGHUP when the terminal closes: the sandbox is removed
    then too, as after Ctrl-C) lands only where it is safe to stop: inside a model call
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
            sig: signal.signal(sig, self._handler)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: terminal closed
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

    def text_dropped(self) -> None:
        """The answer streamed so far was cut off and is dropped: the request is made
        again, and the answer starts over (``text`` from its beginning)."""

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
    # None: the model finished; else why the loop stopped early:
    # "interrupted", "too many steps", "cut off" (the reply hit the output limit)
    stopped: str | None


class Agent:
    """One session being worked on. Holds its writer lock until ``close``.

    ``session`` None: the session does not exist yet (a new one, or a fork);
    ``create`` makes it at the first append and returns its id, and ``base``
    (a node id, or None for an empty start) is what the model sees until then.
    """

    def __init__(
        self,
        store: Store,
        session: str | None,
        client: ModelClient,
        toolbox: Toolbox,
        events: AgentEvents | None = None,
        *,
        max_context_tokens: int | None = None,
        system_prompt: str = SYSTEM_PROMPT,
        max_steps: int = MAX_STEPS,
        base: str | None = None,
        create: Callable[[], str] | None = None,
    ) -> None:
        self.store = store
        self.sid: str | None = None
        if session is not None:
            self.sid = store.lock(session)  # SessionBusy names the other process
            if store.session(self.sid).archived:
                store.release(self.sid)
                raise SessionArchived(self.sid)
        elif create is None:
            raise ValueError("an Agent without a session needs a way to create one")
        self._base = base
        self._create = create
        self.client = client
        self.toolbox = toolbox
        self.events = events or AgentEvents()
        self.max_context_tokens = max_context_tokens
        self.system_prompt = system_prompt
        self.max_steps = max_steps
        start = self.sid or base
        self.state = {**default_state(), **(store.state_at(start) if start else {})}
        self.toolbox.state = self.state
        calibrated = self.state.get("usage", {}).get("chars_per_token")
        self.tokens = TokenCounter(float(calibrated or CHARS_PER_TOKEN))
        self._compacted = self._compacted_ids()
        self._always: set[str] = set()
        self._pending: Message | None = None  # the question, until the model answers it
        self.interrupts = Interrupts()

    def close(self) -> None:
        if self.sid is not None:
            self.store.release(self.sid)

    def _session(self) -> str:
        """The session's id, making the session first if it does not exist yet."""
        if self.sid is None:
            assert self._create is not None
            self.sid = self.store.lock(self._create())
        return self.sid

    def _context(self) -> list[Message]:
        start = self.sid or self._base
        return self.store.context(start) if start else []

    def _compacted_ids(self) -> CallIdFilter:
        """The call ids compactions took out of the context: the newest compaction's
        ``compacted_call_ids`` (found like the context, a span at a time)."""
        for node in self.store.walk(self.sid or self._base or None, spans=True):
            if node.is_compaction:
                return CallIdFilter.from_hex(node.meta.get("compacted_call_ids"))
        return CallIdFilter()

    # -- recovery --------------------------------------------------------------

    def recover(self) -> int:
        """Give the tool calls that the context ends with and that have no result
        an explicit 'outcome unknown' result; return how many. Nothing is run again.

        Only the last batch can be open: the loop answers every call before the
        next model call. An open call further back (a session written before
        results were matched by position) cannot be answered by an append; the
        prompt answers it instead (``_prompt``)."""
        context = self._context()
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
            self._pending = {"role": "user", "content": text}
            try:
                return self._turn()
            finally:
                self._pending = None  # a failed turn leaves its question unstored

    def _turn(self) -> TurnResult:
        reply = ""
        done_reason: str | None = None
        tool_calls = 0
        for step in range(1, self.max_steps + 1):
            try:
                answer = self._ask_model()
            except KeyboardInterrupt:
                return TurnResult(reply, None, step, tool_calls, "interrupted")
            done_reason = answer.done_reason
            reply = str(answer.message.get("content") or "")
            calls = answer.message.get("tool_calls") or []
            if done_reason == "length":
                self._refuse_cut_off(calls)
                return TurnResult(reply, done_reason, step, tool_calls, "cut off")
            if not calls:
                return TurnResult(reply, done_reason, step, tool_calls, None)
            tool_calls += len(calls)
            if not self._run_tools(calls):
                return TurnResult(reply, done_reason, step, tool_calls, "interrupted")
        self.events.notice(f"stopped after {self.max_steps} model calls in one turn")
        return TurnResult(reply, done_reason, self.max_steps, tool_calls, "too many steps")

    def _store_question(self) -> None:
        """Append the turn's question, once: with its first answer, or on an interrupt."""
        if self._pending is None:
            return
        question, self._pending = self._pending, None
        sid = self._session()
        self._append(question)
        if self.store.session(sid).title is None:
            self.store.set_title(sid, " ".join(str(question["content"]).split())[:60])

    def _ask_model(self) -> ModelReply:
        """One model call over the current context; its answer is appended when complete.

        Interrupted mid-stream, the text so far is kept as an interrupted answer."""
        messages = self._make_room()
        streamed: list[str] = []

        def on_text(fragment: str) -> None:
            streamed.append(fragment)
            self.events.text(fragment)

        def on_retry(reason: str) -> None:
            if streamed:  # a retried stream starts over: nothing is kept twice
                streamed.clear()
                self.events.text_dropped()
            self._count_retry(reason)

        try:
            try:
                with self.interrupts.interruptible():
                    answer = self.client.chat(messages, TOOL_SCHEMAS, on_text, on_retry)
            except ContextTooLong:
                if not self.compact(automatic=True):
                    raise
                messages = self._prompt()
                with self.interrupts.interruptible():
                    answer = self.client.chat(messages, TOOL_SCHEMAS, on_text, on_retry)
        except KeyboardInterrupt:
            self._store_question()
            partial = "".join(streamed)
            if partial:
                self._append(
                    {"role": "assistant", "content": partial},
                    state=True,
                    meta={"interrupted": True, "model": self.client.model},
                )
            raise
        # The ids a server gives can repeat (a restarted counter) or be missing;
        # the ones stored and sent back are unique in the session.
        unique = with_unique_call_ids(answer.message, context_call_ids(messages), self._compacted)
        answer = dataclasses.replace(answer, message=unique)
        meta = self._account(messages, TOOL_SCHEMAS_TEXT, answer)
        self._store_question()
        self._append(answer.message, state=True, meta=meta)
        return answer

    def _refuse_cut_off(self, calls: list[dict[str, Any]]) -> None:
        """A reply that hit the output limit: its calls are answered, never run."""
        for call in calls:
            self._append(_tool_message(call, CUT_OFF_CALL), state=call is calls[-1])
        what = f"{len(calls)} tool call(s) in it not run" if calls else "the answer is incomplete"
        self.events.notice(
            f"the model's reply was cut off by its output limit (finish reason 'length'): "
            f"{what}; ask it to go on, or allow longer replies"
        )

    def _run_tools(self, calls: list[dict[str, Any]]) -> bool:
        """Run one batch of tool calls, appending each result; False if interrupted."""
        for i, call in enumerate(calls):
            last = i == len(calls) - 1
            name = str(call.get("name"))
            arguments: Any = call.get("arguments_raw", call.get("arguments"))
            try:
                content, ok, files = self._run_one(name, arguments)
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
            self._append(_tool_message(call, content), state=last, meta={"ok": ok}, files=files)
        return True

    def _run_one(self, name: str, arguments: Any) -> tuple[str, bool, FileChanges]:
        spec = TOOLS.get(name)
        if spec is not None and spec.mutating and name not in self._always:
            with self.interrupts.interruptible():
                answer = self.events.approve(name, arguments)
            if answer == "always":
                self._always.add(name)
            elif answer != "yes":
                self.events.tool_finished(name, "declined", False)
                return "[ags] The user declined to run this tool call.", False, {}
        self.events.tool_started(name, arguments)
        with self.interrupts.interruptible():
            outcome = self.toolbox.run(name, arguments)
        self.events.tool_finished(name, outcome.content, outcome.ok)
        return outcome.content, outcome.ok, outcome.files

    # -- context and compaction ------------------------------------------------

    def _system(self) -> Message:
        return {"role": "system", "content": self.system_prompt}

    def _prompt(self) -> list[Message]:
        """The messages of the next model call: the system prompt, the context
        (open calls answered), and the question while it waits for its answer."""
        prompt = [self._system(), *_answered(self._context())]
        if self._pending is not None:
            prompt.append(self._pending)
        return prompt

    def context_tokens(self) -> int:
        """The tokens the next model call would send (the server's counts where known)."""
        return self._tokens(self._prompt())

    def _tokens(self, prompt: list[Message]) -> int:
        return self.tokens.count(prompt, TOOL_SCHEMAS_TEXT)

    def check_budget(self, source: str = "--max-context-tokens") -> None:
        """Refuse a budget the system prompt and the tool definitions already fill.

        ``source`` names where the budget came from, for the message."""
        budget = self.max_context_tokens
        if budget is None:
            return
        fixed = self._tokens([self._system()])
        if fixed + MIN_ROOM > COMPACT_AT * budget:
            least = math.ceil((fixed + MIN_ROOM) / COMPACT_AT)
            raise InvalidInput(
                f"a context budget of {budget} tokens ({source}) cannot work: the system "
                f"prompt and the tool definitions alone take about {fixed}; "
                f"it takes at least {least} (--max-context-tokens {least})"
            )

    def _make_room(self) -> list[Message]:
        """The prompt for the next model call: compacted first at COMPACT_AT of the
        budget; ContextTooLong if it cannot fit, before any summary call when even
        what compaction keeps (the current turn) does not fit."""
        prompt = self._prompt()
        budget = self.max_context_tokens
        if budget is None or self._tokens(prompt) < COMPACT_AT * budget:
            return prompt
        _older, kept = self._split(self._context())
        floor = self._tokens([self._system(), *kept, *([self._pending] if self._pending else [])])
        if floor >= budget:
            what = "your message" if self._pending is not None else "the current turn"
            raise ContextTooLong(
                f"the system prompt, the tool definitions and {what} take about {floor} "
                f"tokens and the limit is {budget}; compaction cannot make that fit: "
                "raise --max-context-tokens, or send less at once"
            )
        if self.compact(automatic=True):
            prompt = self._prompt()
        used = self._tokens(prompt)
        if used >= budget:
            raise ContextTooLong(
                f"the context needs about {used} tokens and the limit is "
                f"{budget}, even after compaction: raise "
                "--max-context-tokens, or fork an earlier point (ags fork SESSION~N)"
            )
        return prompt

    def _split(self, context: list[Message]) -> tuple[list[Message], list[Message]]:
        """(what a compaction summarises, what it keeps verbatim): the current
        turn is kept, from its question on; while the question waits for its
        answer, the turn has not started and everything stored is older."""
        if self._pending is not None:
            return context, []
        start = max(
            (i for i, m in enumerate(context) if isinstance(m, dict) and m.get("role") == "user"),
            default=0,
        )
        return context[:start], context[start:]

    def compact(self, focus: str | None = None, *, automatic: bool = False) -> bool:
        """Summarise the turns before the current one; return whether the context shrank.

        Keeps the current complete user/tool turn verbatim (from the last user
        message on). A failed summary call, or one that does not shrink the
        context, changes nothing.
        """
        context = self._context()
        older, kept = self._split(context)
        if not older:
            self.events.notice("nothing to compact: the context is the current turn alone")
            return False
        ask = SUMMARY_PROMPT + (f"\nFocus on: {focus}" if focus else "")
        request = [self._system(), *older, {"role": "user", "content": ask}]
        try:
            with self.interrupts.interruptible():  # Ctrl-C: no summary, nothing changed
                answer = self.client.chat(request, None, None, self._count_retry)
        except ModelError as e:
            self.events.notice(f"compaction failed, nothing changed: {e}")
            return False
        meta = self._account(request, "", answer)  # summary calls count too, even unused
        summary_text = str(answer.message.get("content") or "").strip()
        summary = {"role": "user", "content": SUMMARY_PREFIX + summary_text}
        before = self.tokens.estimate(context)
        after = self.tokens.estimate([summary, *kept])
        if not summary_text or after >= before:
            self.events.notice(
                f"the summary did not shrink the context ({before} -> {after} tokens); "
                "nothing changed"
            )
            return False
        compacted = CallIdFilter(self._compacted.bits)
        for call_id in context_call_ids(older):
            compacted.add(call_id)
        meta |= {"automatic": automatic, "focus": focus, "compacted_call_ids": compacted.hex()}
        sid = self._session()
        self.store.compact(sid, summary, keep=len(kept), state=self.state, meta=meta)
        self._compacted = compacted
        self.tokens.forget()
        cut = answer.done_reason == "length"
        self.events.notice(
            f"compacted: about {before} -> {after} tokens"
            + (" (the summary was cut off by the output limit)" if cut else "")
        )
        return True

    # -- bookkeeping -----------------------------------------------------------

    def _count_retry(self, reason: str) -> None:
        self.state["retries"] = int(self.state.get("retries", 0)) + 1
        self.events.notice(f"retrying the model call: {reason}")

    def _account(self, prompt: list[Message], extra: str, answer: ModelReply) -> dict[str, Any]:
        """Add a model call to the usage totals, learn from its counts; its node meta."""
        prompt_estimate = self.tokens.estimate(prompt, extra)
        reply_estimate = self.tokens.estimate([answer.message])
        usage = self.state.setdefault("usage", empty_usage())
        add_usage(usage, answer.usage, prompt_estimate, reply_estimate)
        self.tokens.observe(prompt, extra, answer.message, answer.usage)
        usage["chars_per_token"] = self.tokens.chars_per_token
        return {**_reply_meta(answer), **usage_meta(answer.usage, prompt_estimate, reply_estimate)}

    def _append(
        self,
        message: dict[str, Any],
        *,
        state: bool = False,
        meta: dict[str, Any] | None = None,
        files: FileChanges | None = None,
    ) -> str:
        return self.store.append(
            self._session(),
            message,
            state=self.state if state else None,
            meta=meta or {},
            files=files or None,
        )

    def rewind(
        self, steps: int, *, files: bool = False, force: bool = False
    ) -> tuple[str, list[Restored]]:
        """Move the session back ``steps`` messages; the state there comes back too.
        With ``files``, so do the files the tools changed since (checkpoints.py;
        ``force`` overwrites files changed since the agent wrote them). Returns
        the new head and the files put back."""
        if self.sid is None:
            raise InvalidInput("nothing to rewind: the session starts with the first answer")
        spec = f"{self.sid}~{steps}"
        restored: list[Restored] = []
        if files:
            node, restored = rewind_with_files(
                self.store, self.sid, spec, force=force, fs=self.toolbox.files
            )
        else:
            node = self.store.rewind(self.sid, spec)
        self.state.clear()
        self.state.update({**default_state(), **self.store.state_at(self.sid)})
        self._compacted = self._compacted_ids()
        self.tokens.forget()
        return node, restored


def _answered(context: list[Message]) -> list[Message]:
    """The context with an 'outcome unknown' result after every call that has none.

    OpenAI-compatible servers refuse a call without its result. ``recover``
    stores those results for the batch the context ends with; an open call
    further back (stored before results were matched by position) is answered
    here, in the request only.
    """
    missing = unanswered_calls(context)
    if not missing:
        return context
    answered: list[Message] = []
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
        "duration": round(answer.duration, 3),
        "request_id": answer.request_id,
        "done_reason": answer.done_reason,
        "streamed": answer.streamed,
    }
