"""Deploy targets: ``configs/hosts.yaml`` maps a name to an SSH address and how to run there.

Example entry (see configs/hosts.yaml)::

    known_hosts: ~/.config/ups/known_hosts   # ups-managed, first contact records the key
    hosts:
      box:
        host: ssh6.example.com    # address, or an alias from ~/.ssh/config
        port: 10538
        user: root
        key: ~/.ssh/id_ed25519
        kind: container           # the host runs the ups image itself
        image: ghcr.io/you/ups:0.1.0
        workdir: /workspace/ups
        gpus: 2

Each entry is read with the model of its ``kind`` (:mod:`ups.deploy.entries`; a
provider's kind with the model its package declares, through the registry
:mod:`ups.deploy.providers`); a key that belongs to another kind is refused naming the
kinds it belongs to, and every problem of the file is listed in one error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Union

import yaml
from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ups.deploy import providers
from ups.deploy.entries import (
    AddressedHost,
    ContainerHost,
    DockerHost,
    RentedHost,
    SlurmHost,
    SshHost,
    StrictModel,
)
from ups.deploy.errors import UsageError

__all__ = [
    "AddressedHost",
    "ContainerHost",
    "DockerHost",
    "HostSpec",
    "HostsFile",
    "RentedHost",
    "SlurmHost",
    "SshHost",
    "get_host",
    "get_hosts",
    "load_hosts",
]

DEFAULT_HOSTS_FILE = Path("configs/hosts.yaml")
HOSTS_FILE_LOOKUP = "--hosts-file, else $UPS_HOSTS_FILE, else configs/hosts.yaml in this folder"
"""Where the hosts file is looked for (:func:`hosts_file_path`), for messages and help."""
DEFAULT_KNOWN_HOSTS = Path("~/.config/ups/known_hosts")

_MODELS: dict[str, type[SshHost]] = {
    "container": ContainerHost,
    "docker": DockerHost,
    "slurm": SlurmHost,
    **providers.options_models(),  # kind: <provider>, one model per provider
}
HOST_KINDS: tuple[str, ...] = tuple(_MODELS)


def _kind_of(model: type[SshHost]) -> str:
    return next(k for k, m in _MODELS.items() if m is model)


def _own_fields(model: type[SshHost]) -> BeforeValidator:
    """A key that belongs to another kind is an error, not silently ignored."""

    def check(data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                owners = [k for k, other in _MODELS.items() if key in other.model_fields]
                if owners and key not in model.model_fields:
                    rented = [k for k in owners if k in providers.NAMES]
                    if key in RentedHost.model_fields:  # every provider's: say so, not each
                        owners = [k for k in owners if k not in rented]
                        owners.append(f"rented ({' or '.join(rented)})")
                    raise PydanticCustomError(
                        "not_of_kind",
                        "not a field of a {kind} host (it belongs to {owners} hosts)",
                        {"key": key, "kind": _kind_of(model), "owners": " and ".join(owners)},
                    )
        return data

    return BeforeValidator(check)


class _UnknownKind(AddressedHost):
    """An entry whose ``kind`` is none of the kinds: never valid, so its ``kind`` and every
    other wrong key are reported together."""

    kind: str

    @field_validator("kind")
    @classmethod
    def _one_of_the_kinds(cls, kind: str) -> str:
        raise ValueError(f"kind {kind!r} is none of {', '.join(repr(k) for k in HOST_KINDS)}")


def _kind_tag(entry: Any) -> str:
    """The model an entry is read with: its ``kind`` key (default container)."""
    if not isinstance(entry, dict):  # an entry already read (a model instance)
        return next((k for k, m in _MODELS.items() if isinstance(entry, m)), "unknown")
    kind = entry.get("kind", "container")
    return kind if kind in HOST_KINDS else "unknown"


HostSpec = ContainerHost | DockerHost | SlurmHost | RentedHost
"""One hosts.yaml entry: one model per kind (a provider's entry is a :class:`RentedHost`)."""

if TYPE_CHECKING:
    _Entry = HostSpec  # what a validated entry is: _UnknownKind never validates
else:
    _Entry = Annotated[
        Union[
            (
                *(Annotated[m, _own_fields(m), Tag(k)] for k, m in _MODELS.items()),
                Annotated[_UnknownKind, Tag("unknown")],
            )
        ],
        Discriminator(_kind_tag),
    ]
"""How an entry is read: the model of its ``kind`` (default container); a kind that is none
of them is read as ``_UnknownKind``, so its ``kind`` and every other wrong key are reported
together."""


class HostsFile(StrictModel):
    known_hosts: str = str(DEFAULT_KNOWN_HOSTS)
    hosts: dict[str, _Entry] = Field(default_factory=dict)
    groups: dict[str, list[str]] = Field(default_factory=dict)
    """Named host lists for one job on several hosts (``fab deploy --host GROUP``); the
    first host is node 0, which hosts the rendezvous."""

    @model_validator(mode="after")
    def _failover_entries(self) -> HostsFile:
        problems = []
        for name, spec in self.hosts.items():
            for other in spec.failover if isinstance(spec, RentedHost) else ():
                target = self.hosts.get(other)
                if not isinstance(target, RentedHost) or other == name:
                    problems.append(
                        f"hosts.{name}.failover: {other!r} is not another rented entry "
                        f"(kind: {' or '.join(providers.NAMES)}) of this file"
                    )
        if problems:
            raise ValueError("; ".join(problems))
        return self


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
            "  - "
            + "".join(f"{'.'.join(str(p) for p in loc)}: " for loc in [_loc(e)] if loc)
            + e["msg"].removeprefix("Value error, ")
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
