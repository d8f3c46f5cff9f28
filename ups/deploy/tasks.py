"""The operations behind the fabfile's tasks, by host name; each returns an exit code.

``--host`` takes one name from hosts.yaml, ``a,b`` or a group: with several hosts,
deploy runs one job across them (:mod:`ups.deploy.onhost.group`) and the follow-up tasks act
on every host of the job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ups.deploy import frontend, kinds
from ups.deploy.errors import EXIT_INTERRUPTED, DeployError, HostGone, UsageError
from ups.deploy.hosts import HOSTS_FILE_LOOKUP, HostSpec, get_host, get_hosts
from ups.deploy.kinds import refuse_unsupported
from ups.deploy.onhost import group, operate
from ups.deploy.onhost.fetch import fetch as fetch_one
from ups.deploy.onhost.plan import check_run_flag
from ups.deploy.request import DeployRequest
from ups.deploy.transport import remote as rc
from ups.deploy.transport.remote import RemoteRun
from ups.deploy.transport.session import Target, remote_preflight
from ups.grace import STOP_WAIT_S
from ups.log import route_library_logs, setup_logging
from ups.statedir import state_dir


def command_log() -> Path:
    """The JSON log of deploy commands run here (events and library records)."""
    return state_dir() / "logs" / "commands.jsonl"


@dataclass(frozen=True)
class _Attached:
    """A host of ``--host`` for a follow-up task: its kind, its entry, where it runs."""

    host_kind: kinds.HostKind
    spec: HostSpec
    target: Target


def _attached(
    host: str | None, hosts_file: str | None, out: TextIO, run: str | None = None
) -> list[_Attached]:
    specs, known_hosts = get_hosts(_need_host(host), hosts_file)
    label = len(specs) > 1
    found = []
    for i, spec in enumerate(specs):
        kind = kinds.of(spec)
        target = Target(
            spec=kind.attach(spec, run),
            known_hosts=known_hosts,
            out=out,
            label=f"[node{i} {spec.name}] " if label else "",
        )
        found.append(_Attached(kind, spec, target))
    return found


def _targets(
    host: str | None, hosts_file: str | None, out: TextIO, run: str | None = None
) -> list[Target]:
    return [a.target for a in _attached(host, hosts_file, out, run)]


def _need_host(host: str | None) -> str:
    if not host:
        raise UsageError(
            f"which host? pass --host NAME (a key of the hosts file, {HOSTS_FILE_LOOKUP}), "
            "--host a,b or a group name."
        )
    return host


def guarded(fn: Callable[[], int], err: TextIO | None = None, verbose: bool = False) -> int:
    """Run ``fn``; a DeployError becomes its one-paragraph message and its exit code.

    Every event, and every library's log record (paramiko, urllib3, vastai), is appended
    to ``<state dir>/logs/commands.jsonl``; library records reach stderr only with
    ``verbose`` (``--verbose`` or ``UPS_VERBOSE=1``).
    """
    try:
        setup_logging(console=True, stdout=sys.stderr, log_file=command_log())
    except OSError:  # an unwritable state dir must not stop a deploy: no JSON log then
        setup_logging(console=True, stdout=sys.stderr)
    route_library_logs(verbose=verbose or os.environ.get("UPS_VERBOSE", "") not in ("", "0"))
    try:
        return fn()
    except DeployError as exc:
        (err or sys.stderr).write(f"error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        (err or sys.stderr).write(
            "interrupted: stopped following only; a started run keeps going remotely "
            f"({frontend.command('logs', '--host HOST')} re-attaches, "
            f"{frontend.command('stop', '--host HOST')} stops it)\n"
        )
        return EXIT_INTERRUPTED


def deploy(request: DeployRequest, out: TextIO = sys.stdout) -> int:
    """Plan, then (unless ``dry_run``) start and follow a run; see docs/deploy.md.

    Every option the chosen host kind would not honour is refused here, before any host
    or API is contacted.
    """
    specs, known_hosts = get_hosts(_need_host(request.host), request.hosts_file)
    kind = kinds.for_hosts(specs, request.host or "")
    refuse_unsupported(request, kind, request.host or "")
    plan = kind.plan(request, specs, known_hosts, out)
    if not request.dry_run:
        plan.choose_run()  # a continued run is found on the host: the plan names only it
    # The object printed here is the one run below: --dry-run shows exactly what runs.
    out.write(plan.render() + "\n")
    out.flush()
    return 0 if request.dry_run else plan.run()


def preflight(
    host: str | None,
    config: str | None = None,
    *,
    hosts_file: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Run preflight on each host as it is (with a config path on the host, if given)."""

    def one(node: _Attached) -> int:
        target = node.target
        command = node.host_kind.preflight_command(node.spec, config)
        command = rc.in_dir(target.spec.workdir, command)
        conn = target.connect()
        try:
            remote_preflight(target, conn, command)
        finally:
            conn.close()
        return 0

    return _on_each(host, hosts_file, out, one)


def _on_each(
    host: str | None,
    hosts_file: str | None,
    out: TextIO,
    fn: Callable[[_Attached], int],
    run: str | None = None,
) -> int:
    found = _attached(host, hosts_file, out, run)
    if len(found) == 1:
        return fn(found[0])
    return group.worst(group.run_all([a.target for a in found], lambda i: fn(found[i])))


def logs(
    host: str | None,
    run: str | None = None,
    *,
    hosts_file: str | None = None,
    save: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    check_run_flag(run)
    mirror = Path(save) if save else None
    try:
        return _on_each(host, hosts_file, out, lambda a: operate.logs(a.target, run, mirror), run)
    except HostGone as gone:  # e.g. a rented run whose instance is gone: its saved log
        if gone.replay is None:
            raise
        return gone.replay(out)


def status(
    host: str | None,
    run: str | None = None,
    *,
    hosts_file: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    check_run_flag(run)

    def one(node: _Attached) -> int:
        def command(found: RemoteRun) -> str:
            return node.host_kind.status_command(node.spec, found)

        return operate.status(node.target, run, command)

    return _on_each(host, hosts_file, out, one, run)


def stop(
    host: str | None,
    run: str | None = None,
    *,
    hosts_file: str | None = None,
    timeout: float = STOP_WAIT_S,
    out: TextIO = sys.stdout,
) -> int:
    check_run_flag(run)

    def one(node: _Attached) -> int:
        def command(found: RemoteRun) -> str:
            return node.host_kind.stop_command(node.spec, found, timeout)

        return operate.stop(node.target, run, command, timeout)

    return _on_each(host, hosts_file, out, one, run)


def fetch(
    host: str | None,
    run: str | None = None,
    *,
    hosts_file: str | None = None,
    dest: str = "runs",
    out: TextIO = sys.stdout,
) -> int:
    check_run_flag(run)
    targets = _targets(host, hosts_file, out, run)
    if len(targets) == 1:
        return fetch_one(targets[0], run, Path(dest))
    return group.fetch(targets, run, Path(dest))


def instances(
    host: str, *, hosts_file: str | None = None, ledger: bool = False, out: TextIO = sys.stdout
) -> int:
    from ups.deploy.kinds import rented as kind

    return kind.instances(host, hosts_file, out, ledger)


def down(
    host: str, run: str | None = None, *, hosts_file: str | None = None, out: TextIO = sys.stdout
) -> int:
    """End what ups holds for the entry: its rented instances, its queued job."""
    check_run_flag(run)
    spec, _known = get_host(host, hosts_file)
    return kinds.of(spec).down(spec, run, hosts_file, out)
