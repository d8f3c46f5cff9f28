"""`--dry-run` prints exactly the remote commands a deploy then runs, for every host kind.

Each test plans a deploy twice from the same request: once with ``dry_run`` (what a person
reads), once for real against a real host (sshd; sshd in front of a private Docker engine;
the FAKE Vast API with real instances). The real run's commands are read where deploy runs
every remote command (``ups.deploy.transport.session.run`` logs each as a ``remote_command`` event);
every command the dry run printed must have run, verbatim and in the printed order.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.deploy_fixtures import SshServer, demo_config, demo_data, link_data, sshd
from tests.docker_fixtures import COMPOSE, Engine, build_app, engines, import_tiny_base
from tests.fake_vast import FakeVast, fab_env, fake_vast, write_vast_hosts
from ups.deploy import tasks
from ups.deploy.request import DeployRequest

__all__ = ["demo_data", "engines", "fake_vast", "sshd"]  # fixtures used by name below

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ssh,
    pytest.mark.xdist_group("deploy_dry_run"),  # one worker: its private engines start once
]


def _printed(text: str) -> list[str]:
    """The remote commands a plan shows (its ``$ `` lines)."""
    return [line.strip()[2:] for line in text.splitlines() if line.strip().startswith("$ ")]


def _deploy_both_ways(request: DeployRequest) -> tuple[str, list[str], str, int]:
    """The dry run's text, then the commands the real deploy ran, its output and exit code."""
    dry = io.StringIO()
    assert tasks.deploy(DeployRequest(**{**vars(request), "dry_run": True}), dry) == 0
    out = io.StringIO()
    with capture_logs() as events:
        code = tasks.deploy(request, out)
    ran = [e["command"] for e in events if e["event"] == "remote_command"]
    return dry.getvalue(), ran, out.getvalue(), code


def _ran_in_order(printed: list[str], ran: list[str]) -> None:
    assert len(printed) >= 3, printed
    rest = iter(ran)
    missing = [command for command in printed if command not in rest]
    assert missing == [], f"printed but not run as printed: {missing}\nran: {ran}"


def test_container_dry_run_is_what_runs(sshd: SshServer, demo_data: Path, tmp_path: Path) -> None:
    """A container deploy: check-code, upload, preflight and start run exactly as printed,
    and the real deploy shows the very plan the dry run showed."""
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml")
    link_data(sshd.root / "remote", demo_data)
    config = demo_config(tmp_path / "demo.yaml", max_steps=3, nproc=1)  # commands, not ranks
    request = DeployRequest(
        host="test", config=config, run="dry1", hosts_file=str(hosts), follow=False
    )
    dry, ran, out, code = _deploy_both_ways(request)
    assert code == 0, out
    assert out.startswith(dry), out
    _ran_in_order(_printed(dry), ran)
    # The run is detached: follow it to its end so nothing is left running.
    assert tasks.logs("test", "dry1", hosts_file=str(hosts), out=io.StringIO()) == 0


@pytest.mark.docker
def test_docker_dry_run_is_what_runs(
    engines: tuple[Engine, Engine],
    sshd: SshServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A docker deploy: the directories, compose preflight, compose up and the exit watcher
    run exactly as printed."""
    local, remote = engines
    client = local.client()
    image = "ups-kinds-dryrun:app"  # names inside the test's own private engines
    import_tiny_base(client, "ups-deploytest-base:1")  # the base build_app builds FROM
    build_app(client, tmp_path / "ctx", image, version="1")
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(COMPOSE)
    box = sshd.host_entry(
        kind="docker", image=image, docker_host=remote.url, compose_files=[str(compose)]
    )
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml", {"box": box})
    monkeypatch.setenv("DOCKER_HOST", local.url)  # the local engine the image is shipped from
    request = DeployRequest(
        host="box",
        config=demo_config(tmp_path / "demo.yaml"),
        run="dry2",
        hosts_file=str(hosts),
        follow=False,
    )
    dry, ran, out, code = _deploy_both_ways(request)
    assert code == 0, out
    assert out.startswith(dry), out
    _ran_in_order(_printed(dry), ran)
    assert tasks.logs("box", "dry2", hosts_file=str(hosts), out=io.StringIO()) == 0


def test_vast_dry_run_is_what_runs(
    fake_vast: FakeVast, demo_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vast deploy: the container commands printed before any instance exists (its address
    pending) are the ones run on the rented instance."""
    hosts = write_vast_hosts(
        fake_vast, tmp_path / "hosts.yaml", setup=f"mkdir -p data && ln -sfn {demo_data} data/demo"
    )
    for name in [k for k in os.environ if k.startswith(("VAST_", "UPS_", "WANDB_"))]:
        monkeypatch.delenv(name)
    for name, value in fab_env(fake_vast, tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # the run directory is fetched to ./runs
    request = DeployRequest(
        host="vast",
        config=demo_config(tmp_path / "demo.yaml", max_steps=3, nproc=1),  # commands, not ranks
        run="dry3",
        hosts_file=str(hosts),
    )
    dry, ran, out, code = _deploy_both_ways(request)
    assert code == 0, out
    _ran_in_order(_printed(dry), ran)
    assert fake_vast.live() == []
