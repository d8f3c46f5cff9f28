"""Multi-node on one machine: two `ups launch` node agents rendezvous on loopback."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tests.conftest import REPO, worker_env
from tests.launch_helpers import launch_cmd, outcome_of

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_nodes(
    per_node: Callable[[int], Sequence[str]], timeout: float = 240
) -> list[subprocess.CompletedProcess[str]]:
    """Start node 1 first (it must wait for node 0's store), then node 0; wait for both."""
    endpoint = f"127.0.0.1:{_free_port()}"
    procs = {}
    for rank in (1, 0):
        cmd = launch_cmd(
            *per_node(rank), "--nnodes", "2", "--node-rank", str(rank),
            "--nproc-per-node", "1", "--rdzv-endpoint", endpoint,
        )  # fmt: skip
        procs[rank] = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=worker_env(), cwd=REPO,
        )  # fmt: skip
    results = []
    try:
        for rank in (0, 1):
            out, err = procs[rank].communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(cmd, procs[rank].returncode, out, err))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def test_two_node_agents_train_the_bundled_trainer(
    tmp_path: Path, make_config: Callable[..., Path]
) -> None:
    """The bundled trainer across two node agents (1 worker each) forms one world of 2 whose
    global rank is the node rank: both exit 0, node 0 holds rank 0's outcome "finished" for
    world size 2, its checkpoint and rank 0's log, node 1 its own "finished" outcome and
    rank 1's log, each in its own run directory."""
    config = make_config(training={"max_steps": 4, "log_every": 1})

    def args(rank: int) -> list[str]:
        out = tmp_path / f"node{rank}"
        return [str(config), "--run-id", "mt", "--set", f"run.output_dir={out}", "--skip-preflight"]

    node0, node1 = _two_nodes(args)
    assert (node0.returncode, node1.returncode) == (0, 0), node0.stdout[-3000:] + node1.stdout
    outcome = outcome_of(tmp_path / "node0" / "mt")
    assert (outcome["outcome"], outcome["world_size"], outcome["step"]) == ("finished", 2, 4)
    assert list((tmp_path / "node0" / "mt" / "checkpoints").glob("step_*.pt"))
    own = outcome_of(tmp_path / "node1" / "mt")  # node 1's launch tells its own end
    assert (own["outcome"], own["world_size"]) == ("finished", 2), own
    assert own["reason"] == "all 1 worker(s) on node 1 exited 0", own["reason"]
    for node in (0, 1):  # one world: the global rank is the node rank
        logs = tmp_path / f"node{node}" / "mt" / "logs"
        assert sorted(p.name for p in logs.glob("rank*.jsonl")) == [f"rank{node}.jsonl"], node


def test_node_whose_peer_never_comes_fails_within_the_init_timeout(
    tmp_path: Path, make_config: Callable[..., Path]
) -> None:
    """Node 1 started without node 0: it gives up after distributed.init_timeout_s instead
    of hanging, exits 1, and outcome.json says torchrun could not rendezvous."""
    config = make_config(distributed={"init_timeout_s": 5})
    started = time.monotonic()
    proc = subprocess.run(
        launch_cmd(
            str(config), "--run-id", "lone", "--nnodes", "2", "--node-rank", "1",
            "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
            "--skip-preflight",
        ),
        capture_output=True, text=True, timeout=120, env=worker_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert time.monotonic() - started < 90
    reason = outcome_of(tmp_path / "runs" / "lone")["reason"]
    assert reason.startswith("torchrun failed:") and "timed out" in reason
