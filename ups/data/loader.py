"""Sharded, resumable loaders: one batch from every task at every optimizer step.

Every step gets one batch from each task, so every encoder and decoder takes part in every
backward pass (DDP needs no ``find_unused_parameters``) and the task mix is balanced by
construction. An epoch is as long as the task with the most per-rank batches; a task that
runs out earlier starts another pass over its shard with a new shuffle. All step counts
depend only on dataset sizes, so every rank yields the same number of steps.

One DataLoader serves whole steps: :class:`StepSampler` (in the training process) decides
which indices of which task make up each step, and :class:`StepDataset` reads them, in
the training process (``num_workers: 0``) or in ``num_workers`` worker processes per rank.
The sampler alone fixes the order, so a run with workers sees exactly the batches of a run
without, and a resumed run starts at its step without reading the steps before it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Sized
from typing import TYPE_CHECKING, Any, NamedTuple

import structlog
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, default_collate

from ups.config import TaskConfig
from ups.data.pdebench import PDEBenchDataset, Split, TaskInfo
from ups.worker_death import worker_death

if TYPE_CHECKING:
    from ups.train.faults import FaultInjector

Batch = tuple[Tensor, Tensor, Tensor]
log = structlog.get_logger()

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


class StepPlan(NamedTuple):
    """What one step reads: its global step number and each task's dataset indices."""

    step: int
    indices: dict[str, list[int]]


class StepSampler(Sampler[StepPlan]):
    """The steps of one epoch from ``start_step`` on, each with one batch of every task.

    Step ``k`` of a task is batch ``k % batches_per_pass`` of pass ``k // batches_per_pass``
    over that task's shard, so any step can be produced without the ones before it.
    """

    def __init__(self, shards: dict[str, ShardedSampler], batch_size: int) -> None:
        self.shards = shards
        self.batch_size = batch_size
        self.per_pass = {t: -(-s.num_samples // batch_size) for t, s in shards.items()}
        self.steps_per_epoch = max(self.per_pass.values())
        self.epoch = 0
        self.start_step = 0

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        if not 0 <= start_step <= self.steps_per_epoch:
            raise ValueError(f"start_step {start_step} not in [0, {self.steps_per_epoch}]")
        self.epoch, self.start_step = epoch, start_step

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start_step

    def __iter__(self) -> Iterator[StepPlan]:
        passes: dict[str, tuple[int, list[int]]] = {}
        for k in range(self.start_step, self.steps_per_epoch):
            plan = {}
            for task, shard in self.shards.items():
                pass_, batch = divmod(k, self.per_pass[task])
                if passes.get(task, (-1, []))[0] != pass_:
                    shard.set_epoch(self.epoch * PASS_STRIDE + pass_)
                    passes[task] = (pass_, list(shard))
                order = passes[task][1]
                plan[task] = order[batch * self.batch_size : (batch + 1) * self.batch_size]
            yield StepPlan(self.epoch * self.steps_per_epoch + k, plan)


class StepDataset(Dataset[dict[str, Batch]]):
    """Reads a :class:`StepPlan`: ``{task: (x, y, idx)}`` with every task's batch stacked.

    In a worker process each task's HDF5 file is opened by that worker on first use
    (:class:`PDEBenchDataset` never uses a handle across ``fork``).
    """

    def __init__(
        self, datasets: dict[str, PDEBenchDataset], injector: FaultInjector | None = None
    ) -> None:
        self.datasets = datasets
        self.injector = injector
        """Fires faults at point ``loader`` (drills: a worker killed while it reads a step)."""

    def __getitem__(self, plan: StepPlan) -> dict[str, Batch]:
        if self.injector is not None:
            self.injector.fire(plan.step, "loader")
        out: dict[str, Batch] = {}
        for task, indices in plan.indices.items():
            dataset = self.datasets[task]
            out[task] = default_collate([dataset[i] for i in indices])
        return out


def _start_worker(worker_id: int) -> None:
    """Runs first in every worker process.

    torchrun stops a rank by signalling its whole process group (``killpg``), and a
    worker that died of that SIGTERM would fail the rank before it could stop at a step
    and write its preemption checkpoint. In a group of its own the worker is stopped only
    by its rank (at shutdown) or ends itself when the rank is gone (torch's watchdog).
    """
    os.setpgid(0, 0)
    log.debug("loader_worker_started", worker=worker_id, pid=os.getpid())  # file only


class MultiTaskLoader:
    """Yields ``{task name: (x, y, idx)}`` with one batch per task, ``steps_per_epoch`` times.

    Call :meth:`set_epoch` before iterating each epoch; ``start_step`` resumes mid-epoch.
    :meth:`close` ends the worker processes.
    """

    def __init__(self, sampler: StepSampler, loader: DataLoader[dict[str, Batch]]) -> None:
        self.sampler = sampler
        self.loader = loader
        self._active: Iterator[dict[str, Batch]] | None = None

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch

    @property
    def num_workers(self) -> int:
        return self.loader.num_workers

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Select the epoch's shuffle and skip its first ``start_step`` steps (for resume)."""
        self.sampler.set_epoch(epoch, start_step)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[dict[str, Batch]]:
        self._active = iter(self.loader)
        return _with_exit_status(self._active)

    def close(self) -> None:
        """End the worker processes now rather than when the loader is garbage-collected
        (persistent workers would otherwise hold their memory through evaluation)."""
        # torch has no public close: persistent workers live in the DataLoader's iterator.
        for it in (self._active, self.loader._iterator):
            if isinstance(it, _MultiProcessingDataLoaderIter):
                it._shutdown_workers()
        self._active = None
        self.loader._iterator = None


def _with_exit_status(it: Iterator[dict[str, Batch]]) -> Iterator[dict[str, Batch]]:
    """``it``, where a worker death that torch reports without its signal or exit code
    ("DataLoader worker (pid(s) N) exited unexpectedly": it found the worker dead while
    waiting for a batch) is raised again with them, in the words torch uses when its
    SIGCHLD handler sees the death first, so ``ups.worker_death`` reads both alike."""
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except RuntimeError as exc:
            death = worker_death(str(exc))
            if death is None or death.signal or death.exit_code is not None:
                raise
            workers = getattr(it, "_workers", [])  # torch's worker Process objects
            codes = {w.pid: w.exitcode for w in workers if w.pid in death.pids}
            pid, code = next(((p, c) for p, c in codes.items() if c), (None, None))
            if pid is None or code is None:
                raise
            how = (
                f"is killed by signal: {signal.strsignal(-code)}."
                if code < 0
                else f"exited unexpectedly with exit code {code}."
            )
            raise RuntimeError(f"DataLoader worker (pid {pid}) {how}") from exc
        yield batch


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
    prefetch_factor: int = 2,
    pin_memory: bool = False,
    persistent_workers: bool = True,
    injector: FaultInjector | None = None,
) -> MultiTaskLoader:
    """A shuffled, rank-sharded loader over ``split`` of every task (train by default).

    ``pin_memory`` is for CUDA (page-locked batches copy to the GPU faster);
    ``prefetch_factor`` and ``persistent_workers`` apply only with ``num_workers > 0``.
    """
    datasets = {t.name: PDEBenchDataset(t, split, infos[t.name]) for t in tasks}
    shards = {
        name: ShardedSampler(
            ds, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=False
        )
        for name, ds in datasets.items()
    }
    sampler = StepSampler(shards, batch_size)
    workers = num_workers > 0
    loader = DataLoader(
        StepDataset(datasets, injector),
        batch_size=None,  # the dataset returns whole steps
        sampler=sampler,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if workers else None,
        persistent_workers=persistent_workers and workers,
        pin_memory=pin_memory,
        worker_init_fn=_start_worker if workers else None,
        # Its own generator: a DataLoader draws a seed for its workers at every new
        # iterator, and the global RNG (dropout, the checkpointed RNG state) must not
        # depend on the worker count or on how often an epoch was restarted.
        generator=torch.Generator().manual_seed(seed),
    )
    return MultiTaskLoader(sampler, loader)


def step_batch_bytes(infos: dict[str, TaskInfo], batch_size: int) -> int:
    """Bytes of one step's batch (``x`` and ``y`` in float32 and int64 ``idx`` per task)."""
    per_item = sum(2 * 4 * _numel(i.sample_shape) + 8 for i in infos.values())
    return batch_size * per_item


def loader_shm_bytes(
    infos: dict[str, TaskInfo], batch_size: int, num_workers: int, prefetch_factor: int
) -> int:
    """Shared memory one rank's workers use at most: every batch a worker hands over is
    moved into /dev/shm, up to ``num_workers * prefetch_factor`` steps in flight, plus the
    step the rank trains on and the one it just released. Zero without workers."""
    if num_workers == 0:
        return 0
    return (num_workers * prefetch_factor + 2) * step_batch_bytes(infos, batch_size)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


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
