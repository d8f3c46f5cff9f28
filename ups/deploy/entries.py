"""What one ``hosts.yaml`` entry is: one typed model per kind of host.

The models every deploy room shares (SSH login, an addressed host, the container, docker
and slurm kinds) and :class:`RentedHost`, the shape every provider's entry shares (what
to rent, for how long, what to do with it). A provider's own options (its query syntax,
its API's URL) are its own model, a subclass of :class:`RentedHost` in its folder under
``ups/deploy/providers/``; :mod:`ups.deploy.hosts` reads the file and picks the model of
each entry by its ``kind``.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from ups.bucket.store import parse_url

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


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SshHost(StrictModel):
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
                f"kind {getattr(self, 'kind', '?')} needs 'host' (an address or "
                "~/.ssh/config alias)"
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


class RentedHost(SshHost):
    """A host ups rents for the run from a provider (``kind: <provider>``): no address of its
    own; what to rent, for how long and what to do with it. Each provider's entry is a
    subclass with ``kind: Literal["<provider>"]`` and its own options (docs/hosts.md,
    docs/managed-runs.md)."""

    kind: str
    # -- what to rent: the offer requirements, stated once for every provider --
    gpu: list[str] = Field(default_factory=list)
    """GPU model(s) to rent, as people write them (``RTX 4090``, ``A100``, ``H100``): an
    offer matches when its model name starts with one of them, spaces, ``_`` and ``-``
    and the vendor's words ignored. Each provider translates them to its own names."""
    min_vram_gb: float | None = Field(None, gt=0)
    """Least memory per GPU, in GB."""
    region: list[str] = Field(default_factory=list)
    """Where the machine may be (a country code, a region or data centre name as the
    provider writes it); empty: anywhere."""
    min_reliability: float | None = Field(None, ge=0, le=1)
    """Least reliability the provider reports for the machine (0-1), where it reports one."""
    offer: str | None = None
    """The provider's own offer query, for what the fields above cannot say (an escape
    hatch: Vast's ``gpu_name=RTX_4090 num_gpus=2 reliability>0.99``). It narrows the
    search together with the fields above."""
    order: str = "measured"
    """Which matching offer is taken first (the first at or under the cap):
    ``measured``: by expected $ per training sample from the host ledger's burn-in figures
    (docs/burn-in.md), cheapest first while there are none; ``price``: cheapest first; any
    other value is the provider's own sort field (Vast's ``dlperf_per_dphtotal``, ...)."""
    max_price_per_hour: float | None = Field(None, gt=0)
    """Price cap in $/h for the whole instance (on demand: its price with the disk;
    interruptible: the bid)."""
    disk_gb: float = Field(32.0, gt=0)
    interruptible: bool | float = False
    """``true`` bids the offer's minimum bid; a number bids that many $/h for the instance
    (a provider that bids per GPU divides it)."""
    failover: list[str] = Field(default_factory=list)
    """Other rented entries of hosts.yaml, in order: when this entry's provider has no offer
    under the cap, or ``max_offers`` of its hosts failed in a row, the same run continues on
    the next one (another provider), from its newest checkpoint (docs/managed-runs.md)."""
    no_offer_wait_s: float = Field(0.0, ge=0)
    """Where no entry has an offer under the cap: wait this long and search again (within
    ``max_hours``) instead of ending the run with exit 6; 0 ends it."""
    # -- how long, and what to do with it --
    max_hours: float = Field(12.0, gt=0)
    """The instance-side watchdog stops the run and ends the instance after this."""
    start_timeout_s: float = Field(3600.0, gt=0)
    """From create to the run's start on the instance: an instance on which no run started
    by then ends itself through its watchdog (an instance a supervisor created and then
    lost, e.g. frozen between its lease check and its create, bills no longer than this)."""
    on_exit: Literal["destroy", "stop", "keep"] = "destroy"
    setup: str | None = None
    """Shell command run in ``workdir`` before preflight (e.g. fetch the data)."""
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
    vanished instance is noticed within this (plus one API call); instances of the run
    from an older supervisor's lease are looked for as often."""
    ssh_lost_s: float = Field(300.0, gt=0)
    """SSH unreachable this long while the API still lists the instance running: it
    is treated as lost and replaced."""

    @field_validator("gpu", "region", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _what_and_cap(self) -> RentedHost:
        missing = []
        if self.max_price_per_hour is None:
            missing.append("max_price_per_hour")
        if self.offer is None and not self.gpu:
            missing.append("gpu (the GPU model to rent) or offer (the provider's own query)")
        if missing:
            raise ValueError(f"kind {self.kind} needs {' and '.join(missing)}")
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
