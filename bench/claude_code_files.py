"""Generated Claude Code transcripts, the way Claude Code lays them out on disk.

``write_projects`` writes ``<root>/<project>/<session uuid>.jsonl`` files in the
2.x shape (one line per content block of an assistant message, tool results
as user records, ``parentUuid`` chains). About a third of the files are
resumed sessions: as Claude Code's ``--resume`` does, they start with a copy
of an earlier file's records under their own sessionId and go on from there,
so the same history is on disk several times.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .conversations import Conversation, Message, Project


@dataclass(frozen=True, slots=True)
class Written:
    files: int
    messages: int  # messages written, counting the copies resumed files repeat
    bytes: int


def write_projects(root: Path, project: Project, *, files: int, messages: int,
                   seed: int = 7) -> Written:  # fmt: skip
    rng = random.Random(seed)
    conversation = Conversation(project, seed=seed)
    per_file = max(4, messages // files)
    written: list[tuple[Path, list[str], str, int]] = []  # path, lines, last uuid, messages
    total_messages = total_bytes = 0
    for i in range(files):
        folder = root / f"-home-dev-project-{i % 20}"
        folder.mkdir(parents=True, exist_ok=True)
        sid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        lines: list[str] = []
        parent: str | None = None
        copied = 0
        if written and rng.random() < 0.35:
            old_path, old_lines, parent, copied = rng.choice(written[-50:])
            lines = [line.replace(old_path.stem, sid) for line in old_lines]
        own = max(10, per_file - copied)
        clock = 1_700_000_000 + i * 3600
        for message in conversation.take(own):
            for record in _records(message, sid, parent, rng, clock):
                lines.append(json.dumps(record, separators=(",", ":")))
                parent = record["uuid"]
                clock += 1
        path = folder / f"{sid}.jsonl"
        data = "\n".join(lines) + "\n"
        path.write_text(data, "utf-8")
        written.append((path, lines, parent or "", copied + own))
        total_messages += copied + own
        total_bytes += len(data.encode("utf-8"))
    return Written(files, total_messages, total_bytes)


def _records(message: Message, sid: str, parent: str | None, rng: random.Random,
             clock: int) -> list[dict[str, Any]]:  # fmt: skip
    """The records Claude Code writes for one message."""
    base = {"isSidechain": False, "userType": "external", "cwd": "/home/dev/project",
            "sessionId": sid, "version": "2.0.31", "gitBranch": "main"}  # fmt: skip
    out: list[dict[str, Any]] = []

    def add(kind: str, body: dict[str, Any]) -> None:
        nonlocal parent
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        stamp = f"2024-01-01T00:00:{clock % 60:02d}.{len(out):03d}Z"
        out.append({"parentUuid": parent, **base, "type": kind, **body, "uuid": uid,
                    "timestamp": stamp})  # fmt: skip
        parent = uid

    role = message["role"]
    if role == "user":
        add("user", {"message": {"role": "user", "content": message["content"]}})
    elif role == "tool":
        block = {"tool_use_id": message["tool_call_id"], "type": "tool_result",
                 "content": message["content"]}  # fmt: skip
        add("user", {"message": {"role": "user", "content": [block]}})
    else:
        msg_id = f"msg_{rng.getrandbits(64):016x}"
        blocks: list[dict[str, Any]] = [{"type": "text", "text": message["content"]}]
        for call in message.get("tool_calls", []):
            fn = call["function"]
            blocks.append({"type": "tool_use", "id": call["id"], "name": fn["name"],
                           "input": json.loads(fn["arguments"])})  # fmt: skip
        for n, block in enumerate(blocks):
            last = n == len(blocks) - 1
            add("assistant", {"message": {
                "model": "claude-sonnet-4-5-20250929", "id": msg_id, "type": "message",
                "role": "assistant", "content": [block],
                "stop_reason": ("tool_use" if len(blocks) > 1 else "end_turn") if last else None,
                "usage": {"input_tokens": 12, "cache_read_input_tokens": 20000,
                          "output_tokens": 200},
            }, "requestId": f"req_{msg_id[4:]}"})  # fmt: skip
    return out
