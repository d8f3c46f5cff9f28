"""Bucket credentials for a host ups does not trust: minted per run, limited to the run's
prefix and short-lived (docs/security.md).

:class:`Access` says what a host gets (printable, in the deploy plan); :func:`keys_for`
turns it into keys on this machine: the user's own (``account``), or, for ``scoped``,
credentials minted from them with AWS STS ``GetFederationToken`` (an IAM user's keys, no
role to set up) or ``AssumeRole`` (``role_arn``; MinIO implements it), both with an inline
session policy (:func:`policy_document`): get, put and delete under
``<prefix>/<run_id>/``, list with that prefix only. What the session may do is the
intersection of that policy and the user's own permissions.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Literal

from ups.bucket.credentials import Keys, NoCredentials, account_keys
from ups.bucket.store import parse_url

MIN_S = 900
"""STS's shortest lifetime (15 minutes)."""
FEDERATION_MAX_S = 36 * 3600
"""GetFederationToken's longest lifetime for an IAM user's keys."""
ASSUME_ROLE_MAX_S = 3600
"""A role's default ``MaxSessionDuration`` (a role may allow up to 12 h:
``credentials_hours`` asks for more)."""
ROLE_LONGEST_S = 12 * 3600
"""AssumeRole's longest lifetime, for a role whose ``MaxSessionDuration`` allows it."""
MARGIN_S = 1800
"""Past the run's deadline: the final uploads and clock skew."""


class MintRefused(RuntimeError):
    """The store would not mint scoped credentials (no STS, or not allowed)."""


@dataclass(frozen=True)
class Access:
    """What a host gets to reach the run's bucket prefix: keys minted for the run
    (``scoped``) or this machine's own (``account``)."""

    mode: Literal["scoped", "account"]
    url: str
    """``checkpoint_sync.url``; the run's objects are under ``<url>/<run_id>/``."""
    run_id: str
    endpoint_url: str | None = None
    role_arn: str | None = None
    hours: float | None = None
    """Asked lifetime (``credentials_hours``); None: until ``until`` plus a margin."""
    until: float | None = None
    """The run's deadline (epoch), when it has one (``max_hours`` on a rented host)."""
    renew_before_s: float | None = None

    @property
    def method(self) -> str:
        return f"AssumeRole {self.role_arn}" if self.role_arn else "GetFederationToken"

    @property
    def prefix_url(self) -> str:
        return f"{self.url.rstrip('/')}/{self.run_id}/"

    def lifetime_s(self, now: float) -> int:
        """How long freshly minted keys should live: the asked hours, else up to the run's
        deadline plus :data:`MARGIN_S`, within what the method allows."""
        most = ASSUME_ROLE_MAX_S if self.role_arn else FEDERATION_MAX_S
        if self.hours is not None:  # asked: up to a role's own MaxSessionDuration (<= 12 h)
            most = ROLE_LONGEST_S if self.role_arn else FEDERATION_MAX_S
            wanted = self.hours * 3600
        elif self.until is not None:
            wanted = self.until - now + MARGIN_S
        else:
            wanted = most
        return int(max(MIN_S, min(wanted, most)))

    def renew_due(self, expires: float, now: float) -> bool:
        """Whether keys that expire at ``expires`` should be replaced now: they end before
        the run's deadline (plus margin) and less than ``renew_before_s`` (default: half a
        lifetime) is left of them."""
        if self.mode != "scoped" or (self.until is not None and expires >= self.until + MARGIN_S):
            return False
        before = self.renew_before_s or self.lifetime_s(now) / 2
        return expires - now <= before

    def describe(self, now: float) -> str:
        """The secret as the plan lists it: scope and expiry, never a value."""
        if self.mode == "account":
            return (
                "this machine's own S3 keys: everything they reach, until you revoke them "
                "(checkpoint_sync.credentials: account)"
            )
        hours = self.lifetime_s(now) / 3600
        renewed = "renewed by the supervisor before they expire" if self.until else "not renewed"
        return (
            f"minted for this run ({self.method}): get/put/delete under {self.prefix_url}, "
            f"list that prefix only; expire {hours:.2f} h after minting, {renewed}"
        )


def policy_document(url: str, run_id: str) -> dict[str, Any]:
    """The session policy: objects under ``<prefix>/<run_id>/`` only, and listing with that
    prefix only (multipart uploads included: boto3 sends big files in parts)."""
    bucket, prefix = parse_url(url)
    under = f"{prefix}/{run_id}/" if prefix else f"{run_id}/"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "RunObjects",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                ],
                "Resource": f"arn:aws:s3:::{bucket}/{under}*",
            },
            {
                "Sid": "ListRunPrefix",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"{under}*"}},
            },
        ],
    }


def session_name(run_id: str) -> str:
    """A federated user or role session name STS accepts (``[\\w+=,.@-]``, 2 to 32)."""
    return ("ups-" + re.sub(r"[^\w+=,.@-]", "-", run_id))[:32]


def keys_for(access: Access, now: float | None = None) -> Keys:
    """The keys a host gets: this machine's own, or minted from them for ``access``.
    Raises :class:`NoCredentials` (none here) or :class:`MintRefused`."""
    if access.mode == "account":
        return account_keys(access.url)
    return mint(access, access.lifetime_s(time.time() if now is None else now))


def mint(access: Access, lifetime_s: int) -> Keys:
    """Scoped credentials from STS at the bucket's endpoint (AWS's when none is set)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    account_keys(access.url)  # none here: say where they are looked for
    session = boto3.session.Session()
    sts = session.client(
        "sts", endpoint_url=access.endpoint_url, region_name=session.region_name or "us-east-1"
    )
    policy = json.dumps(policy_document(access.url, access.run_id), separators=(",", ":"))
    name = session_name(access.run_id)
    try:
        if access.role_arn:
            answer = sts.assume_role(
                RoleArn=access.role_arn,
                RoleSessionName=name,
                Policy=policy,
                DurationSeconds=lifetime_s,
            )
        else:
            answer = sts.get_federation_token(Name=name, Policy=policy, DurationSeconds=lifetime_s)
    except NoCredentialsError:
        raise NoCredentials(f"checkpoint_sync {access.url}: no S3 credentials here") from None
    except (ClientError, BotoCoreError) as err:
        where = access.endpoint_url or "AWS"
        hint = (
            ""
            if access.role_arn
            else " (GetFederationToken needs an IAM user's long-term keys: with temporary or "
            "SSO credentials, set checkpoint_sync.role_arn to a role they may assume)"
        )
        raise MintRefused(
            f"could not mint credentials scoped to {access.prefix_url} with STS "
            f"{access.method} at {where}: {err}{hint}. ups sends your own S3 keys to a "
            "rented host only when told to: set checkpoint_sync.credentials: account to "
            "accept that (docs/security.md says what it exposes), or use a store with STS "
            "(AWS S3; MinIO with checkpoint_sync.role_arn)"
        ) from None
    found = answer["Credentials"]
    return Keys(
        access_key=found["AccessKeyId"],
        secret_key=found["SecretAccessKey"],
        token=found["SessionToken"],
        expires=found["Expiration"].timestamp(),
    )
