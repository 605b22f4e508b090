"""The object database: loose objects and packs behind one get/put interface.

Where objects go:

* ``put(..., pack=True)`` (appends, batches) appends to this handle's own
  pack; ``sync()`` makes everything appended so far durable with one fsync.
  That is what makes a durable append cost one sync for all of its objects.
* ``put(..., pack=False)`` writes one loose file
  (``objects/<2 hex>/<62 hex>``) with the atomic-replace protocol, durable
  when it returns. Loose files pay for a few objects written outside a
  stream (and map one to one onto an object store's keys); gc folds them
  into a pack.

Writing an object that already exists is a no-op, unless the only copy is
older than FRESHEN_AFTER (or, for a pack write, loose): then it is written again
into this handle's pack.
A copy in a pack another writer has not sealed may not be durable yet (it
fsyncs at its own pace; a batch only at its end): the next ``sync`` fsyncs
that pack too, so what this handle relies on is as durable as what it wrote.
That is what lets gc sweep old unreachable objects beside a writer: the
writer never comes to depend on a copy gc may be deleting (see ``sweep``).
Every read is verified against the id.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
import warnings
from collections.abc import Callable, Container, Iterator
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any, Final, TypeVar

from . import objects
from .block_reader import BlockReader
from .errors import (
    CorruptObject,
    DamagedIndex,
    DamagedPack,
    ObjectError,
    ObjectMissing,
    StoreWarning,
)
from .files import (
    FileLock,
    atomic_write,
    fsync_dir,
    make_dirs,
    open_fd,
    read_file,
    read_only_file_system,
)
from .id_set import IdSet
from .merging import merged_pack
from .objects import LIVE_LEVEL, LIVE_RAW_BYTES
from .pack_format import RECORD_HEAD
from .packs import (
    MAX_PACK_BYTES,
    BlockPackWriter,
    Checked,
    OpenPack,
    PackWriter,
    Replay,
    SealedPack,
    rebuild_index,
    verified_block_pack,
)
from .refs import journaled_generation
from .repack import packs_to_merge
from .seal_helper import SealHelper, SealHelperFailed
from .sealing import BackgroundSeal

HEX_DIR: Final = re.compile(r"[0-9a-f]{2}")  # objects/<first two hex digits of the id>
LEFTOVER_AGE: Final = 3600  # seconds; no write takes this long between its steps
FRESHEN_AFTER: Final = 300  # seconds; a copy older than this is not deduplicated against
_Found = TypeVar("_Found")  # what ``ObjectStore._in_sealed`` looks for
MERGE_BESIDE_APPENDS_MAX: Final = 64 * 1024 * 1024
"""A writer merges its store's sealed packs up to this size while it appends, when
repack.py would merge them (more than MAX_PACKS of them), in its seal's thread after
a seal (``_merge_to_start``); bigger ones are merged by ``repack`` when a handle
closes. Why not only at the close: every pack a handle reads holds two file
descriptors (a mapping of the pack and one of its index, each of which keeps one),
so a writer that never closed, sealing a pack every ~500 appends, met the usual
limit of 1,024 open files (EMFILE) after about 250,000 appends (under a limit of
200: at 92 packs); and every reader beside it paid for its packs: opening the store
maps each, and a lookup that misses searches each (the live-reader bench row, 6,200
messages in 12 packs: 1.43-1.53x the read once the writer closed, 1.27-1.32x with
these merges; merging only past 64 packs, as first tried, none came in that row).
The cost is the writer's: a merge copies its packs' objects again, each about
log2(packs) times over a long run, in a thread beside the appends: one thread
appending 40,000 messages with no fsync spent 217-223 us of CPU per append in all,
against 135-146 merging only past 64 packs (one run each, quiet)."""
# gc's grace period: FRESHEN_AFTER plus far more than any one append takes (see sweep).
MIN_GRACE: Final = 2 * FRESHEN_AFTER
RECORD_OVERHEAD: Final = RECORD_HEAD.size


@dataclass(frozen=True, slots=True)
class SweepResult:
    objects_swept: int  # distinct unreachable objects removed (or that would be)
    bytes_freed: int
    packs_rewritten: int
    loose_packed: int


def _locked(path: str) -> bool:
    """Whether another process holds an flock on ``path`` (a pack being created)."""
    fd = open_fd(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class _MergeBeside:
    """Sealed packs a writer merges in its seal's thread (``_merge_to_start``), with
    the lock that lets it; ``merged``: the pack they went into, once they have."""

    __slots__ = ("lock", "merged", "packs")

    def __init__(self, packs: list[SealedPack], lock: FileLock) -> None:
        self.packs = packs
        self.lock = lock
        self.merged: Path | None = None


class ObjectStore:
    """Objects of one store. ``replay`` restores refs from the ref updates of a
    pack left by a crash (see packs.py).

    Recovery happens in one place, ``recover``, which opening runs: it seals
    the packs crashed writers left and rebuilds damaged indexes, holding
    ``locks/recovery``, which serialises it with the first look of every new
    handle, so no handle reads a ref while another is still restoring it.
    Every later look (``refresh``, a lookup that misses) only reads: a crashed
    pack is scanned like one being written, a damaged index is read around by
    scanning its pack, and both are repaired by the next open."""

    def __init__(
        self,
        root: Path,
        tmp_dir: Path,
        replay: Replay,
        locks_dir: Path,
        before_blocks: Callable[[], None] = lambda: None,
        leave_turn: Callable[[], None] = lambda: None,
        before_files: Callable[[], None] = lambda: None,
        before_journal: Callable[[], None] = lambda: None,
        retired: Callable[[], None] = lambda: None,
    ) -> None:
        self.root = root
        self._before_journal: Callable[[], None] | None = before_journal  # to version 4
        self._leave_turn = leave_turn  # turns.py: an append waits for its fsync outside
        self._before_blocks = before_blocks  # raises the store marker (FORMAT.md 2)
        self._before_files: Callable[[], None] | None = before_files  # to version 3
        self._retired = retired  # a failed fsync retired the handle's pack (``retire_failed``)
        self._uncut: OSError | None = None  # a retired pack could not be cut back
        self._root = os.fspath(root)
        self.pack_dir = root / "pack"
        self._tmp_dir = tmp_dir
        self._replay = replay
        self._recovery_lock = FileLock(locks_dir / "recovery")
        self._repack_lock = locks_dir / "repack"
        self._sealed: dict[str, SealedPack] = {}
        # The ids in the packs this handle sealed, while they are fresh: an id not
        # among them is not looked up in the pack's index (``_fresh_copy``).
        self._sealed_ids: dict[str, frozenset[str]] = {}
        self._open: dict[str, OpenPack] = {}
        self._damaged: dict[str, str] = {}  # pack stem -> why it is left alone
        self._relied_on: dict[str, OpenPack] = {}  # others' unsealed packs to sync with ours
        self._writer: PackWriter | None = None
        self._merging: _MergeBeside | None = None  # run by ``_seal``'s thread after it
        self._last_hit: tuple[str, SealedPack] | None = None  # (stem, pack): a hint
        # The handle's previous pack while a thread of its own seals it (sealing.py):
        # read like ``_writer`` until the handle takes in what the seal wrote.
        self._seal: BackgroundSeal | None = None
        # Writes the block packs of the seals beside the appends (seal_helper.py).
        self._helper = SealHelper(self.pack_dir, self._tmp_dir)
        self.recover()

    # -- discovery -----------------------------------------------------------

    def recover(self) -> None:
        """Look at every pack and repair what crashes and damage left: seal the packs
        of writers that died (replaying their ref updates), rebuild bad indexes. On a
        read-only file system nothing can be repaired, nor written by anyone meanwhile:
        only look, as ``refresh`` does (FORMAT.md 5.2)."""
        if read_only_file_system(self.root):
            self._refresh(recover=False)
            return
        with self._recovery_lock:
            self._refresh(recover=True)

    def refresh(self) -> None:
        """Pick up packs written or sealed by other processes since the last look.
        Writes nothing."""
        self._refresh(recover=False)

    def _refresh(self, *, recover: bool) -> None:
        try:
            listed = os.listdir(self.pack_dir)
        except FileNotFoundError:
            return
        names = set(listed)
        own = {w.path.name for w in self._own_packs()}
        for stem in [stem for stem in self._sealed if f"{stem}.pack" not in names]:
            self._sealed.pop(stem).close()  # merged into a pack this listing holds
        for stem in [stem for stem in self._damaged if f"{stem}.pack" not in names]:
            del self._damaged[stem]
        for stem in [stem for stem in self._open if f"{stem}.pack" not in names]:
            self._forget_open(stem)  # sealed into a block pack, which this listing holds
        for name in listed:
            if not name.endswith(".pack") or name in own:
                continue
            stem = name[: -len(".pack")]
            if stem in self._sealed or stem in self._damaged:
                continue
            try:
                self._look_at(stem, f"{stem}.idx" in names, recover)
            except DamagedPack as e:
                # One bad pack must not stop the store: read the others, name this one.
                self._damaged[stem] = str(e)
                self._forget_open(stem)
                warnings.warn(StoreWarning(f"{e}; it is left as it is (ags fsck)"), stacklevel=2)

    def _look_at(self, stem: str, indexed: bool, recover: bool) -> None:
        """Take in one pack: map a sealed one, scan an open one; with ``recover``,
        rebuild a damaged index and recover a pack a crash left behind."""
        path = self.pack_dir / f"{stem}.pack"
        if indexed:
            try:
                sealed = SealedPack(path)
            except FileNotFoundError:  # merged away by a repack just now
                self._forget_open(stem)
                return
            except DamagedIndex as e:
                if not recover:  # read the pack itself until an open rebuilds the index
                    if stem not in self._open:
                        warnings.warn(StoreWarning(f"{e}: reading its pack instead"), stacklevel=3)
                    self._scan_open(stem, path)
                    return
                self._forget_open(stem)
                try:
                    rebuild_index(path, self._tmp_dir)
                except FileNotFoundError:
                    return
                warnings.warn(
                    StoreWarning(f"{e}: rebuilt it from the pack (an index is derived data)"),
                    stacklevel=3,
                )
                self._sealed[stem] = SealedPack(path)
                return
            self._forget_open(stem)  # sealed by its writer, which synced it first
            self._sealed[stem] = sealed
            return
        pack = self._scan_open(stem, path)
        if pack is None or not recover:
            return
        outcome = pack.try_recover(self._tmp_dir, self._replay)
        if outcome == "busy":
            return
        self._forget_open(stem)  # recovered: fsynced by the recovery
        if outcome == "sealed":
            with suppress(FileNotFoundError):  # merged away by a repack just now
                self._sealed[stem] = SealedPack(path)

    def _scan_open(self, stem: str, path: Path) -> OpenPack | None:
        """The pack without a (usable) index, scanned up to its current end."""
        pack = self._open.get(stem)
        if pack is None:
            try:
                pack = self._open[stem] = OpenPack(path)
            except FileNotFoundError:
                return None
        else:
            pack.refresh()
        return pack

    def _forget_open(self, stem: str) -> None:
        pack = self._open.pop(stem, None)
        self._relied_on.pop(stem, None)
        if pack is not None:
            pack.close()

    def pack_problems(self) -> list[tuple[str, str]]:
        """(pack file, what is wrong) for every pack this handle leaves alone and every
        fault in a sealed pack's index, after a fresh look (the records' faults are
        found by fsck as it reads them)."""
        self.refresh()
        problems = [(f"{stem}.pack", why) for stem, why in self._damaged.items()]
        for pack in self._sealed.values():
            problems += [(pack.path.name, p) for p in pack.index_problems()]
        return problems

    def unsealed_objects(self) -> Iterator[Checked]:
        """Every object of the packs being written and the loose files, read one by one
        and verified (fsck reads the sealed packs itself, a block at a time). An
        object stored twice comes twice."""
        self.refresh()
        others: list[str] = []
        for w in self._own_packs():
            others += w.index
        for open_pack in self._open.values():
            others += open_pack.index
        others += (oid for oid, _path in self._loose_files())
        for oid in others:
            try:
                yield oid, self.get(oid)
            except ObjectError as e:
                yield oid, e

    # -- reading -------------------------------------------------------------

    def loose_path(self, oid: str) -> str:
        return f"{self._root}/{oid[:2]}/{oid[2:]}"

    def _own_packs(self) -> list[PackWriter]:
        """The packs this handle writes: its live pack, and the one being sealed."""
        own = [self._writer] if self._writer is not None else []
        return own if self._seal is None else [*own, self._seal.writer]

    def _stored(self, oid: str) -> bytes | None:
        """The stored form of an object in a pack being written, or a loose file."""
        for w in self._own_packs():
            loc = w.index.get(oid)
            if loc:
                return w.read(loc)
        for pack in self._open.values():
            stored = pack.stored(oid)
            if stored is not None:
                return stored
        return None

    def _loose(self, oid: str) -> bytes | None:
        try:
            return read_file(self.loose_path(oid))
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise CorruptObject(oid, "its loose file is a directory") from None
        except PermissionError as e:
            raise CorruptObject(oid, f"its loose file cannot be read ({e.strerror})") from None

    def _find(self, oid: str) -> tuple[str, bytes] | None:
        stored = self._stored(oid)
        if stored is not None:
            return objects.decode(oid, stored)
        found = self._in_sealed(lambda sealed: sealed.get(oid))
        if found is not None:
            return found
        stored = self._loose(oid)
        return None if stored is None else objects.decode(oid, stored)

    def get(self, oid: str) -> tuple[str, bytes]:
        """Return ``(kind, body)``; raise ObjectMissing or CorruptObject."""
        objects.check_id(oid)
        found = self._find(oid)
        if found is None:
            self.refresh()
            found = self._find(oid)
            if found is None:
                raise ObjectMissing(oid)
        return found

    def get_many(self, oids: list[str]) -> list[tuple[str, bytes]]:
        """``(kind, body)`` of each object, in order: each block they sit in is decoded
        and checked once (block_reader.py)."""
        return BlockReader(self).get_many(oids)

    def live_objects(self, oids: list[str]) -> dict[str, tuple[str, bytes]]:
        """``(kind, body)`` of those of ``oids`` that other writers' packs being written
        hold, each verified against its id, read in one pass per pack (what ``get``
        would return for them): a context beside a live writer takes its newest
        messages from there. Objects not found (or that fail) are left to ``get``."""
        found: dict[str, tuple[str, bytes]] = {}
        for pack in self._open.values():
            found.update(pack.verified_among(oids))
        return found

    def in_block(self, oid: str) -> tuple[SealedPack, int, int, int] | None:
        """The sealed pack that holds ``oid`` in a block, and where (``SealedPack.in_block``);
        None at once for an object in a pack being written (``get`` reads those first),
        so the newest messages beside a live writer cost no search of every index."""
        if (self._writer is not None or self._seal is not None or self._open) and (
            any(oid in w.index for w in self._own_packs())
            or any(p.holds(oid) for p in self._open.values())
        ):
            return None  # (a reader with no pack being written looks at none: a context
            # read asks once for each block)

        def where(sealed: SealedPack) -> tuple[SealedPack, int, int, int] | None:
            found = sealed.in_block(oid)
            return None if found is None else (sealed, *found)

        return self._in_sealed(where)

    def _in_sealed(self, look: Callable[[SealedPack], _Found | None]) -> _Found | None:
        """What ``look`` finds in the first sealed pack it finds anything in, the pack of
        the last hit first: a session's objects sit in a few packs, in runs, and a look
        that misses costs a search of that pack's index (a log of 3,000 messages in a
        store of four packs searched 2.7 indexes for each object, 1.06 so)."""
        last = self._last_hit
        if last is not None and self._sealed.get(last[0]) is last[1]:
            found = look(last[1])
            if found is not None:
                return found
        for stem, sealed in self._sealed.items():
            found = look(sealed)
            if found is not None:
                self._last_hit = (stem, sealed)
                return found
        return None

    def body_size(self, oid: str) -> int:
        """The uncompressed size of an object (0 if it cannot be read)."""
        for sealed in self._sealed.values():
            length = sealed.content_length(oid)
            if length is not None:
                return length - len("blob\0")
        stored = self._stored(oid)
        if stored is None:
            for sealed in self._sealed.values():
                if sealed.find(oid):
                    stored = b""  # a version-1 pack: read below
                    break
            else:
                stored = self._loose(oid)
        if stored is None:
            return 0
        size = objects.content_size(stored)
        if size is None:
            try:
                return len(self.get(oid)[1])
            except ObjectError:
                return 0
        return size - len("blob\0")  # every kind has four letters

    def has(self, oid: str) -> bool:
        """Whether this handle can see the object (without looking for new packs)."""
        return self._stored_location_known(oid) or os.path.lexists(self.loose_path(oid))

    def _stored_location_known(self, oid: str) -> bool:
        return (
            any(oid in w.index for w in self._own_packs())
            or any(p.find(oid) for p in self._open.values())
            or any(p.find(oid) for p in self._sealed.values())
        )

    def _fresh_copy(self, oid: str, loose: bool = True) -> bool:
        """Whether a copy exists that gc will not sweep while a writer comes to need it:
        in a pack being written, or sealed (or, with ``loose``, loose) less than
        FRESHEN_AFTER ago. Only stores of older versions and ``put(pack=False)`` have
        loose objects: a pack write does not stat for one (a copy in the pack too
        costs some bytes until gc; a stat per object costs every append)."""
        w = self._writer
        if w is not None and oid in w.index:
            return True
        if self._seal is not None and oid in self._seal.writer.index:
            return True  # synced before any append that may rely on it (``commit``)
        for stem, pack in self._open.items():
            if pack.find(oid):
                self._relied_on[stem] = pack
                return True
        cutoff = time.time() - FRESHEN_AFTER
        for stem, sealed in self._sealed.items():
            if sealed.sealed_at >= cutoff:
                ids = self._sealed_ids.get(stem)
                if (ids is None or oid in ids) and sealed.find(oid):
                    return True
        if not loose:
            return False
        try:
            return os.lstat(self.loose_path(oid)).st_mtime >= cutoff
        except FileNotFoundError:
            return False

    def stored_sizes(self) -> dict[str, int]:
        """Every object this handle can see and the bytes its stored form takes (of
        an object stored twice, the last copy ``stored_sizes_stream`` gives)."""
        return {oid: size for oid, size, _content in self.stored_sizes_stream()}

    def stored_sizes_stream(self) -> Iterator[tuple[str, int, int | None]]:
        """``stored_sizes`` one object at a time, for a store of any size (the
        duplicates left in), with each object's content length where an index
        gives it (``SealedPack.sizes``)."""
        self.refresh()
        for w in self._own_packs():
            yield from ((oid, loc[1], None) for oid, loc in list(w.index.items()))
        for pack in list(self._open.values()):
            yield from ((oid, loc[1], None) for oid, loc in list(pack.index.items()))
        for sealed in list(self._sealed.values()):
            yield from sealed.sizes()
        for oid, path in self._loose_files():
            with suppress(FileNotFoundError):
                yield oid, os.lstat(path).st_size, None

    def _loose_files(self) -> Iterator[tuple[str, str]]:
        """Every loose object file; other files (not named by a lower-case hex id) are
        not objects, and one of them must not stop a walk of the store."""
        for sub in sorted(os.listdir(self.root)):
            if HEX_DIR.fullmatch(sub):
                for name in os.listdir(self.root / sub):
                    if objects.ID_RE.fullmatch(sub + name):
                        yield sub + name, f"{self._root}/{sub}/{name}"

    def count_hint(self) -> int:
        """About how many objects this handle sees (copies in several packs counted
        each time, loose files not at all): what sizes a whole-store ``IdSet``."""
        count = sum(pack.count for pack in self._sealed.values())
        count += sum(len(pack.index) for pack in self._open.values())
        return count + sum(len(w.index) for w in self._own_packs())

    def release_pages(self) -> None:
        """Let go of the pages of the sealed packs this process has read (see
        ``SealedPack.release_pages``)."""
        for pack in self._sealed.values():
            pack.release_pages()

    def sealed_packs(self) -> list[SealedPack]:
        self.refresh()
        return list(self._sealed.values())

    def with_prefix(self, prefix: str) -> set[str]:
        """Every object id starting with ``prefix`` (lower-case hex, at least 2 digits)."""
        self.refresh()
        found: set[str] = set()
        for w in self._own_packs():
            found.update(oid for oid in w.index if oid.startswith(prefix))
        for pack in self._open.values():
            found.update(oid for oid in pack.index if oid.startswith(prefix))
        for sealed in self._sealed.values():
            found.update(sealed.with_prefix(prefix))
        try:
            rest = prefix[2:]
            found.update(
                prefix[:2] + name
                for name in os.listdir(self.root / prefix[:2])
                if name.startswith(rest) and len(name) == 62
            )
        except FileNotFoundError:
            pass
        return found

    def ids(self) -> Iterator[str]:
        """Every object id this handle can see (duplicates across packs are possible)."""
        self.refresh()
        for w in self._own_packs():
            yield from list(w.index)
        for pack in self._open.values():
            yield from list(pack.index)
        for sealed in self._sealed.values():
            yield from sealed.ids()
        for oid, _path in self._loose_files():
            yield oid

    # -- writing -------------------------------------------------------------

    def put(
        self,
        kind: str,
        body: bytes,
        *,
        pack: bool = True,
        unique: bool = False,
        exact: bool = False,
    ) -> str:
        """Store an object; return its id. See the module doc for where and how durably.

        ``unique``: an object no copy of which is expected anywhere but, perhaps, this
        handle's pack (a node naming its parent and the millisecond it was made), so
        other packs are not searched for one: were there a copy, this one would only
        cost its bytes until a repack merges the two. ``exact``: a JSON body orjson
        wrote (canonical.encode), which its seal need not parse again."""
        content = objects.content_of(kind, body)
        oid = objects.content_id(content)
        if kind == "file" and self._before_files is not None:
            self._before_files()  # an ags of store version 2 would sweep file objects
            self._before_files = None
        if self._seal is not None and self._seal.done:
            self._finish_seal()
        self._refuse_if_failed()
        w = self._writer
        if unique and pack and w is not None and w.size < MAX_PACK_BYTES:
            if oid not in w.index:
                w.add_object(oid, objects.stored_raw(kind, content), content, exact)
            return oid
        if self._fresh_copy(oid, loose=not pack):
            if not pack:
                self._sync_relied_on()  # a loose write is durable when it returns
            return oid  # compressed only if new
        if pack:
            if len(content) <= LIVE_RAW_BYTES:
                stored = objects.stored_raw(kind, content)
            else:
                stored = objects.stored_content(kind, content, LIVE_LEVEL)
            self._pack_writer().add_object(oid, stored, content, exact)
        else:
            atomic_write(self._tmp_dir, self.loose_path(oid), objects.stored_content(kind, content))
        return oid

    def retire_failed(self) -> None:
        """If an fsync of this handle's pack failed (shared_fsync.py), stop writing to it:
        cut it back to what its last good fsync made durable (``PackWriter.cut_back``)
        and let go of it, to be read and recovered as a dead writer's pack is; the
        next write starts a new pack, and ``retired`` tells the Store to read again
        the heads it remembered. Not while records wait in it to be written: they
        are a group of appends under way, which its write fails as one (``flush``).
        Raises if the cut failed: this handle then writes nothing more, since a head
        it would build on may be lost in a power loss."""
        w = self._writer
        if w is not None and w.failed is not None and not w.holding:
            self._writer = None
            try:
                w.cut_back()
            except OSError as e:
                self._uncut = e
            finally:
                w.release()  # once the threads syncing it have raised
                self._retired()
        if self._uncut is not None:
            raise OSError(
                self._uncut.errno,
                f"a pack whose fsync failed could not be cut back ({self._uncut.strerror}): "
                "this store handle writes nothing more",
            )

    def _refuse_if_failed(self) -> None:
        """Inside a write: if the pack failed since the write began, the write is refused
        (it may build on what the failure lost), and the pack retired if it can be."""
        if (self._writer is not None and self._writer.failed is not None) or self._uncut:
            self.retire_failed()
            raise OSError(errno.EIO, "an fsync of this store's pack failed; nothing was written")

    def _pack_writer(self) -> PackWriter:
        w = self._writer
        if w is not None and (w.size < MAX_PACK_BYTES or self._seal is not None):
            # A full pack waits for the seal of the one before it, never the other way
            # round: the seal takes ref locks, which appends hold until they are
            # durable (a leader holds those of every append it runs, combining.py).
            if self._seal is None or not self._seal.done:
                return w
            self._finish_seal()
            if w.size < MAX_PACK_BYTES:
                return w
        if w is not None:
            self._start_seal(w)
        make_dirs(self.pack_dir)
        self._writer = PackWriter(self.pack_dir, self._tmp_dir)
        return self._writer

    def journal_ref_update(self, update: dict[str, Any], *, write: bool = True) -> None:
        """Record a ref update in this handle's pack (durable with the next ``sync``): from
        here until the pack is sealed, that record is the ref's newest value (Journal).
        ``write=False``: held, to be written with the next ``flush`` (combining.py)."""
        if self._before_journal is not None:
            self._before_journal()  # an older ags would read the stale ref file (FORMAT.md 2)
            self._before_journal = None
        # The pack the update's objects went to, even past its size limit: sealing it
        # here would write ref files under the ref lock this update holds.
        w = self._writer if self._writer is not None else self._pack_writer()
        w.add_ref_update(update)  # to a pack whose fsync failed: its flush refuses it
        if write:
            self.flush()

    def journaled(self, name: str, look: bool = True) -> dict[str, Any] | None:
        """The newest journaled update of ref ``name`` in the packs not sealed yet (this
        handle's and, after a fresh look unless ``look`` is false, every other
        writer's), or None. Read before the ref file: a pack is sealed only after
        its refs' files are written."""
        if look:
            self.refresh()
        found = [u for u in self._journaled_updates(name) if u is not None]
        return max(found, key=journaled_generation) if found else None

    def journaled_names(self, prefix: str) -> set[str]:
        """The names starting with ``prefix`` of every ref a live pack journals."""
        self.refresh()
        names = {name for w in self._own_packs() for name in w.journaled}
        for pack in self._open.values():
            names |= pack.journaled_names()
        return {name for name in names if name.startswith(prefix)}

    def _journaled_updates(self, name: str) -> Iterator[dict[str, Any] | None]:
        for w in self._own_packs():
            yield w.journaled.get(name)
        for pack in self._open.values():
            yield pack.journaled(name)

    def flush(self) -> None:
        """Write the records this handle's pack holds (``PackWriter.flush``): other
        handles see them from here, durable or not. The unsealed packs of other
        writers they rely on are synced first: were that to fail once they were in
        the file, another thread's fsync could make them durable, relying on objects
        a power loss may take; so they are dropped instead."""
        w = self._writer
        if w is None:
            return
        if self._relied_on and w.holding:
            try:
                self._sync_relied_on()
            except BaseException:
                w.drop_held()
                raise
        w.flush()
        if w.size >= MAX_PACK_BYTES // 2 and self._helper.idle:
            # Half full: the helper's interpreter starts now, in its own process, so
            # that it is ready for the seal (seal_helper.py).
            self._helper.start()

    def sync(self) -> None:
        """Make every object this handle appended to packs, or relies on in another
        writer's unsealed pack, durable."""
        self._sync_relied_on()
        if self._seal is not None:
            self._seal.writer.sync_or_sealed()
        if self._writer is not None:
            self._writer.flush()
            self._writer.sync()

    def commit(self, left: Callable[[], None] = lambda: None) -> None:
        """Make the journaled update just written durable (Journal.commit): the packs
        this handle relies on first, then, outside the caller's turn (``left`` runs
        once it is given up), this pack, with one fsync for every thread whose
        records came before it.

        The pack being sealed counts among those relied on: an append may have found
        an object there (``_fresh_copy``). Its seal fsyncs it first thing, so this
        waits at most for that fsync, shared with every thread that needs it."""
        self._sync_relied_on()
        w = self._writer
        if w is None:
            return
        older = self._seal.writer if self._seal is not None else None
        w.hold()
        if older is not None:
            older.hold()  # not let go of by the handle while this thread syncs it
        try:
            self._leave_turn()
            left()
            if older is not None:
                older.sync_or_sealed()
            w.sync()
        finally:
            w.let_go()
            if older is not None:
                older.let_go()

    def _sync_relied_on(self) -> None:
        if self._relied_on:
            for pack in self._relied_on.values():
                pack.sync()
            fsync_dir(self.pack_dir)  # its writer may not have made its name durable yet
            self._relied_on.clear()

    def _start_seal(self, w: PackWriter) -> None:
        """Seal this handle's full pack in the background (sealing.py), the seal before
        it having ended (one at a time); appends go on into a new pack."""
        self._writer = None  # whatever happens below, this handle is done with it
        try:
            w.flush()  # all of it in the file: nothing is added to it from here on
            self._before_blocks()
        except BaseException:
            w.release()  # left unsealed, as after a crash: the next open recovers it
            raise
        merging = self._merging = self._merge_to_start()
        w.sealing()
        try:
            self._seal = BackgroundSeal(w, partial(self._seal_and_merge, merging))
        except BaseException:  # no thread: the pack is recovered as after a crash
            self._merging = None
            if merging is not None:
                merging.lock.release()
            w.release()
            raise

    def _merge_to_start(self) -> _MergeBeside | None:
        """The sealed packs of up to MERGE_BESIDE_APPENDS_MAX that repack.py would merge,
        with ``locks/repack`` taken for them; None if there are too few, or another
        process is repacking (it merges them, or the next seal looks again)."""
        small = [p for p in self._sealed.values() if p.size <= MERGE_BESIDE_APPENDS_MAX]
        chosen = packs_to_merge([p.size for p in small])
        if not chosen:
            return None
        lock = FileLock(self._repack_lock)
        if not lock.acquire(blocking=False):
            return None
        return _MergeBeside([small[i] for i in chosen], lock)

    def _seal_and_merge(self, merging: _MergeBeside | None, w: PackWriter) -> Path:
        """In the seal's thread: seal ``w``, then merge ``merging``'s packs into one and
        delete them (the files only: the handle lets go of them in ``_finish_seal``, in
        its turn; until then it reads them through their mappings, valid after the
        files are gone). ``locks/repack`` is let go of whatever happens."""
        try:
            path = self._sealed_pack(w, helped=True)
            if merging is not None:
                self._merge_beside(merging)
            return path
        finally:
            if merging is not None:
                merging.lock.release()

    def _merge_beside(self, merging: _MergeBeside) -> None:
        """Merge and delete ``merging``'s packs, the merge written by the seal helper
        where it can. One that fails leaves them as they were: it is ``repack``'s work,
        done later, not part of any append's."""
        try:
            merged = None
            with suppress(SealHelperFailed):  # seal_helper.py; if it fails, merged here
                paths = [pack.path for pack in merging.packs]
                merged = self._helper.merge(paths)
            if merged is None:
                merged = self._merge(merging.packs).path
            self._delete_packs(merging.packs)
            merging.merged = merged
        except Exception as e:  # noqa: BLE001 - a full disk, say: the packs stay, and read
            warnings.warn(
                StoreWarning(f"merging packs beside the appends failed ({e}); left to repack"),
                stacklevel=1,
            )

    def _finish_seal(self) -> None:
        """Wait for the background seal, if any; take in the block pack it wrote and
        let go of the old pack (or, if the seal failed, leave that pack unsealed for
        the next open to recover, and raise what it raised); then take in the pack
        merged after it, if any, in the place of the packs it merged."""
        seal, merging = self._seal, self._merging
        if seal is None:
            return
        try:
            path = seal.wait()
        except OSError as e:
            if seal.writer.failed is not None:  # its fsync failed, and so did its copy
                self._uncut = e  # a head this handle would build on may be lost
            raise
        finally:
            self._seal = self._merging = None
            seal.writer.release()
        if path is not None and path.stem not in self._sealed:  # else taken in already
            with suppress(FileNotFoundError):  # merged away by another's repack just now
                self._take_in_sealed(path, seal.writer)
        if merging is not None and merging.merged is not None:
            if merging.merged.stem not in self._sealed:  # else a refresh took it in
                with suppress(FileNotFoundError):  # merged away by another's repack
                    self._sealed[merging.merged.stem] = SealedPack(merging.merged)
            for pack in merging.packs:
                if self._sealed.get(pack.path.stem) is pack:
                    self._sealed.pop(pack.path.stem).close()

    def _take_in_sealed(self, path: Path, w: PackWriter) -> None:
        """Read the block pack this handle sealed ``w`` into, from here on, and keep
        which ids it holds while it is fresh (``_sealed_ids``): a seal writes every
        object of its pack, so those are its ids, and each is still looked up in
        the index before an append relies on it."""
        self._sealed[path.stem] = SealedPack(path)
        cutoff = time.time() - FRESHEN_AFTER
        for stem in list(self._sealed_ids):
            sealed = self._sealed.get(stem)
            if sealed is None or sealed.sealed_at < cutoff:
                del self._sealed_ids[stem]  # merged away, or no longer fresh
        self._sealed_ids[path.stem] = frozenset(w.index)

    def _seal_writer(self, w: PackWriter) -> None:
        """Seal this handle's pack here and now (``_sealed_pack``) and take in the block
        pack that replaces it. In this thread, not the helper: nothing runs beside a
        seal at close, and one here takes the objects from what the handle holds,
        where the helper reads, verifies and parses each again."""
        self._writer = None  # whatever happens below, this handle is done with it
        try:
            w.flush()
            self._before_blocks()
            path = self._sealed_pack(w)
        finally:
            w.release()
        self._take_in_sealed(path, w)

    def _sealed_pack(self, w: PackWriter, *, helped: bool = False) -> Path:
        """Seal a pack nothing more is added to (FORMAT.md 5.2): the ref files brought
        up to its journal (durable), then its objects written again, compressed
        together, into a block pack (5.5) that takes its place; the journal records,
        needed no more, are not copied. Returns the block pack's path. Changes
        nothing of the handle's, so it may run in a thread of its own (sealing.py);
        the caller lets go of ``w``.

        A crash before the old pack is gone leaves both: the next open recovers the
        old one (its replay writes nothing) and the next repack merges the copies.
        An error leaves the old pack as a crash would.

        After a failed fsync of the old pack (shared_fsync.py), nothing it holds past
        its last good fsync is known durable there: the block pack, written from what
        the handle holds, makes every object durable first, and the ref files follow.
        Appends relying on the old pack wait for the block pack (``sync_or_sealed``).

        ``helped``: a seal beside the appends, whose block pack the handle's helper
        process writes (seal_helper.py) unless that fails."""
        try:
            return self._sealed_pack_of(w, helped)
        finally:
            w.sealed(False)  # if the copy did not say it was durable (a failed seal)

    def _sealed_pack_of(self, w: PackWriter, helped: bool) -> Path:
        try:
            w.sync()
            copy_first = False
        except OSError:
            if w.failed is None:
                raise
            copy_first = True
        if not copy_first:
            # The ref files, newer than before: from here no record is needed.
            self._replay(list(w.journaled.values()))
        path = None
        if helped and not copy_first:
            with suppress(SealHelperFailed):  # sealed here instead
                path = self._helper.seal(w.path, w.size, w.exact)
        if path is None:
            path = self._block_pack_of(w)
        if copy_first:
            # Its objects are durable: appends relying on them go on (they hold ref
            # locks, which the ref files written next take).
            w.sealed(True)
            self._replay(list(w.journaled.values()))
        os.unlink(w.path)
        fsync_dir(self.pack_dir)
        w.drop_live_index()  # after the pack, while its flock is still held (5.6)
        return path

    def _block_pack_of(self, w: PackWriter) -> Path:
        """Write the objects of ``w`` into a new sealed block pack, from what the handle
        holds of them where it can; return its path."""
        blocks = BlockPackWriter(self.pack_dir, self._tmp_dir, len(w.index))

        def contents() -> Iterator[tuple[str, bytes, bool]]:
            """The pack's objects in pack order (the damaged ones written as they are)."""
            kept, exact = w.contents, w.exact
            for oid, loc in sorted(w.index.items(), key=itemgetter(1)):
                content = kept.get(oid)
                if content is not None:  # hashed to its id when it was written
                    yield oid, content, oid in exact
                    continue
                try:
                    kind, body = objects.decode(oid, w.read(loc))
                except CorruptObject:
                    blocks.add([(oid, w.read(loc))])  # kept as it is, for fsck to report
                    continue
                yield oid, kind.encode("ascii") + b"\0" + body, False

        return blocks.write_sealed(contents())

    def add_pack(self, pack: bytes, index: bytes, name: str) -> int:
        """Add a whole block pack that came from elsewhere (a remote), verified first
        (``verified_block_pack``): it is written through the writer protocol of 5.1 as
        the same records, so it holds the same bytes, and sealed (5.5). Returns how
        many objects it holds that this store did not have; a pack adding nothing
        is not written."""
        return self.add_blocks(verified_block_pack(pack, index, name))

    def add_blocks(self, blocks: list[tuple[bytes, list[tuple[str, int, int]]]]) -> int:
        """Write block records verified by the caller (``verified_block_pack``, or a
        fetch's ranged reads) as the same records into a new sealed pack; return how
        many objects they hold that this store did not have (none: nothing written)."""
        staging = self.block_staging()
        try:
            new = staging.add(blocks)
            staging.commit()
        except BaseException:
            staging.abandon()
            raise
        return new

    def block_staging(self, turn: AbstractContextManager[Any] | None = None) -> BlockStaging:
        """A pack of block records from elsewhere that appears in ``pack/`` only once it
        is whole (``BlockStaging``); each of its calls is made inside ``turn``."""
        return BlockStaging(self, turn or nullcontext())

    def _new_block_writer(self, *, hidden: bool = False) -> BlockPackWriter:
        self._before_blocks()
        if self._before_files is not None:
            # It may hold file objects (4.3), which an ags of store version 2 would
            # sweep; telling without decompressing it all again is not worth it.
            self._before_files()
            self._before_files = None
        make_dirs(self.pack_dir)
        return BlockPackWriter(self.pack_dir, self._tmp_dir, hidden=hidden)

    def repack(self) -> int:
        """Merge small sealed packs into one if there are too many (repack.py); return how
        many were merged. Skips if another process is repacking. Also removes what
        crashed repacks and writers left behind (orphan indexes, old temporary files)."""
        lock = FileLock(self._repack_lock)
        if not lock.acquire(blocking=False):
            return 0
        try:
            self.refresh()
            self._remove_leftovers()
            packs = list(self._sealed.values())
            chosen = [packs[i] for i in packs_to_merge([p.size for p in packs])]
            if not chosen:
                return 0
            self._replace_packs(chosen, self._merge(chosen))
            return len(chosen)
        finally:
            lock.release()

    def sweep(
        self,
        older_than: float,
        mark: Callable[[], Container[str]],
        *,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> SweepResult:
        """Remove the objects ``mark()`` does not return from packs sealed (and loose
        files written) before ``older_than``, a time; fold those loose files into a pack.

        Why nothing a writer needs is lost, with ``older_than`` at least
        MIN_GRACE ago: the packs to sweep are chosen *before* ``mark`` reads
        the refs. An object a writer deduplicated against was in a copy
        younger than FRESHEN_AFTER at that moment (``put``), so it is in none
        of the chosen packs unless its write came before the choice, and so
        before the mark saw the ref that the same append moved. Packs still
        being written are never touched. ``progress(done, total)`` counts packs.
        ``locks/repack`` is held while packs are chosen and while they are swept,
        not while ``mark`` runs.
        """
        lock = FileLock(self._repack_lock)
        lock.acquire()  # one gc or repack at a time
        try:
            self.refresh()
            self._remove_leftovers()
            chosen = [p for p in self._sealed.values() if p.sealed_at < older_than]
            loose = []
            for oid, path in self._loose_files():
                with suppress(FileNotFoundError):
                    st = os.lstat(path)
                    if st.st_mtime < older_than:
                        loose.append((oid, path, st.st_size))
        finally:
            lock.release()
        # Marking reads every ref and history (seconds on a big store) without the
        # lock, so repacks go on meanwhile. What they merge is left out below: its
        # objects sit in a pack younger than the grace period now, and stay.
        keep = mark()
        lock.acquire()
        try:
            self.refresh()
            chosen = [p for p in chosen if self._sealed.get(p.path.stem) is p]
            loose = [item for item in loose if os.path.lexists(item[1])]
            swept = IdSet(key_bytes=8)  # only counted: 8 bytes of an id do (id_set.py)
            freed = 0
            for pack in chosen:
                for oid, size, _content in pack.sizes():
                    if oid not in keep:
                        swept.add(oid)
                        freed += size
            for oid, _p, _s in loose:
                if oid not in keep:
                    swept.add(oid)
            freed += sum(size for oid, _p, size in loose if oid not in keep)
            loose_kept = [(oid, path) for oid, path, _s in loose if oid in keep]
            if dry_run or not (swept or loose_kept or len(chosen) > 1):
                return SweepResult(len(swept), freed, 0, 0)
            merged = self._merge(chosen, keep=keep, extra=loose_kept, progress=progress)
            self._replace_packs(chosen, merged)
            for _oid, path, _s in loose:
                with suppress(FileNotFoundError):
                    os.unlink(path)
            # Report what the disk got back, not the estimate: the merge also dedups.
            freed = sum(p.size for p in chosen) + sum(s for *_x, s in loose) - merged.size
            return SweepResult(len(swept), max(freed, 0), len(chosen), len(loose_kept))
        finally:
            lock.release()

    def _replace_packs(self, old: list[SealedPack], merged: BlockPackWriter) -> None:
        """Put the sealed ``merged`` in the place of ``old`` (with ``locks/repack`` held)."""
        self._sealed[merged.name] = SealedPack(merged.path)
        self._delete_packs(old)
        for pack in old:
            self._sealed.pop(pack.path.stem).close()

    def _delete_packs(self, packs: list[SealedPack]) -> None:
        """Delete the files of ``packs``, merged into a sealed pack (``locks/repack``
        held)."""
        for pack in packs:
            # The pack first, then its index: an index alone is ignored, while a
            # pack alone would look like a crashed writer's and be recovered.
            pack.path.unlink()
            pack.path.with_suffix(".idx").unlink()
        fsync_dir(self.pack_dir)

    def _merge(
        self,
        packs: list[SealedPack],
        *,
        keep: Container[str] | None = None,
        extra: list[tuple[str, str]] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> BlockPackWriter:
        """``merged_pack`` of ``packs`` into this store's pack directory."""
        self._before_blocks()
        return merged_pack(
            packs, self.pack_dir, self._tmp_dir, keep=keep, extra=extra, progress=progress
        )

    def _remove_leftovers(self) -> None:
        """Indexes whose pack is gone (a repack died between its two unlinks) and
        temporary files older than an hour (a writer died before renaming them)."""
        try:
            names = set(os.listdir(self.pack_dir))
        except FileNotFoundError:
            names = set()
        for name in names:
            if name.endswith(".idx") and f"{name[: -len('.idx')]}.pack" not in names:
                with suppress(FileNotFoundError):
                    (self.pack_dir / name).unlink()
            # A live index (5.6) whose pack was sealed by a writer that died before
            # removing it, or was removed.
            stem = name[: -len(".live")]
            if name.endswith(".live") and (f"{stem}.pack" not in names or f"{stem}.idx" in names):
                with suppress(FileNotFoundError):
                    (self.pack_dir / name).unlink()
        cutoff = time.time() - LEFTOVER_AGE
        try:
            leftovers = list(os.scandir(self._tmp_dir))
        except FileNotFoundError:
            leftovers = []
        for entry in leftovers:
            with suppress(FileNotFoundError):
                st = entry.stat(follow_symlinks=False)
                if st.st_mtime < cutoff and (entry.is_symlink() or not _locked(entry.path)):
                    os.unlink(entry.path)

    def close(self) -> None:
        """Seal this handle's pack (after a seal running in the background), merge packs
        if there are too many, let go of every file."""
        if self._seal is not None and self._seal.in_its_thread:
            # Collected in the seal's own thread: the seal ends by itself, and its pack
            # is let go of when the process ends (recovered as after a crash if it
            # failed).
            self._seal = None
        try:
            self._finish_seal()
        finally:
            try:
                with suppress(OSError):
                    self.retire_failed()  # a pack whose fsync failed is cut back, not sealed
                if self._writer is not None:
                    self._seal_writer(self._writer)
                    self.repack()
            finally:
                self._helper.close()
        for pack in self._open.values():
            pack.close()
        for sealed in self._sealed.values():
            sealed.close()
        self._relied_on.clear()
        self._open.clear()
        self._sealed.clear()


Block = tuple[bytes, list[tuple[str, int, int]]]  # a block record and its (id, offset, length)


class BlockStaging:
    """Block records from elsewhere (a fetch's packs, verified by the caller) gathered
    into one new block pack that stays in ``tmp/`` until ``commit`` seals it and
    renames it into ``pack/``: a fetch is all there or not at all. The packs of a
    remote name one another's objects (a node in one, its parent or its message in
    another), so a fetch killed after some of them were added left nodes whose links
    named nothing (``ags fsck``: "parent names missing"); killed before ``commit``, it
    now leaves only a file of ``tmp/`` (removed by a later repack), and once its
    rename is done, a pack whose records are all there (an index missing: written
    from them by the recovery of any process that opens the store).

    A block none of whose objects is new here (in the store or staged) is not
    copied: the packs of a remote may hold an object more than once."""

    def __init__(self, store: ObjectStore, turn: AbstractContextManager[Any]) -> None:
        self._store = store
        self._turn = turn  # the Store handle's turn (turns.py)
        self._writer: BlockPackWriter | None = None

    def has(self, oid: str) -> bool:
        """Whether the store or this staging holds ``oid``."""
        with self._turn:
            return self._store.has(oid) or (self._writer is not None and oid in self._writer)

    def add(self, blocks: list[Block]) -> int:
        """Stage ``blocks``; return how many objects they hold that were new here."""
        with self._turn:
            return self._add(blocks)

    def _add(self, blocks: list[Block]) -> int:
        new: set[str] = set()
        for record, members in blocks:
            fresh = {oid for oid, _i, _n in members if oid not in new and not self.has(oid)}
            if not fresh:
                continue
            if self._writer is None:
                self._writer = self._store._new_block_writer(hidden=True)
            self._writer.add_block_record(record, members)
            new |= fresh
        return len(new)

    def commit(self) -> None:
        """Seal the staged pack into ``pack/`` (nothing if nothing was staged)."""
        with self._turn:
            w, self._writer = self._writer, None
            if w is None:
                return
            try:
                w.seal()
            except BaseException:
                w.abandon()
                raise
            self._store._sealed[w.name] = SealedPack(w.path)

    def abandon(self) -> None:
        """Drop what was staged."""
        with self._turn:
            w, self._writer = self._writer, None
            if w is not None:
                w.abandon()
