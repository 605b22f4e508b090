"""objstore: the content-addressed session store of ags.

Messages, summaries and agent state are immutable, zstd-compressed objects
named by their BLAKE3 hash; sessions are refs to commit-like nodes. See
docs/FORMAT.md for the on-disk format and ``Store`` for the API.
"""

from .errors import (
    AgsError,
    AmbiguousSpec,
    CorruptObject,
    InvalidInput,
    InvalidName,
    LimitExceeded,
    ObjectError,
    ObjectMissing,
    RefConflict,
    SessionArchived,
    SessionBusy,
    SpecError,
    StoreFormatError,
    StoreMissing,
    StoreWarning,
    UnknownSpec,
    UnsafeStore,
)
from .nodes import Node
from .resolve import Target
from .store import LogEntry, ReflogLine, SessionInfo, Store

__all__ = [
    "AgsError",
    "AmbiguousSpec",
    "CorruptObject",
    "InvalidInput",
    "LimitExceeded",
    "InvalidName",
    "LogEntry",
    "Node",
    "ObjectError",
    "ObjectMissing",
    "RefConflict",
    "ReflogLine",
    "SessionArchived",
    "SessionBusy",
    "SessionInfo",
    "SpecError",
    "Store",
    "StoreFormatError",
    "StoreMissing",
    "StoreWarning",
    "Target",
    "UnknownSpec",
    "UnsafeStore",
]
