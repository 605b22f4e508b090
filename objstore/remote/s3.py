"""A remote in an S3-compatible bucket (AWS S3, MinIO, Cloudflare R2, SeaweedFS), through boto3.

docs/REMOTES.md says why boto3 (its credential chain, above all) and what
was measured against the others.

**Credentials** come from where every S3 tool finds them, boto3's chain:
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``),
``AWS_PROFILE`` and the profiles of ``~/.aws/credentials`` and
``~/.aws/config`` (SSO, assumed roles, ``credential_process``), and the
instance or container role. ags never stores one, never asks for one and
never prints one. The endpoint may also come from ``AWS_ENDPOINT_URL_S3``
and the region from ``AWS_REGION`` (which boto3 itself does not read),
``AWS_DEFAULT_REGION`` or the profile when the remote names none.

**Conditional writes**: ``put_object(IfNoneMatch="*")`` and
``put_object(IfMatch=etag)``. A refusal is 412 ``PreconditionFailed``; AWS
answers 404 ``NoSuchKey`` to an If-Match on a missing key, where SeaweedFS
answers 412, and 409 ``ConditionalRequestConflict`` while another
conditional write of the key is in flight: each of them is a lost swap.

**Client settings**, each for a reason:

* retries: botocore's "standard" mode (5xx, throttling and dropped
  connections, exponential backoff with jitter, 4 attempts). A retried
  conditional write can meet its own first attempt; storage.py's ``swap``
  reads the key back to tell that from a lost race.
* checksums only where the API requires them
  (``request_checksum_calculation="when_required"``): botocore's default
  since 1.36 sends CRC32 checksums, for some bodies in ``aws-chunked``
  encoding, which S3-compatible servers have mishandled (stored the chunk
  framing as content, or refused the request). Objects are verified by their
  BLAKE3 ids and cells by their JSON, so nothing relies on the checksum.
* every write sends its body's MD5 (``Content-MD5``). SeaweedFS stores an empty
  object when a PUT is cut off (its sender killed) after its headers and before
  any byte of its body; with the MD5 it refuses it. An empty key (a pack, a
  cell) left by a killed push would read as damage.
* path-style addressing with a custom endpoint (``http://host/bucket/key``):
  what MinIO, SeaweedFS and friends serve without wildcard DNS.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import Iterator
from datetime import UTC
from typing import TYPE_CHECKING, Any, Final, NoReturn

import boto3
import botocore.exceptions as bce
from botocore.config import Config

from .errors import (
    AccessDenied,
    BucketMissing,
    NoCredentials,
    RemoteError,
    RemoteUnreachable,
    SwapFailed,
)
from .storage import ObjectInfo, RemoteStorage, TransferStats

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

DEFAULT_REGION: Final = "us-east-1"
ATTEMPTS: Final = 4
DELETE_BATCH: Final = 1000  # DeleteObjects takes at most 1,000 keys
LIST_PAGE: Final = 1000
IN_FLIGHT_RETRIES: Final = 5  # 409 ConditionalRequestConflict on a create: wait, then look
CREDENTIALS_HINT: Final = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, "
    "or add them to ~/.aws/credentials"
)
_DENIED: Final = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
     "ExpiredToken", "AllAccessDisabled", "403"}
)  # fmt: skip
_UNREACHABLE: Final = (
    bce.EndpointConnectionError,
    bce.ConnectTimeoutError,
    bce.ReadTimeoutError,
    bce.ConnectionClosedError,
    bce.ProxyConnectionError,
)


def _md5(data: bytes) -> str:
    """The ``Content-MD5`` of a body (base64, RFC 1864): the server refuses the write
    unless it got every byte of it (module doc)."""
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def _status(e: bce.ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _code(e: bce.ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", _status(e)))


class S3Storage(RemoteStorage):
    """The keys of a remote under ``prefix`` in ``bucket``."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        max_pool_connections: int = 16,
    ) -> None:
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        try:
            session = boto3.session.Session()
            self.region = (
                region or os.environ.get("AWS_REGION") or session.region_name or DEFAULT_REGION
            )
            self._client: S3Client = session.client(
                "s3",
                endpoint_url=endpoint,
                region_name=self.region,
                config=Config(
                    retries={"mode": "standard", "max_attempts": ATTEMPTS},
                    connect_timeout=10,
                    read_timeout=60,
                    max_pool_connections=max_pool_connections,
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    s3={"addressing_style": "path" if endpoint else "auto"},
                    user_agent_extra="ags",
                ),
            )
        except bce.ProfileNotFound as e:
            raise NoCredentials(f"{self.url}: {e}") from None
        except bce.BotoCoreError as e:
            raise RemoteError(f"{self.url}: {e}") from None
        self.endpoint: str = self._client.meta.endpoint_url
        self.stats = TransferStats()
        self._client.meta.events.register("before-send.s3", self._count_request)

    def _count_request(self, request: Any, **_: Any) -> None:
        """Called by botocore as each request (each retry too) goes on the wire."""
        length = request.headers.get("Content-Length")  # the body may be a stream here
        self.stats.add(requests=1, sent=int(length) if length else 0)

    def close(self) -> None:
        self._client.close()

    # -- errors --------------------------------------------------------------------

    def _fail(self, e: Exception, doing: str) -> NoReturn:
        """Raise ``e`` as the RemoteError a person can act on: one line, no credentials."""
        where = self.url
        if isinstance(e, bce.NoCredentialsError | bce.PartialCredentialsError):
            raise NoCredentials(f"{where}: no S3 credentials found: {CREDENTIALS_HINT}") from None
        if isinstance(e, bce.ProfileNotFound):
            raise NoCredentials(f"{where}: {e}") from None
        if isinstance(e, _UNREACHABLE):
            raise RemoteUnreachable(
                f"{where}: cannot reach {self.endpoint} ({type(e).__name__}); "
                "is the endpoint right and the server up?"
            ) from None
        if isinstance(e, bce.ClientError):
            code, status = _code(e), _status(e)
            if code == "NoSuchBucket":
                raise self._bucket_missing() from None
            if code in _DENIED or status == 403:
                raise AccessDenied(
                    f"{where}: access denied ({code}) while {doing}: "
                    "check the credentials and what they may do in this bucket"
                ) from None
            message = " ".join(str(e.response.get("Error", {}).get("Message", "")).split())
            raise RemoteError(
                f"{where}: {doing}: the server answered {status} {code}"
                + (f": {message[:200]}" if message else "")
            ) from None
        if isinstance(e, bce.BotoCoreError):
            raise RemoteError(f"{where}: {doing}: {e}") from None
        raise e

    def _bucket_missing(self) -> BucketMissing:
        return BucketMissing(f"{self.url}: bucket {self.bucket} does not exist at {self.endpoint}")

    # -- RemoteStorage -----------------------------------------------------------------

    def _check_reachable(self) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except bce.ClientError as e:
            if _status(e) == 404:
                raise self._bucket_missing() from None
            region = (
                e.response.get("ResponseMetadata", {})
                .get("HTTPHeaders", {})
                .get("x-amz-bucket-region")
            )
            if _status(e) in (301, 400) and region:
                raise RemoteError(
                    f"{self.url}: the bucket is in region {region}: give --region {region}"
                ) from None
            self._fail(e, "looking for the bucket")
        except Exception as e:
            self._fail(e, "looking for the bucket")

    def _read(self, key: str) -> tuple[bytes, str] | None:
        return self._get(key, f"reading {key}")

    def _read_range(self, key: str, start: int, end: int) -> bytes | None:
        what = f"reading bytes {start}-{end - 1} of {key}"
        got = self._get(key, what, Range=f"bytes={start}-{end - 1}")
        return None if got is None else got[0]

    def _get(self, key: str, what: str, **extra: Any) -> tuple[bytes, str] | None:
        """The object's bytes (or the range ``extra`` asks for) and its etag; None if the
        key is missing."""
        try:
            reply = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key, **extra)
            with reply["Body"] as body:
                data: bytes = body.read()
            self.stats.add(received=len(data))
            return data, reply["ETag"]
        except bce.ClientError as e:
            if _code(e) == "NoSuchKey":
                return None
            self._fail(e, what)
        except Exception as e:
            self._fail(e, what)

    def _put_if_absent(self, key: str, data: bytes) -> str | None:
        for attempt in range(IN_FLIGHT_RETRIES + 1):
            try:
                reply = self._client.put_object(
                    Bucket=self.bucket,
                    Key=self.prefix + key,
                    Body=data,
                    ContentMD5=_md5(data),
                    IfNoneMatch="*",
                )
                return reply["ETag"]
            except bce.ClientError as e:
                if _status(e) == 412:
                    return None
                if _status(e) == 409 and attempt < IN_FLIGHT_RETRIES:
                    # Another create of this key is in flight (AWS): it lands or it
                    # fails; ask again once it has.
                    time.sleep(0.05 * 2**attempt)
                    continue
                self._fail(e, f"writing {key}")
            except Exception as e:
                self._fail(e, f"writing {key}")
        raise AssertionError("unreachable")

    def _put_if_match(self, key: str, data: bytes, etag: str) -> str:
        try:
            reply = self._client.put_object(
                Bucket=self.bucket,
                Key=self.prefix + key,
                Body=data,
                ContentMD5=_md5(data),
                IfMatch=etag,
            )
            return reply["ETag"]
        except bce.ClientError as e:
            if _status(e) in (412, 409) or _code(e) == "NoSuchKey":
                raise SwapFailed(self.url, key) from None
            self._fail(e, f"writing {key}")
        except Exception as e:
            self._fail(e, f"writing {key}")

    def _head(self, key: str) -> ObjectInfo | None:
        try:
            reply = self._client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except bce.ClientError as e:
            if _status(e) == 404:
                return None
            self._fail(e, f"looking at {key}")
        except Exception as e:
            self._fail(e, f"looking at {key}")
        modified = reply["LastModified"].astimezone(UTC)  # botocore gives local time
        return ObjectInfo(key, reply["ContentLength"], modified, reply["ETag"])

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        cut = len(self.prefix)
        args: dict[str, Any] = {
            "Bucket": self.bucket, "Prefix": self.prefix + prefix, "MaxKeys": LIST_PAGE,
        }  # fmt: skip
        while True:
            try:
                page = self._client.list_objects_v2(**args)
            except Exception as e:
                self._fail(e, f"listing {prefix or 'the keys'}")
            for item in page.get("Contents", []):
                yield ObjectInfo(
                    item["Key"][cut:], item["Size"], item["LastModified"].astimezone(UTC),
                    item.get("ETag"),
                )  # fmt: skip
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            args["ContinuationToken"] = token

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start : start + DELETE_BATCH]
            try:
                reply = self._client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self.prefix + k} for k in batch], "Quiet": True},
                )
            except Exception as e:
                self._fail(e, f"deleting {len(batch)} keys")
            errors = reply.get("Errors", [])
            if errors:
                first = errors[0]
                failed = AccessDenied if first.get("Code") in _DENIED else RemoteError
                raise failed(
                    f"{self.url}: deleting {first.get('Key', '?')[len(self.prefix) :]}: "
                    f"{first.get('Code', '?')} ({len(errors)} of {len(batch)} keys failed)"
                )


__all__ = ["S3Storage"]
