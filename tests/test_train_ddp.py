"""The trainer end to end: two real torchrun ranks (gloo, CPU), then one plain process.

One two-rank run (module fixture) is shared by the tests below; each test checks one
thing a user relies on: ranks train on different data, the loss falls, every rank keeps
a log, rank 1 stays quiet, W&B gets exactly one finished run, the outcome is written.

Data sizes (from ``tiny_data``: 24 samples, 11 frames; Darcy 24 samples, 16x16), chosen
so DistributedSampler has to pad (odd split sizes):

- advection: ``test_fraction=0.125`` -> 3 test / 21 train samples; ``reduced_resolution_t=2``
  -> 6 frames, 5 one-step pairs per sample -> 105 train pairs, 15 test pairs;
- darcy: 3 test / 21 train samples, one pair each -> 21 train, 3 test.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import (
    PYTHON,
    REPO,
    only_run_dir,
    parse_events,
    rank_events,
    worker_env,
)
from tests.wandb_offline import find_wandb_files, read_offline_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("train_ddp"),  # one worker: the module's two-rank run is shared
]

WORLD = 2
BATCH = 8
EPOCHS = 3
TRAIN_PAIRS = {"advection": 105, "darcy": 21}
TEST_PAIRS = {"advection": 15, "darcy": 3}


def _config(root: Path, data: dict[str, Path], **training: Any) -> Path:
    cfg = {
        "run": {"name": "ddp", "output_dir": str(root / "runs"), "seed": 0},
        "tasks": [
            {
                "name": "advection",
                "layout": "single_1d",
                "path": str(data["advection"]),
                "reduced_resolution_t": 2,
                "test_fraction": 0.125,
            },
            {
                "name": "darcy",
                "layout": "darcy_2d",
                "path": str(data["darcy"]),
                "test_fraction": 0.125,
            },
        ],
        "model": {"latent_dim": 16, "depth": 1, "heads": 2, "patch_1d": 8, "patch_2d": 4},
        "training": {
            "epochs": EPOCHS,
            "batch_size": BATCH,
            "log_every": 1,
            "lr": 1e-2,  # high and constant after a short warm-up: the run is only 21 steps
            "warmup_steps": 3,
            "schedule": "constant",
            "record_sample_ids": True,
            **training,
        },
        "checkpoint": {"every_steps": 1000},
        "distributed": {"init_timeout_s": 60, "collective_timeout_s": 30},
        "wandb": {"mode": "offline"},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class DDPRun:
    stdout: dict[int, str]
    """Each rank's own stdout, as torchrun captured it (``--redirects 1``)."""
    output_dir: Path
    run_dir: Path
    outcome: dict[str, Any]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory, tiny_data: dict[str, Path]) -> DDPRun:
    """Two ranks under real torchrun; each rank's stdout goes to its own file."""
    root = tmp_path_factory.mktemp("ddp")
    cmd = [
        PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
        "--monitor-interval=0.2", f"--log-dir={root / 'torchrun'}", "--redirects=1",
        "-m", "ups.train.main", str(_config(root, tiny_data)),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env=worker_env(), cwd=REPO
    )
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-4000:])
    stdout = {}
    for rank in range(WORLD):  # <log-dir>/<rdzv id>/attempt_0/<local rank>/stdout.log
        (path,) = (root / "torchrun").glob(f"*/attempt_0/{rank}/stdout.log")
        stdout[rank] = path.read_text()
    run_dir = only_run_dir(root / "runs")
    outcome = json.loads((run_dir / "outcome.json").read_text())
    return DDPRun(stdout, root / "runs", run_dir, outcome)


def _ids_by_step(run_dir: Path, rank: int) -> dict[int, dict[str, list[int]]]:
    return {e["step"]: e["ids"] for e in rank_events(run_dir, rank) if e["event"] == "batch_ids"}


def test_ranks_train_on_disjoint_shards_covering_the_split(ddp_run: DDPRun) -> None:
    """The loader is built after the process group, so ranks get different data: in every
    full pass over a task, the two ranks' sample ids are exactly what DistributedSampler
    promises: ceil(N/2) ids each, no repeats within a rank, union = the whole train split,
    and only the padding (ceil(N/2)*2 - N ids) seen by both ranks."""
    ids = {rank: _ids_by_step(ddp_run.run_dir, rank) for rank in range(WORLD)}
    steps_per_epoch = max(math.ceil(math.ceil(n / WORLD) / BATCH) for n in TRAIN_PAIRS.values())
    start = next(e for e in rank_events(ddp_run.run_dir, 0) if e["event"] == "train_start")
    assert start["steps_per_epoch"] == steps_per_epoch == 7
    assert sorted(ids[0]) == sorted(ids[1]) == list(range(EPOCHS * steps_per_epoch))

    checked: dict[str, int] = defaultdict(int)
    for task, n in TRAIN_PAIRS.items():
        per_rank = math.ceil(n / WORLD)
        padding = per_rank * WORLD - n
        assert padding == 1  # odd split sizes: the padding case is exercised
        batches_per_pass = math.ceil(per_rank / BATCH)
        for epoch in range(EPOCHS):
            first = epoch * steps_per_epoch
            for p in range(steps_per_epoch // batches_per_pass):  # complete passes only
                steps = range(first + p * batches_per_pass, first + (p + 1) * batches_per_pass)
                shard = [[i for s in steps for i in ids[r][s][task]] for r in range(WORLD)]
                for rank_ids in shard:
                    assert len(rank_ids) == per_rank
                    assert len(set(rank_ids)) == per_rank  # no repeats within a rank
                    assert all(0 <= i < n for i in rank_ids)
                assert set(shard[0]) | set(shard[1]) == set(range(n))
                assert len(set(shard[0]) & set(shard[1])) == padding
                checked[task] += 1
    assert checked == {"advection": EPOCHS, "darcy": EPOCHS * 3}

    # a new shuffle every epoch
    epoch0 = [i for s in range(7) for i in ids[0][s]["advection"]]
    epoch1 = [i for s in range(7, 14) for i in ids[0][s]["advection"]]
    assert epoch0 != epoch1


def test_training_loss_falls(ddp_run: DDPRun) -> None:
    """Rank 0's logged training loss (averaged across ranks) drops well below its start,
    for the weighted total and for each task on its own."""
    steps = [e for e in rank_events(ddp_run.run_dir, 0) if e["event"] == "train_step"]
    assert [e["step"] for e in steps] == list(range(EPOCHS * 7))
    for key in ("train/loss", "train/advection/rel_l2", "train/darcy/rel_l2"):
        losses = [e[key] for e in steps]
        assert all(math.isfinite(v) for v in losses)
        early, late = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
        assert late < 0.8 * early, (key, losses)
    losses = [e["train/loss"] for e in steps]
    assert sum(losses[-3:]) < 0.6 * sum(losses[:3]), losses
    assert all(e["train/samples_per_s"] > 0 for e in steps)


def test_every_rank_keeps_a_json_log_with_its_identity(ddp_run: DDPRun) -> None:
    """``logs/rank0.jsonl`` and ``logs/rank1.jsonl`` exist; every line is a JSON event
    carrying the run id, the rank, the world size; per-step events carry the step."""
    logs = sorted(p.name for p in (ddp_run.run_dir / "logs").iterdir())
    assert logs == ["rank0.jsonl", "rank1.jsonl"]
    run_id = ddp_run.outcome["run_id"]
    assert ddp_run.run_dir.name == run_id
    for rank in range(WORLD):
        lines = (ddp_run.run_dir / "logs" / f"rank{rank}.jsonl").read_text().splitlines()
        events = [json.loads(line) for line in lines]
        assert events, rank
        for e in events:
            assert (e["run_id"], e["rank"], e["world_size"]) == (run_id, rank, WORLD), e
        names = {e["event"] for e in events}
        assert {"train_start", "batch_ids", "eval", "outcome"} <= names, names
        per_step = [e for e in events if e["event"] in ("batch_ids", "train_step")]
        assert per_step and all(isinstance(e["step"], int) for e in per_step)


def test_only_rank0_prints_progress(ddp_run: DDPRun) -> None:
    """Rank 0's stdout shows progress as JSON lines; rank 1's stdout holds only warnings
    and errors (so nothing in a clean run), and no per-step debug event reaches stdout."""
    for line in ddp_run.stdout[1].splitlines():  # empty in a clean run; never a raw print
        if line.strip():
            assert json.loads(line)["level"] in ("warning", "error", "critical"), line
    events = parse_events(ddp_run.stdout[0])
    assert {e["rank"] for e in events} == {0}
    names = [e["event"] for e in events]
    assert names.count("train_step") == EPOCHS * 7
    assert {"train_start", "eval", "outcome"} <= set(names)
    assert all(e["level"] != "debug" for e in events)


def test_exactly_one_wandb_run_finished_with_the_loss(ddp_run: DDPRun) -> None:
    """Only rank 0 starts W&B: one offline run in the whole output dir, named after the
    run id, closed with exit code 0, with the train loss in its history and eval in its
    summary."""
    everywhere = list(ddp_run.output_dir.rglob("*.wandb"))
    files = find_wandb_files(ddp_run.run_dir)
    assert len(files) == 1 and everywhere == files
    wb = read_offline_run(files[0])
    assert wb.run_id == ddp_run.outcome["run_id"]
    assert wb.exit_code == 0
    logged = [h for h in wb.history if "train/loss" in h]
    assert len(logged) == EPOCHS * 7
    first, last = logged[0]["train/loss"], logged[-1]["train/loss"]
    assert isinstance(first, float) and isinstance(last, float) and last < first
    assert wb.summary["eval/darcy/samples"] == TEST_PAIRS["darcy"]


def test_outcome_says_finished_with_eval_metrics(ddp_run: DDPRun) -> None:
    """``outcome.json`` records a finished 2-rank run with held-out metrics per task,
    computed over each test pair exactly once (no duplicates across ranks), where the
    trained model beats the naive baseline it is reported next to."""
    out = ddp_run.outcome
    assert (out["outcome"], out["exit_code"], out["world_size"]) == ("finished", 0, WORLD)
    assert out["step"] == EPOCHS * 7
    assert out["failed_rank"] is None
    assert Path(out["checkpoint"]).is_file()
    metrics = out["metrics"]
    for task, n in TEST_PAIRS.items():
        assert metrics[f"eval/{task}/samples"] == n
        # 21 steps are enough to beat persistence (advection) and the mean field (Darcy)
        assert 0 < metrics[f"eval/{task}/rel_l2"] < metrics[f"eval/{task}/baseline_rel_l2"]
    assert (ddp_run.output_dir / "latest").resolve() == ddp_run.run_dir.resolve()


def test_same_config_runs_as_one_plain_process(tmp_path: Path, tiny_data: dict[str, Path]) -> None:
    """Without torchrun, ``python -m ups.train.main CONFIG`` trains on the whole split
    (each epoch sees every train pair once), finishes, and writes the same artefacts."""
    config = _config(tmp_path, tiny_data, epochs=1)
    proc = subprocess.run(
        [PYTHON, "-m", "ups.train.main", str(config)],
        capture_output=True,
        text=True,
        timeout=180,
        env=worker_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-4000:])
    run_dir = only_run_dir(tmp_path / "runs")
    outcome = json.loads((run_dir / "outcome.json").read_text())
    steps = math.ceil(TRAIN_PAIRS["advection"] / BATCH)  # 14: advection sets the epoch length
    assert (outcome["outcome"], outcome["world_size"], outcome["step"]) == ("finished", 1, steps)
    assert outcome["metrics"]["eval/advection/samples"] == TEST_PAIRS["advection"]
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["rank0.jsonl"]
    ids = _ids_by_step(run_dir, 0)
    seen = sorted(i for s in range(steps) for i in ids[s]["advection"])
    assert seen == list(range(TRAIN_PAIRS["advection"]))
    (wandb_file,) = find_wandb_files(run_dir)
    assert read_offline_run(wandb_file).exit_code == 0
    assert "outcome" in {e["event"] for e in parse_events(proc.stdout)}
