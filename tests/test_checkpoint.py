"""Checkpoints are never half-written, and a damaged one is detected and skipped on resume."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import structlog
import torch

from ups.train.checkpoint import (
    CheckpointCorrupt,
    latest_good_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)


def _state(value: float, numel: int = 10) -> dict[str, torch.Tensor]:
    return {"w": torch.full((numel,), value)}


def test_keeps_only_the_last_k_checkpoints(tmp_path: Path) -> None:
    """Saving five checkpoints with keep_last=2 leaves the two newest, each with its checksum."""
    for step in range(5):
        save_checkpoint(tmp_path, step, _state(step), keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert sorted(p.name for p in tmp_path.glob("*.sha256")) == [
        "step_000003.pt.sha256",
        "step_000004.pt.sha256",
    ]


def test_truncated_newest_checkpoint_falls_back_to_previous(tmp_path: Path) -> None:
    """A truncated newest file fails its checksum; resume takes the previous good one and warns."""
    save_checkpoint(tmp_path, 1, _state(1.0), keep_last=3)
    newest = save_checkpoint(tmp_path, 2, _state(2.0), keep_last=3)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    with pytest.raises(CheckpointCorrupt, match="does not match"):
        load_checkpoint(newest)
    with structlog.testing.capture_logs() as logs:
        found = latest_good_checkpoint(tmp_path)
    assert found is not None
    path, state = found
    assert path.name == "step_000001.pt" and torch.equal(state["w"], _state(1.0)["w"])
    assert [e["event"] for e in logs] == ["checkpoint_corrupt"]


def test_corrupt_checkpoint_without_checksum_is_detected_by_loading(tmp_path: Path) -> None:
    """With its checksum file gone, a damaged checkpoint still fails to load and is skipped."""
    save_checkpoint(tmp_path, 1, _state(1.0), keep_last=3)
    newest = save_checkpoint(tmp_path, 2, _state(2.0), keep_last=3)
    Path(str(newest) + ".sha256").unlink()
    newest.write_bytes(newest.read_bytes()[:100])
    found = latest_good_checkpoint(tmp_path)
    assert found is not None and found[0].name == "step_000001.pt"


_WRITER = """
import sys, torch
from pathlib import Path
from ups.train.checkpoint import save_checkpoint
save_checkpoint(Path(sys.argv[1]), 2, {"w": torch.ones(150_000_000)}, keep_last=3)
"""


@pytest.mark.slow
def test_writer_killed_mid_write_leaves_previous_checkpoint_usable(tmp_path: Path) -> None:
    """SIGKILL while a 600 MB checkpoint is written: only a temp file is left; resume uses 1."""
    save_checkpoint(tmp_path, 1, _state(1.0), keep_last=3)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)])
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".step_000002.pt.tmp-*")):
        assert writer.poll() is None, "writer finished before it could be killed"
        assert time.monotonic() < deadline, "writer never started writing"
        time.sleep(0.01)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    found = latest_good_checkpoint(tmp_path)
    assert found is not None and found[0].name == "step_000001.pt"
