"""The shell commands of the docker kind: compose, the exit watcher, stop, preflight.

Built like every remote command (:mod:`ups.deploy.transport.remote`): pure functions over
:class:`RemoteRun`, every value quoted; :mod:`ups.deploy.transport.session` runs them.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

from ups.deploy.transport.remote import RemoteRun, argv, mkdir_command, q, secrets_line

WANDB_KEY_FILE = "wandb_api_key"
"""The W&B key as a 0600 file in the run's state directory (a compose secret)."""


def compose_project(run_id: str) -> str:
    """Compose project name for a run (compose allows ``[a-z0-9_-]``)."""
    return "ups-" + re.sub(r"[^a-z0-9_-]", "-", run_id.lower())


def docker_argv(docker_host: str | None) -> list[str]:
    """``docker`` talking to ``docker_host`` (the default socket when None): the one way
    every docker command here, and the SDK's dial-stdio channel, picks the daemon."""
    return ["env", f"DOCKER_HOST={docker_host}", "docker"] if docker_host else ["docker"]


def compose_argv(
    *,
    run: RemoteRun,
    image: str,
    compose_files: Sequence[str],
    docker_host: str | None,
) -> list[str]:
    """``docker compose`` with the run's project name, files and environment."""
    env = {
        "UPS_IMAGE": image,
        "UPS_IMAGE_CPU": image,  # the CPU override (docker/compose.cpu.yml) reads this
        "UPS_RUN_ID": run.run_id,
        "UPS_CONFIG": posixpath.relpath(run.state("config.yaml"), run.workdir),
        "UPS_WANDB_KEY_FILE": run.state(WANDB_KEY_FILE),  # a file's path, never the key
    }
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    files = [w for f in compose_files for w in ("-f", posixpath.basename(f))]
    return [
        "env",
        *(f"{k}={v}" for k, v in env.items()),
        "docker",
        "compose",
        "-p",
        compose_project(run.run_id),
        *files,
    ]


def watcher_script(
    run: RemoteRun, compose: Sequence[str], service: str, docker_host: str | None
) -> str:
    """Detached watcher: record the container id, its pid file, and its exit code."""
    s = run.state
    docker = argv(*docker_argv(docker_host))
    return "\n".join(
        [
            "#!/bin/sh",
            f"cd {q(run.workdir)} || exit 1",
            f"cid=$({argv(*compose, 'ps', '-q', service)})",
            f'echo "$cid" > {q(s("cid"))}',
            f"echo $$ > {q(s('pid'))}",
            f'code=$({docker} wait "$cid")',
            f'echo "${{code:-1}}" > {q(s("exit.tmp"))}',
            f"mv {q(s('exit.tmp'))} {q(s('exit'))}",
            "",
        ]
    )


def compose_command(run: RemoteRun, compose: Sequence[str], *args: str) -> str:
    """A compose command run in the workdir with the run's secrets in its environment."""
    return f"cd {q(run.workdir)} && {secrets_line(run)} && {argv(*compose, *args)}"


def prepare_dirs_command(run: RemoteRun, runs_dir: str, owner: str | None) -> str:
    """Create the state and runs directories; hand the runs volume to the image's user."""
    mk = mkdir_command(run.state_dir, runs_dir)
    if not owner:
        return mk
    # Best effort: without the right to chown, preflight in the container reports it.
    return f"{mk} && {{ {argv('chown', owner, runs_dir)} 2>/dev/null || true; }}"


def docker_stop_command(run: RemoteRun, docker_host: str | None, timeout_s: float) -> str:
    """SIGTERM the training container and give it time to write its checkpoint."""
    docker = argv(*docker_argv(docker_host), "stop", "-t", str(int(timeout_s)))
    return f"{docker} $(cat {q(run.state('cid'))})"


def docker_preflight_command(
    image: str, docker_host: str | None, gpus: int, config: str | None
) -> str:
    """Preflight inside the image, so the checks see what the container sees."""
    words = [*docker_argv(docker_host), "run", "--rm"]
    if gpus:
        words += ["--gpus", "all"]
    words += ["--ipc", "host", "--network", "host"]
    mount = '-v "$PWD/data:/app/data"'  # $PWD is the workdir: expanded by the remote shell
    tail = ["--entrypoint", "ups", image, "preflight", "--events", "off"]
    if config:
        tail += ["--config", config]
    return f"{argv(*words)} {mount} {argv(*tail)}"


def dial_stdio_command(docker_host: str | None) -> str:
    """The exec command behind every Docker SDK request to the remote daemon."""
    return argv(*docker_argv(docker_host), "system", "dial-stdio")
