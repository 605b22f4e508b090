"""Where a sync keeps things on a remote: the marker, packs, ref cells (docs/REMOTES.md 3).

```
ags-remote.json               {"format":"ags-remote","version":2}  (1 before array blocks)
packs/pack-<64 hex>.pack      block packs (FORMAT.md 5.5), named by 32 random bytes
packs/pack-<64 hex>.idx       their indexes, written after the pack
refs/sessions/<session id>    cells: {"target": <head node>, "meta": {...}}, or null (deleted)
refs/tags/<name>              cells: {"target": <node>}
locks/gc                      the remote gc lease (a cell)
pins/pin-<64 hex>             {"nodes": [...]}: fork points a push relies on, for remote gc
probe/<random>                scratch keys of the connect-time check and of remote gc
```

Everything here is a key of ``RemoteStorage``; this module names them and reads
and writes the marker, the one key every sync looks at first.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any, Final

from .. import canonical
from ..errors import InvalidName
from ..objects import ID_RE
from ..refs import SESSION_ID_RE, check_tag_name, ref_kind
from ..session_meta import meta_damage
from .errors import BadRemote, DamagedRemoteKey, KeyMissing, SwapFailed
from .storage import PROBE_PREFIX, RemoteStorage

MARKER_KEY: Final = "ags-remote.json"
MARKER_FORMAT: Final = "ags-remote"
MARKER_VERSION: Final = 3  # the newest this ags reads, and the one it writes
# A remote that may hold blocks in the array (2) or the MessagePack (3) layout (FORMAT.md 5.5)
PACKED_BLOCKS_VERSION: Final = 3
PACKS: Final = "packs/"
REFS: Final = "refs/"
SESSION_CELLS: Final = "refs/sessions/"
TAG_CELLS: Final = "refs/tags/"
GC_LEASE: Final = "locks/gc"
PINS: Final = "pins/"
PACK_KEY_RE: Final = re.compile(r"packs/pack-([0-9a-f]{64})\.(pack|idx)")
PIN_KEY_RE: Final = re.compile(r"pins/pin-[0-9a-f]{64}")


def new_pack_name() -> str:
    """A remote pack's name: random, never a content hash. A pack named by its content
    would, sent again, meet an old copy (a killed push's orphan) that remote gc may
    have chosen to delete, and the push's ref would then name what gc sweeps; a new
    key is always younger than anything gc chose (local gc's freshen rule, for free)."""
    return secrets.token_hex(32)


def pack_key(name: str) -> str:
    return f"{PACKS}pack-{name}.pack"


def index_key(name: str) -> str:
    return f"{PACKS}pack-{name}.idx"


def pin_key() -> str:
    """A new pin's key: random, so that every push's pin is a new key."""
    return f"{PINS}pin-{secrets.token_hex(32)}"


def pin_body(nodes: list[str]) -> bytes:
    return canonical.dumps({"nodes": nodes}) + b"\n"


def pin_nodes(url: str, key: str, data: bytes) -> list[str]:
    """The nodes a pin names, or DamagedRemoteKey: what a pin protects is unknown
    otherwise, and remote gc must not guess."""
    try:
        nodes = canonical.loads(data).get("nodes")
    except (ValueError, AttributeError):
        nodes = None
    if not isinstance(nodes, list) or not all(
        isinstance(n, str) and ID_RE.fullmatch(n) for n in nodes
    ):
        raise DamagedRemoteKey(f"{url}: {key} is not a pin ags wrote")
    return nodes


def cell_key(ref: str) -> str:
    """The cell of a local ref name (``sessions/<id>`` or ``tags/<name>``)."""
    return REFS + ref


def ref_of_cell(key: str) -> str | None:
    """The ref name a cell key holds, or None for a key that is no ref cell of ours."""
    if key.startswith(SESSION_CELLS):
        sid = key[len(SESSION_CELLS) :]
        return f"sessions/{sid}" if SESSION_ID_RE.fullmatch(sid) else None
    if key.startswith(TAG_CELLS):
        try:
            return f"tags/{check_tag_name(key[len(TAG_CELLS) :])}"
        except InvalidName:  # not a tag name a store can hold: not ours
            return None
    return None


@dataclass(frozen=True, slots=True)
class Marker:
    """The remote's marker as read: its version, and the etag a raise swaps from
    (None where this process wrote it: it is then at MARKER_VERSION already)."""

    version: int
    etag: str | None


def _marker_body(version: int) -> bytes:
    return canonical.dumps({"format": MARKER_FORMAT, "version": version}) + b"\n"


def _marker_version(storage: RemoteStorage, data: bytes) -> int:
    try:
        body = canonical.loads(data)
        name, version = body["format"], body["version"]
    except (ValueError, KeyError, TypeError):
        raise DamagedRemoteKey(f"{storage.url}: {MARKER_KEY} is unreadable") from None
    if name != MARKER_FORMAT or type(version) is not int or version < 1:
        raise DamagedRemoteKey(f"{storage.url}: {MARKER_KEY} is not an ags remote's marker")
    if version > MARKER_VERSION:
        raise BadRemote(
            f"{storage.url} has remote format {version}; this ags reads up to {MARKER_VERSION}"
        )
    return version


def read_marker(storage: RemoteStorage) -> Marker | None:
    """The remote's marker, or None if it holds nothing at all; a marker of a newer
    version, or keys of something else with no marker, are refused (a mistyped URL
    must not receive packs, nor be read as sessions)."""
    try:
        data, etag = storage.get_versioned(MARKER_KEY)
    except KeyMissing:
        keys = (info.key for info in storage.list("") if not info.key.startswith(PROBE_PREFIX))
        other = next(keys, None) or next(iter(storage.hidden_names()), None)  # a home dir
        if other is not None:
            raise BadRemote(
                f"{storage.url} holds other things ({other}) and is not an ags "
                "remote; use an empty bucket prefix or directory"
            ) from None
        return None
    return Marker(_marker_version(storage, data), etag)


def checked_marker(storage: RemoteStorage) -> Marker | None:
    """``storage.check()`` with the marker read between its halves (``read_marker``):
    a remote that holds other things, or one of a newer format, is refused before
    the conditional-write check writes its scratch keys there (in a directory, with
    the ``.ags-locks`` and ``.ags-tmp`` it writes them through)."""
    storage.check_reachable()
    marker = read_marker(storage)
    storage.verify_conditional_writes()
    return marker


def ensure_marker(storage: RemoteStorage, marker: Marker | None) -> Marker:
    """The ``marker`` read (``checked_marker``), or for an empty remote (None) the one
    written now, at MARKER_VERSION (write-once: two first pushes at once write the
    same bytes; one of an older ags that wins writes version 1, read again here and
    raised before a pack goes)."""
    if marker is not None:
        return marker
    if storage.put_new(MARKER_KEY, _marker_body(MARKER_VERSION)):
        return Marker(MARKER_VERSION, None)
    marker = read_marker(storage)
    if marker is None:  # written, then deleted by hand: not a remote to write to
        raise BadRemote(f"{storage.url}: {MARKER_KEY} vanished as it was written")
    return marker


def raise_marker(storage: RemoteStorage, marker: Marker, version: int) -> Marker:
    """The marker at ``version`` or above: rewritten from the version read if it is
    below (FORMAT.md 16.2), by a write conditional on the etag read, so that a marker
    another writer raised meanwhile (perhaps higher than this ags knows) is never
    written over, and a marker never goes down. Called before the pack that needs
    it is written; a crash between the two leaves a raised marker and no pack, which
    costs nothing but an older ags's access."""
    if marker.version >= version:
        return marker
    assert marker.etag is not None  # only a marker this process wrote has none
    try:
        return Marker(version, storage.replace(MARKER_KEY, _marker_body(version), marker.etag))
    except SwapFailed:  # raised by another push meanwhile, or our own lost answer
        now = read_marker(storage)
        if now is None or now.version < version:
            raise BadRemote(f"{storage.url}: {MARKER_KEY} changed while raising it") from None
        return now


def cell_damage(ref: str, value: Any) -> str | None:
    """What keeps a ref cell's value from being one FORMAT.md 16.4 describes, or
    None: nothing of a cell another program wrote is taken for a ref. A session's
    metadata is checked as strictly as the API checks it (session_meta.py)."""
    if value is None:
        return None  # a tombstone
    target = value.get("target", 0) if isinstance(value, dict) else 0
    ok = target is None or (isinstance(target, str) and ID_RE.fullmatch(target) is not None)
    if ref_kind(ref) == "sessions":
        ok = ok and isinstance(value.get("meta"), dict)
    else:
        ok = ok and target is not None
    if not ok:
        return f"{cell_key(ref)} is not a ref cell ags wrote"
    if ref_kind(ref) == "sessions":
        damage = meta_damage(value["meta"])
        if damage is not None:
            return f"{cell_key(ref)} is damaged: {damage}"
    return None


def check_cell_value(url: str, ref: str, value: Any) -> None:
    """``cell_damage`` as a DamagedRemoteKey, for a command that cannot go on past
    one (a push over it, a gc that would not know what it reaches)."""
    damage = cell_damage(ref, value)
    if damage is not None:
        raise DamagedRemoteKey(f"{url}: {damage}")
