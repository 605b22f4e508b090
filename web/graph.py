"""The fork graph of a session family, drawn as SVG.

A family is the session a chain of forks started from and every session
forked from it, at any depth. Each session is one row: a line from the
message where it left its parent (0 for the first) to its last message, so
the shared history is read on the parent's row and a fork point is where a
row starts. Each fork point links to the fork's transcript at that point;
each row's label links to its session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from markupsafe import Markup

from agent.control_chars import visible
from objstore import AgsError, SessionInfo, Store

MAX_MEMBERS: Final = 400  # rows drawn; a larger family is cut (and says so)
ROW: Final = 34
LEFT: Final = 16
LANE_WIDTH: Final = 620
LABEL_WIDTH: Final = 420


@dataclass(frozen=True, slots=True)
class Member:
    """A session of a family: its row, and where on its parent's row it starts."""

    info: SessionInfo
    parent: str | None  # the session it was forked from, if that is in the family
    start: int  # messages it shares with its parent
    row: int


def _fork_depth(handle: Store, info: SessionInfo) -> int:
    node = (info.forked_from or {}).get("node")
    if not isinstance(node, str):
        return 0
    try:
        return handle.node(node).messages
    except AgsError:  # a fork point gc took, or a damaged node: drawn from the start
        return 0


def family(handle: Store, sid: str) -> list[Member]:
    """The family of session ``sid``, parents before their forks, each fork's forks
    after it in order of where they left it."""
    rows = {r.id: r for r in handle.sessions(include_archived=True)}

    def parent_of(info: SessionInfo) -> str | None:
        parent = (info.forked_from or {}).get("session")
        return parent if isinstance(parent, str) and parent in rows else None

    top = rows[sid]
    seen = {top.id}
    while (up := parent_of(top)) is not None and up not in seen:
        seen.add(up)  # a cycle cannot be made by fork, but a hand-edited ref could
        top = rows[up]
    children: dict[str, list[SessionInfo]] = {}
    for info in rows.values():
        parent = parent_of(info)
        if parent is not None:
            children.setdefault(parent, []).append(info)
    members: list[Member] = []
    stack: list[tuple[SessionInfo, str | None]] = [(top, None)]
    placed: set[str] = set()
    while stack and len(members) < MAX_MEMBERS:
        info, parent = stack.pop()
        if info.id in placed:
            continue
        placed.add(info.id)
        start = _fork_depth(handle, info) if parent else 0
        members.append(Member(info, parent, start, len(members)))
        kids = sorted(children.get(info.id, []), key=lambda c: (_fork_depth(handle, c), c.created))
        stack += [(kid, info.id) for kid in reversed(kids)]
    return members


def _label(info: SessionInfo) -> str:
    title = visible(info.title) if info.title else "(untitled)"
    title = title if len(title) <= 48 else title[:47] + "…"
    archived = " · archived" if info.archived else ""
    return f"{title} · {info.messages} messages · {info.id[:8]}{archived}"


def fork_graph_svg(members: list[Member], current: str) -> str:
    """The SVG of a family (``family``), the row of session ``current`` marked."""
    longest = max((max(m.info.messages, m.start) for m in members), default=1) or 1
    by_id = {m.info.id: m for m in members}

    def x(messages: int) -> float:
        return round(LEFT + messages / longest * LANE_WIDTH, 1)

    def y(row: int) -> int:
        return 20 + row * ROW

    height = y(len(members) - 1) + 24 if members else 40
    width = LEFT + LANE_WIDTH + LABEL_WIDTH
    out = [
        f'<svg class="forks" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        'role="img" aria-label="fork graph" xmlns="http://www.w3.org/2000/svg">'
    ]
    for m in members:
        sid = m.info.id
        classes = "lane" + (" current" if sid == current else "")
        classes += " archived" if m.info.archived else ""
        x0, x1, yy = x(m.start), x(max(m.info.messages, m.start)), y(m.row)
        parent = by_id.get(m.parent) if m.parent else None
        if parent is not None:
            py = y(parent.row)
            out.append(f'<path class="link" d="M {x0} {py} V {yy - 8} Q {x0} {yy} {x0 + 8} {yy}"/>')
        out.append(f'<g class="{classes}">')
        out.append(f'<line x1="{x0}" y1="{yy}" x2="{max(x1, x0 + 8)}" y2="{yy}"/>')
        out.append(f'<circle class="head" cx="{max(x1, x0 + 8)}" cy="{yy}" r="4"/>')
        out.append(
            Markup('<a href="/s/{}"><text x="{}" y="{}">{}</text></a>').format(
                sid, max(x1, x0 + 8) + 10, yy + 4, _label(m.info)
            )
        )
        out.append("</g>")
        if parent is not None:
            title = f"fork point: {_label(m.info)} leaves at message {m.start}"
            out.append(
                Markup(
                    '<a class="fork-point" href="/s/{}#fork" data-fork="{}">'
                    '<circle cx="{}" cy="{}" r="6"/><title>{}</title></a>'
                ).format(sid, sid, x0, y(parent.row), title)
            )
    out.append("</svg>")
    return "\n".join(str(part) for part in out)
