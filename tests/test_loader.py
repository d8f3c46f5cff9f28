"""Sharded, resumable multi-task loading over real HDF5 files (written with plain h5py)."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from ups.config import TaskConfig
from ups.data.loader import ShardedSampler, build_eval_loader, build_loader
from ups.data.pdebench import PDEBenchDataset, TaskInfo, inspect_task


def write_1d(path: Path, n: int, t: int = 6, x: int = 8) -> TaskConfig:
    """tensor[n, t, :] = 100 n + t, so an item's input names its sample and frame."""
    u = (100 * np.arange(n)[:, None, None] + np.arange(t)[None, :, None]) * np.ones((1, 1, x))
    with h5py.File(path, "w") as f:
        f.create_dataset("tensor", data=u.astype(np.float32))
        f.create_dataset("x-coordinate", data=np.arange(x, dtype=np.float32))
        f.create_dataset("t-coordinate", data=np.arange(t + 1, dtype=np.float32))
    return TaskConfig(name=path.stem, layout="single_1d", path=path, test_fraction=0.2)


def write_darcy(path: Path, n: int, hw: int = 8) -> TaskConfig:
    nu = np.arange(n, dtype=np.float32)[:, None, None] * np.ones((1, hw, hw), np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("nu", data=nu)
        f.create_dataset("tensor", data=2 * nu[:, None])
    return TaskConfig(name=path.stem, layout="darcy_2d", path=path, test_fraction=0.2)


@pytest.fixture
def two_tasks(tmp_path: Path) -> tuple[list[TaskConfig], dict[str, TaskInfo]]:
    """advection: 20 train samples x 5 pairs = 100 items; darcy: 24 train items."""
    tasks = [write_1d(tmp_path / "adv.h5", n=25), write_darcy(tmp_path / "darcy.h5", n=30)]
    return tasks, {t.name: inspect_task(t) for t in tasks}


def _epoch(sampler: ShardedSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_sampler_shards_are_disjoint_and_cover(tmp_path: Path) -> None:
    """Two ranks see disjoint halves of the split whose union is the whole split."""
    ds = PDEBenchDataset(write_1d(tmp_path / "a.h5", n=25), "train")
    shards = [ShardedSampler(ds, num_replicas=2, rank=r, seed=7) for r in range(2)]
    a, b = (_epoch(s, 3) for s in shards)
    assert len(a) == len(b) == 50
    assert not set(a) & set(b) and set(a) | set(b) == set(range(100))
    assert _epoch(shards[0], 4) != a  # a new epoch reshuffles


def test_sampler_uneven_split_still_covers(tmp_path: Path) -> None:
    """With a split that does not divide evenly, ranks get equal counts and nothing is lost."""
    ds = PDEBenchDataset(write_darcy(tmp_path / "d.h5", n=26), "train")  # 21 items
    shards = [list(ShardedSampler(ds, num_replicas=2, rank=r, seed=0)) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == 11
    assert set(shards[0]) | set(shards[1]) == set(range(21))


def test_set_start_resumes_exactly(tmp_path: Path) -> None:
    """Skipping k batches yields exactly the batches an uninterrupted epoch yields after k."""
    ds = PDEBenchDataset(write_1d(tmp_path / "a.h5", n=25), "train")
    sampler = ShardedSampler(ds, num_replicas=2, rank=1, seed=5)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    sampler.set_epoch(2)
    full = [idx.tolist() for _, _, idx in loader]
    sampler.set_epoch(2)
    sampler.set_start(3, 8)
    assert len(loader) == len(full) - 3
    assert [idx.tolist() for _, _, idx in loader] == full[3:]
    sampler.set_epoch(2)  # set_epoch clears the offset
    assert len(list(sampler)) == 50


def test_multitask_steps_equal_on_every_rank(two_tasks) -> None:
    """Every rank yields the same number of steps, each with one batch of every task."""
    tasks, infos = two_tasks
    for world in (1, 2, 3):
        counts = []
        for rank in range(world):
            loader = build_loader(
                tasks, infos, batch_size=8, num_workers=0, rank=rank, world_size=world, seed=0
            )
            loader.set_epoch(1)
            steps = list(loader)
            assert all(set(s) == {"adv", "darcy"} for s in steps)
            counts.append(len(steps))
        assert len(set(counts)) == 1
        per_rank = math.ceil(100 / world)
        assert counts[0] == math.ceil(per_rank / 8)  # the bigger task sets the length


def test_multitask_passes_and_resume(two_tasks) -> None:
    """The smaller task restarts with a new shuffle; resuming mid-epoch replays the same batches."""
    tasks, infos = two_tasks
    kw = dict(batch_size=8, num_workers=0, world_size=2, seed=1)
    runs = []
    for rank in range(2):
        loader = build_loader(tasks, infos, rank=rank, **kw)  # type: ignore[arg-type]  # kw is dict[str, int]
        assert loader.steps_per_epoch == 7  # advection: 50 per rank / 8; darcy: 12 per rank -> 2
        loader.set_epoch(4)
        runs.append([{k: v[2].tolist() for k, v in step.items()} for step in loader])
    for passes in ((0, 1), (2, 3), (4, 5)):  # every darcy pass: ranks disjoint, all 24 covered
        shards = [{i for step in passes for i in run[step]["darcy"]} for run in runs]
        assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(24))
    darcy = [s["darcy"] for s in runs[0]]
    assert darcy[2] + darcy[3] != darcy[0] + darcy[1]  # a new pass is a new shuffle
    resumed = build_loader(tasks, infos, rank=0, **kw)  # type: ignore[arg-type]  # kw is dict[str, int]
    resumed.set_epoch(4, start_step=5)
    assert len(resumed) == 2
    assert [{k: v[2].tolist() for k, v in s.items()} for s in resumed] == runs[0][5:]


def test_single_task_is_distributed_sampler_data(two_tasks) -> None:
    """With one task the loader serves exactly DistributedSampler's shard of the epoch."""
    tasks, infos = two_tasks
    loader = build_loader(
        tasks[:1], infos, batch_size=8, num_workers=0, rank=1, world_size=2, seed=3
    )
    loader.set_epoch(2)
    got = [i for step in loader for i in step["adv"][2].tolist()]
    ref = DistributedSampler(range(100), num_replicas=2, rank=1, seed=3)  # type: ignore[arg-type]  # len() is all it uses
    ref.set_epoch(2 * 1000)
    assert got == list(ref)


def test_eval_loader_covers_test_split_once(two_tasks) -> None:
    """Eval shards over 3 ranks hold every test item exactly once (no padding duplicates)."""
    tasks, infos = two_tasks
    task, info = tasks[1], infos[tasks[1].name]  # 6 test items
    seen: list[int] = []
    for rank in range(4):
        loader = build_eval_loader(task, info, batch_size=4, rank=rank, world_size=4)
        seen += [i for _, _, idx in loader for i in idx.tolist()]
    assert sorted(seen) == list(range(6))


@pytest.mark.slow
@pytest.mark.parametrize("preload", [2**40, 0], ids=["preload", "per_item"])
def test_worker_processes_read_correctly(tmp_path: Path, preload: int) -> None:
    """Two DataLoader workers, each opening the file itself, return the right values."""
    task = write_1d(tmp_path / "a.h5", n=25)
    ds = PDEBenchDataset(task, "train", preload_max_bytes=preload)
    ds[0]  # the parent has an open handle before the workers fork; they must not use it
    loader = DataLoader(ds, batch_size=16, num_workers=2, shuffle=True, persistent_workers=True)
    for _ in range(2):  # persistent workers serve a second epoch too
        n = 0
        for x, y, idx in loader:
            sample, t = 5 + idx // 5, idx % 5  # first 5 samples are the test split
            assert torch.equal(x[:, 0, 0], (100 * sample + t).float())
            assert torch.equal(y[:, 0, 3], (100 * sample + t + 1).float())
            n += len(idx)
        assert n == 100
    ds.close()


@pytest.mark.slow
def test_multitask_loader_with_workers(two_tasks) -> None:
    """build_loader with num_workers=2 yields the same batches as in-process loading."""
    tasks, infos = two_tasks
    out = []
    for workers in (0, 2):
        loader = build_loader(
            tasks, infos, batch_size=8, num_workers=workers, rank=0, world_size=2, seed=0
        )
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            epochs.append(
                [{k: (v[0].sum().item(), v[2].tolist()) for k, v in s.items()} for s in loader]
            )
        out.append(epochs)
    assert out[0] == out[1]
