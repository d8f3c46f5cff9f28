"""System checks against real conditions: a small tmpfs, lowered ulimits, a memory cgroup,
and the data check on a truncated HDF5 file."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.fixtures.preflight_helpers import run_check, small_tmpfs
from ups.config import load_config
from ups.console.units import GiB
from ups.data.pdebench import inspect_task
from ups.model import build_model, task_shapes
from ups.preflight import Status
from ups.preflight.checks.disk import build_for_counting
from ups.preflight.checks.shm import required_bytes


def test_small_shm_fails_with_compose_hint(tmp_path: Path) -> None:
    """A 16 MiB /dev/shm (Docker's default is 64 MB) fails and the hint says `ipc: host`."""
    with small_tmpfs(tmp_path / "shm", "16m") as shm:
        result = run_check("shm", shm_path=shm)
    assert result.status is Status.FAIL
    assert "below the 1 GiB needed" in result.message
    assert result.hint is not None and "ipc: host" in result.hint and "shm_size" in result.hint


def test_large_shm_passes(tmp_path: Path) -> None:
    """A 4 GiB tmpfs is enough for 2 ranks without DataLoader workers."""
    with small_tmpfs(tmp_path / "shm", "4g") as shm:
        result = run_check("shm", shm_path=shm, nproc_per_node=2)
    assert result.status is Status.PASS
    assert result.threshold == 1.0


def test_shm_need_grows_with_workers(make_config: Callable[..., Path]) -> None:
    """The requirement counts the config's DataLoader workers and their batches: 2 ranks x
    (8 workers x prefetch 4 + 2) steps of 4096 items of both tiny tasks, over the 1 GiB floor."""
    item = (2 * 4 * 64 + 8) + (2 * 4 * 16 * 16 + 8)  # advection (1, 64), darcy (1, 16, 16)
    config = make_config(training={"num_workers": 8, "prefetch_factor": 4, "batch_size": 4096})
    result = run_check("shm", config=config, nproc_per_node=2)
    assert result.details["loader_bytes_per_rank"] == (8 * 4 + 2) * 4096 * item
    assert result.details["required_bytes"] == required_bytes(2, (8 * 4 + 2) * 4096 * item)
    assert result.details["required_bytes"] > 1 * GiB


def test_full_disk_fails(tmp_path: Path, make_config: Callable[..., Path]) -> None:
    """An output_dir on a 16 MiB filesystem fails the disk check, naming the directory."""
    with small_tmpfs(tmp_path / "small", "16m") as small:
        config = make_config(run={"output_dir": str(small / "runs")})
        result = run_check("disk", config=config)
    assert result.status is Status.FAIL
    assert "runs (output_dir)" in result.message


def test_disk_with_room_passes(make_config: Callable[..., Path]) -> None:
    """This machine's disk has room for runs (value in GiB, threshold 2 GiB)."""
    result = run_check("disk", config=make_config())
    assert result.status in {Status.PASS, Status.WARN}
    assert result.threshold == 2.0


def test_disk_estimate_counts_the_real_model_on_cpu_or_meta(
    make_config: Callable[..., Path],
) -> None:
    """The model the disk estimate counts has the trainer's tensor sizes, whether it was built
    on the CPU (small) or, past the element budget, on the meta device; the RNG is untouched."""
    cfg = load_config(make_config())
    shapes = task_shapes({t.name: inspect_task(t) for t in cfg.tasks})
    rng = torch.get_rng_state()
    cpu = build_for_counting(shapes, cfg)
    meta = build_for_counting(shapes, cfg, cpu_elements=1000)
    assert torch.equal(torch.get_rng_state(), rng)

    def sizes(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}

    assert next(cpu.parameters()).device.type == "cpu" and next(meta.parameters()).is_meta
    assert sizes(cpu) == sizes(meta) == sizes(build_model(shapes, cfg.model))


def test_low_nofile_warns_and_normal_passes() -> None:
    """nofile below 4096 warns with the ulimit fix; restoring the limit passes again."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        low = run_check("ulimits")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert low.status is Status.WARN
    assert "nofile 1024 < 4096" in low.message
    assert low.hint is not None and "nofile" in low.hint
    if soft >= 4096 or soft == resource.RLIM_INFINITY:
        assert run_check("ulimits").status is Status.PASS


def test_memory_passes_here() -> None:
    """This machine has more than 2 GiB RAM available."""
    result = run_check("memory")
    assert result.status is Status.PASS
    assert isinstance(result.value, float) and result.value > 2


@pytest.mark.slow
def test_memory_cgroup_limit_fails(tmp_path: Path) -> None:
    """Inside a real 1 GiB memory cgroup, the memory check fails (limit counted, not host RAM)."""
    group = Path(f"/sys/fs/cgroup/memory/ups-preflight-test-{os.getpid()}")
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(GiB))
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup v1 memory group here: {exc}")
    code = (
        "import os, sys, json\n"
        f"open('{group}/cgroup.procs', 'w').write(str(os.getpid()))\n"
        "from ups.preflight import PreflightOptions, run_preflight\n"
        "r = run_preflight(PreflightOptions(only=['memory'])).get('memory')\n"
        "print(json.dumps(r.to_dict()))\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    finally:
        group.rmdir()
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["status"] == "fail"
    assert "cgroup limit" in result["message"]
    assert result["value"] < 1.0


def test_data_passes_on_valid_files(make_config: Callable[..., Path]) -> None:
    """Valid PDEBench-layout files pass, with per-task sizes from the trainer's reader."""
    result = run_check("data", config=make_config())
    assert result.status is Status.PASS
    assert set(result.details["tasks"]) == {"advection", "darcy"}
    assert result.details["tasks"]["advection"]["samples"] == 24


def test_truncated_hdf5_fails_naming_the_task(
    tmp_path: Path, tiny_data: dict[str, Path], make_config: Callable[..., Path]
) -> None:
    """A truncated HDF5 file fails the data check, naming the task and file; others still pass."""
    cut = tmp_path / "cut.hdf5"
    shutil.copy(tiny_data["advection"], cut)
    with cut.open("r+b") as fh:
        fh.truncate(cut.stat().st_size // 2)
    config = make_config(
        tasks=[
            {"name": "advection", "layout": "single_1d", "path": str(cut)},
            {"name": "darcy", "layout": "darcy_2d", "path": str(tiny_data["darcy"])},
        ]
    )
    result = run_check("data", config=config)
    assert result.status is Status.FAIL
    assert result.message.startswith("1 of 2 data file(s) unusable: advection:")
    assert str(cut) in result.message
    assert result.details["tasks"]["darcy"]["ok"] is True
    assert result.hint is not None and "ups data synth" in result.hint
