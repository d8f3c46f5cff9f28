"""Read PDEBench HDF5 files: check a file against its layout, then serve one-step pairs.

:func:`inspect_task` opens a file once, checks every key, rank, shape and dtype the layout
needs, reads the last element of each big dataset so a truncated download
fails here rather than mid-epoch, and returns a :class:`TaskInfo`. :class:`PDEBenchDataset`
serves ``(x, y, i)`` items, channels first, following PDEBench ``FNODatasetSingle``:
``[::reduced_batch]`` samples, ``[::reduced_resolution_t]`` frames, ``[::reduced_resolution]``
on each spatial axis; the test split is the first ``int(N * test_fraction)`` samples of a
single-array file and the last ones of a per-sample-group file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from ups.config import TaskConfig
from ups.config.schema import Layout

Split = Literal["train", "test"]

PRELOAD_MAX_BYTES = 256 * 2**20
"""A split whose reduced arrays fit in this many bytes is read into memory once per process.

Measured on the demo files (2 shared CPU cores): an item from memory costs 3-9 us, a per-item
HDF5 read 50-60 us (with dataset handles cached; 170-340 us without), and reading a whole
demo split 30-60 ms. Bigger splits (full PDEBench files are several GB) are read one slice
per item instead, so memory stays bounded.
"""

_REGENERATE = (
    "The file is truncated or corrupt: download it again, or run `ups data synth` for the "
    "demo data."
)


class DataError(ValueError):
    """A data file is missing or does not match its layout.

    The message is one paragraph naming the file, the HDF5 key and the fix.
    """

    def __init__(self, message: str, path: str = "", key: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.key = key

    @classmethod
    def at(cls, path: Path, key: str, problem: str, fix: str) -> DataError:
        where = f"data file {str(path)!r}" + (f", key {key!r}" if key else "")
        return cls(f"{where}: {problem}. {fix}", str(path), key)


@dataclass(frozen=True)
class TaskInfo:
    """What a task's file holds, after the reductions of its :class:`TaskConfig`."""

    name: str
    layout: Layout
    path: Path
    n_samples: int
    """Samples after ``reduced_batch``."""
    n_train: int
    n_test: int
    n_frames: int
    """Frames after ``reduced_resolution_t``; 1 for a steady task."""
    spatial: tuple[int, ...]
    """Grid sizes after ``reduced_resolution``."""
    channels: int
    steady: bool
    """Steady (Darcy): the input is the coefficient, the baseline is the training mean.
    Otherwise the target is the next frame and the baseline is persistence."""

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one ``x`` or ``y``: ``(channels, *spatial)``."""
        return (self.channels, *self.spatial)

    @property
    def pairs_per_sample(self) -> int:
        return 1 if self.steady else self.n_frames - 1


def _reduced(n: int, step: int) -> int:
    return len(range(0, n, step))


def _dataset(f: h5py.File, path: Path, key: str, shape: str, ndim: int) -> h5py.Dataset:
    obj = f.get(key)
    if not isinstance(obj, h5py.Dataset):
        found = "a group" if obj is not None else "missing"
        raise DataError.at(
            path,
            key,
            f"expected a dataset {shape}, found {found}",
            "Check tasks[].layout against the file, or regenerate it (`ups data synth`)",
        )
    if obj.ndim != ndim:
        raise DataError.at(
            path,
            key,
            f"expected a {ndim}-D dataset {shape}, got shape {obj.shape}",
            "Check tasks[].layout against the file",
        )
    if obj.dtype.kind != "f":
        raise DataError.at(
            path, key, f"expected floating-point values, got dtype {obj.dtype}", _REGENERATE
        )
    if 0 in obj.shape:
        raise DataError.at(path, key, f"dataset is empty (shape {obj.shape})", _REGENERATE)
    return obj


def _expect_shape(path: Path, key: str, ds: h5py.Dataset, want: tuple[int, ...], why: str) -> None:
    if ds.shape != want:
        raise DataError.at(
            path, key, f"expected shape {want} ({why}), got {ds.shape}", "Check the file's layout"
        )


def _probe_last(path: Path, key: str, ds: h5py.Dataset) -> None:
    try:
        ds[tuple(n - 1 for n in ds.shape)]
    except (OSError, RuntimeError, ValueError) as exc:
        raise DataError.at(
            path, key, f"cannot read the last element ({exc})", _REGENERATE
        ) from None


def _sample_groups(f: h5py.File) -> list[str]:
    return sorted(k for k, v in f.items() if isinstance(v, h5py.Group) and "data" in v)


def _check_single_1d(f: h5py.File, path: Path) -> tuple[str, int, int, tuple[int, ...], int]:
    ds = _dataset(f, path, "tensor", "(N, T, X)", 3)
    n, t, x = ds.shape
    _expect_shape(path, "x-coordinate", _dataset(f, path, "x-coordinate", "(X,)", 1), (x,), "X")
    tc = _dataset(f, path, "t-coordinate", "(T+1,)", 1)
    _expect_shape(path, "t-coordinate", tc, (t + 1,), "T+1: one more entry than frames")
    _probe_last(path, "tensor", ds)
    return "tensor", n, t, (x,), 1


def _check_darcy_2d(f: h5py.File, path: Path) -> tuple[str, int, int, tuple[int, ...], int]:
    nu = _dataset(f, path, "nu", "(N, H, W)", 3)
    n, h, w = nu.shape
    ds = _dataset(f, path, "tensor", "(N, 1, H, W)", 4)
    _expect_shape(path, "tensor", ds, (n, 1, h, w), "(N, 1, H, W) with N, H, W of 'nu'")
    _probe_last(path, "nu", nu)
    _probe_last(path, "tensor", ds)
    return "tensor", n, 1, (h, w), 1


def _check_groups_2d(f: h5py.File, path: Path) -> tuple[str, int, int, tuple[int, ...], int]:
    names = _sample_groups(f)
    if not names:
        raise DataError.at(
            path,
            "/",
            "no sample groups ('0000/data', ...) found",
            "Check tasks[].layout against the file (groups_2d needs one group per sample)",
        )
    first = _dataset(f, path, f"{names[0]}/data", "(T, H, W, C)", 4)
    t, h, w, c = first.shape
    for name in names:
        ds = _dataset(f, path, f"{name}/data", "(T, H, W, C)", 4)
        _expect_shape(path, f"{name}/data", ds, first.shape, f"same as {names[0]}/data")
        for axis, size in (("x", h), ("y", w), ("t", t)):
            key = f"{name}/grid/{axis}"
            _expect_shape(path, key, _dataset(f, path, key, f"({axis},)", 1), (size,), axis)
        _probe_last(path, f"{name}/data", ds)
    return f"{names[0]}/data", len(names), t, (h, w), c


_CHECKS = {
    "single_1d": _check_single_1d,
    "darcy_2d": _check_darcy_2d,
    "groups_2d": _check_groups_2d,
}


def inspect_task(task: TaskConfig) -> TaskInfo:
    """Check ``task.path`` against ``task.layout`` and return its sizes. Raises DataError."""
    path = Path(task.path)
    if not path.is_file():
        raise DataError.at(
            path,
            "",
            "file does not exist",
            "Run `ups data synth` for the demo data, or fix tasks[].path in the config",
        )
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise DataError.at(path, "/", f"not a readable HDF5 file ({exc})", _REGENERATE) from None
    with f:
        key, n_raw, t_raw, spatial_raw, channels = _CHECKS[task.layout](f, path)
    steady = task.layout == "darcy_2d"
    n_samples = _reduced(n_raw, task.reduced_batch)
    n_test = int(n_samples * task.test_fraction)
    n_train = n_samples - n_test
    if n_test == 0 or n_train == 0:
        empty = "test" if n_test == 0 else "train"
        raise DataError.at(
            path,
            key,
            f"the {empty} split of task {task.name!r} is empty: {n_samples} samples after "
            f"reduced_batch={task.reduced_batch}, test_fraction={task.test_fraction} gives "
            f"{n_test} test and {n_train} train samples",
            "Change tasks[].test_fraction or lower tasks[].reduced_batch",
        )
    n_frames = 1 if steady else _reduced(t_raw, task.reduced_resolution_t)
    if not steady and n_frames < 2:
        raise DataError.at(
            path,
            key,
            f"only {n_frames} frame(s) left of {t_raw} after "
            f"reduced_resolution_t={task.reduced_resolution_t}; a one-step pair needs 2",
            "Lower tasks[].reduced_resolution_t",
        )
    return TaskInfo(
        name=task.name,
        layout=task.layout,
        path=path,
        n_samples=n_samples,
        n_train=n_train,
        n_test=n_test,
        n_frames=n_frames,
        spatial=tuple(_reduced(s, task.reduced_resolution) for s in spatial_raw),
        channels=channels,
        steady=steady,
    )


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
