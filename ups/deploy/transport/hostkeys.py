"""Host key checking against a ups-managed known_hosts file.

Paramiko (and so Fabric) accepts unknown keys silently by default. ups records the key
on first contact and tells the user its fingerprint; a different key later is an error
that names the host, both fingerprints and the fix.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko

from ups.deploy.errors import HostKeyChanged
from ups.fsio import atomic_write_text


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint, as ``ssh-keygen -lf`` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """The name OpenSSH and paramiko use in known_hosts: ``host`` or ``[host]:port``."""
    return host if port == 22 else f"[{host}]:{port}"


def changed_key_message(name: str, expected: paramiko.PKey, got: paramiko.PKey, path: Path) -> str:
    return (
        f"host key for {name} CHANGED: recorded {expected.get_name()} {fingerprint(expected)}, "
        f"host now presents {got.get_name()} {fingerprint(got)}. This is expected after the "
        "instance was recreated; otherwise someone may be intercepting the connection. If you "
        f"trust the new key, remove the old one with `ssh-keygen -R '{name}' -f {path}` and "
        "deploy again."
    )


class RecordFirstKeyPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko is untyped
    """Record an unknown host's key in ``path`` and report it; refuse a different key type.

    Paramiko itself raises ``BadHostKeyException`` when a recorded key of the same type
    differs; :func:`ups.deploy.transport.connect` turns that into :class:`HostKeyChanged`.
    """

    def __init__(self, path: Path, on_new_key: Callable[[str, paramiko.PKey], None]) -> None:
        self.path = path
        self.on_new_key = on_new_key

    def missing_host_key(self, client: Any, hostname: str, key: paramiko.PKey) -> None:
        recorded = client.get_host_keys().lookup(hostname) or {}
        if recorded:
            # Known host, but no key of this type recorded: a different key, not a new host.
            expected = next(iter(recorded.values()))
            raise HostKeyChanged(changed_key_message(hostname, expected, key, self.path))
        client.get_host_keys().add(hostname, key.get_name(), key)
        save_host_keys(client.get_host_keys(), self.path)
        self.on_new_key(hostname, key)


def save_host_keys(keys: paramiko.HostKeys, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = [
        f"{host} {key.get_name()} {key.get_base64()}\n"
        for host in keys
        for key in keys[host].values()
    ]
    atomic_write_text(path, "".join(lines), mode=0o600)


def load_into(client: paramiko.SSHClient, path: Path) -> None:
    """Load ``path`` (if it exists) as the client's own host keys."""
    if path.exists():
        client.load_host_keys(str(path))
