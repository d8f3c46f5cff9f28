"""An S3 bucket prefix (``s3://bucket/prefix``) as a small key-value store.

boto3 is imported when a bucket is opened, not when this module is: deploy code and the
supervisor import ``ups.bucket`` without paying for it. Credentials come from boto3's own
chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and
``~/.aws/credentials`` or ``AWS_SHARED_CREDENTIALS_FILE``, instance roles); the endpoint
from ``endpoint_url`` or boto3's ``AWS_ENDPOINT_URL``, so any S3-compatible store works.

Every failure of the network or the service is raised as :class:`BucketError` with the
operation, the key and the cause in one sentence; :class:`BucketUnreachable` (a subclass)
marks the ones worth another try (``ups.retry.bucket_retryable``).

Conditional writes (compare-and-swap on the object's ETag: :meth:`Bucket.put_if_absent`,
:meth:`Bucket.put_if_match`, :meth:`Bucket.delete_if_match`) raise
:class:`PreconditionFailed` when the key is not as the caller expected. Not every store
honours the conditions: AWS S3, Cloudflare R2, MinIO and moto do; ``rclone serve s3``
ignores them and writes anyway. :meth:`Bucket.honours_conditions` asks the store itself.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ups.bucket.credentials import RENEWABLE_ENV, CredentialsExpired, file_session
from ups.fsio import atomic_open

_CHUNK = 1 << 20
_CONFLICT_TRIES = 5
"""409 ConditionalRequestConflict: another conditional write on the key was in flight.
AWS says to retry; the retry then answers 412 or succeeds."""


class BucketError(RuntimeError):
    """An operation on the bucket failed; the message names the operation, key and cause."""


class BucketUnreachable(BucketError):
    """The endpoint did not answer, or answered with a server error or a throttle."""


class CredentialsLapsed(BucketUnreachable):
    """The credentials expired; worth another try where they are renewed (a host whose
    supervisor replaces its credentials file)."""


class PreconditionFailed(BucketError):
    """A conditional write found the key not as expected: another writer changed it (412),
    or it is gone (``missing``: 404 on If-Match)."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class Stored:
    """An object's bytes and the ETag they were read with (for a conditional write)."""

    data: bytes
    etag: str


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``. Raises ValueError."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(
            f"{url!r} is not a bucket URL: write s3://BUCKET or s3://BUCKET/PREFIX "
            "(endpoint_url points it at any S3-compatible store: R2, B2, MinIO)"
        )
    if parsed.query or parsed.fragment:
        raise ValueError(f"{url!r}: a bucket URL takes no '?' or '#' part")
    return parsed.netloc, parsed.path.strip("/")


_CREDENTIALS = (
    "the S3 credentials were refused: check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
    "AWS_PROFILE, and checkpoint_sync.endpoint_url"
)
_FIXES = {
    "InvalidAccessKeyId": _CREDENTIALS,
    "SignatureDoesNotMatch": _CREDENTIALS,
    "ExpiredToken": "the session token expired: renew the S3 credentials",
    "AccessDenied": "these credentials may not use this bucket or prefix: grant "
    "s3:ListBucket, s3:GetObject, s3:PutObject, s3:DeleteObject",
    "NoSuchBucket": "no such bucket: create it, or fix checkpoint_sync.url",
}
"""What to do about the errors a user can fix, by S3 error code."""


def _not_found(exc: Exception) -> bool:
    """The store said there is no such key (GET answers NoSuchKey, HEAD a bare 404)."""
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in {
        "NoSuchKey",
        "404",
    }


def _error_code(exc: Exception) -> str | None:
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return None
    return str(exc.response.get("Error", {}).get("Code", "")) or None


def _classify(what: str, key: str, exc: BaseException, *, renewable: bool = False) -> BucketError:
    """One sentence for a boto/botocore error; unreachable when another try may succeed
    (``renewable``: expired credentials too, the file they come from is renewed)."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionClosedError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(exc, CredentialsExpired):
        return CredentialsLapsed(f"{what} {key}: {exc}")
    if isinstance(exc, NoCredentialsError):
        return BucketError(
            f"{what} {key}: no S3 credentials found: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a profile in ~/.aws/credentials"
        )
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        code = str(err.get("Code", status))
        # The code and the fix first: a console line shows only the start of an error.
        text = f"{code} {what} {key}: {err.get('Message', '')}"
        if fix := _FIXES.get(code):
            text = f"{code} ({fix}) {what} {key}"
        if renewable and code == "ExpiredToken":
            return CredentialsLapsed(
                f"{text}: the host's credentials file is renewed by the run's supervisor"
            )
        if status >= 500 or status == 429 or code in {"SlowDown", "RequestTimeout"}:
            return BucketUnreachable(text)
        return BucketError(text)
    if isinstance(exc, FileNotFoundError):  # a local file (pruned meanwhile), not the bucket
        return BucketError(f"{what} {key}: {exc}")
    if isinstance(
        exc, EndpointConnectionError | ConnectionClosedError | ReadTimeoutError | OSError
    ):
        return BucketUnreachable(f"{what} {key}: endpoint unreachable ({exc})")
    if isinstance(exc, BotoCoreError):
        return BucketUnreachable(f"{what} {key}: {type(exc).__name__}: {exc}")
    return BucketError(f"{what} {key}: {type(exc).__name__}: {exc}")


@dataclass
class Bucket:
    """Keys are relative to the URL's prefix: ``put_bytes("r1/outcome.json", ...)``."""

    url: str
    name: str
    prefix: str
    endpoint_url: str | None = None
    _client: Any = field(default=None, repr=False)
    conditions: bool | None = None
    """Whether the store honours conditional writes, once :meth:`honours_conditions` asked."""
    renewable: bool = False
    """Credentials from a file that is renewed (``UPS_BUCKET_CREDENTIALS``): an expiry is
    worth waiting out."""

    @classmethod
    def open(cls, url: str, *, endpoint_url: str | None = None) -> Bucket:
        """A bucket prefix; nothing is contacted until the first operation."""
        name, prefix = parse_url(url)
        import boto3
        from botocore.config import Config as BotoConfig

        # boto3 retries throttles and 5xx itself ("standard" mode, 3 tries); a longer
        # outage is the caller's to wait out (ups.backoff.BUCKET_SYNC), so its timeouts are
        # short enough that training's uploader notices one within seconds.
        config = BotoConfig(
            retries={"mode": "standard", "max_attempts": 3},
            connect_timeout=5,
            read_timeout=60,
            s3={"addressing_style": "path"} if endpoint_url else None,
        )
        path = os.environ.get(RENEWABLE_ENV)
        session = boto3.session.Session(botocore_session=file_session(Path(path)) if path else None)
        client = session.client("s3", endpoint_url=endpoint_url, config=config)
        return cls(url, name, prefix, endpoint_url, client, renewable=bool(path))

    def _classify(self, what: str, key: str, exc: BaseException) -> BucketError:
        return _classify(what, key, exc, renewable=self.renewable)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, key: str, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, method)(Bucket=self.name, **kwargs)
        except Exception as exc:
            raise self._classify(what, self.url_of(key), exc) from exc

    def url_of(self, key: str) -> str:
        """The full ``s3://`` address of ``key``, for messages."""
        return f"s3://{self.name}/{self._key(key)}"

    def put_bytes(self, key: str, data: bytes) -> str:
        """Write ``key``; its new ETag."""
        response = self._call("writing", key, "put_object", Key=self._key(key), Body=data)
        return str(response.get("ETag", ""))

    def put_if_absent(self, key: str, data: bytes) -> str:
        """Create ``key`` only if it does not exist (``If-None-Match: *``); its new ETag.
        Raises :class:`PreconditionFailed` when it exists (on a store that honours it)."""
        return self._conditional("creating", key, "put_object", Body=data, IfNoneMatch="*")

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace ``key`` only if its ETag is still ``etag`` (``If-Match``); the new ETag.
        Raises :class:`PreconditionFailed` when someone wrote it since, or it is gone."""
        return self._conditional("replacing", key, "put_object", Body=data, IfMatch=etag)

    def delete_if_match(self, key: str, etag: str) -> None:
        """Delete ``key`` only if its ETag is still ``etag``; raises
        :class:`PreconditionFailed` when someone wrote it since, or it is gone."""
        self._conditional("deleting", key, "delete_object", IfMatch=etag)

    def _conditional(self, what: str, key: str, method: str, **kwargs: Any) -> str:
        for attempt in range(_CONFLICT_TRIES):
            try:
                response = getattr(self._client, method)(
                    Bucket=self.name, Key=self._key(key), **kwargs
                )
                return str(response.get("ETag", ""))
            except Exception as exc:
                code = _error_code(exc)
                if code == "ConditionalRequestConflict" and attempt + 1 < _CONFLICT_TRIES:
                    time.sleep(0.1 * (attempt + 1))  # a rival's conditional write in flight
                    continue
                if code in {"PreconditionFailed", "412"}:
                    raise PreconditionFailed(
                        f"{what} {self.url_of(key)}: another writer changed it first (412)"
                    ) from None
                if code in {"NoSuchKey", "404"} and "IfMatch" in kwargs:
                    raise PreconditionFailed(
                        f"{what} {self.url_of(key)}: it is gone (404)", missing=True
                    ) from None
                raise self._classify(what, self.url_of(key), exc) from exc
        raise AssertionError("unreachable: the last try returns or raises")

    def get_stored(self, key: str) -> Stored | None:
        """The object's bytes with its ETag, or None when there is no such key."""
        try:
            response = self._client.get_object(Bucket=self.name, Key=self._key(key))
            return Stored(response["Body"].read(), str(response.get("ETag", "")))
        except Exception as exc:
            if _not_found(exc):
                return None
            raise self._classify("reading", self.url_of(key), exc) from exc

    def honours_conditions(self, under: str) -> bool:
        """Whether the store honours conditional writes: an object is written under
        ``under``, then written again with ``If-None-Match: *``, which must answer 412.
        The answer is kept in :attr:`conditions`. Raises :class:`BucketError` when the
        store cannot be asked."""
        key = f"{under}/.conditions-probe-{secrets.token_hex(4)}"  # one per probe
        self.put_bytes(key, b"probe")
        try:
            self.put_if_absent(key, b"probe again")
            self.conditions = False
        except PreconditionFailed:
            self.conditions = True
        finally:
            self.delete(key)
        return self.conditions

    def endpoint(self) -> str:
        """The store's address, for messages: the endpoint URL, or AWS S3."""
        return self.endpoint_url or str(self._client.meta.endpoint_url)

    def get_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is no such key."""
        try:
            response = self._client.get_object(Bucket=self.name, Key=self._key(key))
            data: bytes = response["Body"].read()
            return data
        except Exception as exc:
            if _not_found(exc):
                return None
            raise self._classify("reading", self.url_of(key), exc) from exc

    def list(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, relative to the bucket prefix, sorted."""
        keys: list[str] = []
        strip = len(self._key("")) if self.prefix else 0
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.name, Prefix=self._key(prefix)
            )
            for page in pages:
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        except Exception as exc:
            raise self._classify("listing", self.url_of(prefix), exc) from exc
        return sorted(keys)

    def upload_file(self, path: Path, key: str) -> None:
        """Upload one local file (multipart when large: boto3's transfer manager)."""
        try:
            self._client.upload_file(str(path), self.name, self._key(key))
        except Exception as exc:
            raise self._classify(f"uploading {path} to", self.url_of(key), exc) from exc

    def download_file(self, key: str, path: Path) -> str:
        """Write the object to ``path`` atomically; returns its SHA-256 (hex). Raises
        BucketError when the key is absent."""
        digest = hashlib.sha256()
        try:
            body = self._client.get_object(Bucket=self.name, Key=self._key(key))["Body"]
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(path) as out:
                while chunk := body.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        except BucketError:
            raise
        except Exception as exc:
            raise self._classify("downloading", self.url_of(key), exc) from exc
        return digest.hexdigest()

    def modified(self, key: str) -> float | None:
        """When the object was last written (epoch seconds), or None when there is none."""
        try:
            head = self._client.head_object(Bucket=self.name, Key=self._key(key))
        except Exception as exc:
            if _not_found(exc):
                return None
            raise self._classify("reading", self.url_of(key), exc) from exc
        return float(head["LastModified"].timestamp())

    def delete(self, key: str) -> None:
        """Remove ``key``; an absent key is not an error (S3 semantics)."""
        self._call("deleting", key, "delete_object", Key=self._key(key))
