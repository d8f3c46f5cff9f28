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
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ups.bucket.store import parse_url
from ups.deploy.errors import UsageError

DEFAULT_HOSTS_FILE = Path("configs/hosts.yaml")
HOSTS_FILE_LOOKUP = "--hosts-file, else $UPS_HOSTS_FILE, else configs/hosts.yaml in this folder"
"""Where the hosts file is looked for (:func:`hosts_file_path`), for messages and help."""
DEFAULT_KNOWN_HOSTS = Path("~/.config/ups/known_hosts")

KindName = Literal["container", "docker", "vast", "slurm"]
HOST_KINDS: tuple[KindName, ...] = ("container", "docker", "vast", "slurm")

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


class SshHost(_Strict):
    """What every kind shares: how to log in over SSH and run ups there."""

    name: str = ""
    """The key in hosts.yaml (filled in by the loader)."""
    user: str | None = None
    key: str | None = None
    """Private key file; default: the ssh agent and ``~/.ssh/id_*``."""
    image: SafeWord = "ups:latest"
    """Image reference the host runs (container, vast) or receives (docker)."""
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
    ssh_config: str | None = None
    """OpenSSH client config to read aliases from (default: ``~/.ssh/config``)."""
    connect_timeout: float = Field(10.0, gt=0)
    keepalive_s: int = Field(5, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _fields_of_its_kind(cls, data: Any) -> Any:
        """A key that belongs to another kind is an error, not silently ignored."""
        if isinstance(data, dict) and cls in _MODELS.values():
            for key in data:
                owners = [k for k, model in _MODELS.items() if key in model.model_fields]
                if owners and key not in cls.model_fields:
                    raise PydanticCustomError(
                        "not_of_kind",
                        "not a field of a {kind} host (it belongs to {owners} hosts)",
                        {"key": key, "kind": _kind_of(cls), "owners": " and ".join(owners)},
                    )
        return data


class AddressedHost(SshHost):
    """A host with an address of its own (not rented by ups): what SSH connects to."""

    host: str = ""
    """Address or ``~/.ssh/config`` alias (its HostName, Port, User, IdentityFile apply)."""
    port: int | None = Field(None, ge=1, le=65535)
    jump: str | None = None
    """Jump host as ``user@host:port`` (like ``ssh -J``)."""

    @model_validator(mode="after")
    def _needs_address(self) -> AddressedHost:
        if not self.host:
            raise ValueError(
                f"kind {_kind_of(type(self))} needs 'host' (an address or ~/.ssh/config alias)"
            )
        return self


class ContainerHost(AddressedHost):
    """``kind: container``: the host runs the ups image itself; ups runs over SSH."""

    kind: Literal["container"] = "container"


class DockerHost(AddressedHost):
    """``kind: docker``: a machine with a Docker daemon; the image is shipped, compose runs it."""

    kind: Literal["docker"] = "docker"
    registry: str | None = None
    """Push ``image`` here and pull it remotely instead of shipping layers."""
    compose_files: list[SafeWord] = Field(default_factory=lambda: ["docker-compose.yml"])
    """Local compose files, uploaded into ``workdir`` (``-f`` in this order)."""
    compose_service: SafeWord = "train-ddp"
    preflight_service: SafeWord = "preflight"
    container_user: SafeWord | None = "1000:1000"
    """uid:gid the image runs as; deploy chowns the runs directory to it."""
    runs_dir: SafeWord = "runs"
    """Host directory (relative to ``workdir``) mounted as the runs volume."""
    docker_host: str | None = None
    """Remote ``DOCKER_HOST`` when the daemon is not on the default socket."""


class VastHost(SshHost):
    """``kind: vast``: no address, ups rents one (ups/deploy/providers/vast/,
    ups/deploy/managed/, docs/vast.md)."""

    kind: Literal["vast"] = "vast"
    # -- the rental: what to rent, for how long, what to do with it (one block) --
    offer: str | None = None
    """Offer query in `vastai search offers` syntax (``gpu_name=RTX_4090 num_gpus=2``)."""
    order: str = "measured"
    """Sort order of the search; the first offer under the price cap is taken.
    ``measured``: by expected $ per training sample from the host ledger's burn-in figures
    (docs/burn-in.md), the search's ``dph_total`` order while there are none; any other
    value is Vast's own sort field (``dph_total``, ``dlperf_per_dphtotal``, ...)."""
    max_price_per_hour: float | None = Field(None, gt=0)
    """Price cap in $/h (``dph_total`` on demand, the bid when interruptible)."""
    disk_gb: float = Field(32.0, gt=0)
    interruptible: bool | float = False
    """``true`` bids the offer's minimum bid; a number bids that many $/h."""
    max_hours: float = Field(12.0, gt=0)
    """The instance-side watchdog stops the run and ends the instance after this."""
    on_exit: Literal["destroy", "stop", "keep"] = "destroy"
    setup: str | None = None
    """Shell command run in ``workdir`` before preflight (e.g. fetch the data)."""
    vast_url: str | None = None
    """API server (default: the SDK's, console.vast.ai)."""
    watchdog_key_file: str | None = None
    """Local file with a scoped API key for the watchdog (else the instance's own)."""
    watchdog_grace_s: float = Field(300.0, ge=0)
    """After a run ends, how long the watchdog leaves for a laptop to fetch it."""
    watchdog_poll_s: float = Field(2.0, gt=0)
    """How often the watchdog checks its deadline, the runs' exit files and the lease: it
    acts within this much of ``max_hours`` (a fraction of an hour works: 0.01 = 36 s)."""
    boot_timeout_s: float = Field(900.0, gt=0)
    """From create to SSH answering (image pull, boot, key install) before giving up."""
    max_recoveries: int = Field(3, ge=0)
    """New instances (or in-place relaunches) after an outbid, a vanished host or a
    retryable crash, before giving up with exit 8."""
    max_offers: int = Field(3, ge=1)
    """Offers tried per deploy or recovery when machines fail (a host fault: never running,
    a driver or pull error, SSH silent, preflight failing there), then exit 7."""
    ledger_ttl_h: float = Field(72.0, ge=0)
    """Machines that failed here within this many hours are left out of the search."""
    burn_in: Literal["off", "warn", "enforce"] = "enforce"
    """The run's ``preflight.burn_in`` on the instance (an explicit ``--set`` wins):
    ``enforce`` makes a machine below its known-good figures a host fault (docs/burn-in.md)."""
    checkpoint_sync: str = "local"
    """Where checkpoints go as they are written: ``local`` (copied to this machine's run
    directory over SSH while deploy follows), or ``s3://bucket/prefix``: the instance
    uploads them itself (the run's ``checkpoint_sync.url``; credentials and
    ``AWS_ENDPOINT_URL`` from this machine, sent as a 0600 file; docs/managed-runs.md)."""
    sync_every_s: float = Field(10.0, gt=0)
    """How often new checkpoints are looked for on the instance while following."""
    monitor_s: float = Field(15.0, gt=0)
    """How often the API is asked about the instance while following: an outbid or a
    vanished instance is noticed within this (plus one API call)."""
    ssh_lost_s: float = Field(300.0, gt=0)
    """SSH unreachable this long while the API still lists the instance running: it
    is treated as lost and replaced."""
    # -- end of the rental block --

    @model_validator(mode="after")
    def _offer_and_cap(self) -> VastHost:
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
        return self

    def as_container(self, host: str, port: int | None) -> ContainerHost:
        """The container host a rented instance of this entry is, once it has an address:
        the shared fields carry over, the rental's fields stay behind."""
        shared = self.model_dump(include=set(SshHost.model_fields))
        shared["user"] = self.user or "root"
        return ContainerHost(**shared, host=host, port=port)


_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|UNLIMITED|INFINITE")


class SlurmHost(AddressedHost):
    """``kind: slurm``: the login node of a Slurm cluster; `fab deploy` submits one batch
    job whose ``srun`` starts one ``ups launch`` per node (docs/slurm.md). ``workdir`` must
    be on a filesystem every node shares: the batch script, config and run directories
    live there."""

    kind: Literal["slurm"] = "slurm"
    nodes: int = Field(1, ge=1)
    """Nodes the job asks for (``--nodes``); one ``ups launch`` node agent on each."""
    ranks_per_node: int | None = Field(None, ge=1)
    """Training processes per node; default ``gpus_per_node``, else the config's
    ``distributed.nproc_per_node``, else ``ups launch``'s own default."""
    gpus_per_node: int = Field(0, ge=0)
    """GPUs per node (``--gpus-per-node``); 0 asks for none."""
    cpus_per_task: int | None = Field(None, ge=1)
    """CPUs for each node's agent and its ranks (``--cpus-per-task``)."""
    partition: SafeWord | None = None
    time: str | None = None
    """Time limit (``--time``), e.g. ``30``, ``2:00:00``, ``1-12:00:00``."""
    account: SafeWord | None = None
    qos: SafeWord | None = None
    sbatch_options: list[str] = Field(default_factory=list)
    """More ``#SBATCH`` lines, e.g. ``--constraint=a100`` or ``--exclude=node7``."""
    signal_before_end_s: int = Field(120, ge=10)
    """Slurm sends the job SIGUSR1 this long before its time limit
    (``--signal=B:USR1@N``); ups stops the ranks at a step with a checkpoint and, with
    ``requeue``, puts the job back in the queue to continue."""
    requeue: bool = True
    """``--requeue``: a preempted or timed-out job comes back and resumes exactly."""
    max_pending_s: float = Field(1800.0, gt=0)
    """`fab deploy` cancels a job still pending after this long (with Slurm's reason) and
    exits 5: a request the cluster cannot meet is never waited on silently."""
    poll_s: float = Field(1.0, gt=0)
    """How often `fab deploy` asks Slurm about a pending job."""

    @model_validator(mode="after")
    def _slurm_fields(self) -> SlurmHost:
        problems = []
        if self.gpus:
            problems.append("set gpus_per_node (GPUs of each node), not gpus")
        if self.time is not None and not _SLURM_TIME.fullmatch(self.time):
            problems.append(f"time {self.time!r} is not a Slurm time (MM, HH:MM:SS, D-HH:MM:SS)")
        for option in self.sbatch_options:
            if not option.startswith("--") or "\n" in option:
                problems.append(f"sbatch_options: {option!r} is not one long option (--name=value)")
        if problems:
            raise ValueError("; ".join(problems))
        return self


_MODELS: dict[str, type[SshHost]] = {
    "container": ContainerHost,
    "docker": DockerHost,
    "vast": VastHost,
    "slurm": SlurmHost,
}


def _kind_of(model: type[SshHost]) -> str:
    return next(k for k, m in _MODELS.items() if m is model)


class _UnknownKind(AddressedHost):
    """An entry whose ``kind`` is none of the kinds: never valid, so its ``kind`` and every
    other wrong key are reported together."""

    kind: KindName


def _kind_tag(entry: Any) -> str:
    """The model an entry is read with: its ``kind`` key (default container)."""
    if not isinstance(entry, dict):  # an entry already read (a model instance)
        return next((k for k, m in _MODELS.items() if isinstance(entry, m)), "unknown")
    kind = entry.get("kind", "container")
    return kind if kind in HOST_KINDS else "unknown"


HostSpec = ContainerHost | DockerHost | VastHost | SlurmHost
"""One hosts.yaml entry: one model per kind."""

if TYPE_CHECKING:
    _Entry = HostSpec  # what a validated entry is: _UnknownKind never validates
else:
    _Entry = Annotated[
        Annotated[ContainerHost, Tag("container")]
        | Annotated[DockerHost, Tag("docker")]
        | Annotated[VastHost, Tag("vast")]
        | Annotated[SlurmHost, Tag("slurm")]
        | Annotated[_UnknownKind, Tag("unknown")],
        Discriminator(_kind_tag),
    ]
"""How an entry is read: the model of its ``kind`` (default container); a kind that is none
of them is read as ``_UnknownKind``, so its ``kind`` and every other wrong key are reported
together."""


class HostsFile(_Strict):
    known_hosts: str = str(DEFAULT_KNOWN_HOSTS)
    hosts: dict[str, _Entry] = Field(default_factory=dict)
    groups: dict[str, list[str]] = Field(default_factory=dict)
    """Named host lists for one job on several hosts (``fab deploy --host GROUP``); the
    first host is node 0, which hosts the rendezvous."""


def hosts_file_path(path: str | Path | None = None) -> Path:
    """``path``, else ``$UPS_HOSTS_FILE``, else ``configs/hosts.yaml``."""
    return Path(path or os.environ.get("UPS_HOSTS_FILE") or DEFAULT_HOSTS_FILE)


def _loc(error: Any) -> tuple[Any, ...]:
    """The key path of a validation error, as the user wrote it: without the kind tag
    pydantic adds under a host; a key of the wrong kind ends the path itself."""
    loc = tuple(error["loc"])
    if loc[:1] == ("hosts",) and len(loc) > 2 and loc[2] in (*HOST_KINDS, "unknown"):
        loc = (*loc[:2], *loc[3:])
    return (*loc, error["ctx"]["key"]) if error["type"] == "not_of_kind" else loc


def load_hosts(path: str | Path | None = None) -> HostsFile:
    """Read and validate the hosts file; every problem is listed with its key path."""
    file = hosts_file_path(path)
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except FileNotFoundError:
        raise UsageError(
            f"hosts file {file} not found (deploy reads {HOSTS_FILE_LOOKUP}). To try deploy on "
            "this machine, `ups dev-host up` starts a host here and prints the line that "
            "points UPS_HOSTS_FILE at its file. For your own machine write configs/hosts.yaml "
            "with an entry such as `hosts: {gpubox: {kind: container, host: ADDRESS, user: "
            "USER, key: ~/.ssh/id_ed25519, workdir: /workspace/ups}}` (every kind and field: "
            "docs/deploy.md)."
        ) from None
    except yaml.YAMLError as err:
        raise UsageError(f"hosts file {file} is not valid YAML: {err}") from None
    try:
        parsed = HostsFile.model_validate(raw)
    except ValidationError as err:
        problems = "\n".join(
            f"  - {'.'.join(str(p) for p in _loc(e))}: {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
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
                "Add an entry under 'hosts:' (or 'groups:'), pick one of those, or name "
                f"another hosts file (the one read is {HOSTS_FILE_LOOKUP})."
            )
        if spec in specs:
            raise UsageError(f"host {name!r} is named twice in --host {names!r}")
        specs.append(spec)
    known_hosts = os.environ.get("UPS_KNOWN_HOSTS") or hosts.known_hosts
    return specs, Path(known_hosts).expanduser()
