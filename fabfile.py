"""Fabric tasks: ``fab deploy --host vast`` and friends. The logic lives in ``ups.deploy``.

Every task takes ``--host NAME`` (a key of configs/hosts.yaml, ``a,b``, or a group;
``--hosts-file`` / ``$UPS_HOSTS_FILE`` picks the file) and builds its own verified
connection, so ``fab -H`` is not needed. ``fab TASK --help`` shows a task's options.
Exit codes: docs/deploy.md (2 config/flags, 3 host, 4 preflight, else the run's own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fabric import task
from invoke.exceptions import Exit

from ups.deploy import tasks
from ups.grace import STOP_WAIT_S

_HOST = {
    "host": "host from configs/hosts.yaml; a,b or a group runs one job on several hosts",
    "hosts-file": "hosts file to read (default: $UPS_HOSTS_FILE, else configs/hosts.yaml)",
}
_RUN = {"run": "run id (default: the latest deployed)"}
# Options only: `host` would otherwise be a positional argument that swallows `--help`,
# and the automatic short flag `-h` would shadow help.
_OPTS: dict[str, Any] = {"positional": [], "auto_shortflags": False}


def _exit(fn: Callable[[], int]) -> None:
    code = tasks.guarded(fn)
    if code:
        raise Exit(code=code)


@task(
    **_OPTS,
    iterable=["set_"],
    help={
        **_HOST,
        "config": "run config to upload (default: configs/demo.yaml)",
        "run": "run id: a new one, or one to continue (default: continue the host's latest "
        "unfinished run of the config's name, else new)",
        "fresh": "start a new run even if an unfinished one of this name exists",
        "set_": "KEY=VALUE config override, repeatable (as `ups launch --set`)",
        "dry-run": "print the plan only; touch no host",
        "detach": "start and return without following",
        "skip-preflight": "do not run preflight first",
        "sync-wheel": "install this ups wheel remotely first (code-only change)",
        "save": "also write the raw remote log to this local file",
    },
)
def deploy(
    c: Any,
    host: str | None = None,
    config: str = "configs/demo.yaml",
    run: str | None = None,
    hosts_file: str | None = None,
    set_: list[str] | None = None,
    fresh: bool = False,
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
            overrides=set_ or [],
            fresh=fresh,
            dry_run=dry_run,
            detach=detach,
            skip_preflight=skip_preflight,
            sync_wheel=sync_wheel,
            save=save,
        )
    )


@task(**_OPTS, help={**_HOST, "config": "config path on the host"})
def preflight(
    c: Any, host: str | None = None, config: str | None = None, hosts_file: str | None = None
) -> None:
    """Run preflight on the host and show its report."""
    _exit(lambda: tasks.preflight(host, config, hosts_file=hosts_file))


@task(**_OPTS, help={**_HOST, **_RUN, "save": "also write the raw log to this local file"})
def logs(
    c: Any,
    host: str | None = None,
    run: str | None = None,
    hosts_file: str | None = None,
    save: str | None = None,
) -> None:
    """Replay and follow a run's log to its end (reconnects after SSH drops); exit with the
    run's exit code. It never starts or continues a run: `fab deploy` does."""
    _exit(lambda: tasks.logs(host, run, hosts_file=hosts_file, save=save))


@task(**_OPTS, help={**_HOST, **_RUN})
def status(
    c: Any, host: str | None = None, run: str | None = None, hosts_file: str | None = None
) -> None:
    """Show whether the run is alive, its outcome and its last event."""
    _exit(lambda: tasks.status(host, run, hosts_file=hosts_file))


@task(**_OPTS, help={**_HOST, **_RUN, "timeout": "seconds to wait for the checkpoint"})
def stop(
    c: Any,
    host: str | None = None,
    run: str | None = None,
    hosts_file: str | None = None,
    timeout: float = STOP_WAIT_S,
) -> None:
    """Stop gracefully: SIGTERM, wait for the preemption checkpoint and outcome.json."""
    _exit(lambda: tasks.stop(host, run, hosts_file=hosts_file, timeout=timeout))


@task(**_OPTS, help={**_HOST, **_RUN, "dest": "local directory (default: runs)"})
def fetch(
    c: Any,
    host: str | None = None,
    run: str | None = None,
    hosts_file: str | None = None,
    dest: str = "runs",
) -> None:
    """Copy everything the run wrote (checkpoints, outcome, logs, config, W&B) to DEST/<run>."""
    _exit(lambda: tasks.fetch(host, run, hosts_file=hosts_file, dest=dest))


@task(help={"host": "a kind: vast entry (its API settings)", "hosts-file": "hosts file to read"})
def instances(c: Any, host: str = "vast", hosts_file: str | None = None) -> None:
    """List every ups-labelled Vast instance: state, run, $/h and cost so far."""
    _exit(lambda: tasks.instances(host, hosts_file=hosts_file))


@task(help={**_HOST, "run": "only this run's instance (default: every one of this host)"})
def down(c: Any, host: str, run: str | None = None, hosts_file: str | None = None) -> None:
    """Destroy the Vast instances ups created for this host entry (or one run)."""
    _exit(lambda: tasks.down(host, run, hosts_file=hosts_file))
