"""The errors of a remote's storage, under the one ``AgsError`` tree.

Each message is one line that says which remote and what to do next, and
never holds a credential (ags never sees one it did not read from the usual
places, and never prints one)::

    AgsError
    ├── InvalidInput
    │   └── BadRemote                  a remote name or URL ags cannot use
    └── RemoteError                    the remote's storage did not do what was asked
        ├── RemoteUnreachable          the endpoint does not answer (down, DNS, timeout)
        ├── NoCredentials              no credentials in the environment, files or profile
        ├── AccessDenied               the server refused the credentials or the request
        ├── BucketMissing              no such bucket (or directory, for a path remote)
        ├── ConditionalWritesIgnored   the server accepts If-None-Match / If-Match and
        │                              ignores them: pushing there could lose work
        ├── KeyMissing                 a key that is not there
        ├── DamagedRemoteKey           a key whose content ags cannot read
        └── SwapFailed                 a compare-and-swap lost (also a RefConflict)

``SwapFailed`` is also a ``RefConflict``, the local store's "someone else
moved the ref": a caller that retries a lost race catches one class for both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import AgsError, InvalidInput, RefConflict

if TYPE_CHECKING:
    from .storage import Cell


class BadRemote(InvalidInput):
    """A remote name or URL that ags cannot use, or a remote that is not configured."""


class RemoteError(AgsError):
    """Base of what a remote's storage can fail with."""


class RemoteUnreachable(RemoteError):
    """The endpoint does not answer: down, a wrong address, a timeout."""


class NoCredentials(RemoteError):
    """No credentials were found where S3 clients look for them."""


class AccessDenied(RemoteError):
    """The server refused the request: wrong key, wrong secret, or no permission."""


class BucketMissing(RemoteError):
    """The bucket (or, for a path remote, the directory) does not exist."""


class ConditionalWritesIgnored(RemoteError):
    """The server does not enforce If-None-Match / If-Match: two pushers could both
    win a compare-and-swap, so ags refuses to push there."""


class KeyMissing(RemoteError):
    """A key that is not in the remote."""

    def __init__(self, where: str, key: str) -> None:
        super().__init__(f"{where}: no key {key}")
        self.key = key


class DamagedRemoteKey(RemoteError):
    """A key whose content is not what ags wrote there (not a cell, not JSON)."""


class SwapFailed(RemoteError, RefConflict):
    """A compare-and-swap found another version than the one read: someone else
    wrote first. ``current`` is the key as it is now (read again), when known."""

    def __init__(self, where: str, key: str, current: Cell | None = None) -> None:
        super().__init__(f"{where}: {key} was changed by someone else since it was read")
        self.key = key
        self.current = current
