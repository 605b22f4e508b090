"""The one exception hierarchy of ags.

Every error a user can cause, and every problem found in a store, is an
``AgsError``. Callers catch at the level they care about (``AgsError`` for
"print it and exit", ``RefConflict`` for "someone else moved the ref"), and
the command line turns any ``AgsError`` into one line on stderr. The agent's
own errors (model servers, the sandbox, the file tools, importers) hang from
the same root in agent/errors.py::

    AgsError
    ├── InvalidInput               a value given to the store is not acceptable
    │   ├── LimitExceeded          over a limit of the format (limits.py)
    │   ├── InvalidName            a malformed ref name, session id or object id
    │   └── BadExport              an export document that cannot be imported
    ├── StoreFormatError           not a store, or a format this ags cannot read
    │   ├── DamagedPack            a pack left alone (fsck names it)
    │   └── DamagedIndex           a pack index that is rebuilt from its pack
    ├── StoreMissing               no store at the path
    ├── UnsafeStore                another user could change the store
    ├── ObjectError                one object
    │   ├── ObjectMissing
    │   └── CorruptObject
    ├── SpecError                  a spec that does not name exactly one thing
    │   ├── UnknownSpec
    │   │   └── NothingCheckedOut  HEAD names nothing for the directory
    │   └── AmbiguousSpec
    ├── RefConflict                a compare-and-swap lost
    ├── SessionBusy                another process writes the session
    ├── SessionArchived
    ├── ForkedHandle               a handle of the parent used in a child of fork
    └── SearchIndexError           the search index cannot be used
        └── SearchIndexBusy

Two classes here are not ``AgsError``: ``StoreWarning`` (damage ags worked
around, issued with ``warnings.warn``) and ``NestingTooDeep``, a ``ValueError``
like any other JSON that cannot be read, which each reader turns into its own
error (a corrupt object, a bad export, a bad reply from a model).
"""

from __future__ import annotations


class AgsError(Exception):
    """Base of every error ags raises on purpose."""


class InvalidInput(AgsError):
    """A value given to the store is not acceptable (bad message, bad name)."""


class LimitExceeded(InvalidInput):
    """A value is over one of the format's limits (limits.py); ``limit`` says which in a
    few words ("nested too deeply", "too large"), the message says where and by how much."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class InvalidName(InvalidInput):
    """A ref name, session id or object id that is malformed or tries to leave the store."""


class BadExport(InvalidInput):
    """An export document that cannot be imported; the message names the bad place."""


class StoreFormatError(AgsError):
    """The directory is not an ags store, or has a format this version cannot read."""


class DamagedPack(StoreFormatError):
    """A pack file whose header is not a version-1 pack header but which holds records:
    ags leaves it alone, reads the other packs, and fsck reports it."""


class DamagedIndex(StoreFormatError):
    """A pack index that is truncated or malformed; ags rebuilds it from its pack."""


class StoreMissing(AgsError):
    """No store exists at the path (``ags init`` makes one)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"no store at {path} (ags init creates one)")
        self.path = path


class UnsafeStore(AgsError):
    """Someone other than the user could change the store: another user owns it or
    can write to it, or a symbolic link was planted in it. ags refuses rather than
    let a planted file redirect its writes (as Git's ``safe.directory`` does)."""


class StoreWarning(UserWarning):
    """Damage ags worked around and the user should know about (a rebuilt index, a
    ref that cannot be read): issued with ``warnings.warn``; the CLI prints it."""


class ObjectError(AgsError):
    """Base of problems with one object."""

    def __init__(self, object_id: str, message: str) -> None:
        super().__init__(message)
        self.object_id = object_id


class ObjectMissing(ObjectError):
    """No object has this id."""

    def __init__(self, object_id: str) -> None:
        super().__init__(object_id, f"object {object_id} is missing")


class CorruptObject(ObjectError):
    """A stored object does not decode, or its content does not hash to its id."""

    def __init__(self, object_id: str, why: str) -> None:
        super().__init__(object_id, f"object {object_id} is corrupt: {why}")


class SpecError(AgsError):
    """A ref spec does not name exactly one thing."""


class UnknownSpec(SpecError):
    """Nothing matches the spec."""


class NothingCheckedOut(UnknownSpec):
    """No HEAD for the directory or any above it (``HEAD`` names nothing)."""


class AmbiguousSpec(SpecError):
    """A prefix matches several sessions or nodes; ``candidates`` lists them."""

    def __init__(self, spec: str, candidates: list[str]) -> None:
        shown = ", ".join(candidates[:10]) + (" ..." if len(candidates) > 10 else "")
        super().__init__(f"ambiguous spec {spec!r}: it matches {shown}")
        self.spec = spec
        self.candidates = candidates


class RefConflict(AgsError):
    """A compare-and-swap found a different value than the caller expected."""


class SessionBusy(AgsError):
    """Another writer holds the session."""

    def __init__(self, session: str, pid: int | None) -> None:
        holder = f"process {pid}" if pid else "another process"
        super().__init__(f"session {session} is open for writing by {holder}")
        self.session = session
        self.pid = pid


class SessionArchived(AgsError):
    """The session is archived and must be unarchived before it is written."""

    def __init__(self, session: str) -> None:
        super().__init__(
            f"session {session} is archived; unarchive it before resuming or appending"
        )
        self.session = session


class ForkedHandle(AgsError):
    """A handle opened by the parent of this process, before it forked, was used here
    (forks.py): the child must open the store itself."""

    def __init__(self, opener: int, pid: int) -> None:
        super().__init__(
            f"this store handle was opened by process {opener} before it forked; "
            f"process {pid} must open the store itself"
        )
        self.opener = opener


class SearchIndexError(AgsError):
    """The search index file cannot be used (for instance, its directory is read-only)."""


class SearchIndexBusy(SearchIndexError):
    """Another process held the search index for longer than the busy timeout."""


class NestingTooDeep(ValueError):
    """JSON text nests containers deeper than allowed (a ValueError, like any bad JSON)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"nested deeper than {limit} levels, the limit")
        self.limit = limit
