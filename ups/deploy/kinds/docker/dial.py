"""A Docker SDK client for the remote daemon, tunnelled through our verified SSH transport.

The SDK's own ``ssh://`` support opens a second, unverified SSH connection. Instead each
HTTP connection here is an exec channel running ``docker system dial-stdio`` (what the
docker CLI does for ``ssh://`` hosts) on the transport ``ups.deploy.transport.connect`` opened.
"""

from __future__ import annotations

from typing import Any

import docker
import paramiko
import urllib3
from docker.transport.basehttpadapter import BaseHTTPAdapter

from ups.deploy.kinds.docker.commands import dial_stdio_command

API_VERSION = "1.41"
"""Docker 20.10+; new enough for everything deploy does."""


class _DialStdioConnection(urllib3.connection.HTTPConnection):
    def __init__(self, transport: paramiko.Transport, command: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.transport = transport
        self.command = command
        self.channel_timeout = timeout

    def connect(self) -> None:
        chan = self.transport.open_session()
        chan.settimeout(self.channel_timeout)
        chan.exec_command(self.command)
        self.sock = chan


class _Pool(urllib3.connectionpool.HTTPConnectionPool):
    def __init__(self, transport: paramiko.Transport, command: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout, maxsize=4)
        self.transport = transport
        self.command = command
        self.channel_timeout = timeout

    def _new_conn(self) -> _DialStdioConnection:
        return _DialStdioConnection(self.transport, self.command, self.channel_timeout)


class _Adapter(BaseHTTPAdapter):  # type: ignore[misc]  # docker is untyped
    def __init__(self, transport: paramiko.Transport, command: str, timeout: float) -> None:
        self.pool = _Pool(transport, command, timeout)
        super().__init__()

    def get_connection(self, url: Any, proxies: Any = None) -> _Pool:
        return self.pool

    def close(self) -> None:
        self.pool.close()


def remote_client(
    transport: paramiko.Transport, docker_host: str | None = None, timeout: float = 600
) -> Any:
    """A ``docker.DockerClient`` whose every request goes to the remote daemon over SSH."""
    command = dial_stdio_command(docker_host)
    # A unix URL that is never dialled: the adapter mounted below answers every request.
    client = docker.DockerClient(
        base_url="unix:///nonexistent", version=API_VERSION, timeout=int(timeout)
    )
    adapter = _Adapter(transport, command, timeout)
    client.api.mount("http+docker://ssh", adapter)
    client.api.base_url = "http+docker://ssh"
    client.api._custom_adapter = adapter
    return client
