"""Read PDEBench HDF5 files: serve one-step pairs of a file checked against its layout.

The check (:func:`inspect_task`, :class:`TaskInfo`, :class:`DataError`) lives in
:mod:`ups.data.layouts`, which needs no torch; it is re-exported here. :class:`PDEBenchDataset`
serves ``(x, y, i)`` items, channels first, following PDEBench ``FNODatasetSingle``:
``[::reduced_batch]`` samples, ``[::reduced_resolution_t]`` frames, ``[::reduced_resolution]``
on each spatial axis; the test split is the first ``int(N * test_fraction)`` samples of a
single-array file and the last ones of a per-sample-group file.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import h5py
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from ups.config import TaskConfig
from ups.data.layouts import DataError, TaskInfo, _sample_groups, inspect_task

__all__ = ["DataError", "PDEBenchDataset", "TaskInfo", "inspect_task"]

Split = Literal["train", "test"]

PRELOAD_MAX_BYTES = 256 * 2**20
"""A split whose reduced arrays fit in this many bytes is read into memory once per process.

Measured on the demo files (2 shared CPU cores): an item from memory costs 3-9 us, a per-item
HDF5 read 50-60 us (with dataset handles cached; 170-340 us without), and reading a whole
demo split 30-60 ms. Bigger splits (full PDEBench files are several GB) are read one slice
per item instead, so memory stays bounded.
"""


class PDEBenchDataset(Dataset[tuple[Tensor, Tensor, int]]):
    """One-step pairs ``(x, y, i)`` of a task's train or test split, float32, channels first.

    Time tasks: item ``i`` is (sample ``i // (n_frames - 1)``, frame ``t = i % (n_frames - 1)``)
    with ``x = u[t]``, ``y = u[t + 1]``. Darcy: ``x = nu``, ``y = tensor[:, 0]``.
    The HDF5 file is opened lazily by the process that reads, so each DataLoader worker has
    its own handle; a split under ``preload_max_bytes`` is read into memory once per process.
    """

    def __init__(
        self,
        task: TaskConfig,
        split: Split,
        info: TaskInfo | None = None,
        *,
        preload_max_bytes: int = PRELOAD_MAX_BYTES,
    ) -> None:
        self.task = task
        self.split = split
        self.info = info if info is not None else inspect_task(task)
        n_samples, n_test, n_train = self.info.n_samples, self.info.n_test, self.info.n_train
        if task.layout == "groups_2d":
            self.samples = range(0, n_train) if split == "train" else range(n_train, n_samples)
        else:
            self.samples = range(n_test, n_samples) if split == "train" else range(0, n_test)
        arrays = 2 if self.info.steady else self.info.n_frames
        sample_bytes = 4 * arrays * int(np.prod(self.info.sample_shape))
        self.preload = sample_bytes * len(self.samples) <= preload_max_bytes
        self._file: h5py.File | None = None
        self._pid = -1
        self._arrays: dict[str, h5py.Dataset] = {}
        self._groups: list[h5py.Dataset] = []
        self._cache: tuple[np.ndarray, ...] | None = None

    def __len__(self) -> int:
        return len(self.samples) * self.info.pairs_per_sample

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_file=None, _pid=-1, _cache=None, _arrays={}, _groups=[])
        return state

    def close(self) -> None:
        """Close this process's file handle and drop the in-memory split."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file, self._pid, self._cache, self._arrays, self._groups = None, -1, None, {}, []

    def _handle(self) -> h5py.File:
        if self._file is None or self._pid != os.getpid():
            # A handle inherited through fork is never used: HDF5 state is per process.
            self._file = h5py.File(self.info.path, "r")
            self._pid = os.getpid()
            self._cache = None
            # Dataset objects are looked up once: a lookup costs more than a small read.
            self._arrays = {k: v for k, v in self._file.items() if isinstance(v, h5py.Dataset)}
            if self.task.layout == "groups_2d":
                self._groups = [self._file[g]["data"] for g in _sample_groups(self._file)]
        return self._file

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} pairs")
        self._handle()
        sample, t = divmod(i, self.info.pairs_per_sample)
        if self.preload:
            if self._cache is None:
                self._cache = self._read_split()
            x, y = self._cached_pair(sample, t)
        else:
            x, y = self._read_pair(self.samples[sample], t)
        return _tensor(x), _tensor(y), i

    # Reading. Sample numbers below are positions after reduced_batch.

    def _raw(self, sample: int) -> int:
        return sample * self.task.reduced_batch

    def _read_pair(self, sample: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        # Contiguous reads reduced in memory: faster than HDF5 strided selections.
        rr, rt, n = self.task.reduced_resolution, self.task.reduced_resolution_t, self._raw(sample)
        if self.task.layout == "darcy_2d":
            nu, u = self._arrays["nu"][n], self._arrays["tensor"][n, 0]
            return nu[None, ::rr, ::rr], u[None, ::rr, ::rr]
        frames = slice(t * rt, t * rt + rt + 1)
        if self.task.layout == "single_1d":
            pair = self._arrays["tensor"][n, frames][::rt, None, ::rr]
        else:
            pair = np.moveaxis(self._groups[n][frames][::rt, ::rr, ::rr, :], -1, 1)
        return pair[0], pair[1]

    def _cached_pair(self, sample: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        assert self._cache is not None
        if self.info.steady:
            nu, u = self._cache
            return nu[sample], u[sample]
        (u,) = self._cache
        return u[sample, t], u[sample, t + 1]

    def _read_split(self) -> tuple[np.ndarray, ...]:
        """The split's reduced arrays: steady (nu, u) as (S, 1, H, W); else u as (S, T', C, ...).

        One contiguous read per sample, reduced in memory.
        """
        rt, rr = self.task.reduced_resolution_t, self.task.reduced_resolution
        raws = [self._raw(s) for s in self.samples]
        if self.task.layout == "darcy_2d":
            nu = np.stack([self._arrays["nu"][n][::rr, ::rr] for n in raws])[:, None]
            u = np.stack([self._arrays["tensor"][n][:, ::rr, ::rr] for n in raws])
            return np.ascontiguousarray(nu), np.ascontiguousarray(u)
        if self.task.layout == "single_1d":
            u = np.stack([self._arrays["tensor"][n][::rt, ::rr] for n in raws])[:, :, None]
            return (np.ascontiguousarray(u),)
        datas = [self._groups[n][()][::rt, ::rr, ::rr, :] for n in raws]
        return (np.ascontiguousarray(np.moveaxis(np.stack(datas), -1, 2)),)


def _tensor(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
