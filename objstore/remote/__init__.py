"""Remotes: a store's sessions kept on S3-compatible object storage or in a directory.

What is here is the ground a Git-like sync stands on (docs/REMOTES.md has the
design of push, fetch and remote gc over it):

* ``storage.py``: ``RemoteStorage``, the few operations a sync needs (write
  once, read, list, compare-and-swap a small key, delete) and the check that
  a server really enforces conditional writes;
* ``s3.py`` (boto3) and ``directory.py``: its two backends;
* ``location.py``: remote URLs, endpoints and regions, and ``open_storage``;
* ``config.py``: the remotes a store knows, in its ``config.json``;
* ``errors.py``: what can go wrong, under ``AgsError``;
* the sync over them: ``layout.py`` (what a remote holds where), ``push.py``,
  ``fetch.py`` (fetch and pull) and ``remote_gc.py``.

boto3 is imported only when an S3 remote is opened.
"""

from .config import add_remote, remote, remotes, remove_remote
from .errors import (
    AccessDenied,
    BadRemote,
    BucketMissing,
    ConditionalWritesIgnored,
    DamagedRemoteKey,
    KeyMissing,
    NoCredentials,
    RemoteError,
    RemoteUnreachable,
    SwapFailed,
)
from .fetch import FetchResult, RefFetch, SessionPull, fetch, pull
from .layout import checked_marker
from .location import RemoteLocation, check_remote_name, open_storage, parse_location
from .push import PushResult, RefPush, delete_refs, push, record_push
from .remote_gc import RemoteGcReport, collect_remote_garbage
from .storage import Cell, ObjectInfo, RemoteStorage, TransferStats

__all__ = [
    "FetchResult",
    "PushResult",
    "RefFetch",
    "RefPush",
    "RemoteGcReport",
    "SessionPull",
    "TransferStats",
    "collect_remote_garbage",
    "delete_refs",
    "fetch",
    "pull",
    "push",
    "record_push",
    "AccessDenied",
    "BadRemote",
    "BucketMissing",
    "Cell",
    "ConditionalWritesIgnored",
    "DamagedRemoteKey",
    "KeyMissing",
    "NoCredentials",
    "ObjectInfo",
    "RemoteError",
    "RemoteLocation",
    "RemoteStorage",
    "RemoteUnreachable",
    "SwapFailed",
    "add_remote",
    "check_remote_name",
    "checked_marker",
    "open_storage",
    "parse_location",
    "remote",
    "remotes",
    "remove_remote",
]
