"""The latent cache: CPU-only files, frozen encoders, and loud errors when it is stale."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    PYTHON,
    REPO,
    only_run_dir,
    rank_events,
    torchrun,
    uninterrupted_run,
    worker_env,
)
from ups.outcome import EXIT_CONFIG, read_outcome
from ups.preflight.torchfile import scan_file
from ups.train.checkpoint import list_checkpoints, load_checkpoint


def _ups(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "ups", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=worker_env(),
        cwd=REPO,
    )


@pytest.mark.slow
def test_cache_build_then_train_on_cached_latents(
    make_config, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`ups cache build` takes the encoders of the newest checkpoint of the latest run and
    writes CPU-only files; a 2-rank run trains on them with frozen encoders."""
    cache_dir = tmp_path / "cache"
    # The latest run: the shared uninterrupted run of the tiny config (conftest), which
    # other tests train anyway; only read here.
    trained = uninterrupted_run(tmp_path_factory, make_config(training={"max_steps": 12}))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "latest").symlink_to(trained)
    cfg = make_config(training={"max_steps": 6}, cache={"dir": str(cache_dir)})
    built = _ups("cache", "build", str(cfg))
    assert built.returncode == 0, built.stderr
    files = sorted(p.name for p in cache_dir.iterdir())
    assert files == ["advection.pt", "darcy.pt", "encoders.pt", "manifest.json"]
    _, newest = list_checkpoints(trained / "checkpoints")[-1]
    source = json.loads((cache_dir / "manifest.json").read_text())["source"]
    assert Path(source).resolve() == newest.resolve(), source
    encoders = {k.removeprefix("encoders."): v for k, v in load_checkpoint(newest)["model"].items()
                if k.startswith("encoders.")}  # fmt: skip
    written = torch.load(cache_dir / "encoders.pt", weights_only=True)
    assert written.keys() == encoders.keys() and encoders
    assert all(torch.equal(written[k], encoders[k]) for k in encoders), "not the checkpoint's"
    for path in cache_dir.glob("*.pt"):
        scan = scan_file(path)
        assert scan.error is None and scan.storages and scan.locations == {"cpu"}
    z = torch.load(cache_dir / "advection.pt", weights_only=True, mmap=True)["z"]
    assert z.device.type == "cpu" and z.shape[-1] == 16

    cached = make_config(
        training={"max_steps": 6},
        cache={"dir": str(cache_dir), "enabled": True},
        run={"name": "cached", "output_dir": str(tmp_path / "cached")},
    )
    result = torchrun(cached)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "cached")
    assert read_outcome(run_dir).outcome == "finished"  # type: ignore[union-attr]  # a finished run has one
    assert [e for e in rank_events(run_dir, 0) if e["event"] == "train_step"]
    frozen = torch.load(cache_dir / "encoders.pt", weights_only=True)
    _, last = list_checkpoints(run_dir / "checkpoints")[-1]
    trained = load_checkpoint(last)["model"]
    for name, tensor in frozen.items():
        assert torch.equal(trained[f"encoders.{name}"], tensor), f"encoder {name} changed"


@pytest.mark.slow
def test_stale_cache_is_rejected_before_training(make_config, tmp_path: Path) -> None:
    """cache.enabled with no cache built: exit 2 naming cache.dir and the rebuild command."""
    cache_dir = tmp_path / "nocache"
    cache_dir.mkdir()
    cfg = make_config(cache={"dir": str(cache_dir), "enabled": True})
    result = _ups("train", str(cfg))
    assert result.returncode == EXIT_CONFIG
    assert "cache.dir" in result.stdout and "ups cache build" in result.stdout
    assert not (tmp_path / "runs").exists()
