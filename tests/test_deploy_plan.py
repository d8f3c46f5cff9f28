"""Deploy logic that needs no network: hosts file, plan, remote shell text, rendering."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy_fixtures import REPO, demo_config, fab
from ups.deploy.errors import DeployError
from ups.deploy.hosts import get_host
from ups.deploy.plan import build_plan, script_for
from ups.deploy.remote import RemoteRun, run_script
from ups.deploy.stream import follow_command


def _hosts(tmp_path: Path, **entry: object) -> Path:
    path = tmp_path / "hosts.yaml"
    base = {"host": "10.0.0.1", "port": 2222, "user": "root", "workdir": "/w", "gpus": 2}
    path.write_text(yaml.safe_dump({"hosts": {"vast": {**base, **entry}}}))
    return path


def test_unknown_host_names_the_defined_ones(tmp_path: Path) -> None:
    """Asking for a host that is not in hosts.yaml says which hosts exist."""
    with pytest.raises(DeployError, match=r"unknown host 'nope'.*defines vast"):
        get_host("nope", _hosts(tmp_path))


def test_invalid_hosts_file_names_the_key(tmp_path: Path) -> None:
    """A typo'd field or wrong kind in hosts.yaml is reported with its key path."""
    path = _hosts(tmp_path, kind="vm", colour="red")
    with pytest.raises(DeployError) as err:
        get_host("vast", path)
    assert "hosts.vast.kind" in str(err.value)
    assert "hosts.vast.colour" in str(err.value)


def test_example_hosts_file_is_valid() -> None:
    """The shipped configs/hosts.yaml example loads: `vast` rents an instance, `vast-ssh` is
    an instance by address (a container host)."""
    spec, known = get_host("vast", REPO / "configs" / "hosts.yaml")
    assert spec.kind == "vast"
    assert known.name == "known_hosts"
    assert get_host("vast-ssh", REPO / "configs" / "hosts.yaml")[0].kind == "container"


def test_plan_shows_steps_and_never_secret_values(tmp_path: Path) -> None:
    """The plan lists preflight, detached start and follow; secrets appear by name only."""
    spec, _ = get_host("vast", _hosts(tmp_path))
    config = demo_config(tmp_path / "c.yaml")
    plan = build_plan(spec, config, run_id="r1", env={"WANDB_API_KEY": "sekret-123"})
    text = plan.render() + plan.to_json() + script_for(plan, None)
    assert "sekret-123" not in text
    assert plan.secrets == ["WANDB_API_KEY"]
    assert [s.name for s in plan.steps] == [
        "connect",
        "check-code",
        "upload",
        "preflight",
        "start",
        "follow",
    ]
    assert "setsid nohup" in plan.render()
    assert "--nproc-per-node 2" in " ".join(plan.launch_argv)
    assert plan.remote.launch_log == "/w/runs/r1/logs/launch.log"


def test_run_script_is_valid_shell_with_quoted_paths() -> None:
    """The detached run script parses in sh even with spaces and quotes in paths."""
    run = RemoteRun(workdir="/tmp/it's here", run_id="r 1")
    script = run_script(run, ["ups", "launch", "/tmp/it's here/c.yaml"], ". /opt/env")
    subprocess.run(["sh", "-n", "-c", script], check=True, timeout=10)
    command = follow_command("/tmp/a b/launch.log", 41, ["/x/outcome.json"], 2.0)
    assert "-c +42 -F '/tmp/a b/launch.log'" in command
    subprocess.run(["sh", "-n", "-c", command], check=True, timeout=10)


def test_fab_dry_run_prints_plan_with_host_flag(tmp_path: Path) -> None:
    """`fab deploy --host NAME --dry-run` (no -H) prints the plan and touches no host."""
    hosts = _hosts(tmp_path)
    config = demo_config(tmp_path / "c.yaml")
    result = fab(
        "deploy",
        "--host",
        "vast",
        "--hosts-file",
        str(hosts),
        "--config",
        str(config),
        "--dry-run",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "deploy plan: run demo-" in result.stdout
    assert "root@10.0.0.1:2222" in result.stdout


def test_fab_unknown_host_fails_clearly(tmp_path: Path) -> None:
    """`fab deploy --host typo` exits non-zero and names the hosts that exist."""
    result = fab("deploy", "--host", "typo", "--hosts-file", str(_hosts(tmp_path)), timeout=60)
    assert result.returncode != 0
    assert "unknown host 'typo'" in result.stderr
    assert "vast" in result.stderr
