"""Objects and packs written by hand, for tests that put exactly chosen (or
damaged) contents into a store: ids as FORMAT.md computes them, and a block pack
with its index beside the store's own packs."""

from __future__ import annotations

import secrets
from pathlib import Path

import blake3

from objstore import canonical
from objstore.packs import encode_block_pack


def object_id(kind: str, body: bytes) -> str:
    return blake3.blake3(kind.encode() + b"\0" + body).hexdigest()


def blob_object(value: object) -> tuple[str, bytes]:
    """(id, kind + NUL + body) of a blob holding ``value``."""
    body = canonical.dumps(value)
    return object_id("blob", body), b"blob\0" + body


def node_object(body: bytes) -> tuple[str, bytes]:
    """(id, kind + NUL + body) of a node with this body."""
    return object_id("node", body), b"node\0" + body


def write_pack(store: Path, contents: list[tuple[str, bytes]]) -> Path:
    """A sealed block pack of ``contents`` (and its index) in the store; its path."""
    pack, index = encode_block_pack(contents)
    name = store / "objects" / "pack" / f"pack-{secrets.token_hex(16)}"
    name.with_suffix(".idx").write_bytes(index)
    name.with_suffix(".pack").write_bytes(pack)
    return name.with_suffix(".pack")
