"""Open a verified Fabric connection to a host from hosts.yaml, with retries and keepalive."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
from fabric import Config, Connection

from ups.deploy.errors import DeployError, HostKeyChanged
from ups.deploy.hostkeys import (
    RecordFirstKeyPolicy,
    changed_key_message,
    fingerprint,
    known_hosts_name,
    load_into,
)
from ups.deploy.hosts import HostSpec
from ups.log import get_logger

NewKeyCallback = Callable[[str, paramiko.PKey], None]


def _log_new_key(name: str, key: paramiko.PKey) -> None:
    get_logger("ups.deploy").warning(
        "recorded new host key (first contact): compare with the provider's console",
        host=name,
        key_type=key.get_name(),
        fingerprint=fingerprint(key),
    )


def _connection(
    spec: HostSpec, known_hosts: Path, on_new_key: NewKeyCallback, timeout: float
) -> Connection:
    connect_kwargs: dict[str, Any] = {"banner_timeout": timeout, "auth_timeout": timeout}
    if spec.key:
        connect_kwargs["key_filename"] = str(Path(spec.key).expanduser())
    gateway = None
    if spec.jump:
        user, _, rest = spec.jump.rpartition("@")
        hostname, _, port = rest.partition(":")
        jump = spec.model_copy(
            update={"host": hostname, "port": int(port) if port else 22, "user": user or None}
        )
        gateway = _connection(
            jump.model_copy(update={"jump": None}), known_hosts, on_new_key, timeout
        )
    extra: dict[str, Any] = {}
    if spec.ssh_config:
        extra["config"] = Config(runtime_ssh_path=str(Path(spec.ssh_config).expanduser()))
    conn = Connection(
        spec.host,
        user=spec.user,
        port=spec.port,
        connect_kwargs=connect_kwargs,
        connect_timeout=timeout,
        gateway=gateway,
        **extra,
    )
    load_into(conn.client, known_hosts)
    conn.client.set_missing_host_key_policy(RecordFirstKeyPolicy(known_hosts, on_new_key))
    return conn


def connect(
    spec: HostSpec,
    known_hosts: Path,
    *,
    attempts: int = 3,
    backoff_s: float = 1.0,
    on_new_key: NewKeyCallback = _log_new_key,
) -> Connection:
    """Return an open, host-key-verified connection, retrying transient failures.

    Vast instances refuse SSH for a minute after they report running, so network errors
    are retried with exponential backoff; auth and host-key problems are not.
    """
    log = get_logger("ups.deploy")
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        conn = _connection(spec, known_hosts, on_new_key, spec.connect_timeout)
        try:
            conn.open()
        except paramiko.BadHostKeyException as err:
            conn.close()
            name = known_hosts_name(conn.host, int(conn.port))
            raise HostKeyChanged(
                changed_key_message(name, err.expected_key, err.key, known_hosts)
            ) from None
        except HostKeyChanged:
            conn.close()
            raise
        except paramiko.AuthenticationException as err:
            conn.close()
            raise DeployError(
                f"host {spec.name!r} ({_address(spec)}) rejected our key: {err}. Check 'key' "
                "and 'user' in hosts.yaml, or add your public key on the host (Vast: account "
                "SSH keys)."
            ) from None
        except (TimeoutError, OSError, paramiko.SSHException, EOFError) as err:
            conn.close()
            last = err
            if attempt < attempts:
                log.warning(
                    "ssh connect failed, retrying", host=spec.name, attempt=attempt, error=str(err)
                )
                time.sleep(backoff_s * 2 ** (attempt - 1))
            continue
        assert conn.transport is not None
        conn.transport.set_keepalive(spec.keepalive_s)
        return conn
    raise DeployError(
        f"host {spec.name!r} is unreachable at {_address(spec)} after {attempts} attempts: "
        f"{last}. Check that the instance is running and the address/port in hosts.yaml "
        "(Vast: `vastai show instance ID` shows ssh_host and ssh_port)."
    )


def _address(spec: HostSpec) -> str:
    user = f"{spec.user}@" if spec.user else ""
    port = f":{spec.port}" if spec.port else ""
    return f"{user}{spec.host}{port}"
