"""Helpers shared by the test files."""

from __future__ import annotations

import os
from pathlib import Path

from objstore import Store, objects


def store_with_damaged_message(path: Path, text: str) -> tuple[str, str, Path]:
    """A store with one session of one message whose stored form has one bit flipped.

    Returns (session id, message blob id, the pack holding it).
    """
    with Store.open(path) as s:
        sid = s.new_session()
        s.append(sid, {"role": "user", "content": text})
        blob = s.node(s.node_id(sid)).content
        _, stored = objects.encode("blob", s.objects.get(blob)[1])
    pack = next((path / "objects" / "pack").glob("*.pack"))
    data = bytearray(pack.read_bytes())
    at = data.find(stored)
    assert at > 0
    data[at + len(stored) // 2] ^= 0x01  # one bit, in the middle of the message's record
    pack.write_bytes(bytes(data))
    return sid, blob, pack


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (lock files excluded: they hold pids)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            p = Path(dirpath, fn)
            rel = str(p.relative_to(root))
            if rel.startswith("locks/"):
                continue
            out[rel] = p.read_bytes()
    return out
