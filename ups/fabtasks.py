"""Fabric tasks: ``fab deploy --host vast`` and friends, a thin shim over ``ups.cli.deploy``.

A project's ``fabfile.py`` is two lines (``ups init`` writes them; the checkout's own
fabfile.py is the same)::

    # ups's deploy tasks: `fab --list`; `ups deploy|logs|...` are the same commands.
    from ups.fabtasks import *  # noqa: F403

``ups deploy|logs|status|stop|fetch|instances|down`` are the same commands with the same
options and exit codes; the one-line descriptions and option help live there. Every task
takes ``--host NAME`` (a key of the hosts file: ``--hosts-file``, else ``$UPS_HOSTS_FILE``,
else ``configs/hosts.yaml``; ``a,b``, or a group) and builds its own verified connection,
so ``fab -H`` is not needed. ``fab TASK --help`` shows a task's options.
``fab deploy ... -- ARGS`` gives ARGS to your script (:class:`Executor`).
Exit codes: docs/deploy.md (2 config/flags, 3 host, 4 preflight, else the run's own).
"""

from __future__ import annotations

import shlex
import sys
from argparse import Namespace
from collections.abc import Callable
from typing import Any, TypeVar

import fabric
from fabric import task
from invoke.exceptions import Exit

from ups.cli.deploy import HELP, SUMMARY, operation
from ups.deploy import tasks
from ups.deploy.errors import EXIT_USAGE
from ups.grace import STOP_WAIT_S

__all__ = ["deploy", "down", "fetch", "instances", "logs", "preflight", "status", "stop"]

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


@task(help={**_HOST, "run": HELP["down-run"]})
@_described("down")
def down(c: Any, host: str, run: str | None = None, hosts_file: str | None = None) -> None:
    _exit("down", host=host, run=run, hosts_file=hosts_file)


_TASKS = {t.body for t in (deploy, preflight, logs, status, stop, fetch, instances, down)}


def _words_after_dashes(remainder: str) -> list[str]:
    """The words after ``--`` as the shell gave them to ``fab``: Fabric keeps only their
    join (``core.remainder``), which loses a word's spaces. When ``fab`` runs in-process on
    another argv (so ``sys.argv`` is not its own), the join split at spaces is all there is."""
    argv = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []
    return argv if " ".join(argv) == remainder else remainder.split()


class Executor(fabric.Executor):  # type: ignore[misc]  # fabric is untyped (follow_imports=skip)
    """Fabric's executor, but ``fab deploy ... -- ARGS`` passes ARGS to your script.

    Fabric reads the words after ``--`` as a command to run on the ``-H`` hosts and, without
    ``-H``, raises ``NothingToDo`` (a traceback) in :meth:`expand_calls`, before any task
    runs, so no task can take them itself. Here, when ups's ``deploy`` is the one task
    called, they are appended to its ``--script-args`` (as ``ups deploy ... -- ARGS``
    does); after another of ups's tasks they are refused in one paragraph with exit 2.
    Anything else is Fabric's own behaviour.
    """

    def expand_calls(self, calls: list[Any], apply_hosts: bool = True) -> list[Any]:
        remainder = self.core.remainder
        ours = [c for c in calls if getattr(c.task, "body", None) in _TASKS]
        if remainder and ours:
            if len(calls) != 1 or calls[0].task.body is not deploy.body:
                raise Exit(
                    f"fab: the words after `--` ({remainder}) go to your script, and only "
                    "`fab deploy --script FILE` (or `--run-file FILE`) passes them on, as the "
                    "only task of the command; the other tasks take none. Give them to that "
                    "deploy, or as --script-args '...'.",
                    code=EXIT_USAGE,
                )
            kwargs = calls[0].kwargs
            given, words = kwargs.get("script_args"), shlex.join(_words_after_dashes(remainder))
            kwargs["script_args"] = f"{given} {words}" if given else words
            self.core.remainder = ""  # consumed: Fabric must not run it on hosts
        return list(super().expand_calls(calls, apply_hosts=apply_hosts))


def _take_the_remainder() -> None:
    """Make the running ``fab`` use :class:`Executor`.

    Invoke picks the executor class from its program (``fabric.main.program``, what the
    ``fab`` command runs) or from a config file; a fabfile is loaded before either is
    read, and ``from ups.fabtasks import *`` is all a project's fabfile holds, so the
    import sets it. Only when Fabric's own executor is in place (a fabfile that chose
    another keeps it), and only in a process that runs ``fab``.
    """
    program = getattr(sys.modules.get("fabric.main"), "program", None)
    if program is not None and program.executor_class is fabric.Executor:
        program.executor_class = Executor


_take_the_remainder()
