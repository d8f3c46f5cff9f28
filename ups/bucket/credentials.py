"""S3 credentials for a remote run: found where boto3 finds them here, sent as a 0600 file.

Deploy resolves the laptop's credentials with boto3's own chain (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` with
``~/.aws/credentials`` or ``~/.aws/config``, SSO) and writes them on the host as a shared
credentials file (mode 0600, over the verified SSH connection); the run script points
``AWS_SHARED_CREDENTIALS_FILE`` at it. The keys are never in a create request, an
environment, an onstart script, a command line, a log or the image.
"""

from __future__ import annotations

from collections.abc import Mapping

FILE_NAME = "aws_credentials"
"""In the run's state directory on the host, beside ``secrets.env``."""


class NoCredentials(RuntimeError):
    """No S3 credentials could be found on this machine."""


def endpoint_from_env(env: Mapping[str, str]) -> str | None:
    """The endpoint boto3 would use here for S3 from the environment (``AWS_ENDPOINT_URL_S3``
    first, as boto3 does), so the host uses the same store."""
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def credentials_file_text(url: str) -> str:
    """This machine's credentials as a shared credentials file (``[default]`` profile).
    Raises :class:`NoCredentials` naming where they are looked for."""
    import boto3

    found = boto3.session.Session().get_credentials()
    frozen = found.get_frozen_credentials() if found is not None else None
    if frozen is None or not frozen.access_key or not frozen.secret_key:
        raise NoCredentials(
            f"checkpoint_sync {url} needs S3 credentials on this machine: set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE naming a profile in "
            "~/.aws/credentials (deploy sends them to the host as a 0600 file)"
        )
    lines = [
        "[default]",
        f"aws_access_key_id = {frozen.access_key}",
        f"aws_secret_access_key = {frozen.secret_key}",
    ]
    if frozen.token:
        lines.append(f"aws_session_token = {frozen.token}")
    return "\n".join(lines) + "\n"
