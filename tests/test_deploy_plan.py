"""Deploy logic that needs no network: hosts file, plan, remote shell text, rendering."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy_fixtures import REPO, demo_config, fab
from ups.deploy.errors import DeployError
from ups.deploy.hosts import get_host
from ups.deploy.onhost.plan import build_plan, load_run_config, script_for
from ups.deploy.transport.remote import RemoteRun, follow_command, run_script


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


def test_a_key_of_another_kind_is_named_with_its_path(tmp_path: Path) -> None:
    """`offer:` on a docker entry, `registry:` on a container one, an address on a vast one:
    each is refused with its key path and the kind it belongs to, all in one error."""
    path = tmp_path / "hosts.yaml"
    entries = {
        "gpubox": {"host": "g", "kind": "docker", "offer": "num_gpus=1"},
        "box": {"host": "b", "registry": "ghcr.io/x"},
        "v": {"kind": "vast", "offer": "x", "max_price_per_hour": 1, "host": "h"},
        "ok": {"host": "o", "kind": "docker", "registry": "ghcr.io/x"},
    }
    path.write_text(yaml.safe_dump({"hosts": entries}))
    with pytest.raises(DeployError) as err:
        get_host("ok", path)
    text = str(err.value)
    assert err.value.exit_code == 2
    assert "hosts.gpubox.offer: not a field of a docker host (it belongs to rented (vast" in text
    assert "hosts.box.registry: not a field of a container host" in text
    assert "hosts.v.host: not a field of a vast host" in text
    assert "hosts.ok" not in text


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
    cfg = load_run_config(config, [])
    plan = build_plan(spec, config, cfg=cfg, run_id="r1", env={"WANDB_API_KEY": "sekret-123"})
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


@pytest.mark.slow
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
    assert re.search(r"deploy plan: (run|.*else new run) demo-", result.stdout), result.stdout
    assert "root@10.0.0.1:2222" in result.stdout


@pytest.mark.slow
def test_fab_unknown_host_fails_clearly(tmp_path: Path) -> None:
    """`fab deploy --host typo` exits non-zero and names the hosts that exist."""
    result = fab("deploy", "--host", "typo", "--hosts-file", str(_hosts(tmp_path)), timeout=60)
    assert result.returncode != 0
    assert "unknown host 'typo'" in result.stderr
    assert "vast" in result.stderr


@pytest.mark.parametrize("kind", ["container", "docker"])
def test_every_planned_command_is_valid_shell(tmp_path: Path, kind: str) -> None:
    """Each step command `--dry-run` shows (the exact text deploy runs) parses in sh, and
    the run id appears in it only as a quoted word or inside quoted paths."""
    from ups.deploy.kinds.docker.compose import build_docker_plan

    # docker_host only on the docker entry: a container entry refuses docker-only keys.
    extra = {"docker_host": "unix:///x y.sock"} if kind == "docker" else {}
    spec, _ = get_host("vast", _hosts(tmp_path, kind=kind, **extra))
    config = demo_config(tmp_path / "c.yaml")
    cfg = load_run_config(config, ["training.max_steps=5"])
    if kind == "docker":
        plan = build_docker_plan(
            spec, config, cfg=cfg, run_id="r.1", follow=True, skip_preflight=False, env={}
        )
    else:
        plan = build_plan(spec, config, cfg=cfg, run_id="r.1", overrides=["training.max_steps=5"])
    commands = [s.command for s in plan.steps if s.command]
    assert len(commands) >= 2
    for command in commands:
        subprocess.run(["sh", "-n", "-c", command], check=True, timeout=10)
        assert command in plan.render()
    if kind == "docker":
        assert "'DOCKER_HOST=unix:///x y.sock'" in plan.render()


def test_the_docker_kind_and_the_container_executor_stay_apart() -> None:
    """The host kinds share ups.deploy.onhost and ups.deploy.transport and never import
    each other (no circle anywhere in ups/: tests/test_import_contract.py); the docker kind
    (its own package) and the container executor never import each other either."""
    package = REPO / "ups" / "deploy" / "kinds" / "docker"
    docker = "\n".join(p.read_text() for p in package.glob("*.py"))
    operate = (REPO / "ups" / "deploy" / "onhost" / "operate.py").read_text()
    assert "operate" not in docker and "kinds" not in operate


@pytest.mark.slow
def test_group_dry_run_plans_one_node_agent_per_host(tmp_path: Path) -> None:
    """`fab deploy --host GROUP --dry-run` plans one `ups launch` per host, all with the
    same run id and node 0's rendezvous address, node ranks in group order; only node 0
    checks the rendezvous port; a docker host in the group is refused (exit 2)."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "a": {"host": "10.0.0.1", "workdir": "/w", "rdzv_address": "192.168.7.5"},
                    "b": {"host": "10.0.0.2", "workdir": "/w"},
                    "d": {"host": "10.0.0.3", "workdir": "/w", "kind": "docker"},
                },
                "groups": {"pair": ["b", "a"]},
            }
        )
    )
    config = demo_config(tmp_path / "c.yaml")
    result = fab("deploy", "--host", "pair", "--hosts-file", str(hosts), "--config", str(config),
                 "--run", "job1", "--dry-run", timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    launches = [line for line in result.stdout.splitlines() if "launch:   " in line]
    assert len(launches) == 2
    port = yaml.safe_load(config.read_text())["distributed"]["master_port"]
    assert launches[0].startswith("[node0 b]") and "--node-rank 0" in launches[0]
    assert launches[1].startswith("[node1 a]") and "--node-rank 1" in launches[1]
    for line in launches:
        assert "--run-id job1 --nnodes 2" in line
        assert f"--rdzv-endpoint 10.0.0.2:{port}" in line  # node 0 is b, first in the group
    checks = [line for line in result.stdout.splitlines() if "preflight --events off" in line]
    assert "--skip ports" not in checks[0] and "--skip ports" in checks[1]
    mixed = fab("deploy", "--host", "a,d", "--hosts-file", str(hosts), "--dry-run", timeout=60)
    assert mixed.returncode == 2
    assert "d (docker)" in mixed.stderr


def test_a_bad_value_reads_as_a_sentence_without_pydantics_prefix(tmp_path: Path) -> None:
    """`checkpoint_sync: my-bucket/ups` (no s3://) says what to write, and not pydantic's
    "Value error," in front of it."""
    path = tmp_path / "hosts.yaml"
    entry = {"kind": "vast", "offer": "num_gpus=1", "max_price_per_hour": 1,
             "image": "ghcr.io/x/ups:1", "checkpoint_sync": "my-bucket/ups"}  # fmt: skip
    path.write_text(yaml.safe_dump({"hosts": {"v": entry}}))
    with pytest.raises(DeployError) as err:
        get_host("v", path)
    text = str(err.value)
    assert "hosts.v: checkpoint_sync: 'my-bucket/ups' is not a bucket URL: write s3://" in text
    assert "Value error" not in text
