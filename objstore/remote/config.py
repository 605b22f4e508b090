"""The store's configuration file, ``config.json``: the remotes it syncs with.

docs/FORMAT.md section 15 is the contract. The file is canonical JSON and a
newline, 0600 like every file of a store, replaced whole by the store's
atomic-replace protocol (files.py) while ``locks/config`` is held, so two
``ags remote add`` at once both land and a reader sees the old file or the
new one. Keys this version does not know are kept as they are, so settings
that a later ags adds survive an older one changing the remotes.

Credentials are never in it: a remote is a URL, an endpoint and a region.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .. import canonical
from ..errors import StoreFormatError
from ..files import FileLock, atomic_write, read_file
from .errors import BadRemote
from .location import RemoteLocation, check_remote_name, parse_location

if TYPE_CHECKING:
    from ..store import Store

CONFIG_FILE: Final = "config.json"
CONFIG_LOCK: Final = "locks/config"
CONFIG_VERSION: Final = 1


def _path(store: Store) -> Path:
    return Path(store.path) / CONFIG_FILE


def _read(store: Store) -> dict[str, Any]:
    path = _path(store)
    try:
        data = read_file(path)
    except FileNotFoundError:
        return {"version": CONFIG_VERSION, "remotes": {}}
    try:
        doc = canonical.loads(data)
    except ValueError:
        raise StoreFormatError(f"{path} is not JSON; fix or remove it") from None
    if not isinstance(doc, dict) or type(doc.get("version")) is not int:
        raise StoreFormatError(f"{path} has no version; fix or remove it")
    if doc["version"] > CONFIG_VERSION:
        raise StoreFormatError(
            f"{path} has version {doc['version']}; this ags reads up to {CONFIG_VERSION}"
        )
    remotes = doc.setdefault("remotes", {})
    if not isinstance(remotes, dict):
        raise StoreFormatError(f"{path}: remotes is not an object")
    for name, entry in remotes.items():
        _location(path, name, entry)  # every entry readable, or the file is refused
    return doc


def _location(path: Path, name: str, entry: Any) -> RemoteLocation:
    try:
        check_remote_name(name)
        if not isinstance(entry, dict) or not set(entry) <= {"url", "endpoint", "region"}:
            raise BadRemote("unexpected fields")
        url, endpoint, region = entry.get("url"), entry.get("endpoint"), entry.get("region")
        if not isinstance(url, str):
            raise BadRemote("no url")
        location = parse_location(url, endpoint, region)
    except BadRemote as e:
        raise StoreFormatError(f"{path}: remote {name!r} is unreadable ({e})") from None
    if location.url != url:
        raise StoreFormatError(f"{path}: remote {name!r} has a URL ags would not write: {url!r}")
    return location


def _entry(location: RemoteLocation) -> dict[str, str]:
    entry = {"url": location.url}
    if location.endpoint is not None:
        entry["endpoint"] = location.endpoint
    if location.region is not None:
        entry["region"] = location.region
    return entry


def _change(store: Store, change: Callable[[dict[str, Any]], None]) -> None:
    """Read, change and replace the file while holding ``locks/config``."""
    with FileLock(Path(store.path) / CONFIG_LOCK):
        doc = _read(store)
        change(doc)
        atomic_write(store.tmp_dir, _path(store), canonical.dumps(doc) + b"\n")


def remotes(store: Store) -> dict[str, RemoteLocation]:
    """Every configured remote, by name (sorted)."""
    doc = _read(store)
    path = _path(store)
    return {name: _location(path, name, doc["remotes"][name]) for name in sorted(doc["remotes"])}


def remote(store: Store, name: str) -> RemoteLocation:
    found = remotes(store).get(check_remote_name(name))
    if found is None:
        raise BadRemote(f"no remote named {name!r} (ags remote -v lists them)")
    return found


def add_remote(store: Store, name: str, location: RemoteLocation) -> None:
    """Configure ``name``; BadRemote if it exists (remove it first)."""
    check_remote_name(name)

    def add(doc: dict[str, Any]) -> None:
        if name in doc["remotes"]:
            raise BadRemote(f"remote {name!r} exists already (ags remote remove {name} first)")
        doc["remotes"][name] = _entry(location)

    _change(store, add)


def remove_remote(store: Store, name: str) -> RemoteLocation:
    """Forget ``name`` (nothing on the remote changes); return where it was."""
    check_remote_name(name)
    removed: list[RemoteLocation] = []

    def remove(doc: dict[str, Any]) -> None:
        if name not in doc["remotes"]:
            raise BadRemote(f"no remote named {name!r} (ags remote -v lists them)")
        removed.append(_location(_path(store), name, doc["remotes"].pop(name)))

    _change(store, remove)
    # What was seen of it goes too, as git forgets a removed remote's refs.
    store.drop_tracking_refs(name)
    shutil.rmtree(Path(store.path) / "cache" / "remotes" / name, ignore_errors=True)
    return removed[0]


__all__ = ["CONFIG_FILE", "add_remote", "remote", "remotes", "remove_remote"]
