"""Deploy targets: ``configs/hosts.yaml`` maps a name to an SSH address and how to run there.

Example entry (see configs/hosts.yaml)::

    known_hosts: ~/.config/ups/known_hosts   # ups-managed, first contact records the key
    hosts:
      vast:
        host: ssh6.vast.ai        # address, or an alias from ~/.ssh/config
        port: 10538
        user: root
        key: ~/.ssh/id_ed25519
        kind: container           # the host runs the ups image itself (normal Vast instance)
        image: ghcr.io/you/ups:0.1.0
        workdir: /workspace/ups
        gpus: 2
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ups.bucket.store import parse_url
from ups.deploy.errors import UsageError

DEFAULT_HOSTS_FILE = Path("configs/hosts.yaml")
DEFAULT_KNOWN_HOSTS = Path("~/.config/ups/known_hosts")

HostKind = Literal["container", "docker", "vast"]
HOST_KINDS = ("container", "docker", "vast")

_DOCKER = frozenset({"docker"})
_VAST = frozenset({"vast"})
KIND_FIELDS: dict[str, frozenset[str]] = {
    # An address: ups rents the vast instance, so it has none in hosts.yaml.
    **dict.fromkeys(("host", "port", "jump"), frozenset({"container", "docker"})),
    **dict.fromkeys(
        (
            "registry",
            "compose_files",
            "compose_service",
            "preflight_service",
            "container_user",
            "runs_dir",
            "docker_host",
        ),
        _DOCKER,
    ),
    **dict.fromkeys(
        (
            "offer",
            "order",
            "max_price_per_hour",
            "disk_gb",
            "interruptible",
            "max_hours",
            "on_exit",
            "setup",
            "vast_url",
            "watchdog_key_file",
            "watchdog_grace_s",
            "boot_timeout_s",
            "max_recoveries",
            "checkpoint_sync",
            "sync_every_s",
            "monitor_s",
            "ssh_lost_s",
        ),
        _VAST,
    ),
}
"""The keys only some kinds take; every other key is shared (SSH, image, workdir...)."""

_SAFE = re.compile(r"[A-Za-z0-9_./~][A-Za-z0-9_./@:+=-]*")


def _shell_safe(value: str) -> str:
    """Names and paths that reach remote commands: quoted there anyway, refused here early."""
    if not _SAFE.fullmatch(value) or ".." in value.split("/"):
        raise ValueError(
            f"{value!r} may only hold letters, digits and '_ . / ~ @ : + = -' (no spaces, "
            "quotes, ';', '$', '|' or '..'): it is used in commands on the host"
        )
    return value


SafeWord = Annotated[str, AfterValidator(_shell_safe)]
"""A value deploy puts into remote commands: an executable, a path, a service name."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HostSpec(_Strict):
    """One deploy target."""

    name: str = ""
    """The key in hosts.yaml (filled in by the loader)."""
    host: str = ""
    """Address or ``~/.ssh/config`` alias (its HostName, Port, User, IdentityFile apply)."""
    port: int | None = Field(None, ge=1, le=65535)
    user: str | None = None
    key: str | None = None
    """Private key file; default: the ssh agent and ``~/.ssh/id_*``."""
    jump: str | None = None
    """Jump host as ``user@host:port`` (like ``ssh -J``)."""
    kind: HostKind = "container"
    """``container``: the host is the ups image (Vast instance); ``docker``: it runs a daemon."""
    image: SafeWord = "ups:latest"
    """Image reference the host runs (container) or receives (docker)."""
    workdir: SafeWord = "/workspace/ups"
    """Remote directory that holds configs/, data/ and runs/."""
    rdzv_address: SafeWord | None = None
    """Address the other hosts of a multi-host job reach this one at, when it is node 0
    (default: ``host``; set it when ``host`` is an SSH proxy, as on Vast)."""
    gpus: int = Field(0, ge=0)
    """GPUs the run uses; 0 lets ``ups launch`` decide (2 CPU ranks without a GPU)."""
    ups_bin: SafeWord = "ups"
    """The ``ups`` executable on a container host."""
    remote_env: str | None = None
    """Shell line run before every remote command (e.g. ``. /opt/venv/bin/activate``)."""
    registry: str | None = None
    """docker kind: push ``image`` here and pull it remotely instead of shipping layers."""
    compose_files: list[SafeWord] = Field(default_factory=lambda: ["docker-compose.yml"])
    """docker kind: local compose files, uploaded into ``workdir`` (``-f`` in this order)."""
    compose_service: SafeWord = "train-ddp"
    preflight_service: SafeWord = "preflight"
    container_user: SafeWord | None = "1000:1000"
    """docker kind: uid:gid the image runs as; deploy chowns the runs directory to it."""
    runs_dir: SafeWord = "runs"
    """docker kind: host directory (relative to ``workdir``) mounted as the runs volume."""
    docker_host: str | None = None
    """docker kind: remote ``DOCKER_HOST`` when the daemon is not on the default socket."""
    ssh_config: str | None = None
    """OpenSSH client config to read aliases from (default: ``~/.ssh/config``)."""
    connect_timeout: float = Field(10.0, gt=0)
    keepalive_s: int = Field(5, ge=1)

    # kind: vast -- no address: ups rents one (ups/deploy/vast/, docs/vast.md).
    offer: str | None = None
    """vast: offer query in `vastai search offers` syntax (``gpu_name=RTX_4090 num_gpus=2``)."""
    order: str = "dph_total"
    """vast: sort order of the search; the first offer under the price cap is taken."""
    max_price_per_hour: float | None = Field(None, gt=0)
    """vast: price cap in $/h (``dph_total`` on demand, the bid when interruptible)."""
    disk_gb: float = Field(32.0, gt=0)
    interruptible: bool | float = False
    """vast: ``true`` bids the offer's minimum bid; a number bids that many $/h."""
    max_hours: float = Field(12.0, gt=0)
    """vast: the instance-side watchdog stops the run and ends the instance after this."""
    on_exit: Literal["destroy", "stop", "keep"] = "destroy"
    setup: str | None = None
    """vast: shell command run in ``workdir`` before preflight (e.g. fetch the data)."""
    vast_url: str | None = None
    """vast: API server (default: the SDK's, console.vast.ai)."""
    watchdog_key_file: str | None = None
    """vast: local file with a scoped API key for the watchdog (else the instance's own)."""
    watchdog_grace_s: float = Field(300.0, ge=0)
    """vast: after a run ends, how long the watchdog leaves for a laptop to fetch it."""
    boot_timeout_s: float = Field(900.0, gt=0)
    """vast: from create to SSH answering (image pull, boot, key install) before giving up."""
    max_recoveries: int = Field(3, ge=0)
    """vast: new instances (or in-place relaunches) after an outbid, a vanished host or a
    retryable crash, before giving up with exit 8."""
    checkpoint_sync: str = "local"
    """vast: where checkpoints go as they are written: ``local`` (copied to this machine's
    run directory over SSH while deploy follows), or ``s3://bucket/prefix``: the instance
    uploads them itself (the run's ``checkpoint_sync.url``; credentials and
    ``AWS_ENDPOINT_URL`` from this machine, sent as a 0600 file; docs/managed-runs.md)."""
    sync_every_s: float = Field(10.0, gt=0)
    """vast: how often new checkpoints are looked for on the instance while following."""
    monitor_s: float = Field(15.0, gt=0)
    """vast: how often the API is asked about the instance while following: an outbid or a
    vanished instance is noticed within this (plus one API call)."""
    ssh_lost_s: float = Field(300.0, gt=0)
    """vast: SSH unreachable this long while the API still lists the instance running: it
    is treated as lost and replaced."""

    @model_validator(mode="before")
    @classmethod
    def _fields_of_its_kind(cls, data: Any) -> Any:
        """A key that belongs to another kind is an error, not silently ignored."""
        if isinstance(data, dict):
            kind = data.get("kind", "container")
            for key in data:
                owners = KIND_FIELDS.get(key)
                if owners is not None and kind in HOST_KINDS and kind not in owners:
                    raise PydanticCustomError(
                        "not_of_kind",
                        "not a field of a {kind} host (it belongs to {owners} hosts)",
                        {"key": key, "kind": kind, "owners": " and ".join(sorted(owners))},
                    )
        return data

    @model_validator(mode="after")
    def _address_or_offer(self) -> HostSpec:
        if self.kind == "vast":
            missing = [f for f in ("offer", "max_price_per_hour") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"kind vast needs {' and '.join(missing)}")
            if self.checkpoint_sync != "local":
                try:
                    parse_url(self.checkpoint_sync)
                except ValueError as err:
                    raise ValueError(
                        f"checkpoint_sync: {err}; or 'local' (copied to this machine over SSH)"
                    ) from None
        elif not self.host:
            raise ValueError(f"kind {self.kind} needs 'host' (an address or ~/.ssh/config alias)")
        return self


class HostsFile(_Strict):
    known_hosts: str = str(DEFAULT_KNOWN_HOSTS)
    hosts: dict[str, HostSpec] = Field(default_factory=dict)
    groups: dict[str, list[str]] = Field(default_factory=dict)
    """Named host lists for one job on several hosts (``fab deploy --host GROUP``); the
    first host is node 0, which hosts the rendezvous."""


def hosts_file_path(path: str | Path | None = None) -> Path:
    """``path``, else ``$UPS_HOSTS_FILE``, else ``configs/hosts.yaml``."""
    return Path(path or os.environ.get("UPS_HOSTS_FILE") or DEFAULT_HOSTS_FILE)


def _loc(error: Any) -> tuple[Any, ...]:
    """The key path of a validation error; a key of the wrong kind ends the path itself."""
    loc = tuple(error["loc"])
    return (*loc, error["ctx"]["key"]) if error["type"] == "not_of_kind" else loc


def load_hosts(path: str | Path | None = None) -> HostsFile:
    """Read and validate the hosts file; every problem is listed with its key path."""
    file = hosts_file_path(path)
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except FileNotFoundError:
        raise UsageError(
            f"hosts file {file} not found. Copy configs/hosts.yaml, add your host, and pass "
            "--hosts-file PATH or set UPS_HOSTS_FILE."
        ) from None
    except yaml.YAMLError as err:
        raise UsageError(f"hosts file {file} is not valid YAML: {err}") from None
    try:
        parsed = HostsFile.model_validate(raw)
    except ValidationError as err:
        problems = "\n".join(
            f"  - {'.'.join(str(p) for p in _loc(e))}: {e['msg']}" for e in err.errors()
        )
        raise UsageError(f"hosts file {file} is invalid:\n{problems}") from None
    hosts = {name: spec.model_copy(update={"name": name}) for name, spec in parsed.hosts.items()}
    return parsed.model_copy(update={"hosts": hosts})


def get_host(name: str, path: str | Path | None = None) -> tuple[HostSpec, Path]:
    """Return the named host and the known_hosts file to verify it against."""
    specs, known_hosts = get_hosts(name, path)
    if len(specs) != 1:
        raise UsageError(f"{name!r} names {len(specs)} hosts; this task takes one host")
    return specs[0], known_hosts


def get_hosts(names: str, path: str | Path | None = None) -> tuple[list[HostSpec], Path]:
    """Resolve ``--host``: one name, ``a,b`` or a group; node order is the order given."""
    hosts = load_hosts(path)
    wanted: list[str] = []
    for name in (n.strip() for n in names.split(",")):
        wanted += hosts.groups.get(name, [name]) if name not in hosts.hosts else [name]
    specs = []
    for name in wanted:
        spec = hosts.hosts.get(name)
        if spec is None:
            known = ", ".join([*sorted(hosts.hosts), *sorted(hosts.groups)]) or "(none)"
            raise UsageError(
                f"unknown host {name!r}: {hosts_file_path(path)} defines {known}. "
                "Add an entry under 'hosts:' (or 'groups:') or pick one of those."
            )
        if spec in specs:
            raise UsageError(f"host {name!r} is named twice in --host {names!r}")
        specs.append(spec)
    known_hosts = os.environ.get("UPS_KNOWN_HOSTS") or hosts.known_hosts
    return specs, Path(known_hosts).expanduser()
