"""S3 credentials for a remote run: written by deploy as a 0600 file, read by the run there.

Deploy writes the host's credentials (minted for the run, or this machine's own keys:
:mod:`ups.bucket.scoped`, docs/security.md) as a shared credentials file over the
verified SSH connection; the run script points ``AWS_SHARED_CREDENTIALS_FILE`` (any boto3
in the run) and ``UPS_BUCKET_CREDENTIALS`` (ups's own bucket client) at it. The keys are
never in a create request, an environment, an onstart script, a command line, a log or
the image.

Minted credentials carry their expiry (``ups_expiration``, which boto3 ignores). ups's
client on the host reads them as botocore ``RefreshableCredentials`` that read the file
again as the expiry nears, so the supervisor's renewal (it replaces the file) is picked
up without a restart; once the file's credentials have expired, every request fails with
:class:`CredentialsExpired` until it is renewed.
"""

from __future__ import annotations

import configparser
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FILE_NAME = "aws_credentials"
"""In the run's state directory on the host, beside ``secrets.env``."""
RENEWABLE_ENV = "UPS_BUCKET_CREDENTIALS"
"""The credentials file ups's bucket client reads (and reads again as its expiry nears)."""
_EXPIRATION = "ups_expiration"


class NoCredentials(RuntimeError):
    """No S3 credentials could be found on this machine."""


class CredentialsExpired(RuntimeError):
    """The credentials file's credentials have expired and were not renewed (yet)."""


@dataclass(frozen=True)
class Keys:
    """One set of S3 credentials; ``expires`` (epoch) for minted ones."""

    access_key: str
    secret_key: str
    token: str | None = None
    expires: float | None = None

    def file_text(self) -> str:
        """As a shared credentials file (``[default]`` profile)."""
        lines = [
            "[default]",
            f"aws_access_key_id = {self.access_key}",
            f"aws_secret_access_key = {self.secret_key}",
        ]
        if self.token:
            lines.append(f"aws_session_token = {self.token}")
        if self.expires is not None:
            lines.append(f"{_EXPIRATION} = {iso(self.expires)}")
        return "\n".join(lines) + "\n"


def iso(epoch: float) -> str:
    """``2026-11-26T01:23:28Z``"""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_file(text: str, where: str) -> Keys:
    """The ``[default]`` profile of a credentials file written by :meth:`Keys.file_text`."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text, source=where)
        section = parser["default"]
        expires = section.get(_EXPIRATION)
        return Keys(
            access_key=section["aws_access_key_id"],
            secret_key=section["aws_secret_access_key"],
            token=section.get("aws_session_token"),
            expires=datetime.fromisoformat(expires).timestamp() if expires else None,
        )
    except (configparser.Error, KeyError, ValueError) as err:
        raise NoCredentials(f"{where} is not a credentials file ups wrote: {err}") from None


def endpoint_from_env(env: Mapping[str, str]) -> str | None:
    """The endpoint boto3 would use here for S3 from the environment (``AWS_ENDPOINT_URL_S3``
    first, as boto3 does), so the host uses the same store."""
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def account_keys(url: str) -> Keys:
    """This machine's credentials, found where boto3 finds them. Raises
    :class:`NoCredentials` naming where they are looked for."""
    import boto3

    found = boto3.session.Session().get_credentials()
    frozen = found.get_frozen_credentials() if found is not None else None
    if frozen is None or not frozen.access_key or not frozen.secret_key:
        raise NoCredentials(
            f"checkpoint_sync {url} needs S3 credentials on this machine: set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE naming a profile in "
            "~/.aws/credentials (deploy sends them, or credentials minted from them, to the "
            "host as a 0600 file)"
        )
    return Keys(frozen.access_key, frozen.secret_key, frozen.token or None)


def _read(path: Path, *, fresh: bool = True) -> Keys:
    """The file's keys; with ``fresh``, :class:`CredentialsExpired` once they expired."""
    try:
        keys = parse_file(path.read_text(), str(path))
    except OSError as err:
        raise NoCredentials(f"the bucket credentials file {path}: {err.strerror}") from None
    if fresh and keys.expires is not None and keys.expires <= time.time():
        raise CredentialsExpired(
            f"the bucket credentials expired at {iso(keys.expires)} and were not renewed: "
            "the run's supervisor renews them (`fab deploy` or `ups deploy` of this run, or its "
            "`--detach` supervisor, must be running); uploads catch up once it has"
        )
    return keys


def _metadata(path: Path, *, fresh: bool = True) -> dict[str, Any]:
    keys = _read(path, fresh=fresh)
    assert keys.expires is not None  # only renewable files are read again
    return {
        "access_key": keys.access_key,
        "secret_key": keys.secret_key,
        "token": keys.token or "",
        "expiry_time": iso(keys.expires),
    }


class _Quiet(logging.Filter):
    """botocore logs a failed mandatory refresh with a traceback each time; the uploader
    names an expiry itself (``checkpoint_sync_failed``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, CredentialsExpired)


def file_session(path: Path) -> Any:
    """A botocore session whose credentials come from ``path``: read once when they do not
    expire, else read again whenever botocore finds them near their expiry (a renewal on
    the host is picked up by the running process)."""
    import botocore.session
    from botocore.credentials import CredentialProvider, Credentials, RefreshableCredentials

    class FileProvider(CredentialProvider):  # type: ignore[misc]  # botocore is untyped
        METHOD = CANONICAL_NAME = "ups-credentials-file"

        def load(self) -> Credentials | None:
            if not path.is_file():
                return None  # the rest of boto3's chain
            keys = _read(path, fresh=False)  # expired: the first request says so
            if keys.expires is None:
                return Credentials(keys.access_key, keys.secret_key, keys.token, self.METHOD)
            return RefreshableCredentials.create_from_metadata(
                _metadata(path, fresh=False),
                refresh_using=lambda: _metadata(path),
                method=self.METHOD,
            )

    logger = logging.getLogger("botocore.credentials")
    if not any(isinstance(f, _Quiet) for f in logger.filters):
        logger.addFilter(_Quiet())
    session = botocore.session.get_session()
    session.get_component("credential_provider").insert_before("env", FileProvider())
    return session
