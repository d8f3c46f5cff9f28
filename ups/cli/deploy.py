"""``ups deploy|logs|status|stop|fetch|instances|down``: the fabfile's tasks as ups commands.

Both front ends take the same options (the help texts below are the fabfile's too), build
the same :class:`~ups.deploy.request.DeployRequest` and call the same functions in
:mod:`ups.deploy.tasks`, so they exit with the same codes (docs/deploy.md). Nothing here
imports torch: these commands answer as fast as the SSH connection allows.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ups.grace import STOP_WAIT_S

if TYPE_CHECKING:
    from ups.workload import ScriptWorkload

SUMMARY = {
    "deploy": "Preflight remotely, start the run detached, stream its log; exit with its "
    "exit code.",
    "preflight": "Run preflight on the host and show its report.",
    "logs": "Replay and follow a run's log to its end (reconnects after SSH drops).",
    "status": "Show whether the run is alive, its outcome and its last event.",
    "stop": "Stop gracefully: SIGTERM, wait for the preemption checkpoint and outcome.json.",
    "fetch": "Copy everything the run wrote (checkpoints, outcome, logs, config, W&B) to "
    "DEST/<run>.",
    "instances": "List every ups-labelled instance on the entry's provider account: state, run, "
    "$/h and cost so far.",
    "down": "Destroy the instances ups rented for this host entry (or one run); on a "
    "slurm entry, cancel the run's job.",
}
"""One line per command: `fab --list`, `ups --help` and each command's --help show it."""

HELP = {
    "host": "host from configs/hosts.yaml; a,b or a group runs one job on several hosts",
    "hosts-file": "hosts file to read (default: $UPS_HOSTS_FILE, else configs/hosts.yaml)",
    "run": "run id (default: the latest deployed)",
    "deploy-run": "run id: a new one, or one to continue (default: continue the host's latest "
    "unfinished run of the config's name, else new)",
    "config": "run config to upload (default: configs/demo.yaml)",
    "script": "your own torchrun script instead of the trainer: its directory is synced to the "
    "host and it runs there with the checkpoint contract (docs/script.md)",
    "run-file": "a run file (script, args, workdir, setup, env, checkpoint_dir, data, "
    "include/exclude; docs/script.md) instead of a config",
    "script-args": "the script's arguments as one string (shell words), replacing the run file's "
    "args; `ups deploy` also takes them after `--`",
    "fresh": "start a new run even if an unfinished one of this name exists",
    "set": "KEY=VALUE config override, repeatable (as `ups launch --set`)",
    "dry-run": "print the plan only; touch no host",
    "detach": "start and return without following",
    "skip-preflight": "do not run preflight first",
    "sync-wheel": "install this ups wheel remotely first (code-only change)",
    "save": "also write the raw remote log to this local file",
    "timeout": "seconds to wait for the checkpoint",
    "dest": "local directory (default: runs)",
    "vast-host": "a rented entry (kind: vast, runpod, ...: its provider and API settings)",
    "down-run": "only this run's instance (default: every one of this host); slurm: this "
    "run's job (default: the last deployed)",
    "ledger": "also show the host ledger: machines that failed here and are skipped",
    "verbose": "also show libraries' log records (paramiko, urllib3, vastai) on stderr; "
    "they always go to the JSON log (UPS_VERBOSE=1 does the same)",
}


def _parser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"ups {name}", description=SUMMARY[name])
    p.add_argument("--hosts-file", help=HELP["hosts-file"])
    p.add_argument("--verbose", action="store_true", help=HELP["verbose"])
    if name in {"instances", "down"}:
        p.add_argument(
            "--host", default="vast" if name == "instances" else None, help=HELP["vast-host"]
        )
        if name == "down":
            p.add_argument("--run", help=HELP["down-run"])
        else:
            p.add_argument("--ledger", action="store_true", help=HELP["ledger"])
        return p
    p.add_argument("--host", help=HELP["host"])
    if name == "deploy":
        p.add_argument("--config", help=HELP["config"])
        p.add_argument("--script", help=HELP["script"])
        p.add_argument("--run-file", help=HELP["run-file"])
        p.add_argument("--script-args", help=HELP["script-args"])
        p.add_argument("--run", help=HELP["deploy-run"])
        p.add_argument("--fresh", action="store_true", help=HELP["fresh"])
        p.add_argument(
            "--set", dest="set_", action="append", default=[], metavar="KEY=VALUE", help=HELP["set"]
        )
        p.add_argument("--dry-run", action="store_true", help=HELP["dry-run"])
        p.add_argument("--detach", action="store_true", help=HELP["detach"])
        p.add_argument("--skip-preflight", action="store_true", help=HELP["skip-preflight"])
        p.add_argument("--sync-wheel", help=HELP["sync-wheel"])
        p.add_argument("--save", help=HELP["save"])
    elif name == "preflight":
        p.add_argument("--config", help="config path on the host")
    else:
        p.add_argument("--run", help=HELP["run"])
    if name == "logs":
        p.add_argument("--save", help="also write the raw log to this local file")
    if name == "stop":
        p.add_argument("--timeout", type=float, default=STOP_WAIT_S, help=HELP["timeout"])
    if name == "fetch":
        p.add_argument("--dest", default="runs", help=HELP["dest"])
    return p


def operation(name: str, a: argparse.Namespace) -> Callable[[], int]:
    """The call behind command ``name`` with parsed options ``a`` (fab's tasks use it too)."""
    from ups.deploy import tasks
    from ups.deploy.request import DeployRequest

    if name == "deploy":
        return lambda: tasks.deploy(
            DeployRequest(
                host=a.host,
                config=Path(a.config or "configs/demo.yaml"),
                run=a.run,
                hosts_file=a.hosts_file,
                overrides=tuple(a.set_ or ()),
                fresh=a.fresh,
                dry_run=a.dry_run,
                follow=not a.detach,
                skip_preflight=a.skip_preflight,
                sync_wheel=Path(a.sync_wheel) if a.sync_wheel else None,
                save=Path(a.save) if a.save else None,
                workload=_workload(a),
            )
        )
    calls: dict[str, Callable[[], int]] = {
        "preflight": lambda: tasks.preflight(a.host, a.config, hosts_file=a.hosts_file),
        "logs": lambda: tasks.logs(a.host, a.run, hosts_file=a.hosts_file, save=a.save),
        "status": lambda: tasks.status(a.host, a.run, hosts_file=a.hosts_file),
        "stop": lambda: tasks.stop(a.host, a.run, hosts_file=a.hosts_file, timeout=a.timeout),
        "fetch": lambda: tasks.fetch(a.host, a.run, hosts_file=a.hosts_file, dest=a.dest),
        "instances": lambda: tasks.instances(
            a.host, hosts_file=a.hosts_file, ledger=getattr(a, "ledger", False)
        ),
        "down": lambda: tasks.down(a.host, a.run, hosts_file=a.hosts_file),
    }
    return calls[name]


def _workload(a: argparse.Namespace) -> ScriptWorkload | None:
    """``--script``/``--run-file`` as one checked workload; a problem is a UsageError."""
    from ups.deploy.errors import UsageError
    from ups.workload import WorkloadError

    try:
        return _checked_workload(a)
    except (WorkloadError, ValueError) as err:
        raise UsageError(str(err)) from None


def _checked_workload(a: argparse.Namespace) -> ScriptWorkload | None:
    """``--script``/``--run-file`` read and checked with light imports only (no SSH, no
    deploy code), so a mistake in them is answered at once. Raises WorkloadError."""
    from ups.workfiles import left_behind
    from ups.workload import WorkloadError, load_run_file, script_workload, with_args

    if cached := getattr(a, "checked_workload", None):
        return cached  # type: ignore[no-any-return]  # set by run() below
    script, run_file = getattr(a, "script", None), getattr(a, "run_file", None)
    try:
        words = shlex.split(a.script_args) if getattr(a, "script_args", None) else []
    except ValueError as err:  # an unclosed quote
        raise ValueError(
            f"--script-args {a.script_args!r}: {err}; quote it as you would on a shell line"
        ) from None
    words += getattr(a, "after_dashes", None) or []
    if script is None and run_file is None:
        if words:
            raise ValueError("script arguments were given without --script or --run-file")
        return None
    if sum(x is not None for x in (script, run_file, a.config)) > 1:
        raise ValueError("give one of --config, --script and --run-file")
    if run_file is not None:
        workload = with_args(load_run_file(Path(run_file)), words)
    else:
        assert script is not None
        workload = script_workload(script, words)
    if problems := left_behind(workload):
        raise WorkloadError(workload.source, problems)
    return workload


EXIT_USAGE = 2
"""``ups.deploy.errors.UsageError``'s exit code, for a mistake answered before that loads."""


def run(name: str, argv: list[str]) -> int:
    """Parse ``argv`` for command ``name`` and run it; the exit code of ``fab NAME``."""

    after: list[str] = []
    if name == "deploy" and "--" in argv:
        argv, after = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = _parser(name).parse_args(argv)
    args.after_dashes = after
    if name == "deploy":
        from ups.workload import WorkloadError

        try:  # before the deploy code is imported: a wrong script is answered at once
            args.checked_workload = _checked_workload(args)
        except (WorkloadError, ValueError) as err:
            sys.stderr.write(f"error: {err}\n")
            return EXIT_USAGE
    if name == "down" and not args.host:
        _parser(name).error("--host is required (a kind: vast entry of hosts.yaml)")
    from ups.deploy import tasks

    return tasks.guarded(operation(name, args), verbose=args.verbose)


def deploy(argv: list[str]) -> int:
    return run("deploy", argv)


def logs(argv: list[str]) -> int:
    return run("logs", argv)


def status(argv: list[str]) -> int:
    return run("status", argv)


def stop(argv: list[str]) -> int:
    return run("stop", argv)


def fetch(argv: list[str]) -> int:
    return run("fetch", argv)


def instances(argv: list[str]) -> int:
    return run("instances", argv)


def down(argv: list[str]) -> int:
    return run("down", argv)
