"""Resolving ref specs (specs.py) to nodes and sessions, as Git resolves revisions.

Reads only: refs, reflogs and node objects. ``HEAD`` is looked up for a
project root, then for each of its parent directories in turn, the way Git
finds the repository a directory is in.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Final

from . import objects
from .errors import (
    AgsError,
    AmbiguousSpec,
    NothingCheckedOut,
    ObjectMissing,
    SpecError,
    UnknownSpec,
)
from .nodes import Node
from .object_store import ObjectStore
from .refs import (
    SESSION_ID_RE,
    RefStore,
    check_session_id,
    check_tag_name,
    head_ref_name,
    ref_kind,
    ref_short,
    session_of,
    session_ref,
    tag_ref,
)
from .specs import HEX_PREFIX, MIN_PREFIX, Spec, parse_spec
from .walk import walk

RootPath = str | os.PathLike[str] | None
SHORT_HEX: Final = re.compile(rf"[0-9a-f]{{1,{MIN_PREFIX - 1}}}")  # too short to be a prefix


@dataclass(frozen=True, slots=True)
class Target:
    """What a spec names: a node, and the session it was reached through (if any)."""

    node: str | None
    session: str | None


def project_root(root: RootPath) -> str:
    """The absolute, symlink-free path of a project root (default: the current directory)."""
    return os.path.realpath(root if root is not None else os.getcwd())


class Resolver:
    def __init__(self, refs: RefStore, objects: ObjectStore, node: Callable[[str], Node]) -> None:
        self._refs = refs
        self._objects = objects
        self._node = node

    def lookup(self, spec: str, root: RootPath = None) -> Target:
        """Resolve a spec to a node and the session it was reached through."""
        parsed = parse_spec(spec)
        if parsed.reflog is None:
            session, node = self._base(parsed, root)
        else:
            name = self.ref_name(parsed, root)
            session = session_of(name)
            node = self._reflog_value(name, parsed)
        if parsed.back:
            # (at most sys.maxsize steps: islice takes no more, and no history is as deep)
            chain = list(islice(walk(node, self._node), min(parsed.back, sys.maxsize - 1) + 1))
            if len(chain) <= parsed.back:
                raise UnknownSpec(f"{spec}: history is only {len(chain)} nodes deep")
            node = chain[-1].id
        return Target(node, session)

    def session_id(self, spec: str) -> str:
        """The id of the session ``spec`` names (a full or prefix id, sessions/..., HEAD)."""
        if type(spec) is str and SESSION_ID_RE.fullmatch(spec):
            return spec
        target = self.lookup(spec)
        if target.session is None or not parse_spec(spec).is_plain:
            raise SpecError(f"{spec} does not name a session")
        return target.session

    def ref_name(self, parsed: Spec, root: RootPath = None) -> str:
        """The ref a spec's base names (for its reflog)."""
        base = parsed.base
        if base == "HEAD":
            return head_ref_name(self.head_root(root))
        if base.startswith("tags/"):
            return tag_ref(check_tag_name(base[5:]))
        if base.startswith("sessions/") and SESSION_ID_RE.fullmatch(base[9:]):
            return base  # a full id: its reflog outlives a deleted session
        if base.startswith("remotes/"):
            return self._tracking_ref(base, parsed.text)
        session, _node = self._base(parsed, root)
        if session is not None:
            return session_ref(session)
        with suppress(AgsError):
            if self._refs.read(tag_ref(check_tag_name(base))) is not None:
                return tag_ref(base)
        raise SpecError(f"{parsed.text}: @{{N}} needs a session, tag or HEAD")

    def head_root(self, root: RootPath) -> str:
        """The nearest directory, from ``root`` up, that has a HEAD."""
        start = Path(project_root(root))
        for d in (start, *start.parents):
            if self._refs.read(head_ref_name(str(d))) is not None:
                return str(d)
        raise NothingCheckedOut(f"nothing is checked out for {start}")

    def _reflog_value(self, name: str, parsed: Spec) -> str | None:
        """The target ``parsed.reflog`` moves ago; for HEAD, a session stands for its head."""
        moves = [e for e in self._refs.reflog(name) if e.old != e.new]
        n = parsed.reflog or 0
        if n == 0:
            current = self._refs.read(name)
            value = current.target if current else None
        elif n <= len(moves):
            value = moves[-n].old  # the value the nth-last move moved away from
        else:
            raise UnknownSpec(f"{parsed.text}: {name} has moved only {len(moves)} times")
        sid = session_of(value)
        if ref_kind(name) == "HEAD" and sid is not None:
            return self._session_head(sid)
        return value

    def _base(self, parsed: Spec, root: RootPath) -> tuple[str | None, str | None]:
        """(session, node) for the base of a spec."""
        base = parsed.base
        if base == "HEAD":
            return self._head(root)
        if base.startswith("sessions/"):
            sid = self._session_by_prefix(base[len("sessions/") :], parsed.text)
            return sid, self._session_head(sid)
        if base.startswith("tags/"):
            return None, self._tag_target(check_tag_name(base[5:]))
        if base.startswith("remotes/"):
            rec = self._refs.read(self._tracking_ref(base, parsed.text))
            return None, rec.target if rec else None
        if HEX_PREFIX.fullmatch(base):
            if len(base) == 32:  # a full session id is taken as one: its ref read once
                rec = self._refs.read(session_ref(base))
                if rec is not None:
                    return base, rec.target
            sessions = self._sessions_with_prefix(base)
            # A full session id is taken as one, as Git takes a ref name before a hash.
            full = len(base) == 32 and sessions
            nodes = [] if full else self._nodes_with_prefix(base)
            found = [f"session {s}" for s in sessions] + [f"node {n}" for n in nodes]
            if len(found) > 1:
                raise AmbiguousSpec(parsed.text, sorted(found))
            if sessions:
                return sessions[0], self._session_head(sessions[0])
            if nodes:
                return None, nodes[0]
        try:
            return None, self._tag_target(check_tag_name(base))
        except (AgsError, ValueError):
            pass
        if SHORT_HEX.fullmatch(base):
            raise UnknownSpec(
                f"no session, node or tag matches {parsed.text!r} (an id prefix needs at "
                f"least {MIN_PREFIX} digits)"
            )
        raise UnknownSpec(f"no session, node or tag matches {parsed.text!r}")

    def _head(self, root: RootPath) -> tuple[str | None, str | None]:
        rec = self._refs.read(head_ref_name(self.head_root(root)))
        value = rec.target if rec else None
        if not value:
            raise UnknownSpec("HEAD changed while it was being read")
        sid = session_of(value)
        if sid is None:
            return None, value
        if self._refs.read(value) is None:
            raise UnknownSpec(f"HEAD names session {sid}, which no longer exists")
        return sid, self._session_head(sid)

    def _session_head(self, sid: str) -> str | None:
        rec = self._refs.read(session_ref(sid))
        return rec.target if rec else None

    def _tag_target(self, name: str) -> str | None:
        rec = self._refs.read(tag_ref(name))
        if rec is None:
            raise UnknownSpec(f"no tag {name}")
        return rec.target

    def _tracking_ref(self, base: str, text: str) -> str:
        """The one remote-tracking ref ``remotes/<remote>/<session id or prefix>`` names."""
        remote, _, prefix = base[len("remotes/") :].partition("/")
        if not HEX_PREFIX.fullmatch(prefix) or len(prefix) > 32:
            raise UnknownSpec(f"{text}: write remotes/<remote>/<session id or prefix>")
        start = f"remotes/{remote}/{prefix}"
        found = sorted(n for n in self._refs.names("remotes") if n.startswith(start))
        if len(found) > 1:
            raise AmbiguousSpec(text, found)
        if not found:
            raise UnknownSpec(f"no remote-tracking ref matches {text!r} (ags fetch first?)")
        return found[0]

    def _sessions_with_prefix(self, prefix: str) -> list[str]:
        if len(prefix) > 32:
            return []
        if len(prefix) == 32:
            return [prefix] if self._refs.read(session_ref(prefix)) else []
        ids = (ref_short(name) for name in self._refs.names("sessions"))
        return sorted(sid for sid in ids if sid.startswith(prefix))

    def _session_by_prefix(self, prefix: str, text: str) -> str:
        if not HEX_PREFIX.fullmatch(prefix):
            check_session_id(prefix)
        found = self._sessions_with_prefix(prefix)
        if len(found) > 1:
            raise AmbiguousSpec(text, [f"session {s}" for s in found])
        if not found:
            raise UnknownSpec(f"no session matches {text!r}")
        return found[0]

    def _nodes_with_prefix(self, prefix: str) -> list[str]:
        if len(prefix) == objects.ID_HEX_LEN:
            candidates = {prefix}
        else:
            candidates = self._objects.with_prefix(prefix)
        out = []
        for oid in sorted(candidates):
            try:
                if self._objects.get(oid)[0] == "node":
                    out.append(oid)
            except ObjectMissing:
                continue
        return out
