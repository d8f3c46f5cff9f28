"""The compose files are valid Compose and say what the runbook promises (no engine needed).

The schema is compose-spec/compose-go ``schema/compose-spec.json`` (commit e70e961c,
2026-07-21, draft 2020-12), vendored under tests/fixtures/. Each file is validated alone;
the GPU file merged with the CPU override is validated as ``docker compose config``
renders it, which is also how Compose itself interprets ``!reset``/``!override``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from ups.grace import container_grace_s

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tests/fixtures/compose-spec.json").read_text())
BASE = ROOT / "docker-compose.yml"
CPU = ROOT / "docker/compose.cpu.yml"


class _ComposeLoader(yaml.SafeLoader):
    """SafeLoader that reads Compose's merge tags as the plain value they carry."""


def _tagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]  # a ScalarNode here


_ComposeLoader.add_multi_constructor("!", _tagged)


def _load(path: Path) -> dict[str, Any]:
    data = yaml.load(path.read_text(), Loader=_ComposeLoader)
    assert isinstance(data, dict)
    return data


def _errors(doc: dict[str, Any]) -> list[str]:
    validator = Draft202012Validator(SCHEMA)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


def _compose() -> list[str]:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    if os.environ.get("CI") == "true":
        pytest.fail("docker compose is missing in CI: run scripts/docker-engine.sh first")
    pytest.skip("docker compose plugin not installed (scripts/docker-engine.sh installs it)")


def _rendered(*files: Path) -> dict[str, Any]:
    args = [a for f in files for a in ("-f", str(f))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPS_")}
    out = subprocess.run(
        # --env-file /dev/null: a developer's own .env must not change what is checked.
        [
            *_compose(),
            "--env-file",
            "/dev/null",
            "--profile",
            "tools",
            *args,
            "config",
            "--format",
            "json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    data = json.loads(out.stdout)
    assert isinstance(data, dict)
    return data


def _sets(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--set"]


@pytest.mark.parametrize("path", [BASE, CPU], ids=["docker-compose.yml", "compose.cpu.yml"])
def test_each_compose_file_alone_matches_the_compose_schema(path: Path) -> None:
    """A typo'd key or wrong type in either compose file is caught before anyone deploys."""
    assert _errors(_load(path)) == []


def test_schema_catches_a_wrong_key() -> None:
    """The validation is real: an unknown service key is reported, so passing means something."""
    doc = _load(BASE)
    doc["services"]["train-ddp"]["gpu_count"] = 8
    assert any("gpu_count" in e for e in _errors(doc))


@pytest.mark.slow
@pytest.mark.docker
def test_gpu_file_runs_preflight_first_and_keeps_everything_on_the_host() -> None:
    """train-ddp starts only after preflight succeeds, sees all GPUs, and writes to host dirs."""
    services = _rendered(BASE)["services"]
    ddp = services["train-ddp"]
    assert ddp["depends_on"]["preflight"]["condition"] == "service_completed_successfully"
    assert services["preflight"]["entrypoint"] == ["ups-entrypoint", "ups", "preflight"]
    for name in ("preflight", "train-ddp", "train"):
        svc = services[name]
        assert svc["ipc"] == "host"
        assert svc["ulimits"]["memlock"] == -1
        assert svc["ulimits"]["stack"] == 67108864
        assert {v["target"] for v in svc["volumes"]} >= {"/app/runs", "/app/cache", "/app/data"}
        assert all(v["type"] == "bind" for v in svc["volumes"])
        assert svc["init"] is True
    devices = ddp["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": -1, "capabilities": ["gpu"]}]
    single = services["train"]["deploy"]["resources"]["reservations"]["devices"]
    assert single[0]["count"] == 1
    # Long enough for every rank to write its preemption checkpoint (ups.grace derives it).
    seconds = int(container_grace_s())
    assert ddp["stop_grace_period"] == f"{seconds // 60}m{seconds % 60}s"


@pytest.mark.slow
@pytest.mark.docker
def test_the_wandb_key_is_a_secret_file_never_an_environment_entry() -> None:
    """The W&B key reaches every service as a secret file (default: an empty one, so W&B
    logs offline); nothing forwards .env as environment, which `docker inspect` would show."""
    base = _load(BASE)
    assert "env_file" not in base["x-ups"]
    assert "WANDB_API_KEY" not in str(base["x-ups"]["environment"])
    assert (
        base["secrets"]["wandb_api_key"]["file"] == "${UPS_WANDB_KEY_FILE:-./docker/no-wandb-key}"
    )
    assert (ROOT / "docker/no-wandb-key").read_bytes() == b""
    services = _rendered(BASE)["services"]
    for name in ("preflight", "train-ddp", "train", "synth"):
        assert services[name]["secrets"][0]["target"] == "/run/secrets/wandb_api_key"
        assert services[name]["user"] == "0:0"  # the entrypoint switches to the runs/ owner
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT)
    assert ignored.returncode == 0
    assert "UPS_WANDB_KEY_FILE=" in (ROOT / "example.env").read_text()
    assert ".env" in (ROOT / ".dockerignore").read_text().split()


@pytest.mark.slow
@pytest.mark.docker
def test_preflight_checks_the_same_run_that_train_ddp_launches() -> None:
    """The gate checks the config and overrides training will use, in both variants."""
    for files in ((BASE,), (BASE, CPU)):
        services = _rendered(*files)["services"]
        pre = services["preflight"]["command"]
        ddp = services["train-ddp"]["command"]
        assert pre[0] == "--config" and pre[1] == ddp[0]
        assert _sets(pre) == _sets(ddp)


@pytest.mark.slow
@pytest.mark.docker
def test_cpu_override_merged_is_valid_and_drops_gpus() -> None:
    """With the CPU override: valid Compose, no GPU reservation, host network, gloo on 2 ranks."""
    merged = _rendered(BASE, CPU)
    assert _errors(merged) == []
    for name, svc in merged["services"].items():
        assert "deploy" not in svc, name
        assert svc["network_mode"] == "host"
        assert svc["image"] == "ups:cpu"
        assert svc["pull_policy"] == "never"
        assert "memlock" not in svc["ulimits"]
        assert svc["ulimits"]["stack"] == 67108864
    ddp = merged["services"]["train-ddp"]["command"]
    assert "distributed.backend=gloo" in ddp and "distributed.nproc_per_node=2" in ddp
    assert merged["services"]["train-ddp"]["depends_on"]["preflight"]["condition"] == (
        "service_completed_successfully"
    )
