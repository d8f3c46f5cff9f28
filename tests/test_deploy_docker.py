"""`fab deploy` to a `docker` host: a real sshd in front of a private Docker engine.

The "local" engine builds the image, the "remote" engine (reached only through sshd)
receives it; each is a private dockerd so the remote really lacks the layers.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.deploy_fixtures import SshServer, demo_config, demo_data, fab, sshd
from tests.docker_fixtures import COMPOSE, Engine, build_app, engines, import_tiny_base

__all__ = ["demo_data", "engines", "sshd"]  # fixtures used by name below

pytestmark = [
    pytest.mark.docker,
    pytest.mark.ssh,
    pytest.mark.slow,
    pytest.mark.xdist_group("deploy_docker"),  # one worker: its private engines start once
]

IMAGE = "ups-deploytest:app"


def _sent(stdout: str) -> int:
    match = re.search(r"sent (\d+) bytes", stdout)
    assert match, stdout
    return int(match.group(1))


def test_docker_deploy_sends_only_missing_layers(
    engines: tuple[Engine, Engine], sshd: SshServer, tmp_path: Path
) -> None:
    """The first deploy ships the whole image; after a one-line code change the second ships
    only the changed layer (a few KB instead of MB); each time `docker compose up -d` runs
    the service remotely, its log streams back and `fab` exits with the container's code."""
    local, remote = engines
    client = local.client()
    import_tiny_base(client, "ups-deploytest-base:1")
    build_app(client, tmp_path / "ctx", IMAGE, version="1")
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(COMPOSE)
    box = sshd.host_entry(
        kind="docker", image=IMAGE, docker_host=remote.url, compose_files=[str(compose)]
    )
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml", {"box": box})
    config = demo_config(tmp_path / "demo.yaml")
    env = {**os.environ, "DOCKER_HOST": local.url}
    args = ["deploy", "--host", "box", "--hosts-file", str(hosts), "--config", str(config)]

    first = fab(*args, "--run", "d1", env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "send 3 of 3 layers" in first.stdout
    assert "preflight OK (tiny image)" in first.stdout
    assert "version=1" in first.stdout and "raw line from the container" in first.stdout
    assert remote.client().images.get(IMAGE).id == client.images.get(IMAGE).id

    build_app(client, tmp_path / "ctx", IMAGE, version="2", exit_code=3)  # one-line change
    second = fab(*args, "--run", "d2", env=env)
    assert second.returncode == 3, second.stdout[-3000:] + second.stderr[-3000:]
    assert "send 1 of 3 layers" in second.stdout
    assert "version=2" in second.stdout
    first_bytes, second_bytes = _sent(first.stdout), _sent(second.stdout)
    assert first_bytes > 4_000_000  # the 4 MB random deps layer went once
    assert second_bytes < 20_000
    assert remote.client().images.get(IMAGE).id == client.images.get(IMAGE).id
    log = sshd.root / "remote" / "runs" / "d2" / "logs" / "launch.log"
    assert log.read_text().count('"version":"2"') == 20


def test_docker_preflight_failure_starts_nothing(
    engines: tuple[Engine, Engine], sshd: SshServer, tmp_path: Path
) -> None:
    """When the compose preflight service fails remotely, deploy shows its output, exits
    non-zero and never starts the training service."""
    local, remote = engines
    client = local.client()
    import_tiny_base(client, "ups-deploytest-base:1")
    build_app(client, tmp_path / "ctx", IMAGE, version="pf")
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(COMPOSE.replace("${FAKE_PREFLIGHT_EXIT:-0}", "1"))
    box = sshd.host_entry(
        kind="docker", image=IMAGE, docker_host=remote.url, compose_files=[str(compose)]
    )
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml", {"box": box})
    result = fab(
        "deploy",
        "--host",
        "box",
        "--hosts-file",
        str(hosts),
        "--config",
        str(demo_config(tmp_path / "demo.yaml")),
        "--run",
        "pf",
        env={**os.environ, "DOCKER_HOST": local.url},
    )
    assert result.returncode == 4, result.stdout + result.stderr
    assert "preflight OK (tiny image)" in result.stdout  # the report is shown
    assert "nothing was started" in result.stderr
    running = remote.client().containers.list(
        filters={"label": "com.docker.compose.service=train-ddp"}
    )
    assert running == []


def test_docker_deploy_real_image_with_project_compose(
    ups_image: str, sshd: SshServer, demo_data: Path, tmp_path: Path
) -> None:
    """With the project image (ups:cpu) and the repo's compose files, `fab deploy` runs the
    compose preflight service, starts train-ddp detached, streams the trainer's log back
    and exits 0 when the run finished. The W&B key travels as a 0600 file that compose
    mounts as a secret: it is in no `docker inspect` of the run's containers and in no
    line of the streamed log."""
    import secrets
    import shutil
    import subprocess

    key = "ups-deploy-" + secrets.token_hex(16)
    workdir = sshd.root / "remote"
    shutil.copytree(demo_data, workdir / "data" / "demo")  # a volume cannot follow symlinks
    box = sshd.host_entry(
        kind="docker",
        image=ups_image,
        compose_files=["docker-compose.yml", "docker/compose.cpu.yml"],
    )
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml", {"box": box})
    result = fab(
        "deploy",
        "--host",
        "box",
        "--hosts-file",
        str(hosts),
        "--config",
        str(demo_config(tmp_path / "demo.yaml", max_steps=20)),
        "--run",
        "real",
        timeout=400,
        env={**os.environ, "WANDB_API_KEY": key},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    key_file = workdir / ".ups" / "deploy" / "real" / "wandb_api_key"
    assert key_file.read_text() == key and key_file.stat().st_mode & 0o777 == 0o600
    assert key not in result.stdout + result.stderr
    containers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=com.docker.compose.project=ups-real"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    assert containers
    inspect = subprocess.run(
        ["docker", "inspect", *containers], capture_output=True, text=True, timeout=60
    )
    assert "/run/secrets/wandb_api_key" in inspect.stdout and key not in inspect.stdout
    assert "remote already has" in result.stdout  # same engine: nothing to send
    assert "remote preflight on box" in result.stdout
    assert "train_step" in result.stdout
    assert "finished (exit 0)" in result.stdout
    assert (workdir / "runs" / "real" / "outcome.json").exists()


def test_docker_stop_is_graceful(
    engines: tuple[Engine, Engine], sshd: SshServer, tmp_path: Path
) -> None:
    """`fab stop` on a docker host SIGTERMs the training container, waits for its outcome
    and reports "preempted (exit 75)"; `fab logs` then exits 75 too."""
    local, remote = engines
    client = local.client()
    import_tiny_base(client, "ups-deploytest-base:1")
    build_app(client, tmp_path / "ctx", IMAGE, version="long", lines=100000)
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(COMPOSE)
    box = sshd.host_entry(
        kind="docker", image=IMAGE, docker_host=remote.url, compose_files=[str(compose)]
    )
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml", {"box": box})
    env = {**os.environ, "DOCKER_HOST": local.url}
    started = fab(
        "deploy",
        "--host",
        "box",
        "--hosts-file",
        str(hosts),
        "--config",
        str(demo_config(tmp_path / "demo.yaml")),
        "--run",
        "long",
        "--detach",
        "--skip-preflight",
        env=env,
    )
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    stopped = fab("stop", "--host", "box", "--hosts-file", str(hosts), "--timeout", "60")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "preempted (exit 75)" in stopped.stdout
    followed = fab("logs", "--host", "box", "--hosts-file", str(hosts), timeout=60)
    assert followed.returncode == 75
    assert "SIGTERM: checkpoint written" in followed.stdout
