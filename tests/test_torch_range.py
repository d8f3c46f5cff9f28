"""ups on the oldest torch it supports, in a virtualenv of its own (scripts/torch-range.sh).

CI's main venv holds the pinned release (pins.toml); these tests run the other end of the
range (``ups.torchcompat.SUPPORTED_TORCH``): the quick tier, a 2-rank ``ups launch``
stopped with SIGTERM and resumed to ``finished``, and preflight, all under that torch.
scripts/test.sh starts the venv's install (about 3 GB of CUDA wheels from PyPI) in the
background before the linters; the fixture below waits for it on the install's lock, or
installs it itself when pytest runs alone. ``UPS_TORCH_VENV=DIR`` points them at another
venv of the range (``scripts/torch-range.sh newest`` does, for the newest release).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.distributed.run import get_args_parser
from torch.nn.parallel import DistributedDataParallel

from tests.conftest import REPO, worker_env
from tests.lifecycle_helpers import MARKER, assert_no_survivors, finish, outcome, wait_for
from ups.config.schema import TrainingConfig
from ups.torchcompat import (
    SUPPORTED_TORCH,
    ddp_no_forward_buffer_sync,
    fsdp_missing,
    in_supported_range,
    supported_range_text,
    torchrun_argv,
)
from ups.train.startcheck import strategy_problems

OLDEST_VENV = REPO / ".venv-torch-oldest"


def RANGE(test: Callable[..., None]) -> Callable[..., None]:
    """The tests that need the range's venv share one worker (one waits for the install, not
    two) and start once scripts/test.sh's background install ``torch-oldest`` should have
    ended (tests/background.py)."""
    return pytest.mark.background("torch-oldest")(pytest.mark.xdist_group("torch-range")(test))


@pytest.fixture(scope="session")
def range_python() -> Path:
    """The python of the range's venv: UPS_TORCH_VENV's, else the oldest release's (its
    install waited for, or run, under the script's lock)."""
    given = os.environ.get("UPS_TORCH_VENV")
    if given:
        return Path(given) / "bin" / "python"
    proc = subprocess.run(["bash", "scripts/torch-range.sh", "install", str(OLDEST_VENV)],
                          capture_output=True, text=True, timeout=1800, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return OLDEST_VENV / "bin" / "python"


def _torch_version(python: Path) -> str:
    proc = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_pyproject_declares_the_supported_range_and_make_venv_the_pin() -> None:
    """pyproject.toml's torch requirement is ups.torchcompat's range, which holds the pinned
    release; `make venv` installs exactly the pinned release (its CPU wheel lies on
    this machine's index, handed to uv from pip's configuration), in the same resolution as
    the dev extras, so nothing pulls a CUDA build into the main venv."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    torch_req = [d for d in project["dependencies"] if re.match(r"torch\b", d)]
    assert torch_req == [f"torch{supported_range_text()}"]
    assert supported_range_text() == ">=2.11,<2.16"
    pin = tomllib.loads((REPO / "pins.toml").read_text())["versions"]["torch"]
    assert in_supported_range(pin)
    assert f'"torch=={pin}" -e ".[dev]"' in (REPO / "Makefile").read_text()


def test_each_feature_is_chosen_by_what_this_torch_has() -> None:
    """Run in both venvs (the pinned torch and the oldest): DDP gets the keyword its
    signature has; torchrun gets ``--shutdown-timeout`` where its parser has it; fsdp is
    allowed where FSDP2 can reset a step cut off mid-way, and refused in one line naming
    the release that can where it cannot (2.11, 2.12)."""
    keywords = inspect.signature(DistributedDataParallel.__init__).parameters
    assert set(ddp_no_forward_buffer_sync()) <= set(keywords)
    assert list(ddp_no_forward_buffer_sync().values()) == [False]
    assert strategy_problems(TrainingConfig(strategy="ddp")) == []
    plan = ["--nproc-per-node=2", "--shutdown-timeout=120", "-m", "ups.train.main", "c.yaml"]
    argv, grace = torchrun_argv(plan)
    args = get_args_parser().parse_args(argv)  # this torchrun accepts what is left
    if grace is None:  # 2.13 on: torchrun's own option
        assert argv == plan and args.shutdown_timeout == 120
    else:  # before: the option is taken out, and the workers get the grace another way
        assert (argv, grace) == (plan[:1] + plan[2:], 120)
    fsdp = strategy_problems(TrainingConfig(strategy="fsdp"))
    if fsdp_missing() is None:
        assert fsdp == []
    else:
        assert fsdp == [
            "training.strategy: fsdp needs FSDPModule.reset_iter_state, which torch "
            f"{torch.__version__} lacks (torch 2.13 has it): use strategy ddp here, or "
            "torch>=2.13"
        ]


@pytest.mark.slow
@RANGE
def test_quick_tier_passes_under_the_oldest_torch(range_python: Path) -> None:
    """Every test of the quick tier (no processes) passes under the range's torch, skipping
    nothing but GPU tests (tests/conftest.py fails any other skip)."""
    version = _torch_version(range_python)
    if "UPS_TORCH_VENV" not in os.environ:
        assert version.startswith(SUPPORTED_TORCH[0] + "."), version
    proc = subprocess.run(
        [str(range_python), "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
         "-p", "no:randomly", "-x", "-rfEs", "tests"],
        capture_output=True, text=True, timeout=900, cwd=REPO, env=worker_env(),
    )  # fmt: skip
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, f"torch {version}:\n{tail}"
    assert re.search(r"\d+ passed", proc.stdout), tail


@pytest.mark.slow
@RANGE
def test_launch_stop_resume_and_preflight_under_the_oldest_torch(
    range_python: Path, make_config: Callable[..., Path], tmp_path: Path
) -> None:
    """Under the range's torch: `ups launch` of a 2-rank run passes its preflight (the
    launcher's own gate, on the master port it picked: other tests may hold 29500), its
    versions row warning with the pinned and the running torch; SIGTERM once it trains
    (exit 75, a checkpoint), the same command resumes it to `finished`, nothing
    survives."""
    version = _torch_version(range_python)
    cfg = make_config(training={"max_steps": 100_000, "epochs": 1000},
                      checkpoint={"every_steps": 100_000})  # fmt: skip
    marker = f"torch-range-{tmp_path.name}"
    env = worker_env({MARKER: marker})
    launch = [str(range_python), "-m", "ups", "launch", str(cfg)]
    # The first launch runs preflight as a user's does, its checks as JSON events.
    proc = subprocess.Popen([*launch, "--log-format", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)  # fmt: skip
    wait_for(tmp_path / "runs" / "latest" / "logs" / "launch.log", proc, 300, event="train_step")
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, timeout=300)
    assert proc.returncode == 75, f"torch {version}:\n{out[-3000:]}"
    assert_no_survivors(marker)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    checks = {e["check"]: e for e in events if e.get("event") == "preflight_check"}
    pinned = tomllib.loads((REPO / "pins.toml").read_text())["versions"]["torch"]
    if version.split("+")[0] != pinned:
        assert checks["versions"]["status"] == "warn", checks["versions"]
        assert f"torch: pinned {pinned}, running {version}" in checks["versions"]["message"]
    assert checks["allreduce"]["status"] == "pass", checks["allreduce"]
    assert not [e for e in checks.values() if e["status"] == "fail"], checks
    run_dir = (tmp_path / "runs" / "latest").resolve()
    stopped = outcome(run_dir)
    assert (stopped["outcome"], stopped["cause"]) == ("preempted", "preempted")
    assert Path(stopped["checkpoint"]).is_file()

    resume = [*launch, "--skip-preflight", "--set", f"training.max_steps={stopped['step'] + 2}"]
    again = subprocess.run(resume, capture_output=True, text=True, timeout=400, env=env, cwd=REPO)
    assert again.returncode == 0, f"torch {version}:\n{again.stdout[-3000:]}"
    assert_no_survivors(marker)
    assert f"resuming run {run_dir.name} from step {stopped['step']}" in again.stdout
    done = outcome(run_dir)
    assert done["outcome"] == "finished" and done["resumed_from"]["step"] == stopped["step"]
    assert done["step"] == stopped["step"] + 2
