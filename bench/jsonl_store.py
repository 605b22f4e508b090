"""The baseline: one JSONL file per session, the way Claude Code and Codex keep them.

``<root>/<session id>.jsonl`` holds one JSON object per line:

* the first line, ``{"type": "session", "title": ..., "created": ...}``;
* ``{"type": "message", "time": ..., "message": {...}}`` for each message;
* ``{"type": "compaction", "time": ..., "summary": ..., "keep": N}`` for a
  compaction: from there the context is the summary and the last ``N``
  messages before it. Nothing is removed from the file.

An append writes one line and fsyncs the file, so it is as durable as an ags
append. A fork copies the file (up to the fork point) and syncs the copy.
Resuming reads and parses the whole file; listing reads every file.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Message = dict[str, Any]
_MESSAGE_PREFIX = b'{"type": "message"'


@dataclass(frozen=True, slots=True)
class JsonlSessionInfo:
    """One session as a JSONL listing shows it."""

    id: str
    title: str | None
    messages: int
    mtime: float


class JsonlStore:
    """A directory of session files. Keeps one open, append-only descriptor per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._fds: dict[str, int] = {}

    def path(self, sid: str) -> Path:
        return self.root / f"{sid}.jsonl"

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> JsonlStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------

    def new_session(self, title: str | None = None) -> str:
        """Create a session file holding its header line; return the session id."""
        sid = secrets.token_hex(16)
        header = {"type": "session", "title": title, "created": time.time()}
        self._write_lines(sid, [header])
        _fsync_dir(self.root)
        return sid

    def append(self, sid: str, message: Message) -> None:
        """Append one message line; durable when it returns."""
        self._write_lines(sid, [_message_line(message)])

    def append_many(self, sid: str, messages: list[Message]) -> None:
        """Append many message lines with one fsync at the end (bulk set-up)."""
        self._write_lines(sid, [_message_line(m) for m in messages])

    def compact(self, sid: str, summary: str, keep: int = 0) -> None:
        """Append a compaction line: the context becomes the summary plus the last ``keep``."""
        line = {"type": "compaction", "time": time.time(), "summary": summary, "keep": keep}
        self._write_lines(sid, [line])

    def fork(self, sid: str, at: int | None = None) -> str:
        """Copy the session (up to its ``at``-th message, if given) to a new, synced file."""
        new = secrets.token_hex(16)
        if at is None:
            shutil.copyfile(self.path(sid), self.path(new))
        else:
            self.path(new).write_bytes(_prefix_through_message(self.path(sid).read_bytes(), at))
        _fsync_file(self.path(new))
        _fsync_dir(self.root)
        return new

    def _write_lines(self, sid: str, lines: list[dict[str, Any]]) -> None:
        """Append lines in one write, then fsync."""
        fd = self._fds.get(sid)
        if fd is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            fd = self._fds[sid] = os.open(self.path(sid), flags, 0o644)
        data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
        view = memoryview(data.encode("utf-8"))
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)

    # -- reading -----------------------------------------------------------------

    def context(
        self, sid: str, upto: int | None = None, with_compaction: bool = True
    ) -> list[Message]:
        """The active context: read and parse the file, replaying its compactions.

        ``upto`` stops after that many message lines (the session as it was
        then); ``with_compaction`` says whether a compaction line right after
        the last of them is read too.
        """
        summary: Message | None = None
        messages: list[Message] = []
        seen = 0
        with open(self.path(sid), "rb") as f:
            for raw in f:
                line = json.loads(raw)
                if line["type"] == "message":
                    if upto is not None and seen == upto:
                        break
                    messages.append(line["message"])
                    seen += 1
                elif line["type"] == "compaction":
                    if upto is not None and seen == upto and not with_compaction:
                        break
                    keep = line["keep"]
                    summary = {"role": "user", "content": line["summary"]}
                    messages = messages[-keep:] if keep else []
        return ([summary] if summary else []) + messages

    def sessions(self) -> list[JsonlSessionInfo]:
        """Every session, most recently modified first: each file is read for its
        title (the first line) and its message count."""
        rows = []
        for entry in os.scandir(self.root):
            if entry.name.endswith(".jsonl"):
                rows.append(_session_info(entry.path, entry.name[: -len(".jsonl")]))
        rows.sort(key=lambda s: s.mtime, reverse=True)
        return rows


def _message_line(message: Message) -> dict[str, Any]:
    return {"type": "message", "time": time.time(), "message": message}


def _prefix_through_message(data: bytes, at: int) -> bytes:
    """The lines of a session file up to and including its ``at``-th message line."""
    pos, seen = 0, 0
    while seen < at:
        end = data.index(b"\n", pos) + 1
        if data.startswith(_MESSAGE_PREFIX, pos):
            seen += 1
        pos = end
    return data[:pos]


def _session_info(path: str, sid: str) -> JsonlSessionInfo:
    with open(path, "rb") as f:
        data = f.read()
        mtime = os.fstat(f.fileno()).st_mtime
    first, _, rest = data.partition(b"\n")
    count = sum(1 for line in rest.split(b"\n") if line.startswith(_MESSAGE_PREFIX))
    return JsonlSessionInfo(sid, json.loads(first).get("title"), count, mtime)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
