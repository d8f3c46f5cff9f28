"""An S3 server on loopback that honours conditional writes (``If-None-Match: *``,
``If-Match``), for the fenced lease: moto's server mode (``ThreadedMotoServer``) in a
thread of the test process, on a port the kernel picks. ``rclone serve s3``
(tests/s3_server.py) ignores those conditions; the two together cover both kinds of store.

Its objects live in this process's memory, so other processes reach them over HTTP like
any store. Credentials are random per server (moto accepts any) and reach boto3 through
the environment, as with tests/s3_server.py.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


class MotoServer:
    """One moto S3 server; ``bucket`` exists once it has started."""

    def __init__(self, root: Path, bucket: str | None = None) -> None:
        # moto keeps every server's objects in one in-process store: a bucket of its own
        # per server, or a test sees the objects an earlier test on this worker left.
        self.root, self.bucket = root, bucket or f"ups-test-{secrets.token_hex(4)}"
        self.access_key = "UPSTEST" + secrets.token_hex(8).upper()
        self.secret_key = "ups-test-secret-" + secrets.token_hex(16)
        self.port = 0
        self._server: Any = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, prefix: str = "runs") -> str:
        return f"s3://{self.bucket}/{prefix}"

    def client_env(self) -> dict[str, str]:
        """What a client process needs (boto3's chain reads it); no ~/.aws file applies."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_SHARED_CREDENTIALS_FILE": str(self.root / "no-credentials"),
            "AWS_CONFIG_FILE": str(self.root / "no-config"),
        }

    def start(self) -> None:
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.port = int(self._server.get_host_and_port()[1])
        boto3.session.Session(
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        ).client("s3", endpoint_url=self.endpoint_url).create_bucket(Bucket=self.bucket)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


@pytest.fixture
def moto_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoServer]:
    """A running moto S3 server; this process's boto3 gets its credentials from the
    environment."""
    server = MotoServer(tmp_path / "moto")
    for key, value in server.client_env().items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
