"""Remote gc: drop the packs no remote ref reaches (docs/REMOTES.md 6).

Local gc's rule, with ages from the server's LastModified so that no clock
but the server's matters:

1. take the lease ``locks/gc`` (a cell: ``{"holder", "until"}``; one that ran
   out may be taken over), so that two gcs never sweep at once;
2. learn the server's time: write a ``probe/`` key and read its LastModified;
3. **choose**, before reading any ref: every pack (and ``probe/`` key, and
   index whose pack is gone) older than the grace period;
4. **mark**: fetch (the store running gc gets every object the refs reach),
   then read every ref cell and mark what its target reaches (``reach``),
   then, after every cell, read the pins younger than the grace period and
   mark what their nodes reach (a fork's push relies on them: push.py);
5. **sweep**: a chosen pack with no marked object is deleted, its index
   first (a pack without an index is an orphan to everyone); one with some is
   sent again as a new pack of those objects, then deleted.

Ref cells are never deleted, tombstones included: S3 has no conditional
delete everywhere, so deleting one could drop a ref a push just wrote.

Beside a concurrent push: its new packs are younger than the grace period
(their names are new, layout.new_pack_name), so never chosen; what it relies
on beyond them is reached by the ref version it swaps against, and that
swap fails if the ref moved after gc read it; or, for a fork, by its parent's
cell, read after the push wrote its pin: a gc that read that cell before it
moved marked the fork point, and one that lists pins after the pin was
written marks it from there (REMOTES.md 6 has the whole argument).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from ..errors import InvalidInput, ObjectMissing, RefConflict
from ..object_store import MIN_GRACE
from ..reach import reachable
from ..store import Store
from .errors import DamagedRemoteKey, KeyMissing, SwapFailed
from .fetch import fetch, fetch_packs, index_ids
from .layout import (
    GC_LEASE,
    PACK_KEY_RE,
    PACKS,
    PIN_KEY_RE,
    PINS,
    REFS,
    Marker,
    check_cell_value,
    checked_marker,
    index_key,
    pack_key,
    pin_nodes,
    ref_of_cell,
)
from .push import send_objects
from .storage import PROBE_PREFIX, RemoteStorage

LEASE: Final = 3600.0  # seconds a gc holds the remote; a dead gc's lease runs out


@dataclass(frozen=True, slots=True)
class RemoteGcReport:
    packs_deleted: int
    packs_rewritten: int
    objects_dropped: int
    other_keys_deleted: int  # old probes, indexes whose pack is gone


def _server_now(storage: RemoteStorage) -> datetime:
    key = f"{PROBE_PREFIX}{secrets.token_hex(16)}"
    storage.put_new(key, b"now\n")
    try:
        info = storage.head(key)
    finally:
        storage.delete(key)
    if info is None:
        raise RefConflict(f"{storage.url}: a key just written is gone; try again")
    return info.modified


def _take_lease(storage: RemoteStorage, holder: str) -> None:
    """Take the lease (module doc, 1): free, run out, or held by a gc of this machine
    whose process has ended (a gc killed before it let go: as ``git gc`` does with
    its ``gc.pid``, the pid tells, so that no one waits out the hour)."""
    cell = storage.read_cell(GC_LEASE)
    value = cell.value
    held = isinstance(value, dict) and isinstance(value.get("until"), (int, float))
    running = held and value["until"] > time.time() and value.get("holder") != holder
    if running and not _ended_here(value):
        where = ""
        if isinstance(value.get("host"), str) and type(value.get("pid")) is int:
            where = f", process {value['pid']} on {value['host'][:100]}"
        raise RefConflict(
            f"another remote gc holds {storage.url} (until "
            f"{datetime.fromtimestamp(value['until'], UTC):%Y-%m-%d %H:%M:%S}Z{where}); "
            "try later"
        )
    lease = {
        "holder": holder,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pids": _pid_space(),
        "until": time.time() + LEASE,
    }
    try:
        storage.swap(cell, lease)
    except SwapFailed:
        raise RefConflict(f"another remote gc just took {storage.url}; try later") from None


def _pid_space() -> str | None:
    """What names this process's pids apart from every other machine's, boot's and
    container's: the kernel's boot id and the pid namespace; None where there is no
    /proc to tell (a lease then runs out, never is taken over)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _ended_here(lease: dict[str, object]) -> bool:
    """Whether a lease was taken by a process of this machine (the same pid space: a
    host name alone is no proof, many machines are called localhost) that has ended."""
    pid, here = lease.get("pid"), _pid_space()
    if here is None or lease.get("pids") != here or type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False  # another user's process, or no pid this machine can have
    return False


def _release_lease(storage: RemoteStorage, holder: str) -> None:
    cell = storage.read_cell(GC_LEASE)
    if isinstance(cell.value, dict) and cell.value.get("holder") == holder:
        with suppress(SwapFailed):  # taken over after it ran out: not ours to clear
            storage.swap(cell, None)


def collect_remote_garbage(
    store: Store,
    storage: RemoteStorage,
    remote: str,
    *,
    grace: float = 3600,
    dry_run: bool = False,
) -> RemoteGcReport:
    """Drop what no ref of the remote reaches, as the module doc says."""
    if grace < MIN_GRACE:
        raise InvalidInput(
            f"the grace period must be at least {MIN_GRACE // 60} minutes: "
            "a push running beside gc relies on it"
        )
    marker = checked_marker(storage)
    if marker is None:
        return RemoteGcReport(0, 0, 0, 0)
    holder = secrets.token_hex(8)
    _take_lease(storage, holder)
    try:
        return _collect(store, storage, marker, remote, grace, dry_run)
    finally:
        _release_lease(storage, holder)


def _pinned(store: Store, storage: RemoteStorage, remote: str, cutoff: datetime) -> set[str]:
    """What the pins younger than the grace period reach, read after every ref cell.
    A pinned node the remote does not hold (swept before the pin was written) is
    skipped: the push that wrote the pin then finds its parent no longer reaching
    it and sends the fork's whole history."""
    nodes: set[str] = set()
    for info in storage.list(PINS):
        if PIN_KEY_RE.fullmatch(info.key) and info.modified >= cutoff:
            with suppress(KeyMissing):  # deleted by hand since the listing: it pins nothing
                nodes.update(pin_nodes(storage.url, info.key, storage.get(info.key)))
    if any(not store.has_object(n) for n in nodes):
        fetch_packs(store, storage, remote, None)
    return reachable([n for n in nodes if store.has_object(n)], store.node)


def _collect(
    store: Store,
    storage: RemoteStorage,
    marker: Marker,
    remote: str,
    grace: float,
    dry_run: bool,
) -> RemoteGcReport:
    cutoff = _server_now(storage) - timedelta(seconds=grace)
    # Choose, before any ref is read.
    packs: dict[str, dict[str, datetime]] = {}
    for info in storage.list(PACKS):
        m = PACK_KEY_RE.fullmatch(info.key)
        if m:
            packs.setdefault(m.group(1), {})[m.group(2)] = info.modified
    chosen = [
        name
        for name, parts in packs.items()
        if "idx" in parts and "pack" in parts and max(parts.values()) < cutoff
    ]
    # A pack without its index (a push killed between them) or an index without its
    # pack (a gc killed between its deletes): nothing may rely on either.
    stray = [
        key
        for name, parts in packs.items()
        if len(parts) == 1 and max(parts.values()) < cutoff
        for key in ([pack_key(name)] if "pack" in parts else [index_key(name)])
    ]
    stray += [i.key for i in storage.list(PROBE_PREFIX) if i.modified < cutoff]
    stray += [i.key for i in storage.list(PINS) if i.modified < cutoff]
    # Mark: bring every object the refs reach here, then read the refs (after choosing),
    # fetching again what a ref that moved meanwhile names.
    fetch(store, storage, remote)
    targets: dict[str, str] = {}
    for info in storage.list(REFS):
        ref = ref_of_cell(info.key)
        if ref is None:  # what it would keep is unknown: sweep nothing
            raise DamagedRemoteKey(f"{storage.url}: {info.key} is not the key of a ref cell")
        value = storage.read_cell(info.key).value
        check_cell_value(storage.url, ref, value)  # what it reaches must be known
        if value is not None and value["target"] is not None:
            targets[info.key] = value["target"]
    for _ in range(3):
        if all(store.has_object(t) for t in targets.values()):
            break
        fetch_packs(store, storage, remote, None)
    marked: set[str] = set()
    for key, target in targets.items():
        try:
            marked |= reachable([target], store.node, skip_missing=False)
        except ObjectMissing as e:
            raise RefConflict(
                f"{key} reaches {e}, which the remote does not hold; gc stopped"
            ) from None
    marked |= _pinned(store, storage, remote, cutoff)
    deleted = rewritten = dropped = 0
    for name in chosen:
        ids = index_ids(storage.get(index_key(name)), f"{storage.url} pack {name}")
        keep = [oid for oid in ids if oid in marked]
        if len(keep) == len(ids):
            continue
        dropped += len(ids) - len(keep)
        deleted += 1
        rewritten += bool(keep)
        if dry_run:
            continue
        if keep:
            send_objects(storage, store, marker, keep)  # the new copy first, then the old one goes
        storage.delete(index_key(name))
        storage.delete(pack_key(name))
    if stray and not dry_run:
        storage.delete(*stray)
    return RemoteGcReport(deleted, rewritten, dropped, len(stray))
