"""One deploy, as asked on the command line: built once, checked once, passed whole.

``fab deploy`` and ``ups deploy`` build a :class:`DeployRequest` from their flags; it
refuses contradictory flags itself, and :func:`refuse_unsupported` refuses every flag the
chosen host kind would not honour, before any host or API is contacted (exit 2). Which
kind honours which option is the table :data:`SUPPORTED`, so no flag is silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ups.deploy.errors import UsageError
from ups.runid import run_id_problem

GROUP = "group"
"""The kind of a job across several hosts (``--host a,b`` or a group name)."""

KINDS = ("container", "docker", "vast", GROUP)


@dataclass(frozen=True)
class DeployRequest:
    """Everything ``fab deploy`` / ``ups deploy`` was asked to do."""

    host: str | None
    config: Path = Path("configs/demo.yaml")
    run: str | None = None
    hosts_file: str | None = None
    overrides: tuple[str, ...] = ()
    fresh: bool = False
    dry_run: bool = False
    follow: bool = True
    """Stream the run's log to its end (``--detach`` is ``follow=False``)."""
    skip_preflight: bool = False
    sync_wheel: Path | None = None
    save: Path | None = None

    def __post_init__(self) -> None:
        if self.run is not None and (problem := run_id_problem(self.run)):
            raise UsageError(f"--run: {problem}.")
        if self.run and self.fresh:
            raise UsageError("--fresh starts a new run and --run names one: give only one of them")


OPTIONS = {
    "run": "--run",
    "overrides": "--set",
    "fresh": "--fresh",
    "dry_run": "--dry-run",
    "follow": "--detach",
    "skip_preflight": "--skip-preflight",
    "sync_wheel": "--sync-wheel",
    "save": "--save",
}
"""Request field -> the flag a person typed. ``host``, ``config`` and ``hosts_file`` say
what and where; every kind takes them."""

_DEFAULTS = DeployRequest(host=None)

SUPPORTED: dict[str, frozenset[str]] = {
    "container": frozenset(OPTIONS),
    "docker": frozenset({"run", "fresh", "dry_run", "follow", "skip_preflight"}),
    "vast": frozenset({"run", "overrides", "dry_run", "follow", "skip_preflight", "save"}),
    GROUP: frozenset({"run", "overrides", "dry_run", "follow", "skip_preflight"}),
}

_INSTEAD: dict[tuple[str, str], str] = {
    ("overrides", "docker"): "the compose services read the uploaded config as it is. Put "
    "the change in the config file and deploy again.",
    ("fresh", "vast"): "a vast deploy always starts a new run on a new instance unless --run "
    "names one. Leave out --fresh.",
    ("fresh", GROUP): "a job on several hosts always starts a new run unless --run names "
    "one. Leave out --fresh.",
    ("sync_wheel", "docker"): "a docker host runs the image: rebuild it "
    "(scripts/build-images.sh) and deploy again; only the layers that changed are sent.",
    ("sync_wheel", "vast"): "a vast instance starts from the image: publish a new image, "
    "point `image:` in hosts.yaml at it and deploy again.",
    ("sync_wheel", GROUP): "install the wheel on each host first with `fab deploy --host "
    "NAME --sync-wheel WHEEL --detach` (one host at a time), or rebuild the image they run.",
    ("save", "docker"): "follow the run with `fab logs --host NAME --save FILE`, which "
    "writes the raw log while it streams.",
    ("save", GROUP): "`fab fetch --host HOSTS` brings every node's logs home after the run.",
}


def given(request: DeployRequest) -> list[str]:
    """The request fields (of :data:`OPTIONS`) set to something other than their default."""
    return [
        f.name
        for f in fields(DeployRequest)
        if f.name in OPTIONS and getattr(request, f.name) != getattr(_DEFAULTS, f.name)
    ]


def refuse_unsupported(request: DeployRequest, kind: str, where: str) -> None:
    """Raise a UsageError (exit 2) naming the first option ``kind`` would not honour."""
    for name in given(request):
        if name in SUPPORTED[kind]:
            continue
        instead = _INSTEAD.get((name, kind)) or "deploy without it."
        raise UsageError(f"{OPTIONS[name]} is not supported by a {kind} host ({where}): {instead}")
