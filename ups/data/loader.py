"""Sharded, resumable loaders: one batch from every task at every optimizer step.

Every step gets one batch from each task, so every encoder and decoder takes part in every
backward pass (DDP needs no ``find_unused_parameters``) and the task mix is balanced by
construction. An epoch is as long as the task with the most per-rank batches; a task that
runs out earlier starts another pass over its shard with a new shuffle. All step counts
depend only on dataset sizes, so every rank yields the same number of steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from ups.config import TaskConfig
from ups.data.pdebench import PDEBenchDataset, Split, TaskInfo

Batch = tuple[Tensor, Tensor, Tensor]

PASS_STRIDE = 1000
"""Sampler epoch of pass ``p`` in epoch ``e`` is ``e * PASS_STRIDE + p``: distinct shuffles."""


class ShardedSampler(DistributedSampler[int]):
    """A :class:`DistributedSampler` that can skip the first batches of an epoch exactly.

    ``set_start(k, batch_size)`` drops the first ``k * batch_size`` indices of this epoch's
    shard without loading them, so a run resumed after ``k`` steps sees exactly the batches it
    would have seen. ``set_epoch`` clears the offset: call it first, then ``set_start``.
    """

    def __init__(self, dataset: Sized, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)  # type: ignore[arg-type]  # the sampler only needs len(), not a Dataset
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.start = 0

    def set_start(self, batch_offset: int, batch_size: int) -> None:
        """Skip the first ``batch_offset`` batches of ``batch_size`` in the current epoch."""
        if batch_offset < 0 or batch_size < 1:
            raise ValueError(
                f"set_start({batch_offset}, {batch_size}): need offset >= 0, size >= 1"
            )
        self.start = min(batch_offset * batch_size, self.num_samples)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start :])

    def __len__(self) -> int:
        return self.num_samples - self.start


class _TaskStream:
    """One task's DataLoader, restarted with a fresh shuffle each time it runs out."""

    def __init__(self, loader: DataLoader[Any], sampler: ShardedSampler, batch_size: int):
        self.loader = loader
        self.sampler = sampler
        self.batch_size = batch_size
        self.batches_per_pass = -(-sampler.num_samples // batch_size)
        self.epoch = 0
        self.pass_ = 0
        self._it: Iterator[Batch] | None = None

    def start(self, epoch: int, step: int) -> None:
        """Position the stream at global step ``step`` of ``epoch``."""
        self.epoch = epoch
        self.pass_, offset = divmod(step, self.batches_per_pass)
        self._begin_pass(offset)

    def _begin_pass(self, offset: int) -> None:
        self.sampler.set_epoch(self.epoch * PASS_STRIDE + self.pass_)
        self.sampler.set_start(offset, self.batch_size)
        self._it = iter(self.loader)

    def next(self) -> Batch:
        assert self._it is not None, "start() must be called before next()"
        try:
            return next(self._it)
        except StopIteration:
            self.pass_ += 1
            self._begin_pass(0)
            return next(self._it)


class MultiTaskLoader:
    """Yields ``{task name: (x, y, idx)}`` with one batch per task, ``steps_per_epoch`` times.

    Call :meth:`set_epoch` before iterating each epoch; ``start_step`` resumes mid-epoch.
    """

    def __init__(self, streams: dict[str, _TaskStream]) -> None:
        self.streams = streams
        self.epoch = 0
        self.start_step = 0

    @property
    def steps_per_epoch(self) -> int:
        return max(s.batches_per_pass for s in self.streams.values())

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Select the epoch's shuffle and skip its first ``start_step`` steps (for resume)."""
        if not 0 <= start_step <= self.steps_per_epoch:
            raise ValueError(f"start_step {start_step} not in [0, {self.steps_per_epoch}]")
        self.epoch = epoch
        self.start_step = start_step

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start_step

    def __iter__(self) -> Iterator[dict[str, Batch]]:
        for stream in self.streams.values():
            stream.start(self.epoch, self.start_step)
        for _ in range(self.start_step, self.steps_per_epoch):
            yield {name: stream.next() for name, stream in self.streams.items()}


def build_loader(
    tasks: list[TaskConfig],
    infos: dict[str, TaskInfo],
    *,
    batch_size: int,
    num_workers: int,
    rank: int,
    world_size: int,
    seed: int,
    split: Split = "train",
) -> MultiTaskLoader:
    """A shuffled, rank-sharded loader over ``split`` of every task (train by default)."""
    streams = {}
    for task in tasks:
        dataset = PDEBenchDataset(task, split, infos[task.name])
        sampler = ShardedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=False
        )
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            pin_memory=False,
        )
        streams[task.name] = _TaskStream(loader, sampler, batch_size)
    return MultiTaskLoader(streams)


class _StridedShard(Sampler[int]):
    """Indices ``rank, rank + world_size, ...``: no shuffle and no padding duplicates."""

    def __init__(self, n: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, n, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def build_eval_loader(
    task: TaskConfig, info: TaskInfo, *, batch_size: int, rank: int, world_size: int
) -> DataLoader[Any]:
    """The test split of ``task``, sharded over ranks without duplicates (counts may differ)."""
    dataset = PDEBenchDataset(task, "test", info)
    sampler = _StridedShard(len(dataset), rank, world_size)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=0)
