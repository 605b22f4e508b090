"""The block packs of a handle's full packs, written by a helper process.

A seal beside the appends (sealing.py) ran its Python in a thread of the handle's
process: reading the pack's objects, filling blocks, building the index, for
every object the appends wrote. That thread took turns with the appending
threads for the interpreter lock, and with eight threads appending, the same run
with packs that never sealed was 20-30% faster. So the part of a background seal
that grows with the pack, writing its block pack (FORMAT.md 5.5), runs in a
helper process of the handle's own, on the other core, and the seal's thread
waits for it without the lock. The rest stays in the thread: the fsync of the
full pack and the ref files its journal is ahead of before, and its deletion
after (5.2).

So does a merge beside the appends (FORMAT.md 5.4), which the seal's thread
runs after its seal when sealed packs pile up: the helper writes the merged
pack (``write_merged_pack``, by the code a handle merges with), and the thread
deletes the packs it merged.

The helper reads the full pack from its file (written and synced: nothing more
is added to it) and writes the block pack by the same code as a seal in the
process (``write_block_pack``), each object verified against its id on the way
(one that does not verify fails the request, and the thread seals the pack from
the copies the handle holds). It is started when the handle's pack is half full
(its interpreter starts meanwhile, in its own process), or else by the first
request. It takes one request at a time on its standard input (a JSON line),
answers on its standard output (a JSON line: the block pack's path, or what
failed), and ends at the end of its input, when the handle closes. If the
handle's process dies (killed, say), the helper ends within HELPER_WATCH
seconds, whatever it was doing: a kill -9 leaves no process behind.

Whatever goes wrong with the helper (it cannot start, it died, it answered an
error), the seal is done in the thread as before, and the helper is not asked
again: a failure costs speed, never a seal. A helper that ends in the middle
leaves at most a block pack without its index, which the next open indexes
as it does any block pack whose writer died (5.2); the full pack is still
there, so its objects are, and the copies are merged away by the next repack,
as are those of a helper that wrote its block pack but ended before it
answered. A handle used in a process forked from the one that started
the helper does not use it (its pipes are the parent's).

A seal at close stays in the handle's thread: nothing runs beside it to take
turns with, and the thread takes the objects from what the handle holds, where
the helper reads, verifies and parses each again (a run of eight threads timed
through its close was 4% slower with the close's seal in the helper).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import IO, Any, Final

from . import objects
from .errors import CorruptObject
from .merging import merged_pack
from .pack_format import PACK_MAGIC
from .packs import BlockPackWriter, SealedPack, scan_records


def write_block_pack(
    pack: Path, end: int, pack_dir: Path, tmp_dir: Path, exact: frozenset[str] = frozenset()
) -> Path:
    """Write the objects of the full pack ``pack`` (its records up to ``end``), in pack
    order, into a new sealed block pack in ``pack_dir``; return its path. An object
    that does not verify raises CorruptObject: the handle, which holds a good copy of
    most objects of its pack, seals it itself (``ObjectStore._block_pack_of``).
    ``exact``: the ids of the JSON bodies orjson wrote (``PackWriter.exact``), not
    parsed again to tell (``packs.block_payload``)."""
    fd = os.open(pack, os.O_RDONLY)
    try:
        scan = scan_records(fd, len(PACK_MAGIC), end)
    finally:
        os.close(fd)
    if scan.end != end:
        raise CorruptObject(pack.name, f"its records end at {scan.end:,}, not at {end:,}")
    blocks = BlockPackWriter(pack_dir, tmp_dir, len(scan.raw_objects))

    def contents() -> Iterator[tuple[str, bytes, bool]]:
        data, base = scan.data, scan.base
        for raw, start in scan.raw_objects.items():
            oid = raw.hex()
            offset, length = scan.location(start)
            kind, body = objects.decode(oid, bytes(data[offset - base : offset - base + length]))
            yield oid, kind.encode("ascii") + b"\0" + body, oid in exact

    return blocks.write_sealed(contents())


def write_merged_pack(paths: list[Path], pack_dir: Path, tmp_dir: Path) -> Path:
    """Merge the sealed packs at ``paths`` into a new sealed block pack in ``pack_dir``
    (``merging.merged_pack``, as a handle merges them); return its path."""
    packs: list[SealedPack] = []
    try:
        for path in paths:
            packs.append(SealedPack(path))
        return merged_pack(packs, pack_dir, tmp_dir).path
    finally:
        for pack in packs:
            pack.close()


class SealHelperFailed(Exception):
    """The helper could not write the block pack (the module doc says what follows)."""


HELPER_WATCH: Final = 0.02
"""Seconds between the helper's looks at whether the process that started it lives."""


class SealHelper:
    """One handle's helper process (module doc), for the store whose pack directory is
    ``pack_dir`` (named in its command line, for ``ps``) and temporary directory
    ``tmp_dir``. ``seal`` is called by one seal's thread at a time (a handle seals
    one pack at a time)."""

    def __init__(self, pack_dir: Path, tmp_dir: Path) -> None:
        self._pack_dir = pack_dir
        self._tmp_dir = tmp_dir
        self._process: subprocess.Popen[bytes] | None = None
        self._pid = os.getpid()
        self._broken = False
        # Reentrant: a handle dropped without closing may be collected, and closed, in the
        # seal's own thread while it asks (``ObjectStore.close``); the seal then fails
        # over to the thread.
        self._mutex = threading.RLock()
        self.sealed = 0  # block packs it wrote for seals
        self.merged = 0  # and for merges

    @property
    def usable(self) -> bool:
        return not self._broken and os.getpid() == self._pid

    @property
    def idle(self) -> bool:
        """Whether ``start`` would start the helper: it has not run yet, or it ended."""
        return self._process is None and self.usable

    def start(self) -> None:
        """Start the helper now (a handle whose pack is filling), to have it ready for
        the seal; it is not waited for. If it cannot start, it is not used."""
        with self._mutex:
            if self.idle:
                try:
                    self._start()
                except OSError:
                    self._broken = True

    def seal(self, pack: Path, end: int, exact: Iterable[str] = ()) -> Path:
        """The path of the block pack the helper wrote for ``pack`` (``write_block_pack``);
        SealHelperFailed if it did not, and the helper is not used again."""
        path = self._done({"pack": str(pack), "end": end, "exact": "".join(exact)})
        self.sealed += 1
        return path

    def merge(self, packs: list[Path]) -> Path:
        """The path of the pack the helper merged ``packs`` into (``write_merged_pack``);
        SealHelperFailed if it did not, and the helper is not used again."""
        path = self._done({"merge": [str(p) for p in packs]})
        self.merged += 1
        return path

    def _done(self, request: dict[str, Any]) -> Path:
        with self._mutex:
            if not self.usable:
                raise SealHelperFailed("not usable")
            try:
                answer = self._ask(request)
            except (OSError, ValueError) as e:
                self._break()
                raise SealHelperFailed(str(e)) from None
            if "path" not in answer:
                self._break()
                raise SealHelperFailed(str(answer.get("error")))
            return Path(answer["path"])

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        process = self._process or self._start()
        stdin, stdout = _pipes(process)
        stdin.write(json.dumps(request).encode() + b"\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise OSError("the seal helper ended")
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise ValueError("the seal helper's answer is not an object")
        return answer

    def _start(self) -> subprocess.Popen[bytes]:
        package_dir = str(Path(__file__).resolve().parent.parent)
        where = [str(self._pid), str(self._pack_dir), str(self._tmp_dir)]
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", _MAIN, package_dir, *where],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        return self._process

    def _break(self) -> None:
        self._broken = True
        self._end(kill=True)

    def close(self) -> None:
        """End the helper: its input ends, and it exits (it is done with any request by
        then). Not waited for: a thread of this process reaps it."""
        with self._mutex:
            if os.getpid() == self._pid:
                self._end(kill=False)

    def _end(self, *, kill: bool) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if kill:
            with suppress(OSError):
                process.kill()
        for pipe in (process.stdin, process.stdout):
            with suppress(OSError):
                if pipe is not None:
                    pipe.close()
        threading.Thread(target=process.wait, name="ags seal helper exit", daemon=True).start()


def _pipes(process: subprocess.Popen[bytes]) -> tuple[IO[bytes], IO[bytes]]:
    if process.stdin is None or process.stdout is None:
        raise OSError("the seal helper has no pipes")
    return process.stdin, process.stdout


# Run with -I (isolated: no user site, no PYTHON* variables, no script directory on
# the path): the package is imported from the directory the handle's process took it
# from, the first argument; the second is the handle's process (``main`` watches it);
# the third and fourth are the store's pack and temporary directories.
_MAIN = "import sys; sys.path.insert(0, sys.argv[1]); from objstore.seal_helper import main; main()"


def main() -> None:
    """The helper's loop (module doc): one request a line, one answer a line, until the
    end of the input, or until the process that started it is gone."""
    # The process that started it, as it said: one that died before this line ran
    # has made another process the parent already.
    threading.Thread(target=_watch, args=(int(sys.argv[2]),), daemon=True).start()
    pack_dir, tmp = Path(sys.argv[3]), Path(sys.argv[4])
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            if "merge" in request:
                path = write_merged_pack([Path(p) for p in request["merge"]], pack_dir, tmp)
            else:
                ids = request.get("exact", "")  # hex ids, one after another
                exact = frozenset(ids[i : i + 64] for i in range(0, len(ids), 64))
                path = write_block_pack(
                    Path(request["pack"]), int(request["end"]), pack_dir, tmp, exact
                )
            answer: dict[str, Any] = {"path": str(path)}
        except Exception as e:  # noqa: BLE001 - told to the handle, which seals itself
            answer = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.buffer.write(json.dumps(answer).encode() + b"\n")
        sys.stdout.buffer.flush()


def _watch(parent: int) -> None:
    """End the helper once its parent is gone (it then has another parent)."""
    while os.getppid() == parent:
        time.sleep(HELPER_WATCH)
    os._exit(1)
