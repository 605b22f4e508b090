"""objstore: the content-addressed session store of ags.

Messages, summaries and agent state are immutable, zstd-compressed objects
named by their BLAKE3 hash; sessions are refs to commit-like nodes. See
docs/FORMAT.md for the on-disk format and ``Store`` for the API.

Everything other code uses is exported here and listed in ``__all__``
(tests/test_public_api.py keeps the list and checks that the command line,
the agent and the web pages use nothing else); the submodules are the
engine's own business.

Only the errors and the limits are imported with the package; every other name
is imported from its submodule when it is first used (PEP 562), so a program
that needs ``Store`` does not load search, export or gc.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    AgsError,
    AmbiguousSpec,
    BadExport,
    CorruptObject,
    DamagedIndex,
    DamagedPack,
    ForkedHandle,
    InvalidInput,
    InvalidName,
    LimitExceeded,
    NestingTooDeep,
    ObjectError,
    ObjectMissing,
    RefConflict,
    SearchIndexBusy,
    SearchIndexError,
    SessionArchived,
    SessionBusy,
    SpecError,
    StoreFormatError,
    StoreMissing,
    StoreWarning,
    UnknownSpec,
    UnsafeStore,
)
from .limits import (
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_OBJECT_BYTES,
    depth_exceeds,
    parse_json,
)

# name -> the submodule that defines it, imported on first use
_LAZY: dict[str, str] = {
    "FileDelta": "diff",
    "SessionDiff": "diff",
    "diff_files": "diff",
    "diff_sessions": "diff",
    "ImportResult": "exchange",
    "encode_document": "exchange",
    "export_session": "exchange",
    "import_document": "exchange",
    "read_document": "exchange",
    "check_file_path": "file_paths",
    "write_private_file": "files",
    "FsckReport": "fsck",
    "Problem": "fsck",
    "check_store": "fsck",
    "GcReport": "gc",
    "collect_garbage": "gc",
    "FileChange": "nodes",
    "Node": "nodes",
    "Span": "nodes",
    "MIN_GRACE": "object_store",
    "ReflogEntry": "reflog",
    "Target": "resolve",
    "project_root": "resolve",
    "SearchHit": "search",
    "SearchIndex": "search",
    "content_text": "search",
    "fts_query": "search",
    "SessionUsage": "stats",
    "StoreUsage": "stats",
    "session_usage": "stats",
    "store_usage": "stats",
    "LogEntry": "store",
    "SessionInfo": "store",
    "Store": "store",
}

if TYPE_CHECKING:  # what the names are, for type checkers
    from .diff import FileDelta, SessionDiff, diff_files, diff_sessions
    from .exchange import (
        ImportResult,
        encode_document,
        export_session,
        import_document,
        read_document,
    )
    from .file_paths import check_file_path
    from .files import write_private_file
    from .fsck import FsckReport, Problem, check_store
    from .gc import GcReport, collect_garbage
    from .nodes import FileChange, Node, Span
    from .object_store import MIN_GRACE
    from .reflog import ReflogEntry
    from .resolve import Target, project_root
    from .search import SearchHit, SearchIndex, content_text, fts_query
    from .stats import SessionUsage, StoreUsage, session_usage, store_usage
    from .store import LogEntry, SessionInfo, Store


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later uses find it without calling here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_OBJECT_BYTES",
    "MIN_GRACE",
    "AgsError",
    "AmbiguousSpec",
    "BadExport",
    "CorruptObject",
    "DamagedIndex",
    "DamagedPack",
    "FileChange",
    "FileDelta",
    "ForkedHandle",
    "FsckReport",
    "GcReport",
    "ImportResult",
    "InvalidInput",
    "InvalidName",
    "LimitExceeded",
    "LogEntry",
    "NestingTooDeep",
    "Node",
    "ObjectError",
    "ObjectMissing",
    "Problem",
    "RefConflict",
    "ReflogEntry",
    "SearchHit",
    "SearchIndex",
    "SearchIndexBusy",
    "SearchIndexError",
    "SessionArchived",
    "SessionBusy",
    "SessionDiff",
    "SessionInfo",
    "SessionUsage",
    "Span",
    "SpecError",
    "Store",
    "StoreFormatError",
    "StoreMissing",
    "StoreUsage",
    "StoreWarning",
    "Target",
    "UnknownSpec",
    "UnsafeStore",
    "check_file_path",
    "check_store",
    "collect_garbage",
    "content_text",
    "depth_exceeds",
    "diff_files",
    "diff_sessions",
    "encode_document",
    "export_session",
    "fts_query",
    "import_document",
    "parse_json",
    "project_root",
    "read_document",
    "session_usage",
    "store_usage",
    "write_private_file",
]
