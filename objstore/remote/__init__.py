"""Remotes: a store's sessions kept on S3-compatible object storage or in a directory.

What is here is the ground a Git-like sync stands on (docs/REMOTES.md has the
design of push, fetch and remote gc over it):

* ``storage.py``: ``RemoteStorage``, the few operations a sync needs (write
  once, read, list, compare-and-swap a small key, delete) and the check that
  a server really enforces conditional writes;
* ``s3.py`` (boto3) and ``directory.py``: its two backends;
* ``location.py``: remote URLs, endpoints and regions, and ``open_storage``;
* ``config.py``: the remotes a store knows, in its ``config.json``;
* ``errors.py``: what can go wrong, under ``AgsError``.

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
from .location import RemoteLocation, check_remote_name, open_storage, parse_location
from .storage import Cell, ObjectInfo, RemoteStorage

__all__ = [
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
    "open_storage",
    "parse_location",
    "remote",
    "remotes",
    "remove_remote",
]
