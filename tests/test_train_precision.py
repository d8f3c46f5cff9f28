"""Mixed precision and torch.compile.

Real torchrun workers (gloo, CPU, 2 ranks) for a bf16 run and a compiled run (the
compiled one needs a C++ compiler: ``scripts/test.sh`` installs one when missing); the
fp16 loss scaler (CUDA only in a run) is checked on CPU tensors with torch's real
``GradScaler``.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.conftest import PYTHON, REPO, only_run_dir, torchrun, worker_env
from tests.fault_helpers import events, strict_json, survivors
from ups.outcome import EXIT_CONFIG
from ups.train.amp import is_overflow, scaler_overflow
from ups.train.compile import compile_failure

# Per rank: advection 110 train pairs, darcy 11: batch 11 gives every step the same
# shapes, so the compiled model compiles once.
BATCH = 11


def _inductor(root: Path) -> dict[str, str]:
    """The environment of a compiled run: inductor's on-disk cache in the test's own
    directory, shared by both ranks as on a user's host (rank 1 loads rank 0's kernels),
    never a kernel a previous run left in the default one; and the build in each rank's own
    process: inductor's default pool of compile workers (one per core) costs each rank a
    process per core that imports torch, more CPU than the few kernels of this model save
    on 2 cores."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TORCHINDUCTOR_COMPILE_THREADS": "1"}  # fmt: skip


def _config(root: Path, data: dict[str, Path], tasks: int = 2, **training: Any) -> Path:
    cfg = {
        "run": {"name": "prec", "output_dir": str(root / "runs"), "seed": 0},
        "tasks": [
            {"name": "advection", "layout": "single_1d", "path": str(data["advection"])},
            {"name": "darcy", "layout": "darcy_2d", "path": str(data["darcy"])},
        ][:tasks],
        "model": {"latent_dim": 16, "depth": 1, "heads": 2, "patch_1d": 8, "patch_2d": 4},
        "training": {"batch_size": BATCH, "log_every": 1, "lr": 1e-2, "warmup_steps": 2,
                     "schedule": "constant", **training},
        "checkpoint": {"every_steps": 1000},
        # gloo: these runs are on the CPU on every host; on a 1-GPU host `auto` would pick
        # nccl and give rank 1 a GPU that is not there (the GPU suite's first run).
        "distributed": {"backend": "gloo", "init_timeout_s": 300, "collective_timeout_s": 60},
        "wandb": {"mode": "disabled"},
    }  # fmt: skip
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _assert_loss_falls(run_dir: Path) -> None:
    losses = [e["train/loss"] for e in events(run_dir, 0, "train_step")]
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses


@pytest.mark.slow
def test_bf16_run_trains_and_records_its_precision(
    tmp_path: Path, tiny_data: dict[str, Path]
) -> None:
    """``training.precision: bf16``: the 2-rank run finishes, the loss falls, the replicas
    agree, and train_start and outcome.json say bf16."""
    result = torchrun(_config(tmp_path, tiny_data, precision="bf16", max_steps=12))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    _assert_loss_falls(run_dir)
    assert events(run_dir, 0, "train_start")[0]["precision"] == "bf16"
    digests = {r: events(run_dir, r, "replica_digest")[-1]["sha256"] for r in (0, 1)}
    assert digests[0] == digests[1]
    outcome = strict_json(run_dir / "outcome.json")
    assert outcome["outcome"] == "finished"
    assert outcome["training"] == {
        "strategy": "ddp", "precision": "bf16", "compiled": False, "accum_steps": 1,
        "oom_policy": "skip",
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.background("cxx")  # inductor's C++ compiler (scripts/test.sh installs it)
def test_compiled_two_rank_run_finishes_and_says_so(
    tmp_path: Path, tiny_data: dict[str, Path]
) -> None:
    """``training.compile: true``: both ranks compile before the first step (a real
    inductor build with the host's C++ compiler), the run finishes, the loss falls, the
    replicas agree, and outcome.json records that compile ran. One task: compiling on a
    CPU is slow, and one task's graph proves the same."""
    config = _config(tmp_path, tiny_data, tasks=1, compile=True, max_steps=10)
    result = torchrun(config, env=_inductor(tmp_path), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    for rank in (0, 1):
        assert len(events(run_dir, rank, "compiled")) == 1
    _assert_loss_falls(run_dir)
    digests = {r: events(run_dir, r, "replica_digest")[-1]["sha256"] for r in (0, 1)}
    assert digests[0] == digests[1]
    outcome = strict_json(run_dir / "outcome.json")
    assert outcome["outcome"] == "finished" and outcome["training"]["compiled"] is True
    assert survivors(str(config)) == []


@pytest.mark.slow
def test_compile_without_a_cxx_compiler_stops_every_rank_naming_the_fix(
    tmp_path: Path, tiny_data: dict[str, Path]
) -> None:
    """No working C++ compiler (``CXX`` names a missing one): both ranks stop before the
    first step with exit code 2 and the same paragraph naming both ranks and the fixes
    (install build-essential, or compile: false); no hang, no process left behind. Each rank
    finds it out before tracing the model (ups.train.compile._find_cxx)."""
    config = _config(tmp_path, tiny_data, tasks=1, compile=True, max_steps=3)
    env = {**_inductor(tmp_path), "CXX": str(tmp_path / "no-such-g++")}
    result = torchrun(config, env=env, timeout=300)
    assert result.returncode != 0
    run_dir = only_run_dir(tmp_path / "runs")
    outcome = strict_json(run_dir / "outcome.json")
    assert (outcome["exit_code"], outcome["cause"], outcome["phase"]) == (2, "config", "compile")
    assert "rank(s) [0, 1]" in outcome["reason"] and "build-essential" in outcome["reason"]
    for rank in (0, 1):
        assert [e["exit_code"] for e in events(run_dir, rank, "outcome")] == [EXIT_CONFIG]
        assert not events(run_dir, rank, "train_step")
        (failed,) = events(run_dir, rank, "compile_failed")
        # Found by the compiler search, before tracing; a host's setup: no traceback.
        assert failed["stage"] == "compiler_search", f"rank {rank} traced the model first"
        assert "exception" not in failed, failed["exception"][-2000:]
    assert survivors(str(config)) == []


@pytest.mark.slow
def test_fp16_without_cuda_is_a_config_error(tmp_path: Path, tiny_data: dict[str, Path]) -> None:
    """``precision: fp16`` on a run without CUDA (``backend: gloo``, so on a GPU host too):
    exit 2 before any process group, naming the key and the alternatives (no traceback)."""
    proc = subprocess.run(
        [PYTHON, "-m", "ups.train.main", str(_config(tmp_path, tiny_data, precision="fp16"))],
        capture_output=True, text=True, timeout=120, env=worker_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == EXIT_CONFIG, proc.stderr[-2000:]
    assert "training.precision: fp16 needs CUDA" in proc.stdout and "bf16" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_fp16_overflow_on_one_rank_backs_off_the_scale_on_every_rank() -> None:
    """An overflow agreed at the step's agreement (one rank's scaled gradients were inf, the
    other's finite): both ranks' real GradScalers halve the scale alike and neither applies
    an update; a NaN loss is a divergence, not an overflow."""
    scales, unchanged = [], []
    for overflowed in (False, True):  # rank 0 finite, rank 1 overflowed
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaler.scale(model(torch.randn(4, 3)).sum()).backward()  # type: ignore[no-untyped-call]
        if overflowed:
            model.weight.grad.fill_(math.inf)  # type: ignore[union-attr]
        before = model.weight.detach().clone()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        scales.append(scaler_overflow(scaler, optimizer, grads))
        unchanged.append(torch.equal(before, model.weight))
    assert scales == [512.0, 512.0] and unchanged == [True, True]
    scaler = torch.amp.GradScaler("cpu")
    assert is_overflow(scaler, [1], [(0.5, 0.2), (0.4, 0.3)])
    assert not is_overflow(scaler, [1], [(0.5, 0.2), (math.nan, 0.3)])
    assert not is_overflow(None, [1], [(0.5, 0.2), (0.4, 0.3)])


def test_compile_failure_names_the_ranks_and_the_fix() -> None:
    """A missing C++ compiler on rank 1 reads as one paragraph: the rank, what it said,
    and the two fixes (install build-essential, or training.compile: false)."""
    text = compile_failure(
        {1: "InductorError: InvalidCxxCompiler: No working C++ compiler found in cpp.cxx"}
    )
    assert "rank(s) [1]" in text and "InvalidCxxCompiler" in text
    assert "apt-get install build-essential" in text and "training.compile: false" in text
    other = compile_failure({0: "Unsupported: dynamic control flow", 1: "Unsupported: x"})
    assert "rank(s) [0, 1]" in other and "build-essential" not in other
