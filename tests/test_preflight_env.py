"""Distributed env and W&B checks: consistent torchrun variables, credentials never shown."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, worker_env
from tests.fixtures.preflight_helpers import run_check
from ups.preflight import PreflightOptions, Status, run_preflight

TORCHRUN_ENV = {
    "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511",
}  # fmt: skip


def test_plain_process_passes() -> None:
    """Outside torchrun there is nothing to check: pass."""
    result = run_check("distenv", env={})
    assert result.status is Status.PASS
    assert "not under torchrun" in result.message


def test_consistent_torchrun_env_passes() -> None:
    """A consistent torchrun environment passes and is summarised."""
    result = run_check("distenv", env=TORCHRUN_ENV)
    assert result.status is Status.PASS
    assert result.message.startswith("rank 1 of 2 (local 1 of 2), master 127.0.0.1:29511")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({**TORCHRUN_ENV, "RANK": "3"}, "RANK=3 is outside 0..WORLD_SIZE-1"),
        ({k: v for k, v in TORCHRUN_ENV.items() if k != "MASTER_PORT"}, "MASTER_PORT"),
        ({"RANK": "0"}, "only some torchrun variables are set: RANK"),
    ],
)
def test_inconsistent_torchrun_env_fails(env: dict[str, str], expected: str) -> None:
    """Contradictory or partial RANK/WORLD_SIZE/MASTER_* fail with the launcher hint."""
    result = run_check("distenv", env=env)
    assert result.status is Status.FAIL
    assert expected in result.message
    assert result.hint is not None and "ups launch" in result.hint


def test_world_size_vs_nproc_per_node_fails() -> None:
    """LOCAL_WORLD_SIZE that disagrees with --nproc-per-node fails."""
    result = run_check("distenv", env=TORCHRUN_ENV, nproc_per_node=4)
    assert result.status is Status.FAIL


@pytest.mark.slow
def test_under_real_torchrun(tmp_path: Path) -> None:
    """Under real torchrun (2 workers), every worker's distenv check passes."""
    out = tmp_path / "out"
    out.mkdir()
    code = (
        "import os, sys\n"
        "from ups.preflight import PreflightOptions, run_preflight\n"
        "r = run_preflight(PreflightOptions(only=['distenv'], nproc_per_node=2)).get('distenv')\n"
        f"open(os.path.join({str(out)!r}, os.environ['RANK']), 'w').write(r.status + '|' + "
        "r.message)\n"
    )
    script = tmp_path / "check.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script)],
        capture_output=True, text=True, timeout=120, env=worker_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = {p.name: p.read_text() for p in out.iterdir()}
    assert results["0"].startswith("pass|rank 0 of 2")
    assert results["1"].startswith("pass|rank 1 of 2")


def test_wandb_online_without_credentials_fails(tmp_path: Path) -> None:
    """W&B online with no key in the env or ~/.netrc fails with the login hint."""
    result = run_check("wandb", env={"WANDB_MODE": "online", "HOME": str(tmp_path)})
    assert result.status is Status.FAIL
    assert result.hint is not None and "WANDB_API_KEY" in result.hint


def test_wandb_key_is_found_but_never_shown(
    tmp_path: Path, make_config: Callable[..., Path]
) -> None:
    """A key in the env or ~/.netrc is reported by source only; the JSON never contains it."""
    secret = "0123456789abcdef0123456789abcdef01234567"
    config = make_config(wandb={"mode": "auto"})
    env = {"WANDB_API_KEY": secret, "HOME": str(tmp_path)}
    report = run_preflight(PreflightOptions(only=["wandb"], config=config, env=env))
    result = report.get("wandb")
    assert result.status is Status.PASS
    assert result.message == "W&B auto -> online (key from WANDB_API_KEY)"
    assert secret not in report.to_json() and secret not in report.render_table()

    (tmp_path / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {secret}\n")
    (tmp_path / ".netrc").chmod(0o600)
    report = run_preflight(
        PreflightOptions(only=["wandb"], env={"WANDB_MODE": "online", "HOME": str(tmp_path)})
    )
    assert report.get("wandb").message == "W&B online, key from ~/.netrc"
    assert secret not in json.dumps(report.to_dict())
