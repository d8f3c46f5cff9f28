"""The operations behind the fabfile's tasks, by host name; each returns an exit code."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ups.deploy import execute
from ups.deploy.errors import DeployError
from ups.deploy.hosts import HostSpec, get_host
from ups.deploy.plan import build_plan
from ups.log import setup_logging


def _target(
    host: str, hosts_file: str | None, out: TextIO, run: str | None = None
) -> execute.Target:
    spec, known_hosts = get_host(host, hosts_file)
    if spec.kind == "vast":  # the instance ups rented for this entry (and run), by its label
        from ups.deploy.vast import ops

        spec = ops.attach(spec, run)
    return execute.Target(spec=spec, known_hosts=known_hosts, out=out)


def guarded(fn: Callable[[], int], err: TextIO | None = None) -> int:
    """Run ``fn``; a DeployError becomes its message on stderr and its exit code."""
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
        return 130


def deploy(
    host: str,
    config: str = "configs/demo.yaml",
    *,
    run: str | None = None,
    hosts_file: str | None = None,
    dry_run: bool = False,
    detach: bool = False,
    skip_preflight: bool = False,
    sync_wheel: str | None = None,
    save: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    spec, known_hosts = get_host(host, hosts_file)
    if spec.kind == "vast":
        from ups.deploy.vast import ops

        return ops.deploy(
            spec,
            known_hosts,
            Path(config),
            out,
            run_id=run,
            dry_run=dry_run,
            detach=detach,
            skip_preflight=skip_preflight,
            mirror=Path(save) if save else None,
        )
    target = _target(host, hosts_file, out)
    if target.spec.kind == "docker":
        from ups.deploy import docker_kind

        return docker_kind.deploy(
            target,
            Path(config),
            run_id=run,
            dry_run=dry_run,
            detach=detach,
            skip_preflight=skip_preflight,
        )
    env = dict(os.environ)
    plan = build_plan(
        target.spec,
        Path(config),
        run_id=run,
        follow=not detach,
        skip_preflight=skip_preflight,
        env=env,
    )
    target.say(plan.render())
    if dry_run:
        return 0
    return execute.deploy(
        target,
        plan,
        env=env,
        skip_preflight=skip_preflight,
        sync=Path(sync_wheel) if sync_wheel else None,
        mirror=Path(save) if save else None,
    )


def preflight(
    host: str, config: str | None = None, *, hosts_file: str | None = None, out: TextIO = sys.stdout
) -> int:
    """Run preflight on the host as it is (with a config path on the host, if given)."""
    target = _target(host, hosts_file, out)
    spec = target.spec
    command = f"{spec.ups_bin} preflight"
    if spec.kind == "docker":
        # The checks must see what the container sees: run them in the image.
        docker = (
            f"env DOCKER_HOST={shlex.quote(spec.docker_host)} docker"
            if (spec.docker_host)
            else "docker"
        )
        gpus = "--gpus all " if spec.gpus else ""
        command = (
            f'{docker} run --rm {gpus}--ipc host --network host -v "$PWD/data:/app/data" '
            f"--entrypoint ups {shlex.quote(spec.image)} preflight"
        )
    if config:
        command += f" --config {shlex.quote(config)}"
    conn = target.connect()
    try:
        execute.remote_preflight(target, conn, command)
    finally:
        conn.close()
    return 0


def logs(
    host: str,
    run: str | None = None,
    *,
    hosts_file: str | None = None,
    save: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    target = _target(host, hosts_file, out, run)
    return execute.logs(target, run, Path(save) if save else None)


def status(
    host: str, run: str | None = None, *, hosts_file: str | None = None, out: TextIO = sys.stdout
) -> int:
    return execute.status(_target(host, hosts_file, out, run), run)


def stop(
    host: str,
    run: str | None = None,
    *,
    hosts_file: str | None = None,
    timeout: float = 180.0,
    out: TextIO = sys.stdout,
) -> int:
    return execute.stop(_target(host, hosts_file, out, run), run, timeout)


def fetch(
    host: str,
    run: str | None = None,
    *,
    hosts_file: str | None = None,
    dest: str = "runs",
    out: TextIO = sys.stdout,
) -> int:
    return execute.fetch(_target(host, hosts_file, out, run), run, Path(dest))


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
        raise DeployError(
            f"host {host!r} is kind {spec.kind}, not vast: `fab instances` and `fab down` "
            "manage Vast instances that ups created. Pass a `kind: vast` entry."
        )
    return spec
