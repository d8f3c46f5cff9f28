"""The PDEBench reader on real HDF5 files written with plain h5py (not via ups.data.synth)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from ups.config import TaskConfig
from ups.data.pdebench import DataError, PDEBenchDataset, inspect_task

BOTH_MODES = pytest.mark.parametrize("preload", [2**40, 0], ids=["preload", "per_item"])


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def write_single_1d(path: Path, n: int = 10, t: int = 11, x: int = 16, **drop: Any) -> Path:
    """tensor[n, t, x] = 10000 n + 100 t + x, so every value names its own index."""
    nn, tt, xx = np.meshgrid(np.arange(n), np.arange(t), np.arange(x), indexing="ij")
    keys = {
        "tensor": _f32(10000 * nn + 100 * tt + xx),
        "x-coordinate": _f32((np.arange(x) + 0.5) / x),
        "t-coordinate": _f32(np.arange(t + 1) * 0.01),
    }
    keys.update(drop)
    with h5py.File(path, "w") as f:
        for key, value in keys.items():
            if value is not None:
                f.create_dataset(key, data=value)
        f.attrs["beta"] = 0.4
    return path


def write_darcy(path: Path, n: int = 10, hw: int = 8, tensor_shape: tuple[int, ...] | None = None):
    """nu[n, h, w] = 10000 n + 100 h + w; tensor = -nu."""
    nn, hh, ww = np.meshgrid(np.arange(n), np.arange(hw), np.arange(hw), indexing="ij")
    nu = _f32(10000 * nn + 100 * hh + ww)
    tensor = -nu[:, None] if tensor_shape is None else np.zeros(tensor_shape, np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("nu", data=nu)
        f.create_dataset("tensor", data=tensor)
        f.create_dataset("x-coordinate", data=_f32(np.arange(hw)))
        f.create_dataset("y-coordinate", data=_f32(np.arange(hw)))
        f.create_dataset("t-coordinate", data=_f32(np.arange(10)))
        f.attrs["beta"] = 1.0
    return path


def write_groups(path: Path, n: int = 10, t: int = 6, hw: int = 8, c: int = 2) -> Path:
    """group n: data[t, h, w, c] = 10000 n + 1000 t + 100 h + 10 w + c."""
    tt, hh, ww, cc = np.meshgrid(
        np.arange(t), np.arange(hw), np.arange(hw), np.arange(c), indexing="ij"
    )
    with h5py.File(path, "w") as f:
        for i in range(n):
            g = f.create_group(f"{i:04d}")
            g.create_dataset("data", data=_f32(10000 * i + 1000 * tt + 100 * hh + 10 * ww + cc))
            g.create_dataset("grid/x", data=_f32(np.arange(hw)))
            g.create_dataset("grid/y", data=_f32(np.arange(hw)))
            g.create_dataset("grid/t", data=_f32(np.arange(t)))
    return path


def task(path: Path, layout: str, **kw: Any) -> TaskConfig:
    return TaskConfig(name="t", layout=layout, path=path, **kw)  # type: ignore[arg-type]  # str, not the Literal


@BOTH_MODES
def test_single_1d_reductions_and_split(tmp_path: Path, preload: int) -> None:
    """1D pairs are (u[t], u[t+1]) of the reduced grid; test = the first samples (PDEBench)."""
    cfg = task(
        write_single_1d(tmp_path / "a.hdf5"),
        "single_1d",
        reduced_batch=2,
        reduced_resolution=2,
        reduced_resolution_t=2,
        test_fraction=0.2,
    )
    info = inspect_task(cfg)
    assert (info.n_samples, info.n_train, info.n_test, info.n_frames) == (5, 4, 1, 6)
    assert info.sample_shape == (1, 8) and not info.steady
    train = PDEBenchDataset(cfg, "train", info, preload_max_bytes=preload)
    test = PDEBenchDataset(cfg, "test", info, preload_max_bytes=preload)
    assert (len(train), len(test)) == (4 * 5, 1 * 5)
    x, y, i = train[7]  # second train sample (raw 4), pair t=2 -> frames 4 and 6
    assert i == 7 and x.dtype == torch.float32 and x.shape == (1, 8)
    assert torch.equal(x[0], torch.tensor(40000.0 + 400 + np.arange(0, 16, 2)))
    assert torch.equal(y[0], torch.tensor(40000.0 + 600 + np.arange(0, 16, 2)))
    x, y, _ = test[4]  # the only test sample is raw 0, last pair: frames 8 and 10
    assert x[0, 0] == 800 and y[0, 1] == 1002


@BOTH_MODES
def test_darcy_pairs_are_coefficient_and_solution(tmp_path: Path, preload: int) -> None:
    """Darcy items are x = nu, y = tensor[:, 0], one per sample, reduced in space."""
    cfg = task(write_darcy(tmp_path / "d.hdf5"), "darcy_2d", reduced_resolution=2)
    info = inspect_task(cfg)
    assert info.steady and info.n_frames == 1 and info.sample_shape == (1, 4, 4)
    train = PDEBenchDataset(cfg, "train", info, preload_max_bytes=preload)
    assert len(train) == 9
    x, y, _ = train[0]  # first train sample is raw 1
    expect = 10000 + 100 * np.arange(0, 8, 2)[:, None] + np.arange(0, 8, 2)[None, :]
    assert torch.equal(x[0], torch.tensor(expect, dtype=torch.float32))
    assert torch.equal(y, -x)
    assert PDEBenchDataset(cfg, "test", info, preload_max_bytes=preload)[0][0][0, 0, 0] == 0


@BOTH_MODES
def test_groups_channels_first_and_test_is_last(tmp_path: Path, preload: int) -> None:
    """Per-sample groups give (C, H, W) frames; the test split is the LAST groups."""
    cfg = task(write_groups(tmp_path / "g.h5"), "groups_2d", test_fraction=0.2)
    info = inspect_task(cfg)
    assert (info.n_train, info.n_test, info.n_frames, info.sample_shape) == (8, 2, 6, (2, 8, 8))
    test = PDEBenchDataset(cfg, "test", info, preload_max_bytes=preload)
    assert len(test) == 2 * 5
    x, y, _ = test[6]  # group 0009, pair t=1
    assert x.shape == (2, 8, 8)
    assert x[1, 3, 4] == 90000 + 1000 + 300 + 40 + 1
    assert y[0, 0, 0] == 92000
    train = PDEBenchDataset(cfg, "train", info, preload_max_bytes=preload)
    assert train[0][0][0, 0, 0] == 0


def _error(cfg: TaskConfig) -> DataError:
    with pytest.raises(DataError) as err:
        inspect_task(cfg)
    assert str(cfg.path) in str(err.value)
    return err.value


def test_missing_file(tmp_path: Path) -> None:
    """A missing file is reported with its path and the `ups data synth` fix."""
    err = _error(task(tmp_path / "none.hdf5", "single_1d"))
    assert "does not exist" in str(err) and "ups data synth" in str(err)


def test_missing_key(tmp_path: Path) -> None:
    """A file without `t-coordinate` names that key."""
    err = _error(task(write_single_1d(tmp_path / "a.h5", **{"t-coordinate": None}), "single_1d"))
    assert err.key == "t-coordinate" and "'t-coordinate'" in str(err)


def test_wrong_shapes(tmp_path: Path) -> None:
    """Wrong ranks and shapes name the offending key and the expected shape."""
    tc = np.zeros(11, np.float32)  # T entries instead of T+1
    err = _error(task(write_single_1d(tmp_path / "a.h5", **{"t-coordinate": tc}), "single_1d"))
    assert err.key == "t-coordinate" and "(12,)" in str(err)
    err = _error(task(write_darcy(tmp_path / "d.h5", tensor_shape=(10, 1, 8, 7)), "darcy_2d"))
    assert err.key == "tensor" and "(10, 1, 8, 8)" in str(err)
    err = _error(task(write_darcy(tmp_path / "d2.h5"), "single_1d"))  # wrong layout
    assert err.key == "tensor" and "3-D" in str(err)


def test_truncated_file(tmp_path: Path) -> None:
    """A file cut short (interrupted download) fails at inspect time, not mid-epoch."""
    path = write_single_1d(tmp_path / "a.h5")
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.truncate(size // 2)
    err = _error(task(path, "single_1d"))
    assert "truncated" in str(err) and err.key == "/"


def test_not_hdf5(tmp_path: Path) -> None:
    """A file that is not HDF5 at all is reported as such."""
    path = tmp_path / "a.hdf5"
    path.write_text("<html>403 Forbidden</html>")
    assert "not a readable HDF5 file" in str(_error(task(path, "single_1d")))


def test_empty_splits_and_too_few_frames(tmp_path: Path) -> None:
    """An empty test split, or one frame after reduction, is a DataError naming the fix."""
    path = write_single_1d(tmp_path / "a.h5", n=5)
    err = _error(task(path, "single_1d", test_fraction=0.1))
    assert "test split" in str(err) and "test_fraction" in str(err) and err.key == "tensor"
    err = _error(task(path, "single_1d", reduced_resolution_t=11, test_fraction=0.5))
    assert "frame" in str(err) and "reduced_resolution_t" in str(err)


def test_dataset_pickles_without_handle(tmp_path: Path) -> None:
    """A dataset that has read items can be pickled (to spawn workers); the copy reopens."""
    import pickle

    cfg = task(write_single_1d(tmp_path / "a.h5"), "single_1d")
    ds = PDEBenchDataset(cfg, "train")
    first = ds[3]
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._file is None and copy._cache is None
    assert torch.equal(copy[3][0], first[0])
    ds.close()


def test_data_check_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ups data check` prints one line per task and exits 1 naming the broken file and key."""
    from ups.cli.data import main

    good = write_single_1d(tmp_path / "good.h5")
    bad = write_single_1d(tmp_path / "bad.h5", **{"x-coordinate": None})
    config = tmp_path / "run.yaml"
    config.write_text(
        "tasks:\n"
        f"  - {{name: adv, layout: single_1d, path: {good}}}\n"
        f"  - {{name: burgers, layout: single_1d, path: {bad}}}\n"
    )
    assert main(["check", str(config), "--set", "tasks.1.path=" + str(good)]) == 0
    assert main(["check", str(config)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert '"data_ok"' in lines[2] and "'x-coordinate'" in lines[3] and "bad.h5" in lines[3]
