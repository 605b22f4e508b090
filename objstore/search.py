"""Full-text search over every message of every session: a cache, rebuilt at will.

The index lives in one SQLite file, ``<store>/cache/search.sqlite``. It is
derived data: every row comes from objects and refs, so the file can be
deleted at any time, and a missing or corrupt file, or one of another schema
version, is made again silently. Nothing in the store depends on it.

It indexes the whole parent chain of every session (history that compaction
took out of the context included, and compaction summaries, marked as such),
each message blob once however many nodes and sessions share it, up to
``limits.MAX_INDEXED_CHARS`` of its text. Which
sessions reach a node is kept as *segments*: a segment is a run of nodes,
each the parent of the next, numbered by depth (distance from the first node
of the chain); a segment that starts at a fork names the segment and depth it
branched from. A session reaches exactly the nodes of the segments on its
head's path, each up to some depth: one ``reach`` row per segment on the
path. So:

* a refresh walks a session only from its head back to the first node
  already indexed: an append costs O(new nodes), a fork O(new nodes + the
  number of forks it descends from);
* a rewind, a move to another branch, a delete only replace the session's
  ``reach`` rows: hits are joined through them, so a node the head no longer
  reaches stops matching at once; rows no session reaches any more are
  pruned in the same transaction.

A hit is a (session, node) pair: a message in history that forks share is
listed once for each session that reaches it, newest first.

A refresh is a run of SQLite write transactions (WAL, busy timeout), one every
``BATCH_NODES`` new nodes, each leaving whole sessions indexed: processes
refreshing at once take turns and the later ones find less or nothing left
to do, and a refresh that is stopped (killed, power lost) leaves the sessions
it committed, which the next one does not index again.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

import zstandard

from . import forks
from .errors import AgsError, InvalidInput, SearchIndexBusy, SearchIndexError
from .files import make_dirs, open_fd, planted_link
from .limits import MAX_INDEXED_CHARS
from .reach import scanning
from .store import SessionInfo, Store
from .walk import walk

SCHEMA_VERSION: Final = 2  # 2: a message's text is indexed up to MAX_INDEXED_CHARS
STAMP_SETTLE_S: Final = 2.0  # see SearchIndex._refs_stamp
INDEX_PATH: Final = Path("cache") / "search.sqlite"
BUSY_TIMEOUT_S: Final = 60.0
BATCH_NODES: Final = 20_000  # nodes indexed between two commits of a refresh
CACHE_KIB: Final = 16 * 1024  # SQLite's page cache, per connection
OPTIMIZE_AFTER_TEXTS: Final = 50_000  # texts one refresh adds before it merges the FTS index
SNIPPET_TOKENS: Final = 16
SUMMARY_ROLE: Final = "summary"  # the role filter that selects compaction summaries

_OPEN, _CLOSE = "\x02", "\x03"  # match markers in snippets; never left in indexed text
_UNSAFE = str.maketrans({"\x00": " ", _OPEN: " ", _CLOSE: " "})
_TERM = re.compile(r'"([^"]*)"?|([^\s"]+)')
_UNZSTD: Final = "ags_unzstd"  # the SQL function each connection registers
_CORRUPT_CODES: Final = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB (primary codes)
_BUSY_CODES: Final = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED

_SCHEMA: Final = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE blobs ("
    " id INTEGER PRIMARY KEY, oid BLOB NOT NULL UNIQUE, role TEXT, text BLOB NOT NULL)",
    # The FTS table keeps only the inverted index; the text its snippets show comes
    # from blobs.text, zstd-compressed: 17 MB instead of 36 MB for 20,000 messages.
    f"CREATE VIEW blob_texts AS SELECT id, {_UNZSTD}(text) AS text FROM blobs",
    "CREATE VIRTUAL TABLE texts USING fts5(text, content = 'blob_texts', content_rowid = 'id',"
    " tokenize = 'unicode61 remove_diacritics 2')",
    "CREATE TABLE segments ("
    " id INTEGER PRIMARY KEY, parent INTEGER, parent_depth INTEGER, tip INTEGER NOT NULL)",
    "CREATE TABLE nodes ("
    " id INTEGER PRIMARY KEY, oid BLOB NOT NULL UNIQUE, blob INTEGER NOT NULL,"
    " seg INTEGER NOT NULL, depth INTEGER NOT NULL, summary INTEGER NOT NULL,"
    " time TEXT NOT NULL)",
    "CREATE INDEX nodes_by_blob ON nodes (blob)",
    "CREATE UNIQUE INDEX nodes_by_seg ON nodes (seg, depth)",
    "CREATE TABLE sessions ("
    " id INTEGER PRIMARY KEY, sid TEXT NOT NULL UNIQUE, head TEXT,"
    " archived INTEGER NOT NULL, updated TEXT NOT NULL, failed TEXT)",
    "CREATE TABLE reach ("
    " seg INTEGER NOT NULL, session INTEGER NOT NULL, upto INTEGER NOT NULL,"
    " PRIMARY KEY (seg, session)) WITHOUT ROWID",
    "CREATE INDEX reach_by_session ON reach (session)",
)

T = TypeVar("T")


class _Indexed(NamedTuple):
    """A session as the index has it."""

    rowid: int
    head: str | None
    archived: bool
    failed: str | None  # why its history could not be indexed


Reach = list[tuple[int, int]]  # (segment, deepest depth reached), head's segment first


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A message (or compaction summary) that matches, in one session that reaches it.

    ``snippet`` is one line of text around the match (``…`` where it was cut);
    ``matches`` are the (start, end) offsets of the matched words in it.
    """

    session: str
    node: str
    role: str | None
    snippet: str
    time: str
    is_summary: bool
    matches: tuple[tuple[int, int], ...] = ()

    def marked(self, before: str = "[", after: str = "]") -> str:
        """The snippet with each match wrapped in ``before`` and ``after``."""
        out, at = [], 0
        for start, end in self.matches:
            out += [self.snippet[at:start], before, self.snippet[start:end], after]
            at = end
        return "".join([*out, self.snippet[at:]])


@dataclass(frozen=True, slots=True)
class RefreshStats:
    """What one refresh did.

    ``failed``: (session id, why) for every session the index leaves out because
    an object of its history is missing or corrupt. Such a session is tried again
    when its head moves, or by ``rebuild``.
    """

    sessions: int = 0  # sessions in the store, archived included
    updated: int = 0  # sessions whose head (or archived flag) was (re)indexed
    removed: int = 0  # sessions dropped from the index (deleted from the store)
    nodes: int = 0  # nodes newly indexed
    texts: int = 0  # message blobs newly indexed
    failed: tuple[tuple[str, str], ...] = ()


def searchable_text(message: Any) -> str:
    """The searchable text of a message: its content (a string, or the text of its
    parts), its reasoning, the names and arguments of its tool calls, and a tool
    result's tool name and content."""
    parts: list[str] = []
    if isinstance(message, dict):
        _content_text(message.get("content"), parts)
        for key in ("thinking", "reasoning_content", "name", "tool_name"):
            if isinstance(message.get(key), str):
                parts.append(message[key])
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict):
                fn = call.get("function")
                _call_text(fn if isinstance(fn, dict) else call, parts)
    else:
        _content_text(message, parts)
    return "\n".join(p for p in parts if p).translate(_UNSAFE)


def indexed_text(message: Any) -> str:
    """What the index keeps of a message: the start of its text, MAX_INDEXED_CHARS at
    most, so the cost of a hit (a snippet reads the text) has a bound."""
    return searchable_text(message)[:MAX_INDEXED_CHARS]


def content_text(value: Any) -> str:
    """The text of a message's content, whatever its shape (see ``_content_text``)."""
    parts: list[str] = []
    _content_text(value, parts)
    return "\n".join(p for p in parts if p)


def _content_text(value: Any, parts: list[str]) -> None:
    """Text of a content value: a string, or a list of parts (OpenAI ``text`` parts,
    Anthropic ``tool_use``/``tool_result`` blocks); images and the like have none."""
    if isinstance(value, str):
        parts.append(value)
    elif isinstance(value, list):
        for item in value:
            _content_text(item, parts)
    elif isinstance(value, dict):
        for key in ("text", "thinking"):
            if isinstance(value.get(key), str):
                parts.append(value[key])
        if value.get("type") == "tool_use":
            _call_text(value, parts)
        if "content" in value:
            _content_text(value["content"], parts)


def _call_text(call: dict[str, Any], parts: list[str]) -> None:
    if isinstance(call.get("name"), str):
        parts.append(call["name"])
    for key in ("arguments", "input"):
        args = call.get(key)
        if isinstance(args, str):
            parts.append(args)
        elif args is not None:
            parts.append(json.dumps(args, ensure_ascii=False, sort_keys=True))


def fts_query(query: str) -> str:
    """The FTS5 expression for what a user typed: every word must match (AND); a
    ``"quoted phrase"`` matches as a phrase; ``word*`` matches words starting with
    ``word``. Everything else is text: each term is quoted, so FTS5 operators
    (``AND``, ``NEAR(``, ``-``, ``^``, ``col:``) are searched as words, never run."""
    terms = []
    text = query.encode("utf-8", "replace").decode("utf-8")  # lone surrogates -> "?"
    for phrase, word in _TERM.findall(text.translate(_UNSAFE)):
        if phrase:
            terms.append(_quoted(phrase))
        elif word:
            stem = word.rstrip("*")
            terms.append(_quoted(stem) + "*" if stem and stem != word else _quoted(word))
    if not terms:
        raise InvalidInput(
            "the search query is empty"
            if not query.strip()
            else "the search query has no words to search for"
        )
    return " ".join(terms)


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


class SearchIndex:
    """The search index of one store. Open with ``SearchIndex.open(store)``; close when done.

    Like a ``Store`` handle, it belongs to one thread, and to the process that
    opened it: in a child of a fork it raises ForkedHandle, and its close does
    nothing (forks.py; SQLite's connections must not cross a fork either).
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.path = store.path / INDEX_PATH
        self._compressor = zstandard.ZstdCompressor(level=3)
        self._read_node = scanning(store.node, store.release_pages)
        self._opener = forks.Opener()
        self._db = self._connect()

    @classmethod
    def open(cls, store: Store) -> SearchIndex:
        return cls(store)

    def close(self) -> None:
        if not self._opener.forked:
            self._db.close()

    def __enter__(self) -> SearchIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the public operations -------------------------------------------------

    def refresh(self) -> RefreshStats:
        """Bring the index up to date with every session's head. Cheap when nothing
        changed: one read of each session ref and one query."""
        return self._guarded(self._refresh)

    def rebuild(self) -> RefreshStats:
        """Drop everything and index every session again from the objects."""

        def rebuild() -> RefreshStats:
            with self._writing() as writing:
                _create_schema(self._db)
                return self._update(self.store.sessions(include_archived=True), {}, writing)

        return self._guarded(rebuild)

    def search(
        self,
        query: str,
        session: str | None = None,
        role: str | None = None,
        limit: int = 50,
        include_archived: bool = False,
        refresh: bool = True,
    ) -> list[SearchHit]:
        """Messages matching ``query`` (see ``fts_query``), newest first: one hit per
        session that reaches a matching node, so a message in history that forks
        share is listed once for each fork.

        ``session``: a full session id; only that session is searched (archived or
        not). ``role``: only messages of that role; ``"summary"`` selects compaction
        summaries, which any other role leaves out. Archived sessions are searched
        only with ``include_archived``. The index is refreshed first unless
        ``refresh`` is false.
        """
        match = fts_query(query)
        if type(limit) is not int or limit < 1:
            raise InvalidInput("limit must be a positive integer")
        where, args = ["texts MATCH ?"], [match]
        if session is not None:
            where.append("s.sid = ?")
            args.append(session)
        elif not include_archived:
            where.append("s.archived = 0")
        if role == SUMMARY_ROLE:
            where.append("n.summary = 1")
        elif role is not None:
            where += ["b.role = ?", "n.summary = 0"]
            args.append(role)
        sql = f"""
            SELECT s.sid, n.oid, b.role, snippet(texts, 0, ?, ?, '…', {SNIPPET_TOKENS}),
                   n.time, n.summary
            FROM texts
            JOIN blobs b ON b.id = texts.rowid
            JOIN nodes n ON n.blob = b.id
            JOIN reach r ON r.seg = n.seg AND n.depth <= r.upto
            JOIN sessions s ON s.id = r.session
            WHERE {" AND ".join(where)}
            ORDER BY n.time DESC, n.depth DESC, s.updated DESC, s.sid
            LIMIT ?"""
        params = (_OPEN, _CLOSE, *args, limit)

        def run() -> list[SearchHit]:
            if refresh:
                self._refresh()
            return [_hit(*row) for row in self._db.execute(sql, params)]

        return self._guarded(run)

    # -- the database ------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """Open the file, making it (or making it again) if it is missing, corrupt or
        of another schema version. A store on a read-only file system gets an index in
        memory (``_in_memory``)."""
        if self.store.read_only:
            return self._in_memory()
        try:
            try:
                return self._connect_once()
            except sqlite3.DatabaseError as e:
                if not _is_corrupt(e):
                    raise
            self._remove_files()
            return self._connect_once()
        except (sqlite3.Error, OSError) as e:
            raise _index_error(self.path, e) from None

    def _connect_once(self) -> sqlite3.Connection:
        _private_database_file(self.path)
        # isolation_level=None: transactions are begun explicitly (BEGIN IMMEDIATE).
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        db.create_function(_UNZSTD, 1, _text_decompressor(), deterministic=True)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")  # a cache: a lost commit is redone
            db.execute("PRAGMA journal_size_limit = 8388608")  # a big refresh's WAL shrinks
            db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
            if _schema_version(db) != SCHEMA_VERSION:
                with _Transaction(db):
                    if _schema_version(db) != SCHEMA_VERSION:  # another process may have
                        _create_schema(db)
        except BaseException:
            db.close()
            raise
        return db

    def _in_memory(self) -> sqlite3.Connection:
        """An index in memory, for a store that cannot be written (a backup, a snapshot
        mounted read-only): a copy of the file's, if there is one of this schema and
        it reads, brought up to date by the search's refresh like the file would
        be; else an empty one, which that refresh fills from the whole store."""
        db = sqlite3.connect(":memory:", isolation_level=None)
        try:
            if os.path.isfile(self.path) and not os.path.islink(self.path):
                uri = f"{self.path.absolute().as_uri()}?mode=ro&immutable=1"
                with closing(sqlite3.connect(uri, uri=True)) as disk:
                    if _schema_version(disk) == SCHEMA_VERSION:
                        disk.backup(db)
                        if db.execute("PRAGMA quick_check").fetchall() != [("ok",)]:
                            raise sqlite3.DatabaseError("damaged")
        except (sqlite3.Error, OSError):  # unreadable or damaged: start from nothing
            db.close()
            db = sqlite3.connect(":memory:", isolation_level=None)
        db.create_function(_UNZSTD, 1, _text_decompressor(), deterministic=True)
        if _schema_version(db) != SCHEMA_VERSION:
            with _Transaction(db):
                _create_schema(db)
        return db

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def _writing(self) -> _Transaction:
        return _Transaction(self._db)

    def _guarded(self, operation: Callable[[], T]) -> T:
        """Run ``operation``; if the file turns out corrupt, make a new one and run it
        once more (the new, empty index is filled by the refresh the operation does
        or, for a search that was told not to refresh, by one done here)."""
        self._opener.check()
        try:
            return operation()
        except sqlite3.Error as e:
            if not _is_corrupt(e):
                raise _index_error(self.path, e) from None
        self._db.close()
        try:
            self._remove_files()
        except OSError as e:
            raise _index_error(self.path, e) from None
        self._db = self._connect()
        try:
            self._refresh()
            return operation()
        except sqlite3.Error as e:
            raise _index_error(self.path, e) from None

    # -- refreshing ----------------------------------------------------------------

    def _indexed(self) -> dict[str, _Indexed]:
        rows = self._db.execute("SELECT sid, id, head, archived, failed FROM sessions")
        return {sid: _Indexed(rowid, head, bool(arch), why) for sid, rowid, head, arch, why in rows}

    def _refresh(self) -> RefreshStats:
        stamp = self._refs_stamp()
        if stamp is not None and stamp == self._stored_stamp():
            # Nothing changed: no session row is read, only the count and the failures.
            (count,) = self._db.execute("SELECT count(*) FROM sessions").fetchone()
            failed = self._db.execute(
                "SELECT sid, failed FROM sessions WHERE failed IS NOT NULL ORDER BY sid"
            )
            return RefreshStats(sessions=count, failed=tuple(failed))
        listed = self.store.sessions(include_archived=True)
        indexed = self._indexed()
        if len(indexed) == len(listed) and all(
            (i := indexed.get(s.id)) is not None and (i.head, i.archived) == (s.head, s.archived)
            for s in listed
        ):
            stats = RefreshStats(sessions=len(listed), failed=_failures(indexed))
        else:
            with self._writing() as writing:
                # Read both again under the write lock: another process may have done it.
                listed = self.store.sessions(include_archived=True)
                stats = self._update(listed, self._indexed(), writing)
        if stamp is not None:
            with self._writing():
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('refs', ?)", (stamp,))
        return stats

    def _refs_stamp(self) -> str | None:
        """When the session refs last changed, if that is long enough ago to trust.

        Every change of a session ref (a title, an archive, a delete; an
        append once its pack is sealed) renames a file into or out of
        ``refs/sessions/``, which sets that directory's mtime; while a pack
        journals appends (FORMAT.md 9) there is no stamp. File times tick
        coarsely (a few milliseconds), so a stamp younger than STAMP_SETTLE_S
        could hide a later change in the same tick: such a stamp is not used,
        as Git treats a "racy" index entry. Taken before the refs are read, a
        stamp never covers a change the read missed.
        """
        if self.store.journaled_sessions():
            return None  # a live writer's heads are in its pack's journal, not in files
        try:
            st = os.stat(self.store.path / "refs" / "sessions")
        except OSError:
            return None
        if time.time() - st.st_mtime < STAMP_SETTLE_S:
            return None
        return f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}"

    def _stored_stamp(self) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'refs'").fetchone()
        return str(row[0]) if row else None

    def _update(
        self, listed: list[SessionInfo], indexed: dict[str, _Indexed], writing: _Transaction
    ) -> RefreshStats:
        """Index the sessions of ``listed`` whose head or archived flag ``indexed`` does
        not have, and drop the sessions that are gone. Commits every BATCH_NODES new
        nodes: a first build of a big store neither holds its whole index in one
        transaction nor starts again from nothing if it is stopped. Each commit
        leaves a sound index (every session in it complete); the next refresh does
        the rest."""
        db = self._db
        counts = {"nodes": 0, "texts": 0}
        updated = 0
        gone = set(indexed) - {s.id for s in listed}
        for sid in gone:
            db.execute("DELETE FROM reach WHERE session = ?", (indexed[sid].rowid,))
            db.execute("DELETE FROM sessions WHERE id = ?", (indexed[sid].rowid,))
        for sid in gone:
            del indexed[sid]
        prune = bool(gone)
        committed_at = 0
        now: dict[str, SessionInfo] | None = None  # the refs as read after a commit
        for info in listed:
            if counts["nodes"] - committed_at >= BATCH_NODES:
                if prune:
                    self._prune()
                    prune = False
                writing.commit_and_begin()
                committed_at = counts["nodes"]
                # Between the two, another process may have indexed sessions, at heads
                # newer than this listing's: read both again, as a refresh begins.
                indexed = self._indexed()
                now = {s.id: s for s in self.store.sessions(include_archived=True)}
            if now is not None:
                if info.id not in now:
                    continue  # deleted meanwhile: the next refresh drops it
                info = now[info.id]
            known = indexed.get(info.id)
            if known is not None and (known.head, known.archived) == (info.head, info.archived):
                continue
            updated += 1
            if known is not None and known.head == info.head:
                db.execute(
                    "UPDATE sessions SET archived = ? WHERE id = ?", (info.archived, known.rowid)
                )
                indexed[info.id] = known._replace(archived=info.archived)
                continue
            why = None
            try:
                reach = self._index_chain(info.head, counts) if info.head else []
            except AgsError as e:  # a missing or corrupt object: leave the session out
                reach, why = [], str(e)
            row = (info.head, info.archived, info.updated, why)
            if known is None:
                rowid = db.execute(
                    "INSERT INTO sessions (head, archived, updated, failed, sid)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (*row, info.id),
                ).lastrowid
                assert rowid is not None
            else:
                rowid = known.rowid
                db.execute(
                    "UPDATE sessions SET head = ?, archived = ?, updated = ?, failed = ?"
                    " WHERE id = ?",
                    (*row, rowid),
                )
                old = dict(db.execute("SELECT seg, upto FROM reach WHERE session = ?", (rowid,)))
                new = dict(reach)
                # An append only deepens the reach; anything else may strand rows.
                prune |= any(new.get(seg, -1) < upto for seg, upto in old.items())
                db.execute("DELETE FROM reach WHERE session = ?", (rowid,))
            db.executemany(
                "INSERT INTO reach (seg, session, upto) VALUES (?, ?, ?)",
                [(seg, rowid, upto) for seg, upto in reach],
            )
            indexed[info.id] = _Indexed(rowid, info.head, info.archived, why)
        if prune:
            self._prune()
        self.store.release_pages()
        if counts["texts"] >= OPTIMIZE_AFTER_TEXTS:
            # Many batches leave the full-text index in many segments, and a query
            # reads each: merged into one, a search of a big store takes half the time.
            db.execute("INSERT INTO texts (texts) VALUES ('optimize')")
        return RefreshStats(
            len(listed), updated, len(gone), counts["nodes"], counts["texts"], _failures(indexed)
        )

    def _index_chain(self, head: str, counts: dict[str, int]) -> Reach:
        """Index the nodes from ``head`` back to the first one already indexed; return
        the reach of ``head``. Reads every object before writing a row, so a bad
        object leaves the index as it was."""
        db = self._db
        new: list[tuple[str, str, bool, str]] = []  # (node, blob, is summary, time), newest first
        texts: dict[str, tuple[str, str | None]] = {}  # blobs not yet indexed
        blob_rows: dict[str, int] = {}  # blobs indexed: their row
        anchor = None
        for node in walk(head, self._read_node):
            anchor = db.execute(
                "SELECT seg, depth FROM nodes WHERE oid = ?", (bytes.fromhex(node.id),)
            ).fetchone()
            if anchor is not None:
                break
            blob = node.content
            if blob not in texts and blob not in blob_rows:
                row = db.execute("SELECT id FROM blobs WHERE oid = ?", (bytes.fromhex(blob),))
                found = row.fetchone()
                if found is not None:
                    blob_rows[blob] = found[0]
                else:
                    message = self.store.blob(blob)
                    role = message.get("role") if isinstance(message, dict) else None
                    text = indexed_text(message)
                    texts[blob] = (text, role if isinstance(role, str) else None)
            time = node.meta.get("time")
            new.append((node.id, blob, node.is_compaction, time if isinstance(time, str) else ""))
        if not new:
            assert anchor is not None
            return self._reach(*anchor)

        for blob, (text, role) in texts.items():
            rowid = db.execute(
                "INSERT INTO blobs (oid, role, text) VALUES (?, ?, ?)",
                (bytes.fromhex(blob), role, self._compressor.compress(text.encode())),
            ).lastrowid
            assert rowid is not None
            blob_rows[blob] = rowid
            db.execute("INSERT INTO texts (rowid, text) VALUES (?, ?)", (rowid, text))
        counts["texts"] += len(texts)
        counts["nodes"] += len(new)

        if anchor is None:
            seg, depth = self._new_segment(None, None), 0
        else:
            parent_seg, parent_depth = anchor
            (tip,) = db.execute("SELECT tip FROM segments WHERE id = ?", (parent_seg,)).fetchone()
            # The anchor ends its segment: extend it, so a session that only appends
            # keeps one segment and one reach row.
            extend = tip == parent_depth
            seg = parent_seg if extend else self._new_segment(parent_seg, parent_depth)
            depth = parent_depth + 1
        db.executemany(
            "INSERT INTO nodes (oid, blob, seg, depth, summary, time) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (bytes.fromhex(oid), blob_rows[blob], seg, depth + i, summary, time)
                for i, (oid, blob, summary, time) in enumerate(reversed(new))
            ],
        )
        tip = depth + len(new) - 1
        db.execute("UPDATE segments SET tip = ? WHERE id = ?", (tip, seg))
        return self._reach(seg, tip)

    def _new_segment(self, parent: int | None, parent_depth: int | None) -> int:
        rowid = self._db.execute(
            "INSERT INTO segments (parent, parent_depth, tip) VALUES (?, ?, -1)",
            (parent, parent_depth),
        ).lastrowid
        assert rowid is not None
        return rowid

    def _reach(self, seg: int | None, depth: int | None) -> Reach:
        """The segments on the path from the node at (``seg``, ``depth``) to the start."""
        out: Reach = []
        while seg is not None and depth is not None:
            out.append((seg, depth))
            seg, depth = self._db.execute(
                "SELECT parent, parent_depth FROM segments WHERE id = ?", (seg,)
            ).fetchone()
        return out

    def _prune(self) -> None:
        """Drop the rows no session reaches any more: whole segments, the ends of
        segments beyond every reach, and then the texts no node names."""
        db = self._db
        db.execute("DELETE FROM segments WHERE id NOT IN (SELECT seg FROM reach)")
        db.execute("DELETE FROM nodes WHERE seg NOT IN (SELECT id FROM segments)")
        db.execute(
            "UPDATE segments SET tip = (SELECT max(upto) FROM reach WHERE seg = segments.id)"
        )
        db.execute(
            "DELETE FROM nodes WHERE depth > (SELECT tip FROM segments WHERE id = nodes.seg)"
        )
        unused = "SELECT id FROM blobs WHERE id NOT IN (SELECT blob FROM nodes)"
        # An external-content FTS table forgets a row when told its old text.
        db.execute(
            f"INSERT INTO texts (texts, rowid, text)"
            f" SELECT 'delete', id, {_UNZSTD}(text) FROM blobs WHERE id IN ({unused})"
        )
        db.execute(f"DELETE FROM blobs WHERE id IN ({unused})")


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back if the block raises.

    IMMEDIATE takes the write lock at the start (waiting up to the busy
    timeout), so what the block reads stays true until it commits."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> _Transaction:
        self._db.execute("BEGIN IMMEDIATE")
        return self

    def commit_and_begin(self) -> None:
        """Commit what is done so far and go on in a new transaction."""
        self._db.execute("COMMIT")
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        elif self._db.in_transaction:
            with suppress(sqlite3.Error):  # a corrupt file may refuse even this
                self._db.execute("ROLLBACK")


def _private_database_file(path: Path) -> None:
    """Make the database file 0600 in a 0700 directory before SQLite opens it (its
    -wal and -shm files take the database file's mode), and refuse links: SQLite
    would follow them."""
    make_dirs(path.parent, durable=False)
    for suffix in ("-wal", "-shm"):
        if os.path.islink(f"{path}{suffix}"):
            raise planted_link(f"{path}{suffix}")
    os.close(open_fd(path, os.O_RDWR | os.O_CREAT))


def _create_schema(db: sqlite3.Connection) -> None:
    """Drop whatever the file holds and create empty tables (inside a write)."""
    old = db.execute(
        "SELECT type, name FROM sqlite_master"
        " WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    for kind, name in old:
        # Shadow tables of an FTS table go with it; skip any already gone.
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone():
            db.execute(f'DROP {kind.upper()} "{name.replace(chr(34), chr(34) * 2)}"')
    for statement in _SCHEMA:
        db.execute(statement)
    db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))


def _failures(indexed: dict[str, _Indexed]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((sid, i.failed) for sid, i in indexed.items() if i.failed is not None))


def _schema_version(db: sqlite3.Connection) -> int | None:
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone() is None:
        return None
    row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    try:
        return int(row[0]) if row else None
    except ValueError:
        return None


def _is_corrupt(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _CORRUPT_CODES


def _index_error(path: Path, e: sqlite3.Error | OSError) -> SearchIndexError:
    """An SQLite or file error as an AgsError, so the CLI prints one line."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _BUSY_CODES:
        return SearchIndexBusy(f"the search index {path} is busy in another process")
    return SearchIndexError(f"cannot use the search index {path}: {e}")


def _hit(
    sid: str, node: bytes, role: str | None, marked: str, time: str, summary: int
) -> SearchHit:
    text, matches = _unmark(" ".join(marked.split()))
    return SearchHit(sid, node.hex(), role, text, time, bool(summary), matches)


def _text_decompressor() -> Callable[[bytes], str]:
    unzstd = zstandard.ZstdDecompressor()
    return lambda data: unzstd.decompress(data).decode()


def _unmark(marked: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """Split FTS5's marked snippet into plain text and the offsets of its matches."""
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    length = 0
    start = None
    for piece in re.split(f"([{_OPEN}{_CLOSE}])", marked):
        if piece == _OPEN:
            start = length
        elif piece == _CLOSE:
            if start is not None and start < length:
                spans.append((start, length))
            start = None
        else:
            out.append(piece)
            length += len(piece)
    return "".join(out), tuple(spans)
