"""One deploy, as asked on the command line: built once, checked once, passed whole.

``fab deploy`` and ``ups deploy`` build a :class:`DeployRequest` from their flags; it
refuses contradictory flags itself, and :func:`ups.deploy.kinds.refuse_unsupported`
refuses every flag the chosen host kind would not honour, before any host or API is
contacted (exit 2). Each
kind (``ups.deploy.kinds``) declares the options it honours, so no flag is silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ups.deploy.errors import UsageError
from ups.runid import run_id_problem
from ups.workload import ScriptWorkload


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
    workload: ScriptWorkload | None = None
    """Your own script (``--script PATH -- ARGS`` or ``--run-file``) instead of the trainer
    with ``config``."""

    def __post_init__(self) -> None:
        if self.workload is not None and self.overrides:
            raise UsageError(
                "--set overrides a ups config; a script takes its own arguments after `--` "
                "(or `args:` in the run file)"
            )
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
    "workload": "--script/--run-file",
}
"""Request field -> the flag a person typed. ``host``, ``config`` and ``hosts_file`` say
what and where; every kind takes them."""

_DEFAULTS = DeployRequest(host=None)


def given(request: DeployRequest) -> list[str]:
    """The request fields (of :data:`OPTIONS`) set to something other than their default."""
    return [
        f.name
        for f in fields(DeployRequest)
        if f.name in OPTIONS and getattr(request, f.name) != getattr(_DEFAULTS, f.name)
    ]
