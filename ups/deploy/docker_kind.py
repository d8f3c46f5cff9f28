"""Deploy to a host with a Docker daemon: ship the image, then ``docker compose up -d``.

Contract with the compose file (docs/deploy.md): it reads ``UPS_IMAGE``, ``UPS_RUN_ID``
and ``UPS_CONFIG`` (the uploaded config, relative to the workdir) from the environment,
has a one-shot ``preflight`` service and the ``train-ddp`` service, and mounts
``<workdir>/runs`` as the run output directory, so the log is readable on the host.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from fabric import Connection

from ups.deploy import execute
from ups.deploy import remote as rc
from ups.deploy.errors import DeployError, PreflightFailed
from ups.deploy.execute import Target
from ups.deploy.hosts import HostSpec
from ups.deploy.plan import SECRET_NAMES, DeployPlan, Step, address
from ups.deploy.progress import Progress, human_bytes
from ups.runid import new_run_id


def _project(run_id: str) -> str:
    return "ups-" + re.sub(r"[^a-z0-9_-]", "-", run_id.lower())


def compose_prefix(spec: HostSpec, run: rc.RemoteRun) -> str:
    """``docker compose`` with the run's project name, files and environment."""
    files = " ".join(f"-f {rc.q(Path(f).name)}" for f in spec.compose_files)
    env = {
        "UPS_IMAGE": spec.image,
        "UPS_IMAGE_CPU": spec.image,  # the CPU override (docker/compose.cpu.yml) reads this
        "UPS_RUN_ID": run.run_id,
        "UPS_CONFIG": posixpath.relpath(run.state("config.yaml"), run.workdir),
    }
    if spec.docker_host:
        env["DOCKER_HOST"] = spec.docker_host
    assignments = " ".join(f"{k}={rc.q(v)}" for k, v in env.items())
    return f"env {assignments} docker compose -p {_project(run.run_id)} {files}"


KEY_FILE = "wandb_api_key"
"""The W&B key on the remote host: a 0600 file in the run's state directory."""


def _secrets_line(run: rc.RemoteRun) -> str:
    """Point compose at the uploaded key file (docker-compose.yml's `wandb_api_key` secret).

    The key never enters compose's environment or the container's: compose bind-mounts the
    file at /run/secrets/wandb_api_key and the image's entrypoint reads it as root.
    """
    path = rc.q(run.state(KEY_FILE))
    return f"if [ -s {path} ]; then export UPS_WANDB_KEY_FILE={path}; fi"


def build_docker_plan(
    spec: HostSpec,
    config: Path,
    *,
    run_id: str | None,
    follow: bool,
    skip_preflight: bool,
    env: dict[str, str],
) -> DeployPlan:
    from ups.config import load_config

    cfg = load_config(config, check_files=False)
    run_id = run_id or cfg.run.run_id or new_run_id(cfg.run.name)
    run = rc.RemoteRun(workdir=spec.workdir, run_id=run_id, output_dir=spec.runs_dir)
    compose = compose_prefix(spec, run)
    how = (
        f"push to {spec.registry}, pull remotely"
        if spec.registry
        else ("send only the layers the remote daemon lacks (gzip over SSH into docker load)")
    )
    steps = [
        Step("connect", f"ssh {address(spec)}, verify host key against the ups known_hosts"),
        Step("image", f"{spec.image}: {how}"),
        Step("upload", f"{', '.join(spec.compose_files)}, config, secrets (0600)"),
    ]
    if not skip_preflight:
        steps.append(
            Step(
                "preflight",
                "one-shot preflight service; stop on failure",
                f"{compose} run --rm {spec.preflight_service}",
            )
        )
    steps.append(
        Step(
            "start",
            "compose up -d (detached); a watcher records the exit code",
            f"{compose} up -d --no-deps {spec.compose_service}",
        )
    )
    if follow:
        steps.append(Step("follow", f"stream {run.launch_log} until the container exits"))
    return DeployPlan(
        host=spec.name,
        kind=spec.kind,
        address=address(spec),
        image=spec.image,
        run_id=run_id,
        config=str(config),
        remote=run,
        launch_argv=[],
        follow=follow,
        steps=steps,
        secrets=[n for n in SECRET_NAMES if env.get(n)],
    )


def ship_image(target: Target, conn: Connection) -> tuple[int, str]:
    """Make the image exist remotely; return (bytes sent, description)."""
    import docker

    from ups.deploy import layers
    from ups.deploy.remote_docker import remote_client

    spec = target.spec
    local = docker.from_env()
    assert conn.transport is not None
    remote = remote_client(conn.transport, spec.docker_host)
    try:
        if spec.registry:
            ref = f"{spec.registry.rstrip('/')}/{spec.image}"
            local.images.get(spec.image).tag(ref)
            for line in local.images.push(ref, stream=True, decode=True):
                if "error" in line:
                    raise DeployError(f"push to {spec.registry} failed: {line['error']}")
            remote.images.pull(ref).tag(spec.image)
            return 0, f"pulled {ref} on {spec.name}"
        progress = Progress(f"image {spec.image}", None, target.out)
        plan, sent = layers.transfer(local, remote, spec.image, progress.update)
        progress.close()
        return sent, f"{plan.describe()}; sent {sent} bytes ({human_bytes(sent)})"
    finally:
        remote.close()
        local.close()


def deploy(
    target: Target,
    config: Path,
    *,
    run_id: str | None,
    dry_run: bool,
    detach: bool,
    skip_preflight: bool,
) -> int:
    spec = target.spec
    env = dict(os.environ)
    plan = build_docker_plan(
        spec, config, run_id=run_id, follow=not detach, skip_preflight=skip_preflight, env=env
    )
    target.say(plan.render())
    if dry_run:
        return 0
    run = plan.remote
    conn = target.connect()
    try:
        _sent, what = ship_image(target, conn)
        target.say(what)
        upload(target, conn, plan, env)
        compose = compose_prefix(spec, run)
        cd = f"cd {rc.q(spec.workdir)} && {_secrets_line(run)} && "
        if not skip_preflight:
            result = execute._run(conn, f"{cd}{compose} run --rm {spec.preflight_service}", spec)
            execute.show_report(target, result.stdout + result.stderr)
            if result.exited != 0:
                raise PreflightFailed(
                    f"preflight failed on {spec.name!r} (exit {result.exited}); nothing was "
                    "started. Fix the failing checks above and deploy again."
                )
        up = execute._run(conn, f"{cd}{compose} up -d --no-deps {spec.compose_service}", spec)
        if up.exited != 0:
            raise DeployError(f"`docker compose up` failed on {spec.name!r}:\n{up.stderr}")
        started = execute._run(conn, rc.start_command(run), spec)
        if started.exited != 0:
            raise DeployError(
                f"starting the exit watcher on {spec.name!r} failed: {started.stderr}"
            )
        target.say(
            f"started run {run.run_id} on {spec.name} (compose project {_project(run.run_id)})"
        )
    finally:
        conn.close()
    if detach:
        target.say(f"follow it with: fab logs --host {spec.name} --run {run.run_id}")
        return 0
    return execute.follow(target, run)


def upload(target: Target, conn: Connection, plan: DeployPlan, env: dict[str, str]) -> None:
    spec, run = target.spec, plan.remote
    runs = rc.q(posixpath.join(spec.workdir, spec.runs_dir))
    # The image runs as a fixed uid (docs/docker.md); it must be able to write the runs volume.
    owner = (
        f"chown {rc.q(spec.container_user)} {runs} 2>/dev/null || true"
        if (spec.container_user)
        else "true"
    )
    mk = execute._run(conn, f"mkdir -p {rc.q(run.state_dir)} {runs} && {owner}", spec)
    if mk.exited != 0:
        raise DeployError(f"cannot create {run.state_dir} on {spec.name!r}: {mk.stderr}")
    sftp = conn.sftp()
    for f in spec.compose_files:
        sftp.put(f, posixpath.join(spec.workdir, Path(f).name))
    sftp.put(plan.config, run.state("config.yaml"))
    with sftp.open(run.state("output_dir"), "w") as fh:
        fh.write(run.output_dir.encode())
    with sftp.open(run.state("run.sh"), "w") as fh:
        fh.write(watcher_script(spec, run).encode())
    if "WANDB_API_KEY" in plan.secrets:
        execute.write_private(conn, run.state(KEY_FILE), env["WANDB_API_KEY"])


def watcher_script(spec: HostSpec, run: rc.RemoteRun) -> str:
    """Detached watcher: record the container id, its pid file, and its exit code."""
    s = run.state
    compose = compose_prefix(spec, run)
    docker = f"env DOCKER_HOST={rc.q(spec.docker_host)} docker" if spec.docker_host else "docker"
    return "\n".join(
        [
            "#!/bin/sh",
            f"cd {rc.q(spec.workdir)} || exit 1",
            f"cid=$({compose} ps -q {spec.compose_service})",
            f'echo "$cid" > {rc.q(s("cid"))}',
            f"echo $$ > {rc.q(s('pid'))}",
            f'code=$({docker} wait "$cid")',
            f'echo "${{code:-1}}" > {rc.q(s("exit.tmp"))}',
            f"mv {rc.q(s('exit.tmp'))} {rc.q(s('exit'))}",
            "",
        ]
    )


def stop_command(spec: HostSpec, run: rc.RemoteRun, timeout_s: float) -> str:
    """SIGTERM the training container and give it time to write its checkpoint."""
    docker = f"env DOCKER_HOST={rc.q(spec.docker_host)} docker" if spec.docker_host else "docker"
    return f"{docker} stop -t {int(timeout_s)} $(cat {rc.q(run.state('cid'))})"
