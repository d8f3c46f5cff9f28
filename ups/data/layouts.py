"""Check a PDEBench HDF5 file against its layout, without torch (h5py only).

:func:`inspect_task` opens a file once, checks every key, rank, shape and dtype the layout
needs, reads the last element of each big dataset so a truncated download fails here
rather than mid-epoch, and returns a :class:`TaskInfo`. ``ups launch`` runs it on every
data file while it checks the config, which must not cost a torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import h5py

from ups.config import TaskConfig
from ups.config.schema import Layout

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
