"""Fabric tasks: ``fab deploy --host vast`` and friends, a thin shim over ``ups.cli.deploy``.

``ups deploy|logs|status|stop|fetch|instances|down`` are the same commands with the same
options and exit codes; the one-line descriptions and option help live there. Every task
takes ``--host NAME`` (a key of configs/hosts.yaml, ``a,b``, or a group; ``--hosts-file``
/ ``$UPS_HOSTS_FILE`` picks the file) and builds its own verified connection, so ``fab -H``
is not needed. ``fab TASK --help`` shows a task's options.
Exit codes: docs/deploy.md (2 config/flags, 3 host, 4 preflight, else the run's own).
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from typing import Any, TypeVar

from fabric import task
from invoke.exceptions import Exit

from ups.cli.deploy import HELP, SUMMARY, operation
from ups.deploy import tasks
from ups.grace import STOP_WAIT_S

F = TypeVar("F", bound=Callable[..., None])

_HOST = {"host": HELP["host"], "hosts-file": HELP["hosts-file"]}
_RUN = {"run": HELP["run"]}
# Options only: `host` would otherwise be a positional argument that swallows `--help`,
# and the automatic short flag `-h` would shadow help.
_OPTS: dict[str, Any] = {"positional": [], "auto_shortflags": False}


def _described(name: str) -> Callable[[F], F]:
    """Give the task the command's one line (what `fab --list` shows, uncut)."""

    def set_doc(fn: F) -> F:
        fn.__doc__ = SUMMARY[name]
        return fn

    return set_doc


def _exit(name: str, **options: Any) -> None:
    code = tasks.guarded(operation(name, Namespace(**options)))
    if code:
        raise Exit(code=code)


@task(
    **_OPTS,
    iterable=["set_"],
    help={
        **_HOST,
        "config": HELP["config"],
        "script": HELP["script"],
        "run-file": HELP["run-file"],
        "script-args": HELP["script-args"],
        "run": HELP["deploy-run"],
        "fresh": HELP["fresh"],
        "set_": HELP["set"],
        "dry-run": HELP["dry-run"],
        "detach": HELP["detach"],
        "skip-preflight": HELP["skip-preflight"],
        "sync-wheel": HELP["sync-wheel"],
        "save": HELP["save"],
    },
)
@_described("deploy")
def deploy(
    c: Any,
    host: str | None = None,
    config: str | None = None,
    script: str | None = None,
    run_file: str | None = None,
    script_args: str | None = None,
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
    _exit(
        "deploy",
        host=host,
        config=config,
        script=script,
        run_file=run_file,
        script_args=script_args,
        run=run,
        hosts_file=hosts_file,
        set_=set_,
        fresh=fresh,
        dry_run=dry_run,
        detach=detach,
        skip_preflight=skip_preflight,
        sync_wheel=sync_wheel,
        save=save,
    )


@task(**_OPTS, help={**_HOST, "config": "config path on the host"})
@_described("preflight")
def preflight(
    c: Any, host: str | None = None, config: str | None = None, hosts_file: str | None = None
) -> None:
    _exit("preflight", host=host, config=config, hosts_file=hosts_file)


@task(**_OPTS, help={**_HOST, **_RUN, "save": "also write the raw log to this local file"})
@_described("logs")
def logs(
    c: Any,
    host: str | None = None,
    run: str | None = None,
    hosts_file: str | None = None,
    save: str | None = None,
) -> None:
    _exit("logs", host=host, run=run, hosts_file=hosts_file, save=save)


@task(**_OPTS, help={**_HOST, **_RUN})
@_described("status")
def status(
    c: Any, host: str | None = None, run: str | None = None, hosts_file: str | None = None
) -> None:
    _exit("status", host=host, run=run, hosts_file=hosts_file)


@task(**_OPTS, help={**_HOST, **_RUN, "timeout": HELP["timeout"]})
@_described("stop")
def stop(
    c: Any,
    host: str | None = None,
    run: str | None = None,
    hosts_file: str | None = None,
    timeout: float = STOP_WAIT_S,
) -> None:
    _exit("stop", host=host, run=run, hosts_file=hosts_file, timeout=timeout)


@task(**_OPTS, help={**_HOST, **_RUN, "dest": HELP["dest"]})
@_described("fetch")
def fetch(
    c: Any,
    host: str | None = None,
    run: str | None = None,
    hosts_file: str | None = None,
    dest: str = "runs",
) -> None:
    _exit("fetch", host=host, run=run, hosts_file=hosts_file, dest=dest)


@task(
    help={"host": HELP["vast-host"], "hosts-file": "hosts file to read", "ledger": HELP["ledger"]}
)
@_described("instances")
def instances(
    c: Any, host: str = "vast", hosts_file: str | None = None, ledger: bool = False
) -> None:
    _exit("instances", host=host, hosts_file=hosts_file, ledger=ledger)


@task(**_OPTS, help={**_HOST, "run": HELP["down-run"]})
@_described("down")
def down(
    c: Any, host: str | None = None, run: str | None = None, hosts_file: str | None = None
) -> None:
    if host is None:  # what `ups down` says too; an option, so `fab down --help` shows help
        raise Exit("fab down: --host is required (a kind: vast entry of hosts.yaml)", code=2)
    _exit("down", host=host, run=run, hosts_file=hosts_file)
