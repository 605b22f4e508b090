"""A session's transcript for people: Markdown, and one self-contained HTML page.

Shared by ``ags export --format md|html`` and the session browser (web/).
``transcript_entries`` reads what to show (oldest first, compactions and the
fork point marked); ``render_markdown`` and ``render_html`` only format it;
``shown_entries`` and ``entry_html`` are the HTML of one entry for both pages.

The HTML page loads nothing from anywhere (no script, no font, no image: a
strict Content-Security-Policy says so too). Message text is rendered as
Markdown and sanitised by an allow-list, everything else from a message is
escaped (agent/markup.py); tool calls fold with their results into
``<details>``; the page reads on a phone.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from objstore import LogEntry, Store, content_text

from .control_chars import visible
from .markup import HIGHLIGHT_CSS, code_html, markdown_html, text_html
from .messages import call_function, calls_of

FOLD_OVER: Final = 12  # lines of tool output shown before it is folded away
SHOWN_CHARS: Final = 50_000
"""Characters of one text of an entry (its message, thinking, a call's arguments, a
tool's output) that a page linking to the whole entry shows (``entry_html``'s
``whole``): a message may hold 128 MiB, which sent whole made a page of 134 MB."""


@dataclass(frozen=True, slots=True)
class Transcript:
    title: str | None
    session: str | None
    head: str | None
    root: str | None
    model: str | None
    created: str | None
    forked_from: dict[str, Any] | None
    entries: list[LogEntry]  # oldest first


def transcript_entries(store: Store, spec: str) -> Transcript:
    """Everything a person needs to read the history at ``spec``, oldest first."""
    target = store.target(spec)
    info = store.session(target.session) if target.session else None
    entries = list(store.log(spec))[::-1] if target.node else []
    return Transcript(
        title=info.title if info else None,
        session=info.id if info else None,
        head=target.node,
        root=info.root if info else None,
        model=info.model if info else None,
        created=info.created if info else None,
        forked_from=info.forked_from if info else None,
        entries=entries,
    )


def _fork_index(t: Transcript) -> int | None:
    """Index of the entry a fork starts after (the shared history ends there)."""
    node = (t.forked_from or {}).get("node")
    if not node:
        return None
    return next((i for i, e in enumerate(t.entries) if e.id == node), None)


def _text(message: Any) -> str:
    if not isinstance(message, dict):
        return json.dumps(message, ensure_ascii=False)
    return content_text(message.get("content"))


def _arguments(args: Any) -> str:
    """A call's arguments (``_call_parts``) as text: the raw text a model sent as it is."""
    if isinstance(args, str):
        return args
    return json.dumps(args, ensure_ascii=False, indent=2)


def _fence(text: str, lang: str = "") -> list[str]:
    """A fenced block that no backtick run inside ``text`` can close."""
    ticks = "`" * max(3, _longest_backticks(text) + 1)
    return [f"{ticks}{lang}", text, ticks]


def _longest_backticks(text: str) -> int:
    """The longest run of backticks in ``text``, found by substring searches (a run of
    n holds one of every shorter length): a few scans at C speed, where a loop over
    the characters took 14 s of a message of 128 MiB."""
    if "`" not in text:
        return 0
    found, absent = 1, 2  # a run of ``found`` is in the text, one of ``absent`` is not
    while "`" * absent in text:
        found, absent = absent, absent * 2
    while absent - found > 1:
        middle = (found + absent) // 2
        if "`" * middle in text:
            found = middle
        else:
            absent = middle
    return found


# -- Markdown ---------------------------------------------------------------------


def render_markdown(t: Transcript) -> str:
    lines = [f"# {_md_inline(t.title or 'Untitled session')}", ""]
    facts = [
        ("session", t.session),
        ("head", t.head),
        ("project", t.root),
        ("model", t.model),
        ("created", t.created),
    ]
    lines += [f"- {k}: `{v}`" for k, v in facts if v]
    fork = _fork_index(t)
    if t.forked_from:
        lines.append(
            f"- forked from: `{t.forked_from.get('session') or '-'}` "
            f"at `{t.forked_from.get('node') or '-'}`"
        )
    lines.append("")
    if fork is None and t.forked_from and t.forked_from.get("node"):
        lines += ["> **Fork point** is before this transcript's first entry.", ""]
    for i, entry in enumerate(t.entries):
        lines += _md_entry(entry)
        if i == fork:
            lines += ["---", "", "> **Fork point**: this session's own history starts here.", ""]
    return "\n".join(lines).rstrip() + "\n"


def _md_inline(text: str) -> str:
    return " ".join(text.split()).replace("<", "&lt;")


def _md_code(value: Any) -> str:
    """A short value as inline code that its own backticks cannot end."""
    text = " ".join(str(value).split())
    ticks = "`" * (_longest_backticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def entry_markdown(entry: LogEntry) -> str:
    """One entry whole, as the Markdown transcript has it (the session browser's link
    to the whole of an entry it shows cut)."""
    return "\n".join(_md_entry(entry)).rstrip() + "\n"


def _md_entry(entry: LogEntry) -> list[str]:
    n = entry.node
    msg = entry.message if isinstance(entry.message, dict) else {"content": entry.message}
    when = n.meta.get("time", "")
    if n.is_compaction:
        kept = f", {len(n.kept)} messages kept verbatim" if n.kept else ""
        return [
            "---",
            "",
            f"## Compaction ({when}{kept})",
            "",
            "> Earlier turns were summarised; from here the model saw this summary:",
            "",
            *_fence(_text(msg)),
            "",
            "---",
            "",
        ]
    role = str(msg.get("role", "?"))
    out: list[str] = []
    if role == "tool":
        name = msg.get("name") or "tool"
        out += [
            f"### tool result: {_md_inline(str(name))} {_md_code(msg.get('tool_call_id', ''))} "
            f"<sub>{when}</sub>",
            "",
        ]
        out += _fence(_text(msg))
        out.append("")
        for f in n.files:
            out.append(f"- {_change_word(f.before, f.after)} {_md_code(f.path)}")
        if n.files:
            out.append("")
        return out
    out += [f"### {_md_inline(role)} <sub>{_md_inline(str(when))}</sub>", ""]
    if msg.get("thinking"):
        out += [
            "<details><summary>thinking</summary>",
            "",
            *_fence(str(msg["thinking"])),
            "",
            "</details>",
            "",
        ]
    text = _text(msg)
    if text:
        # Message text is shown as text: a fence keeps Markdown and HTML in it inert.
        out += [*_fence(text, "text"), ""]
    for call in calls_of(msg):
        cid, name, args = _call_parts(call)
        out += [f"**tool call** {_md_code(name)} {_md_code(cid)}", ""]
        out += [*_fence(_arguments(args), "json"), ""]
    return out


# -- HTML ---------------------------------------------------------------------------
#
# One renderer of entries for both pages that show them: the exported page
# (``render_html``) and the session browser (web/), which adds its own controls
# to each entry through ``entry_html(..., controls=...)``. Text from a message
# goes through agent/markup.py and nowhere else.


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call of an assistant message, with the result that answered it if any."""

    id: str
    name: str
    arguments: Any  # the parsed arguments, or the raw text a model sent
    result: LogEntry | None


@dataclass(frozen=True, slots=True)
class ShownEntry:
    """One entry as a page shows it: tool results sit with the calls they answer
    (``calls``), and ``in_context`` says whether the model saw it at the head."""

    entry: LogEntry
    calls: tuple[ToolCall, ...]
    in_context: bool


def context_ids(entries: list[LogEntry]) -> set[str]:
    """The nodes of ``entries`` (oldest first) that the model saw at the last one: the
    last compaction, the messages it kept verbatim, and everything after it."""
    last = next((i for i in range(len(entries) - 1, -1, -1) if entries[i].node.is_compaction), None)
    if last is None:
        return {e.id for e in entries}
    return {*entries[last].node.kept, *(e.id for e in entries[last:])}


def context_entries(entries: list[LogEntry]) -> list[LogEntry]:
    """What the model saw at the last of ``entries`` (oldest first), in the order it saw
    it: the last compaction's summary, the messages it kept, the messages after it."""
    last = next((i for i in range(len(entries) - 1, -1, -1) if entries[i].node.is_compaction), None)
    if last is None:
        return list(entries)
    kept = set(entries[last].node.kept)
    return [entries[last], *(e for e in entries[:last] if e.id in kept), *entries[last + 1 :]]


def _call_parts(call: Any) -> tuple[str, str, Any]:
    """(id, name, arguments) of a tool call in ags' shape or OpenAI's ``function`` shape."""
    if not isinstance(call, dict):
        return "", "?", call
    fn = call_function(call)
    args = fn.get("arguments_raw", fn.get("arguments", {}))
    return str(call.get("id", "")), str(fn.get("name", "?")), args


def _message(entry: LogEntry) -> dict[str, Any]:
    return entry.message if isinstance(entry.message, dict) else {"content": entry.message}


def shown_entries(entries: list[LogEntry], in_context: set[str] | None = None) -> list[ShownEntry]:
    """``entries`` (oldest first) as shown: each tool result that answers a call of an
    earlier assistant message moves into that call; one that answers none stays."""
    if in_context is None:
        in_context = context_ids(entries)
    results: dict[int, LogEntry] = {}  # index of a result -> itself, once paired
    pairs: dict[tuple[int, str], LogEntry] = {}  # (index of the caller, call id) -> result
    waiting: dict[str, int] = {}  # call id -> index of the latest message that made it
    for i, entry in enumerate(entries):
        msg = _message(entry)
        if entry.node.is_compaction:
            continue
        if msg.get("role") == "tool":
            at = waiting.pop(str(msg.get("tool_call_id", "")), None)
            if at is not None:
                pairs[(at, str(msg.get("tool_call_id", "")))] = entry
                results[i] = entry
            continue
        calls = msg.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            waiting[_call_parts(call)[0]] = i
    out = []
    for i, entry in enumerate(entries):
        if i in results:
            continue
        calls = _message(entry).get("tool_calls") if not entry.node.is_compaction else None
        made = tuple(
            ToolCall(cid, name, args, pairs.get((i, cid)))
            for cid, name, args in (
                _call_parts(c) for c in (calls if isinstance(calls, list) else ())
            )
        )
        out.append(ShownEntry(entry, made, entry.id in in_context))
    return out


_CSS: Final = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1d1d1f;--muted:#6e6e73;--line:#d2d2d7;
--user:#e8f3ff;--assistant:#f5f5f7;--tool:#f6f0ff;--system:#fff8e5;--mark:#fff3cd;
--code:#f0f0f3;--link:#0a58ca}
@media (prefers-color-scheme:dark){:root{--bg:#111;--fg:#eee;--muted:#9a9a9f;--line:#333;
--user:#12263d;--assistant:#1c1c1e;--tool:#231a33;--system:#2f2a14;--mark:#3a3213;
--code:#0b0b0d;--link:#8ab4f8}}
*{box-sizing:border-box}body{margin:0;background:var(--bg);color:var(--fg);
font:16px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif}a{color:var(--link)}
main{max-width:56rem;margin:0 auto;padding:1rem}
h1{font-size:1.4rem;margin:.5rem 0;overflow-wrap:anywhere}dl{display:grid;
grid-template-columns:auto 1fr;gap:.1rem .8rem;font-size:.85rem;color:var(--muted)}
dd{margin:0;overflow-wrap:anywhere}
.msg{border:1px solid var(--line);border-radius:.6rem;padding:.6rem .8rem;margin:.7rem 0}
.user{background:var(--user)}.assistant{background:var(--assistant)}
.tool{background:var(--tool)}.system{background:var(--system)}
.msg>header,.result>header,.marker>header{display:flex;flex-wrap:wrap;gap:.2rem .6rem;
align-items:baseline}
.role{font-weight:600;font-size:.9rem}
.when,.cost,.files{color:var(--muted);font-size:.8rem}a.when{text-decoration:none}
.outside{opacity:.55}.outside:hover{opacity:1}
.md{overflow-wrap:anywhere}.md>:first-child{margin-top:.2rem}.md>:last-child{margin-bottom:.2rem}
.md h1,.md h2,.md h3,.md h4{font-size:1.05rem;margin:.6rem 0 .3rem}
.md table{border-collapse:collapse}.md td,.md th{border:1px solid var(--line);padding:.1rem .4rem}
.md blockquote{margin:.3rem 0;padding-left:.8rem;border-left:3px solid var(--line)}
code{font:.88em ui-monospace,monospace;background:var(--code);padding:0 .2rem;border-radius:.2rem}
pre{white-space:pre-wrap;overflow-wrap:anywhere;font:.85rem/1.4 ui-monospace,monospace;
margin:.3rem 0;max-height:40rem;overflow:auto;background:var(--code);padding:.4rem .5rem;
border-radius:.3rem}pre code{background:none;padding:0;font-size:inherit}
details{margin:.3rem 0}summary{cursor:pointer;color:var(--muted);font-size:.85rem;
overflow-wrap:anywhere}
details.call{border:1px solid var(--line);border-radius:.4rem;padding:.2rem .5rem;
background:var(--bg)}details.call>summary{color:var(--fg)}
.result{border-top:1px dashed var(--line);margin-top:.3rem;padding-top:.3rem}
.ok{color:#1a7f37}.failed{color:#cf222e}.more{color:var(--muted);font-size:.85rem;margin:.2rem 0}
.files-changed{list-style:none;margin:.3rem 0;padding:0;font-size:.85rem}
.files-changed .change{color:var(--muted);display:inline-block;min-width:4.5rem}
.marker{border-left:4px solid #c98a00;background:var(--mark);padding:.6rem .8rem;margin:1rem 0;
border-radius:.3rem}.marker>strong{display:block}
"""


def transcript_css() -> str:
    """The style sheet of a transcript: the page's own rules and the code colours."""
    return _CSS + HIGHLIGHT_CSS


def render_html(t: Transcript) -> str:
    e = html.escape
    title = visible(t.title or "Untitled session")
    facts = [
        ("session", t.session),
        ("head", t.head),
        ("project", t.root),
        ("model", t.model),
        ("created", t.created),
    ]
    if t.forked_from:
        facts.append(
            (
                "forked from",
                f"{t.forked_from.get('session') or '-'} at {t.forked_from.get('node') or '-'}",
            )
        )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">",
        f"<title>{e(title)}</title><style>{transcript_css()}</style></head><body><main>",
        f"<h1>{e(title)}</h1>",
        "<dl>"
        + "".join(f"<dt>{e(k)}</dt><dd>{text_html(str(v))}</dd>" for k, v in facts if v)
        + "</dl>",
    ]
    fork = _fork_index(t)
    if fork is None and t.forked_from and t.forked_from.get("node"):
        parts.append('<div class="marker"><strong>Fork point</strong>before the first entry</div>')
    fork_id = t.entries[fork].id if fork is not None else None
    for shown in shown_entries(t.entries):
        parts.append(entry_html(shown))
        if shown.entry.id == fork_id:
            parts.append(FORK_MARKER)
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


FORK_MARKER: Final = (
    '<div class="marker" id="fork"><strong>Fork point</strong>'
    "this session's own history starts here</div>"
)


def anchor(node_id: str) -> str:
    """The id of an entry's element in a page (search hits and links point at it)."""
    return f"n-{node_id[:12]}"


Controls = Callable[[LogEntry], str]
Whole = Callable[[LogEntry], str] | None
"""The address of an entry's whole text, for a page that shows each text of an entry
up to SHOWN_CHARS; None: every text whole (an export)."""


def _no_controls(_entry: LogEntry) -> str:
    return ""


def _header(entry: LogEntry, label: str, controls: Controls) -> str:
    """Role, time (a link to the entry), time taken and tokens, and the page's controls."""
    e = html.escape
    meta = entry.node.meta
    when = meta.get("time")
    parts = [label]
    if isinstance(when, str):
        shown = when[:19].replace("T", " ") if len(when) >= 19 else when
        parts.append(
            f'<a class="when" href="#{anchor(entry.id)}">'
            f'<time datetime="{e(when)}" title="{e(when)}">{text_html(shown)}</time></a>'
        )
    cost = _cost(meta)
    if cost:
        parts.append(f'<span class="cost">{e(cost)}</span>')
    parts.append(controls(entry))
    return f"<header>{''.join(parts)}</header>"


def _cost(meta: dict[str, Any]) -> str:
    """'2.1 s · 1,234 in · 56 out' from a node's meta; '~' marks estimated tokens."""
    out = []
    duration = meta.get("duration")
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        out.append(f"{duration:.1f} s")
    usage, approx = meta.get("usage"), ""
    if isinstance(meta.get("usage_estimate"), dict):
        usage, approx = meta["usage_estimate"], "~"
    if isinstance(usage, dict):
        for key, word in (("prompt_tokens", "in"), ("completion_tokens", "out")):
            n = usage.get(key)
            if isinstance(n, int) and not isinstance(n, bool):
                out.append(f"{approx}{n:,} {word}")
    return " · ".join(out)


def _cut(text: str, entry: LogEntry, whole: Whole) -> tuple[str, str]:
    """``text`` as a page shows it: whole, or with ``whole`` its first SHOWN_CHARS and
    the HTML of a note linking to the entry's whole text (else an empty note)."""
    if whole is None or len(text) <= SHOWN_CHARS:
        return text, ""
    more = len(text) - SHOWN_CHARS
    return text[:SHOWN_CHARS], (
        f'<p class="more">… {more:,} more characters: '
        f'<a href="{html.escape(whole(entry))}">the whole entry as text</a></p>'
    )


def _markdown(text: str, entry: LogEntry, whole: Whole) -> str:
    """Message text as Markdown in a ``div``, cut as ``_cut`` says."""
    shown, note = _cut(text, entry, whole)
    return f'<div class="md">{markdown_html(shown)}</div>{note}'


def _code(text: str, entry: LogEntry, whole: Whole, lang: str = "") -> str:
    """Code or output in a ``pre``, cut as ``_cut`` says (and then not highlighted: the
    lexer would mark the cut end, an unclosed string, as an error)."""
    shown, note = _cut(text, entry, whole)
    return code_html(shown, "" if note else lang) + note


def entry_html(shown: ShownEntry, controls: Controls = _no_controls, whole: Whole = None) -> str:
    """One entry as HTML: a message (its tool calls folded, each with its result), a
    compaction marker, or a tool result that answers no call of the transcript.
    ``whole``: each text is cut to SHOWN_CHARS, with a link to the whole (``Whole``)."""
    entry = shown.entry
    n = entry.node
    msg = _message(entry)
    outside = "" if shown.in_context else " outside"
    ident = f'id="{anchor(n.id)}" data-node="{n.id}"'
    if n.is_compaction:
        kept = f", {len(n.kept)} messages kept verbatim" if n.kept else ""
        head = _header(entry, f'<strong class="role">Compaction{kept}</strong>', controls)
        return (
            f'<section class="marker compaction{outside}" {ident}>{head}'
            "<p>Earlier turns were summarised; from here the model saw:</p>"
            f"{_markdown(_text(msg), entry, whole)}</section>"
        )
    role = str(msg.get("role", "?"))
    css = role if role in ("user", "assistant", "tool", "system") else "system"
    if role == "tool":
        name = msg.get("name") or msg.get("tool_name") or "tool"
        label = f'<span class="role">tool result · {text_html(str(name))}</span>'
        return (
            f'<article class="msg tool{outside}" {ident}>{_header(entry, label, controls)}'
            f"{_output(msg, entry, whole)}{_files_html(entry)}</article>"
        )
    body = []
    if msg.get("thinking"):
        body.append(
            '<details class="thinking"><summary>thinking</summary>'
            f"{_markdown(str(msg['thinking']), entry, whole)}</details>"
        )
    text = _text(msg)
    if text:
        body.append(_markdown(text, entry, whole))
    body += [_call_html(call, entry, controls, whole) for call in shown.calls]
    label = f'<span class="role">{text_html(role)}</span>'
    return (
        f'<article class="msg {css}{outside}" {ident}>{_header(entry, label, controls)}'
        f"{''.join(body)}</article>"
    )


_FILE_TOOLS: Final = frozenset({"write_file", "edit_file"})
_ARGUMENT_LANGUAGE: Final = {"shell": ("command", "bash")}


def _call_html(call: ToolCall, caller: LogEntry, controls: Controls, whole: Whole) -> str:
    """A tool call of ``caller`` folded to one line (name, arguments in short, outcome,
    the file it changed), unfolding to its arguments and the result that answered it."""
    e = html.escape
    outcome = ""
    if call.result is not None:
        ok = call.result.node.meta.get("ok")
        if ok is True:
            outcome = ' · <span class="ok">ok</span>'
        elif ok is False:
            outcome = ' · <span class="failed">failed</span>'
    else:
        outcome = " · no result"
    files = ""
    path = call.arguments.get("path") if isinstance(call.arguments, dict) else None
    if call.name in _FILE_TOOLS and isinstance(path, str):
        files = f' · <span class="files">changes {text_html(path)}</span>'
    summary = (
        f"<summary>tool call <strong>{text_html(call.name)}</strong> "
        f"<code>{text_html(_short_arguments(call))}</code>{outcome}{files}</summary>"
    )
    key, lang = _ARGUMENT_LANGUAGE.get(call.name, ("", ""))
    args = call.arguments
    if key and isinstance(args, dict) and isinstance(args.get(key), str) and len(args) == 1:
        shown_args = _code(args[key], caller, whole, lang)
    elif isinstance(args, str):
        shown_args = _code(args, caller, whole)
    else:
        shown_args = _code(json.dumps(args, ensure_ascii=False, indent=2), caller, whole, "json")
    result = ""
    if call.result is not None:
        r = call.result
        head = _header(r, '<span class="role">result</span>', controls)
        result = (
            f'<div class="result" id="{anchor(r.id)}" data-node="{r.id}">{head}'
            f"{_output(_message(r), r, whole)}{_files_html(r)}</div>"
        )
    return f'<details class="call" data-call="{e(call.id)}">{summary}{shown_args}{result}</details>'


def _files_html(entry: LogEntry) -> str:
    """The files a tool result's node says its call changed (FORMAT.md 4.2), one per
    line: what the store knows, where the call's arguments only say what was asked."""
    if not entry.node.files:
        return ""
    items = "".join(
        f'<li><span class="change">{_change_word(f.before, f.after)}</span> '
        f"<code>{text_html(f.path)}</code></li>"
        for f in entry.node.files
    )
    return f'<ul class="files-changed">{items}</ul>'


def _change_word(before: str | None, after: str | None) -> str:
    if before is None:
        return "created"
    return "deleted" if after is None else "changed"


def _short_arguments(call: ToolCall) -> str:
    """The arguments on one line of at most 100 characters; each value is cut before it
    is joined, so a write of a huge file costs its first characters only."""
    args = call.arguments
    if isinstance(args, dict):
        if len(args) == 1 or call.name in _FILE_TOOLS or call.name in _ARGUMENT_LANGUAGE:
            text = _short_value(next(iter(args.values()), ""))
        else:
            text = ", ".join(f"{k}={_short_value(v)}" for k, v in args.items())
    else:
        text = _short_value(args)
    text = " ".join(text[:200].split())
    return text if len(text) <= 100 else text[:99] + "…"


def _short_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text[:200]


def _output(msg: dict[str, Any], entry: LogEntry, whole: Whole) -> str:
    """A tool's output: shown when short, folded in ``<details>`` when long."""
    text = _text(msg)
    lines = text.count("\n") + 1
    if lines <= FOLD_OVER and len(text) <= 2000:
        return code_html(text)
    label = f"output of {msg.get('tool_call_id', '')}: {lines} lines, {len(text):,} characters"
    return f"<details><summary>{text_html(label)}</summary>{_code(text, entry, whole)}</details>"


def render(t: Transcript, fmt: str) -> str:
    if fmt == "md":
        return render_markdown(t)
    if fmt == "html":
        return render_html(t)
    raise ValueError(fmt)
