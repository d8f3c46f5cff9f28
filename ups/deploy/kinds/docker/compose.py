"""Deploy to a host with a Docker daemon: ship the image, then ``docker compose up -d``.

Contract with the compose file (docs/deploy.md): it reads ``UPS_IMAGE``, ``UPS_RUN_ID``
and ``UPS_CONFIG`` (the uploaded config, relative to the workdir) from the environment,
has a one-shot ``preflight`` service and the ``train-ddp`` service, and mounts
``<workdir>/runs`` as the run output directory, so the log is readable on the host.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fabric import Connection

from ups.config import Config
from ups.deploy.errors import DeployError, PreflightFailed
from ups.deploy.frontend import command
from ups.deploy.hosts import DockerHost
from ups.deploy.kinds.docker import commands
from ups.deploy.onhost.follow import follow
from ups.deploy.onhost.plan import SECRET_NAMES, DeployPlan, Step, address, check_run_flag
from ups.deploy.onhost.runs import choose_run, settle
from ups.deploy.transport.progress import Progress, human_bytes
from ups.deploy.transport.remote import RemoteRun, start_command
from ups.deploy.transport.session import Target, run, show_report, write_private, write_text
from ups.runid import new_run_id


def compose_argv(spec: DockerHost, found: RemoteRun) -> list[str]:
    return commands.compose_argv(
        run=found, image=spec.image, compose_files=spec.compose_files, docker_host=spec.docker_host
    )


def _steps(spec: DockerHost, found: RemoteRun, *, skip_preflight: bool, follow: bool) -> list[Step]:
    """The compose deploy's steps, each remote command as :class:`DockerDeploy` runs it."""
    compose = compose_argv(spec, found)
    how = (
        f"push to {spec.registry}, pull remotely"
        if spec.registry
        else ("send only the layers the remote daemon lacks (gzip over SSH into docker load)")
    )
    steps = [
        Step("connect", f"ssh {address(spec)}, verify host key against the ups known_hosts"),
        Step("image", f"{spec.image}: {how}"),
        Step(
            "upload",
            f"{', '.join(spec.compose_files)}, config, secrets (0600)",
            # The image runs as a fixed uid (docs/docker.md): it must be able to write the
            # runs volume.
            commands.prepare_dirs_command(
                found, posixpath.join(spec.workdir, spec.runs_dir), spec.container_user
            ),
        ),
    ]
    if not skip_preflight:
        steps.append(
            Step(
                "preflight",
                "one-shot preflight service; stop on failure",
                commands.compose_command(found, compose, "run", "--rm", spec.preflight_service),
            )
        )
    steps.append(
        Step(
            "start",
            "compose up -d (detached)",
            commands.compose_command(found, compose, "up", "-d", "--no-deps", spec.compose_service),
        )
    )
    steps.append(Step("watch", "a detached watcher records the exit code", start_command(found)))
    if follow:
        steps.append(Step("follow", f"stream {found.launch_log} until the container exits"))
    return steps


def build_docker_plan(
    spec: DockerHost,
    config: Path,
    *,
    cfg: Config,
    run_id: str | None,
    overrides: Sequence[str] = (),
    fresh: bool = False,
    follow: bool,
    skip_preflight: bool,
    env: dict[str, str],
) -> DeployPlan:
    """Plan a compose deploy; the commands shown are the ones :func:`deploy` runs."""
    check_run_flag(run_id)
    # --set never gets here: the request refuses it for docker hosts (ups.deploy.request).
    fixed = run_id or cfg.run.run_id
    run_id = fixed or new_run_id(cfg.run.name)
    found = RemoteRun(workdir=spec.workdir, run_id=run_id, output_dir=spec.runs_dir)
    steps = _steps(spec, found, skip_preflight=skip_preflight, follow=follow)
    return DeployPlan(
        host=spec.name,
        kind="docker",
        address=address(spec),
        image=spec.image,
        run_id=run_id,
        config=str(config),
        remote=found,
        launch_argv=[],
        follow=follow,
        steps=steps,
        secrets=[n for n in SECRET_NAMES if env.get(n)],
        resume_name=None if (fixed or fresh) else cfg.run.name,
    )


def ship_image(target: Target, spec: DockerHost, conn: Connection) -> tuple[int, str]:
    """Make the image exist remotely; return (bytes sent, description)."""
    import docker

    from ups.deploy.kinds.docker import layers
    from ups.deploy.kinds.docker.dial import remote_client

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


@dataclass
class DockerDeploy:
    """The plan of one compose deploy; :meth:`run` sends the commands it shows."""

    target: Target
    spec: DockerHost
    plan: DeployPlan
    replan: Callable[[str | None], DeployPlan]
    """The same plan for the run found on the host (a continued run keeps its id)."""
    env: dict[str, str]

    def choose_run(self) -> None:
        self.plan = choose_run(self.target, self.plan, self.replan)

    def render(self) -> str:
        return self.target.labelled(self.plan.render())

    def run(self) -> int:
        target, spec = self.target, self.spec
        conn = target.connect()
        try:
            plan, offset = settle(target, conn, self.plan, self.replan)
            _sent, what = ship_image(target, spec, conn)
            target.say(what)
            upload(target, spec, conn, plan, self.env)
            if plan.has_step("preflight"):
                result = run(conn, plan.step("preflight").command or "", spec)
                show_report(target, result.stdout + result.stderr)
                if result.exited != 0:
                    raise PreflightFailed(
                        f"preflight failed on {spec.name!r} (exit {result.exited}); nothing was "
                        "started. Fix the failing checks above and deploy again."
                    )
            up = run(conn, plan.step("start").command or "", spec)
            if up.exited != 0:
                raise DeployError(f"`docker compose up` failed on {spec.name!r}:\n{up.stderr}")
            started = run(conn, plan.step("watch").command or "", spec)
            if started.exited != 0:
                raise DeployError(
                    f"starting the exit watcher on {spec.name!r} failed: {started.stderr}"
                )
            project = commands.compose_project(plan.run_id)
            target.say(f"started run {plan.run_id} on {spec.name} (compose project {project})")
        finally:
            conn.close()
        if not plan.follow:
            target.say(
                f"follow it with: {command('logs', '--host', spec.name, '--run', plan.run_id)}"
            )
            return 0
        return follow(target, plan.remote, offset=offset)


def upload(
    target: Target, spec: DockerHost, conn: Connection, plan: DeployPlan, env: dict[str, str]
) -> None:
    found = plan.remote
    mk = run(conn, plan.step("upload").command or "", spec)
    if mk.exited != 0:
        raise DeployError(f"cannot create {found.state_dir} on {spec.name!r}: {mk.stderr}")
    sftp = conn.sftp()
    for f in spec.compose_files:
        sftp.put(f, posixpath.join(spec.workdir, Path(f).name))
    sftp.put(plan.config, found.state("config.yaml"))
    write_text(conn, found.state("output_dir"), found.output_dir)
    watcher = commands.watcher_script(
        found, compose_argv(spec, found), spec.compose_service, spec.docker_host
    )
    write_text(conn, found.state("run.sh"), watcher)
    # docker-compose.yml's `wandb_api_key` secret: compose bind-mounts this 0600 file at
    # /run/secrets/wandb_api_key and the image's entrypoint reads it as root, so the key
    # never enters compose's environment, the container's config or `docker inspect`.
    # Empty when there is no key (W&B then logs offline).
    write_private(conn, found.state(commands.WANDB_KEY_FILE), env.get("WANDB_API_KEY", ""))
