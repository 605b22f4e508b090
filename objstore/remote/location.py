"""Where a remote is: its URL, endpoint and region, checked, and the storage they open.

A remote's URL is ``s3://BUCKET[/PREFIX]`` (any S3-compatible server; the
endpoint says which, default AWS) or a path to a directory
(``/media/usb/ags``, ``file:///media/usb/ags``, ``../shared``; made
absolute when the remote is added). Nothing in a location is secret: a URL
with a user or password in it is refused, since ags never stores
credentials.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from .errors import BadRemote
from .storage import KEY_RE, RemoteStorage

REMOTE_NAME_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
# S3's rules for new buckets (3-63 characters; lower case, digits, dots, hyphens).
BUCKET_RE: Final = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
REGION_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, slots=True)
class RemoteLocation:
    """A remote's address as configured: ``url`` plus, for S3, endpoint and region."""

    url: str
    endpoint: str | None = None
    region: str | None = None

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")


def check_remote_name(name: str) -> str:
    """Remote names become part of ref names (``remotes/<name>/...``): like a tag's part."""
    if type(name) is not str or not REMOTE_NAME_RE.fullmatch(name) or name.endswith(".lock"):
        raise BadRemote(
            f"bad remote name {name!r}: use up to 64 letters, digits and ._- "
            "(not starting with . or -)"
        )
    return name


def parse_location(
    url: str, endpoint: str | None = None, region: str | None = None
) -> RemoteLocation:
    """The location ``url`` names, normalised (a path made absolute); BadRemote if unusable."""
    if not url:
        raise BadRemote("a remote needs a URL: s3://bucket/prefix or a directory")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "s3":
        bucket, _, prefix = url[5:].partition("/")
        if "@" in bucket or ":" in bucket:
            raise BadRemote(
                "no credentials in a remote URL (ags never stores them, nor prints them); "
                "use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials"
            )
        if not BUCKET_RE.fullmatch(bucket):
            raise BadRemote(
                f"bad bucket name {bucket!r} in {url!r}: 3-63 lower-case letters, digits, . and -"
            )
        prefix = prefix.strip("/")
        if prefix and not KEY_RE.fullmatch(prefix):
            raise BadRemote(
                f"bad prefix {prefix!r} in {url!r}: /-separated parts of letters, digits "
                "and ._- (not starting with .)"
            )
        return RemoteLocation(
            f"s3://{bucket}/{prefix}".rstrip("/"), _check_endpoint(endpoint), _check_region(region)
        )
    if endpoint is not None or region is not None:
        raise BadRemote("--endpoint and --region are for s3:// remotes, not for a directory")
    if scheme == "file":
        try:
            parts = urlsplit(url)
        except ValueError:  # an unclosed [ of an IPv6 address
            raise BadRemote(f"{url!r}: a file:// URL names a path on this machine") from None
        if parts.netloc not in ("", "localhost"):
            raise BadRemote(f"{url!r}: a file:// URL names a path on this machine")
        path = parts.path
    elif scheme:
        raise BadRemote(f"unsupported remote URL {url!r}: use s3://bucket/prefix or a directory")
    else:
        path = url
    if "\0" in path:
        raise BadRemote(f"bad path {path!r}")
    return RemoteLocation(str(Path(path).expanduser().absolute()))


def _check_endpoint(endpoint: str | None) -> str | None:
    if endpoint is None:
        return None
    unusable = BadRemote(f"bad endpoint {endpoint!r}: give http://host:port or https://host")
    try:
        parts = urlsplit(endpoint)
    except ValueError:  # an unclosed [ of an IPv6 address
        raise unusable from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise unusable
    if parts.username is not None or parts.password is not None:
        raise BadRemote(
            "no credentials in the endpoint URL (ags never stores them); use "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials"
        )
    if parts.query or parts.fragment:
        raise BadRemote(f"bad endpoint {endpoint!r}: no query or fragment")
    try:
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        raise BadRemote(f"bad endpoint {endpoint!r}: the port is not 0-65535") from None
    return endpoint.rstrip("/")


def _check_region(region: str | None) -> str | None:
    if region is not None and not REGION_RE.fullmatch(region):
        raise BadRemote(f"bad region {region!r}")
    return region


def open_storage(location: RemoteLocation) -> RemoteStorage:
    """The storage at ``location``: nothing is sent until it is used (``check``)."""
    if location.is_s3:
        from .s3 import S3Storage  # boto3 takes ~0.5 s to import: only when it is needed

        bucket, _, prefix = location.url[5:].partition("/")
        return S3Storage(bucket, prefix, endpoint=location.endpoint, region=location.region)
    from .directory import DirectoryStorage

    return DirectoryStorage(location.url)


__all__ = ["RemoteLocation", "check_remote_name", "open_storage", "parse_location"]
