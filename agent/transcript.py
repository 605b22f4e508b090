"""A session's transcript for people: Markdown, and one self-contained HTML page.

Shared by ``ags export --format md|html`` and the session browser to come.
``transcript_entries`` reads what to show (oldest first, compactions and the
fork point marked); ``render_markdown`` and ``render_html`` only format it.

The HTML page loads nothing from anywhere (no script, no font, no image: a
strict Content-Security-Policy says so too), escapes every piece of text taken
from a message, folds tool output into ``<details>``, and reads on a phone.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any, Final

from objstore import LogEntry, Store
from objstore.search import content_text

FOLD_OVER: Final = 12  # lines of tool output shown before it is folded away


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
    target = store.lookup(spec)
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


def _arguments(call: dict[str, Any]) -> str:
    if "arguments_raw" in call:
        return str(call["arguments_raw"])
    return json.dumps(call.get("arguments", {}), ensure_ascii=False, indent=2)


def _fence(text: str, lang: str = "") -> list[str]:
    """A fenced block that no backtick run inside ``text`` can close."""
    ticks = "`" * max(3, _longest_backticks(text) + 1)
    return [f"{ticks}{lang}", text, ticks]


def _longest_backticks(text: str) -> int:
    best = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        best = max(best, run)
    return best


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
    for call in msg.get("tool_calls") or []:
        if isinstance(call, dict):
            name, cid = _md_code(call.get("name", "?")), _md_code(call.get("id", ""))
            out += [f"**tool call** {name} {cid}", ""]
            out += [*_fence(_arguments(call), "json"), ""]
    return out


# -- HTML ---------------------------------------------------------------------------

_CSS: Final = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1d1d1f;--muted:#6e6e73;--line:#d2d2d7;
--user:#e8f3ff;--assistant:#f5f5f7;--tool:#f6f0ff;--system:#fff8e5;--mark:#fff3cd}
@media (prefers-color-scheme:dark){:root{--bg:#111;--fg:#eee;--muted:#9a9a9f;--line:#333;
--user:#12263d;--assistant:#1c1c1e;--tool:#231a33;--system:#2f2a14;--mark:#3a3213}}
*{box-sizing:border-box}body{margin:0;background:var(--bg);color:var(--fg);
font:16px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif}
main{max-width:52rem;margin:0 auto;padding:1rem}
h1{font-size:1.4rem;margin:.5rem 0}dl{display:grid;grid-template-columns:auto 1fr;
gap:.1rem .8rem;font-size:.85rem;color:var(--muted)}dd{margin:0;overflow-wrap:anywhere}
.msg{border:1px solid var(--line);border-radius:.6rem;padding:.6rem .8rem;margin:.7rem 0}
.user{background:var(--user)}.assistant{background:var(--assistant)}
.tool{background:var(--tool)}.system{background:var(--system)}
.role{font-weight:600;font-size:.9rem}.when{color:var(--muted);font-size:.8rem;margin-left:.5rem}
.text{white-space:pre-wrap;overflow-wrap:anywhere;margin:.3rem 0}
pre{white-space:pre-wrap;overflow-wrap:anywhere;font:.85rem/1.4 ui-monospace,monospace;
margin:.3rem 0;max-height:40rem;overflow:auto}
details{margin:.3rem 0}summary{cursor:pointer;color:var(--muted);font-size:.85rem}
.marker{border-left:4px solid #c98a00;background:var(--mark);padding:.6rem .8rem;margin:1rem 0;
border-radius:.3rem}.marker strong{display:block}
"""


def render_html(t: Transcript) -> str:
    e = html.escape
    title = t.title or "Untitled session"
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
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body><main>",
        f"<h1>{e(title)}</h1>",
        "<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{e(str(v))}</dd>" for k, v in facts if v) + "</dl>",
    ]
    fork = _fork_index(t)
    if fork is None and t.forked_from and t.forked_from.get("node"):
        parts.append('<div class="marker"><strong>Fork point</strong>before the first entry</div>')
    for i, entry in enumerate(t.entries):
        parts.append(_html_entry(entry))
        if i == fork:
            parts.append(
                '<div class="marker" id="fork"><strong>Fork point</strong>'
                "this session's own history starts here</div>"
            )
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


def _html_entry(entry: LogEntry) -> str:
    e = html.escape
    n = entry.node
    msg = entry.message if isinstance(entry.message, dict) else {"content": entry.message}
    when = f'<span class="when">{e(str(n.meta.get("time", "")))}</span>'
    if n.is_compaction:
        kept = f", {len(n.kept)} messages kept verbatim" if n.kept else ""
        return (
            f'<div class="marker" id="n-{e(n.id[:12])}"><strong>Compaction{e(kept)}</strong>'
            f"Earlier turns were summarised; from here the model saw:{when}"
            f'<div class="text">{e(_text(msg))}</div></div>'
        )
    role = str(msg.get("role", "?"))
    css = role if role in ("user", "assistant", "tool", "system") else "system"
    head = f'<div class="role">{e(role)}'
    body: list[str] = []
    if role == "tool":
        head += f" · {e(str(msg.get('name') or ''))}"
        body.append(_folded(_text(msg), f"output of {msg.get('tool_call_id', '')}"))
    else:
        if msg.get("thinking"):
            body.append(
                f"<details><summary>thinking</summary><pre>{e(str(msg['thinking']))}"
                "</pre></details>"
            )
        text = _text(msg)
        if text:
            body.append(f'<div class="text">{e(text)}</div>')
        for call in msg.get("tool_calls") or []:
            if isinstance(call, dict):
                label = f"tool call {call.get('name', '?')} ({call.get('id', '')})"
                body.append(
                    f"<details open><summary>{e(label)}</summary>"
                    f"<pre>{e(_arguments(call))}</pre></details>"
                )
    head += f"{when}</div>"
    return f'<div class="msg {css}" id="n-{e(n.id[:12])}">{head}{"".join(body)}</div>'


def _folded(text: str, label: str) -> str:
    """Tool output: shown when short, folded in ``<details>`` when long."""
    e = html.escape
    lines = text.count("\n") + 1
    if lines <= FOLD_OVER and len(text) <= 2000:
        return f"<pre>{e(text)}</pre>"
    return (
        f"<details><summary>{e(label)}: {lines} lines, {len(text):,} characters</summary>"
        f"<pre>{e(text)}</pre></details>"
    )


def render(t: Transcript, fmt: str) -> str:
    if fmt == "md":
        return render_markdown(t)
    if fmt == "html":
        return render_html(t)
    raise ValueError(fmt)
