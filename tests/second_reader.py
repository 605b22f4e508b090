"""A second reader of ags stores, written from docs/FORMAT.md alone.

It shares no code with ``objstore``: only the standard library, ``zstandard``
and ``blake3``. If ags writes something this reader cannot read the way the
documentation says, the documentation or the writer is wrong. Sections cited
are FORMAT.md's.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import zstandard

_unzstd = zstandard.ZstdDecompressor()


class Unreadable(Exception):
    """The store breaks a rule of FORMAT.md."""


def object_id(kind: bytes, body: bytes) -> str:  # 4: BLAKE3-256 of kind + NUL + body
    return blake3.blake3(kind + b"\0" + body).hexdigest()


def decode_stored(oid: str, stored: bytes) -> tuple[str, bytes]:  # 4: the stored form
    if stored[:1] != b"\x01":
        raise Unreadable(f"{oid}: format byte {stored[:1]!r}")
    content = _unzstd.decompress(stored[1:])
    if blake3.blake3(content).hexdigest() != oid:
        raise Unreadable(f"{oid}: content does not hash to the id")
    kind, _, body = content.partition(b"\0")
    return kind.decode(), body


def split_claim(payload: bytes) -> tuple[bytes, int]:  # 5.5: the zstd frame, and its claim
    if len(payload) >= 16:
        magic, size, flags, frame = struct.unpack_from("<IIII", payload, len(payload) - 16)
        if magic == 0x184D2A5A and size == 8 and frame == len(payload) - 16:
            return payload[:-16], flags
    return payload, 0


def canonical_json(value: Any) -> bytes:  # 3
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return text.encode("utf-8")


def unpack_value(data: bytes, at: int) -> tuple[Any, int]:
    """5.5: one MessagePack value at ``at`` of the types the MessagePack layout holds,
    and where it ends (the MessagePack specification, read for those types only)."""
    t = data[at]
    at += 1
    if t <= 0x7F:
        return t, at  # positive fixint
    if t >= 0xE0:
        return t - 0x100, at  # negative fixint
    if 0xA0 <= t <= 0xBF:
        return data[at : at + (t & 0x1F)].decode("utf-8"), at + (t & 0x1F)  # fixstr
    if 0x90 <= t <= 0x9F:
        return unpack_items(data, at, t & 0x0F, False)  # fixarray
    if 0x80 <= t <= 0x8F:
        return unpack_items(data, at, t & 0x0F, True)  # fixmap
    fixed = {0xC0: None, 0xC2: False, 0xC3: True}
    if t in fixed:
        return fixed[t], at
    numbers = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
               0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}  # fmt: skip
    if t in numbers:
        (number,) = struct.unpack_from(numbers[t], data, at)
        return number, at + struct.calcsize(numbers[t])
    sized = {0xD9: (">B", "str"), 0xDA: (">H", "str"), 0xDB: (">I", "str"),
             0xDC: (">H", "array"), 0xDD: (">I", "array"), 0xDE: (">H", "map"),
             0xDF: (">I", "map")}  # fmt: skip
    if t not in sized:
        raise Unreadable(f"MessagePack type 0x{t:02x}, which the MessagePack layout has not")
    form, what = sized[t]
    (n,) = struct.unpack_from(form, data, at)
    at += struct.calcsize(form)
    if what == "str":
        return data[at : at + n].decode("utf-8"), at + n
    return unpack_items(data, at, n, what == "map")


def unpack_items(data: bytes, at: int, n: int, pairs: bool) -> tuple[Any, int]:
    items = []
    for _ in range(2 * n if pairs else n):
        item, at = unpack_value(data, at)
        items.append(item)
    if not pairs:
        return items, at
    if not all(isinstance(key, str) for key in items[::2]):
        raise Unreadable("a MessagePack map key is not a string")
    return dict(zip(items[::2], items[1::2], strict=True)), at


def packed_objects(content: bytes) -> list[tuple[bytes, int, bytes]]:
    """5.5: ``block_objects`` of a block in the MessagePack layout."""
    kind, n = content[32:37], struct.unpack_from("<I", content, 37)[0]
    if kind != b"blob\0" or n == 0:
        raise Unreadable(f"a MessagePack block of kind {kind!r} and {n} objects")
    lengths = struct.unpack_from(f"<{n}I", content, 41 + 32 * n)
    sizes = struct.unpack_from(f"<{n}I", content, 41 + 36 * n)
    at = 41 + 40 * n
    if content[at : at + 5] != b"\xdd" + struct.pack(">I", n):
        raise Unreadable("a MessagePack block's array does not start where its table ends")
    at += 5
    out = []
    for i in range(n):
        value, end = unpack_value(content, at)
        if end != at + sizes[i]:
            raise Unreadable(f"a MessagePack block's value {i} is not {sizes[i]} bytes")
        body = canonical_json(value)
        if len(body) != lengths[i]:
            raise Unreadable(f"a MessagePack block's value {i} is not a body of its length")
        out.append((content[41 + 32 * i : 73 + 32 * i], at, kind + body))
        at = end
    if at != len(content):
        raise Unreadable("a MessagePack block has bytes after its array")
    return out


def block_objects(content: bytes) -> list[tuple[bytes, int, bytes]]:
    """5.5: (raw id, the offset in the block its index entry gives, kind + NUL + body)
    of each object of a block's content, in any layout."""
    out = []
    if content[:32] == bytes(31) + b"\x01":
        return packed_objects(content)
    if content[:32] != bytes(32):  # the entry layout
        inner = 0
        while inner < len(content):
            oid_raw, n = struct.unpack_from("<32sI", content, inner)
            out.append((oid_raw, inner + 36, content[inner + 36 : inner + 36 + n]))
            inner += 36 + n
        return out
    kind, n = content[32:37], struct.unpack_from("<I", content, 37)[0]  # the array layout
    if kind not in (b"blob\0", b"node\0") or n == 0:
        raise Unreadable(f"an array block of kind {kind!r} and {n} objects")
    lengths = struct.unpack_from(f"<{n}I", content, 41 + 32 * n)
    at = 41 + 36 * n
    if content[at : at + 1] != b"[":
        raise Unreadable("an array block's array does not start where its table ends")
    at += 1
    for i, length in enumerate(lengths):
        out.append((content[41 + 32 * i : 73 + 32 * i], at, kind + content[at : at + length]))
        at += length
        if content[at : at + 1] != (b"," if i < n - 1 else b"]"):
            raise Unreadable(f"an array block's body {i} is not followed by , or ]")
        at += 1
    if at != len(content):
        raise Unreadable("an array block has bytes after its array")
    values = json.loads(content[41 + 36 * n :])  # one JSON array of the bodies' values
    if values != [json.loads(piece[5:]) for _, _, piece in out]:
        raise Unreadable("an array block's array is not its bodies")
    return out


def reads_exactly(body: bytes) -> bool:  # 5.5: WITHIN_LIMITS, checked with the json module
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return False
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth + 1 > 100:
                return False
            stack += [
                (sub, depth + 1) for sub in (item.values() if isinstance(item, dict) else item)
            ]
        elif isinstance(item, int) and not isinstance(item, bool):
            if not -(2**63) <= item < 2**64:
                return False
        elif isinstance(item, float) and not -(2**63) < item < 2**63:
            return False
    return True


@dataclass
class Store:
    root: Path
    objects: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    journaled: dict[str, dict[str, Any]] = field(default_factory=dict)  # 9: live packs' refs

    @classmethod
    def read(cls, root: Path) -> Store:
        marker = json.loads((root / "ags-store.json").read_bytes())  # 2
        if marker not in ({"format": "ags-store", "version": v} for v in (1, 2, 3, 4, 5, 6)):
            raise Unreadable(f"marker {marker}")
        store = cls(root)
        for sub in sorted((root / "objects").iterdir()):  # 4: loose objects
            if len(sub.name) == 2:
                for f in sub.iterdir():
                    oid = sub.name + f.name
                    store.objects[oid] = decode_stored(oid, f.read_bytes())
        for pack in sorted((root / "objects" / "pack").glob("pack-*.pack")):
            store._read_pack(pack)
        return store

    def _read_pack(self, path: Path) -> None:  # 5.1 records, 5.3 the index, 5.5 blocks
        data = path.read_bytes()
        if data[:8] not in (b"AGSPACK\x01", b"AGSPACK\x02"):
            raise Unreadable(f"{path.name}: header {data[:8]!r}")
        version = data[7]
        at, found = 8, {}
        while at + 37 <= len(data):
            rtype, raw, length = struct.unpack_from("<B32sI", data, at)
            if rtype not in ((1, 2) if version == 1 else (1, 3)) or at + 37 + length > len(data):
                break  # a torn tail
            payload = data[at + 37 : at + 37 + length]
            if rtype == 1:
                found[raw.hex()] = (
                    (at + 37, length) if version == 1 else (at + 37, 2**32 - 1, length)
                )
                self.objects[raw.hex()] = decode_stored(raw.hex(), payload)
            elif rtype == 3:
                if blake3.blake3(payload).digest() != raw:
                    raise Unreadable(f"{path.name}: block at {at} fails its checksum")
                frame, claim = split_claim(payload)
                content = _unzstd.decompress(frame)
                for oid_raw, inner, piece in block_objects(content):
                    if blake3.blake3(piece).hexdigest() != oid_raw.hex():
                        raise Unreadable(f"{oid_raw.hex()}: content does not hash to the id")
                    kind, _, body = piece.partition(b"\0")
                    if claim & 1 and not (kind in (b"blob", b"node") and reads_exactly(body)):
                        raise Unreadable(
                            f"{path.name}: block at {at} claims what {oid_raw.hex()} is not"
                        )
                    self.objects[oid_raw.hex()] = (kind.decode(), body)
                    found[oid_raw.hex()] = (at + 37, inner, len(piece))
            else:
                kind, body = decode_stored(raw.hex(), payload)  # a ref update: a checksum
                update = json.loads(body)
                if kind != "ref" or set(update) != {"body", "log", "ref"}:
                    raise Unreadable(f"{path.name}: ref-update record at {at}")
                if update["body"] and not path.with_suffix(".idx").exists():  # 9: unsealed
                    log = update["log"]
                    gen = log["gen"] if log else update["body"]["generation"]
                    have = self.journaled.get(update["ref"])
                    if have is None or have["generation"] < gen:
                        self.journaled[update["ref"]] = {**update["body"], "generation": gen}
            at += 37 + length
        idx = path.with_suffix(".idx")
        if idx.exists():
            self._check_index(idx.read_bytes(), found, version)

    @staticmethod
    def _check_index(idx: bytes, found: dict[str, tuple[int, ...]], version: int) -> None:
        magic, _pack_length, count = struct.unpack_from("<8sQI", idx, 0)
        size = 44 if version == 1 else 48
        if magic != b"AGSIDX" + bytes([version, 0]) or len(idx) != 1044 + size * count + 32:
            raise Unreadable("index header")
        if blake3.blake3(idx[:-32]).digest() != idx[-32:]:
            raise Unreadable("index checksum")
        fanout = struct.unpack_from("<256I", idx, 20)
        entries = {}
        for i in range(count):
            entry = struct.unpack_from(
                "<32sQI" if version == 1 else "<32sQII", idx, 1044 + size * i
            )
            raw = entry[0]
            entries[raw.hex()] = tuple(entry[1:])
            if fanout[raw[0]] <= i or (raw[0] and fanout[raw[0] - 1] > i):
                raise Unreadable("index fanout")
        if entries != found:
            raise Unreadable("the index does not list the pack's objects")

    # -- objects as values -----------------------------------------------------------

    def value(self, oid: str, kind: str) -> Any:
        have, body = self.objects[oid]
        if have != kind:
            raise Unreadable(f"{oid} is a {have}, not a {kind}")
        return json.loads(body)

    def node(self, oid: str) -> dict[str, Any]:  # 4.2
        node: dict[str, Any] = self.value(oid, "node")
        return node

    def file(self, oid: str) -> bytes:  # 4.3: a file object's body is the file's bytes
        have, body = self.objects[oid]
        if have != "file":
            raise Unreadable(f"{oid} is a {have}, not a file")
        return body

    def files(self, oid: str) -> dict[str, tuple[bytes | None, bytes | None]]:
        """What a node's ``files`` says (4.2): path -> (bytes before, bytes after)."""
        out = {}
        for path, sides in self.node(oid).get("files", {}).items():
            if path.startswith("/") or {"", ".", ".."} & set(path.split("/")) or "\0" in path:
                raise Unreadable(f"{oid}: files names {path!r}")
            before, after = sides.get("before"), sides.get("after")
            out[path] = (
                None if before is None else self.file(before),
                None if after is None else self.file(after),
            )
        return out

    # -- refs --------------------------------------------------------------------------

    def ref(self, name: str) -> dict[str, Any] | None:  # 6: canonical JSON and a newline
        path = self.root / "refs" / name
        if not path.exists():
            return None  # 9: deleted, whatever a journal says
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            raise Unreadable(f"ref {name} has no newline")
        body: dict[str, Any] = json.loads(data)
        journaled = self.journaled.get(name)  # 9: the newer of the file and the journal
        return journaled if journaled and journaled["generation"] > body["generation"] else body

    def sessions(self) -> dict[str, dict[str, Any]]:
        folder = self.root / "refs" / "sessions"
        return {f.name: self.ref(f"sessions/{f.name}") or {} for f in folder.iterdir()}

    def reflog(self, name: str) -> list[dict[str, Any]]:  # 7
        path = self.root / "logs" / name
        if not path.exists():
            return []
        by_gen: dict[int, dict[str, Any]] = {}
        for line in path.read_bytes().split(b"\n")[:-1]:
            entry = json.loads(line)
            by_gen[entry["gen"]] = entry
        current = self.ref(name)
        limit = current["generation"] if current else None
        return [by_gen[g] for g in sorted(by_gen) if limit is None or g <= limit]

    # -- history -----------------------------------------------------------------------

    def transcript(self, head: str | None) -> list[Any]:
        """Every message on the chain, oldest first (a compaction gives its summary)."""
        out = []
        while head is not None:
            node = self.node(head)
            out.append(self.value(node["message" if node["type"] == "message" else "summary"],
                                  "blob"))  # fmt: skip
            head = node["parent"]
        return out[::-1]

    def context(self, head: str | None) -> list[Any]:
        """The active context (4.2), walked by parent links, not spans."""
        newest_first = []
        while head is not None:
            node = self.node(head)
            if node["type"] == "compaction":
                kept = [self.node(k)["message"] for k in node["kept"]]
                front = [node["summary"], *kept]
                return [self.value(b, "blob") for b in front + newest_first[::-1]]
            newest_first.append(node["message"])
            head = node["parent"]
        return [self.value(b, "blob") for b in newest_first[::-1]]

    def spans_agree(self) -> bool:
        """Every span lists the message blobs between its start and its node (4.2)."""
        for oid, (kind, _body) in self.objects.items():
            node = self.node(oid) if kind == "node" else None
            if node is None or "span" not in node:
                continue
            blobs, at = [], oid
            while at != node["span"]["after"]:
                step = self.node(at)
                if step["type"] == "compaction":
                    return False
                blobs.append(step["message"])
                at = step["parent"]
            if blobs[::-1] != node["span"]["messages"]:
                return False
        return True


def file_modes(root: Path) -> set[int]:
    """The permission bits of every file and directory of a store (1: 0600 and 0700)."""
    modes = set()
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            modes.add(os.lstat(os.path.join(dirpath, name)).st_mode & 0o777)
    return modes
