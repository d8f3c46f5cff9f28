"""The operations behind the fabfile's tasks, by host name; each returns an exit code.

``--host`` takes one name from hosts.yaml, ``a,b`` or a group: with several hosts,
deploy runs one job across them (:mod:`ups.deploy.group`) and the follow-up tasks act
on every host of the job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ups.deploy import execute, group
from ups.deploy import remote as rc
from ups.deploy.errors import EXIT_INTERRUPTED, DeployError, UsageError
from ups.deploy.fetch import fetch as fetch_one
from ups.deploy.hosts import HostSpec, get_host, get_hosts
from ups.deploy.plan import DeployPlan, build_plan, check_run_flag, load_run_config
from ups.deploy.request import GROUP, DeployRequest, refuse_unsupported
from ups.deploy.session import Target, remote_preflight
from ups.grace import STOP_WAIT_S
from ups.log import setup_logging


def _targets(
    host: str | None, hosts_file: str | None, out: TextIO, run: str | None = None
) -> list[Target]:
    specs, known_hosts = get_hosts(_need_host(host), hosts_file)
    if any(spec.kind == "vast" for spec in specs):
        from ups.deploy.vast import ops  # the Vast SDK only when a vast entry is used

        # The instance ups rented for this entry (and run), found by its label.
        specs = [ops.attach(spec, run) if spec.kind == "vast" else spec for spec in specs]
    label = len(specs) > 1
    return [
        Target(
            spec=spec,
            known_hosts=known_hosts,
            out=out,
            label=f"[node{i} {spec.name}] " if label else "",
        )
        for i, spec in enumerate(specs)
    ]


def _need_host(host: str | None) -> str:
    if not host:
        raise UsageError(
            "which host? pass --host NAME (a key of configs/hosts.yaml), --host a,b or a "
            "group name; `fab --list` shows the tasks."
        )
    return host


def guarded(fn: Callable[[], int], err: TextIO | None = None) -> int:
    """Run ``fn``; a DeployError becomes its one-paragraph message and its exit code."""
    setup_logging(console=True, stdout=sys.stderr)
    try:
        return fn()
    except DeployError as exc:
        (err or sys.stderr).write(f"error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        (err or sys.stderr).write(
            "interrupted: stopped following only; a started run keeps going remotely "
            "(`fab logs --host HOST` re-attaches, `fab stop --host HOST` stops it)\n"
        )
        return EXIT_INTERRUPTED


def deploy(request: DeployRequest, out: TextIO = sys.stdout) -> int:
    """Plan, then (unless ``dry_run``) start and follow a run; see docs/deploy.md.

    Every option the chosen host kind would not honour is refused here, before any host
    or API is contacted.
    """
    specs, known_hosts = get_hosts(_need_host(request.host), request.hosts_file)
    kinds = {spec.kind for spec in specs}
    if "vast" in kinds and len(specs) > 1:
        raise UsageError(
            f"--host {request.host}: a vast entry rents its own single instance; it cannot be "
            "a node of a multi-host job yet. Deploy it alone (--host NAME)."
        )
    kind = GROUP if len(specs) > 1 else specs[0].kind
    refuse_unsupported(request, kind, request.host or "")
    config = request.config
    if kind == "vast":
        from ups.deploy.vast import ops  # rent, run, fetch, end the instance

        return ops.deploy(
            specs[0],
            known_hosts,
            config,
            out,
            run_id=request.run,
            overrides=request.overrides,
            dry_run=request.dry_run,
            detach=not request.follow,
            skip_preflight=request.skip_preflight,
            mirror=request.save,
        )
    targets = _targets(request.host, request.hosts_file, out)
    cfg = load_run_config(config, request.overrides)
    env = dict(os.environ)
    if kind == GROUP:
        plans = group.plan_group(
            targets,
            config,
            cfg=cfg,
            run_id=request.run,
            overrides=list(request.overrides),
            follow_logs=request.follow,
            skip_preflight=request.skip_preflight,
            env=env,
        )
        for t, p in zip(targets, plans, strict=True):
            t.say(p.render())
        return 0 if request.dry_run else group.deploy(targets, plans, env=env)
    target = targets[0]
    if kind == "docker":
        from ups.deploy import docker_kind  # the Docker SDK only when a docker host is used

        return docker_kind.deploy(
            target,
            config,
            cfg=cfg,
            run_id=request.run,
            fresh=request.fresh,
            dry_run=request.dry_run,
            detach=not request.follow,
            skip_preflight=request.skip_preflight,
        )

    def replan(run_id: str | None) -> DeployPlan:
        return build_plan(
            target.spec,
            config,
            cfg=cfg,
            run_id=run_id,
            overrides=request.overrides,
            fresh=request.fresh,
            follow=request.follow,
            skip_preflight=request.skip_preflight,
            env=env,
        )

    plan = replan(request.run)
    target.say(plan.render())
    if request.dry_run:
        return 0
    return execute.deploy(
        target, plan, env=env, replan=replan, sync=request.sync_wheel, mirror=request.save
    )


def preflight(
    host: str | None,
    config: str | None = None,
    *,
    hosts_file: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Run preflight on each host as it is (with a config path on the host, if given)."""

    def one(target: Target) -> int:
        spec = target.spec
        if spec.kind == "docker":
            # The checks must see what the container sees: run them in the image.
            command = rc.docker_preflight_command(spec.image, spec.docker_host, spec.gpus, config)
        else:
            command = rc.argv(*rc.preflight_argv(spec.ups_bin, config, spec.gpus))
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
    fn: Callable[[Target], int],
    run: str | None = None,
) -> int:
    targets = _targets(host, hosts_file, out, run)
    if len(targets) == 1:
        return fn(targets[0])
    return group.each(targets, fn)


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
    return _on_each(host, hosts_file, out, lambda t: execute.logs(t, run, mirror), run)


def status(
    host: str | None,
    run: str | None = None,
    *,
    hosts_file: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    check_run_flag(run)
    return _on_each(host, hosts_file, out, lambda t: execute.status(t, run), run)


def stop(
    host: str | None,
    run: str | None = None,
    *,
    hosts_file: str | None = None,
    timeout: float = STOP_WAIT_S,
    out: TextIO = sys.stdout,
) -> int:
    check_run_flag(run)
    return _on_each(host, hosts_file, out, lambda t: execute.stop(t, run, timeout), run)


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


def instances(host: str, *, hosts_file: str | None = None, out: TextIO = sys.stdout) -> int:
    from ups.deploy.vast import ops

    return ops.instances(_vast_spec(host, hosts_file), out)


def down(
    host: str, run: str | None = None, *, hosts_file: str | None = None, out: TextIO = sys.stdout
) -> int:
    from ups.deploy.vast import ops

    return ops.down(_vast_spec(host, hosts_file), out, run)


def _vast_spec(host: str, hosts_file: str | None) -> HostSpec:
    spec, _known = get_host(host, hosts_file)
    if spec.kind != "vast":
        raise UsageError(
            f"host {host!r} is kind {spec.kind}, not vast: `fab instances` and `fab down` "
            "manage Vast instances that ups created. Pass a `kind: vast` entry."
        )
    return spec
