"""Fabric tasks: ``fab deploy --host vast`` and friends. The logic lives in ``ups.deploy``.

Every task takes ``--host NAME`` (a key of configs/hosts.yaml, or ``--hosts-file`` /
``$UPS_HOSTS_FILE``) and builds its own verified connection, so ``fab -H`` is not needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fabric import task
from invoke.exceptions import Exit

from ups.deploy import tasks

_HOST = {"host": "host name from configs/hosts.yaml", "hosts-file": "hosts file to read"}


def _exit(fn: Callable[[], int]) -> None:
    code = tasks.guarded(fn)
    if code:
        raise Exit(code=code)


@task(
    help={
        **_HOST,
        "config": "run config to upload",
        "run": "run id (default: generated)",
        "dry-run": "print the plan only",
        "detach": "start and return without following",
        "skip-preflight": "do not run preflight first",
        "sync-wheel": "install this ups wheel remotely first (code-only change)",
        "save": "also write the raw remote log to this local file",
    }
)
def deploy(
    c: Any,
    host: str,
    config: str = "configs/demo.yaml",
    run: str | None = None,
    hosts_file: str | None = None,
    dry_run: bool = False,
    detach: bool = False,
    skip_preflight: bool = False,
    sync_wheel: str | None = None,
    save: str | None = None,
) -> None:
    """Preflight remotely, start the run detached, stream its log; exit with its exit code."""
    _exit(
        lambda: tasks.deploy(
            host,
            config,
            run=run,
            hosts_file=hosts_file,
            dry_run=dry_run,
            detach=detach,
            skip_preflight=skip_preflight,
            sync_wheel=sync_wheel,
            save=save,
        )
    )


@task(help={**_HOST, "config": "config path on the host"})
def preflight(c: Any, host: str, config: str | None = None, hosts_file: str | None = None) -> None:
    """Run preflight on the host and show its report."""
    _exit(lambda: tasks.preflight(host, config, hosts_file=hosts_file))


@task(help={**_HOST, "run": "run id (default: latest deployed)", "save": "also write raw log"})
def logs(
    c: Any,
    host: str,
    run: str | None = None,
    hosts_file: str | None = None,
    save: str | None = None,
) -> None:
    """Follow a run's log until it ends (resumes after SSH drops); exit with its exit code."""
    _exit(lambda: tasks.logs(host, run, hosts_file=hosts_file, save=save))


@task(help={**_HOST, "run": "run id (default: latest deployed)"})
def status(c: Any, host: str, run: str | None = None, hosts_file: str | None = None) -> None:
    """Show whether the run is alive, its outcome and its last log line."""
    _exit(lambda: tasks.status(host, run, hosts_file=hosts_file))


@task(
    help={
        **_HOST,
        "run": "run id (default: latest deployed)",
        "timeout": "seconds to wait for the checkpoint",
    }
)
def stop(
    c: Any, host: str, run: str | None = None, hosts_file: str | None = None, timeout: float = 180.0
) -> None:
    """Stop gracefully: SIGTERM, wait for the preemption checkpoint and outcome.json."""
    _exit(lambda: tasks.stop(host, run, hosts_file=hosts_file, timeout=timeout))


@task(help={**_HOST, "run": "run id (default: latest deployed)", "dest": "local directory"})
def fetch(
    c: Any, host: str, run: str | None = None, hosts_file: str | None = None, dest: str = "runs"
) -> None:
    """Copy the run's checkpoints, outcome and logs to DEST/<run id>."""
    _exit(lambda: tasks.fetch(host, run, hosts_file=hosts_file, dest=dest))


@task(help={"host": "a kind: vast entry (its API settings)", "hosts-file": "hosts file to read"})
def instances(c: Any, host: str = "vast", hosts_file: str | None = None) -> None:
    """List every ups-labelled Vast instance: state, run, $/h and cost so far."""
    _exit(lambda: tasks.instances(host, hosts_file=hosts_file))


@task(help={**_HOST, "run": "only this run's instance (default: every one of this host)"})
def down(c: Any, host: str, run: str | None = None, hosts_file: str | None = None) -> None:
    """Destroy the Vast instances ups created for this host entry (or one run)."""
    _exit(lambda: tasks.down(host, run, hosts_file=hosts_file))
