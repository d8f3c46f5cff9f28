"""Open a verified Fabric connection to a host from hosts.yaml, with retries and keepalive."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
import tenacity
from fabric import Config, Connection

from ups.backoff import SSH_CONNECT
from ups.deploy.entries import AddressedHost
from ups.deploy.errors import DeployError, HostKeyChanged, UsageError
from ups.deploy.transport.hostkeys import (
    RecordFirstKeyPolicy,
    changed_key_message,
    fingerprint,
    known_hosts_name,
    load_into,
)
from ups.log import get_logger

NewKeyCallback = Callable[[str, paramiko.PKey], None]


def _log_new_key(name: str, key: paramiko.PKey) -> None:
    get_logger("ups.deploy").warning(
        "host_key_recorded",
        message="recorded new host key (first contact): compare with the provider's console",
        host=name,
        key_type=key.get_name(),
        fingerprint=fingerprint(key),
    )


def _connection(
    spec: AddressedHost, known_hosts: Path, on_new_key: NewKeyCallback, timeout: float
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


_TRANSIENT = (TimeoutError, OSError, paramiko.SSHException, EOFError)
"""Network trouble worth retrying (a Vast instance still starting its sshd)."""


def check_key_file(spec: AddressedHost) -> None:
    """Refuse a ``key`` that is missing or unreadable before trying to connect with it."""
    if not spec.key:
        return
    path = Path(spec.key).expanduser()
    try:
        path.open("rb").close()
    except OSError as err:
        raise UsageError(
            f"key file {path} for host {spec.name!r} cannot be read ({err.strerror}). Fix "
            "'key' in hosts.yaml (the private key, not the .pub), or create one with "
            f"`ssh-keygen -t ed25519 -f {path}` and add its .pub on the host."
        ) from None


def connect(
    spec: AddressedHost,
    known_hosts: Path,
    *,
    attempts: int = 3,
    backoff_s: float = SSH_CONNECT.first,
    on_new_key: NewKeyCallback = _log_new_key,
) -> Connection:
    """Return an open, host-key-verified connection, retrying transient failures.

    Vast instances refuse SSH for a minute after they report running, so network errors
    are retried with exponential backoff (tenacity); auth and host-key problems are not.
    """
    check_key_file(spec)
    log = get_logger("ups.deploy")

    def before_sleep(state: tenacity.RetryCallState) -> None:
        assert state.outcome is not None
        log.warning(
            "ssh_connect_retry",
            host=spec.name,
            attempt=state.attempt_number,
            error=str(state.outcome.exception()),
        )

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(_TRANSIENT),
        stop=tenacity.stop_after_attempt(attempts),
        wait=SSH_CONNECT.with_(first=backoff_s).wait(),
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        conn: Connection = retrying(_open, spec, known_hosts, on_new_key)
    except _TRANSIENT as err:
        raise DeployError(
            f"host {spec.name!r} is unreachable at {_address(spec)} after {attempts} attempts: "
            f"{err}. Check that the instance is running and the address/port in hosts.yaml "
            "(Vast: `vastai show instance ID` shows ssh_host and ssh_port)."
        ) from None
    return conn


def _open(spec: AddressedHost, known_hosts: Path, on_new_key: NewKeyCallback) -> Connection:
    """One connection attempt; host-key and auth failures become final DeployErrors."""
    conn = _connection(spec, known_hosts, on_new_key, spec.connect_timeout)
    try:
        conn.open()
    except paramiko.BadHostKeyException as err:
        conn.close()
        name = known_hosts_name(conn.host, int(conn.port))
        raise HostKeyChanged(
            changed_key_message(name, err.expected_key, err.key, known_hosts)
        ) from None
    except paramiko.AuthenticationException as err:
        conn.close()
        raise DeployError(
            f"host {spec.name!r} ({_address(spec)}) rejected our key: {err}. Check 'key' "
            "and 'user' in hosts.yaml, or add your public key on the host (Vast: account "
            "SSH keys)."
        ) from None
    except BaseException:
        conn.close()
        raise
    assert conn.transport is not None
    conn.transport.set_keepalive(spec.keepalive_s)
    return conn


def _address(spec: AddressedHost) -> str:
    user = f"{spec.user}@" if spec.user else ""
    port = f":{spec.port}" if spec.port else ""
    return f"{user}{spec.host}{port}"
