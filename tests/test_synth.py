"""Demo data synthesis: PDEBench layouts, determinism and the physics of each file."""

from __future__ import annotations

import hashlib
import io
import re
import resource
import signal
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import PYTHON
from ups.config import TaskConfig
from ups.console.steps import steps_line
from ups.data import synth
from ups.data.pdebench import inspect_task

TINY = synth.Sizes(n_1d=8, x_1d=64, n_darcy=6, hw_darcy=32, n_dr=4, hw_dr=16)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("synth")
    return {p.name: p for p in synth.synthesize(out, seed=0, sizes=TINY)}


def _digest(path: Path) -> str:
    """Hash of every dataset and attribute (HDF5 files embed no timestamps by default, but
    comparing contents is what matters)."""
    h = hashlib.sha256()
    with h5py.File(path, "r") as f:

        def visit(name: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset):
                h.update(name.encode() + obj[()].tobytes())

        f.visititems(visit)
        h.update(repr(sorted(f.attrs.items())).encode())
    return h.hexdigest()


def test_layouts_match_pdebench(files: dict[str, Path]) -> None:
    """Each file has PDEBench's keys, float32 dtypes, attributes and T+1 time coordinates."""
    assert set(files) == {
        synth.ADVECTION_FILE,
        synth.BURGERS_FILE,
        synth.DARCY_FILE,
        synth.DIFFREACT_FILE,
    }
    for name, attr, value in (
        (synth.ADVECTION_FILE, "beta", 0.4),
        (synth.BURGERS_FILE, "Nu", 0.01),
    ):
        with h5py.File(files[name], "r") as f:
            assert set(f) == {"tensor", "x-coordinate", "t-coordinate"}
            assert f["tensor"].shape == (8, 201, 64) and f["tensor"].dtype == np.float32
            assert f["t-coordinate"].shape == (202,) and f["t-coordinate"].dtype == np.float32
            assert np.isclose(f["t-coordinate"][200], 2.0)
            np.testing.assert_allclose(f["x-coordinate"][()], (np.arange(64) + 0.5) / 64)
            assert f.attrs[attr] == value
    with h5py.File(files[synth.DARCY_FILE], "r") as f:
        assert set(f) == {"nu", "tensor", "x-coordinate", "y-coordinate", "t-coordinate"}
        assert f["nu"].shape == (6, 32, 32) and f["tensor"].shape == (6, 1, 32, 32)
        assert f["tensor"].dtype == np.float32 and f["t-coordinate"].shape == (10,)
        assert set(np.unique(f["nu"][()])) == {np.float32(0.1), np.float32(1.0)}
        assert f.attrs["beta"] == 1.0
    with h5py.File(files[synth.DIFFREACT_FILE], "r") as f:
        assert sorted(f) == ["0000", "0001", "0002", "0003"]
        assert f["0002/data"].shape == (101, 16, 16, 2) and f["0002/data"].dtype == np.float32
        assert [f[f"0002/grid/{a}"].shape for a in "xyt"] == [(16,), (16,), (101,)]


def test_files_pass_the_reader(files: dict[str, Path]) -> None:
    """ups's own reader accepts every synthesized file with its layout."""
    layouts = {
        synth.ADVECTION_FILE: "single_1d",
        synth.BURGERS_FILE: "single_1d",
        synth.DARCY_FILE: "darcy_2d",
        synth.DIFFREACT_FILE: "groups_2d",
    }
    for name, layout in layouts.items():
        info = inspect_task(
            TaskConfig(name="t", layout=layout, path=files[name], test_fraction=0.25)  # type: ignore[arg-type]  # str, not the Literal
        )
        assert info.n_test >= 1


def test_deterministic_by_seed(files: dict[str, Path], tmp_path: Path) -> None:
    """The same seed reproduces every file bit for bit; another seed changes them."""
    again = {p.name: p for p in synth.synthesize(tmp_path / "a", seed=0, sizes=TINY)}
    other = {p.name: p for p in synth.synthesize(tmp_path / "b", seed=1, sizes=TINY)}
    for name, path in files.items():
        assert _digest(again[name]) == _digest(path), name
        assert _digest(other[name]) != _digest(path), name


def test_advection_is_the_shifted_initial_condition(files: dict[str, Path]) -> None:
    """At t = 1.25 the profile has moved by beta t = 0.5: exactly half the periodic grid."""
    with h5py.File(files[synth.ADVECTION_FILE], "r") as f:
        u = f["tensor"][()]
    np.testing.assert_allclose(u[:, 125], np.roll(u[:, 0], 32, axis=1), atol=1e-5)
    # Transport conserves the mean of every sample at every frame.
    np.testing.assert_allclose(u.mean(axis=2), u[:, :1].mean(axis=2).repeat(201, 1), atol=1e-2)


def test_advection_matches_the_formula_at_any_time() -> None:
    """Every frame equals u0((x - beta t) mod 1) of the same initial conditions."""
    x = synth.cell_centres(50)
    ic = synth.InitialConditions.draw(5, np.random.default_rng(3))
    times = np.array([0.0, 0.37, 1.91])
    u = synth.advection(ic, x, 0.4, times)
    np.testing.assert_allclose(u[:, 1], ic(np.mod(x - 0.4 * 0.37, 1.0)))
    assert u.shape == (5, 3, 50)


def test_burgers_conserves_mass(files: dict[str, Path]) -> None:
    """The periodic finite-volume Burgers solution keeps sum(u) dx constant to round-off."""
    with h5py.File(files[synth.BURGERS_FILE], "r") as f:
        u = f["tensor"][()].astype(np.float64)
    assert np.isfinite(u).all()
    mass = u.sum(axis=2) / u.shape[2]
    assert np.abs(mass - mass[:, :1]).max() < 1e-5
    # It is not trivially constant: the solution evolves and dissipates energy.
    energy = (u**2).mean(axis=2)
    assert (energy[:, -1] < energy[:, 0]).all()


def test_darcy_residual_small(files: dict[str, Path]) -> None:
    """The stored Darcy solutions satisfy -div(a grad u) = 1 up to float32 storage error."""
    with h5py.File(files[synth.DARCY_FILE], "r") as f:
        a, u = f["nu"][()].astype(np.float64), f["tensor"][:, 0].astype(np.float64)
    assert (synth.darcy_residual(u, a, 1.0) < 1e-3).all()
    assert (u > 0).all()  # positive source, zero boundary: positive everywhere inside


def test_darcy_solver_matches_the_poisson_solution() -> None:
    """With a = 1 the solver reproduces the unit-square Poisson maximum 0.07367."""
    u = synth.darcy(np.ones((1, 64, 64)), 1.0)
    assert synth.darcy_residual(u, np.ones((1, 64, 64)), 1.0)[0] < synth.DARCY_RTOL
    assert abs(u.max() - 0.07367) < 0.0005


def test_darcy_batch_solves_each_sample_as_if_alone() -> None:
    """The batched solver drops each sample once it converges: every sample's solution is
    bit for bit the one it gets solved alone, whatever the others still need."""
    rng = np.random.default_rng(3)
    field = synth.smooth_field(5, 32, 0.06, rng)
    a = np.where(field > field.mean(axis=(1, 2), keepdims=True), 1.0, 0.1)
    a[2] = 1.0  # a smooth sample converges first; the rough ones go on without it
    batch = synth.darcy(a, 1.0)
    alone = np.concatenate([synth.darcy(a[i : i + 1], 1.0) for i in range(len(a))])
    assert np.array_equal(batch, alone)


def test_progress_names_each_file_before_it_is_written_and_the_line_ends_full(
    tmp_path: Path,
) -> None:
    """`ups demo` and `ups data synth` say what they write while they write it: the callback
    names each file, in order, before the file exists; the terminal line ends on 4/4 with
    where the files went."""
    seen: list[tuple[int, int, str, bool]] = []

    def step(done: int, total: int, path: Path) -> None:
        seen.append((done, total, path.name, path.exists()))

    screen = io.StringIO()
    with steps_line(screen, "demo data", "written to data/demo") as line:
        synth.synthesize(tmp_path, seed=0, sizes=TINY, progress=lambda *a: (step(*a), line(*a)))
    names = [synth.ADVECTION_FILE, synth.BURGERS_FILE, synth.DARCY_FILE, synth.DIFFREACT_FILE]
    assert seen == [(i, 4, name, False) for i, name in enumerate(names)]
    last = screen.getvalue().strip().splitlines()[-1]
    assert re.search(r"demo data .* 4/4 +0:00:\d\d written to data/demo$", last), last


UPS = str(Path(PYTHON).parent / "ups")


@pytest.mark.slow
def test_synth_that_cannot_write_names_the_file_and_the_fix_and_leaves_no_half_file(
    tmp_path: Path,
) -> None:
    """`ups data synth` into a broken link, then under a file-size limit that stops the first
    file halfway (as a full disk would): exit 74, one paragraph naming the path, the cause
    and the fix, no traceback; and no file at all where the write failed, neither the
    target nor its temporary (ups.fsio), so the next `ups demo` cannot take a truncated
    file for its data."""
    link = tmp_path / "demo"
    link.symlink_to(tmp_path / "gone")
    broken = subprocess.run(
        [UPS, "data", "synth", "--out", str(link)], capture_output=True, text=True, timeout=120
    )
    assert broken.returncode == 74, broken.stderr[-2000:]
    assert f"cannot write the demo data to {link}: File exists" in broken.stderr
    assert "broken link" in broken.stderr and "Traceback" not in broken.stderr

    def limit() -> None:  # below the first file's 26 MB: its write fails halfway
        resource.setrlimit(resource.RLIMIT_FSIZE, (10_000_000, 10_000_000))

    out = tmp_path / "limited"
    limited = subprocess.run(
        [UPS, "data", "synth", "--out", str(out)], capture_output=True, text=True,
        timeout=300, preexec_fn=limit,
    )  # fmt: skip
    assert limited.returncode == 74, limited.stderr[-2000:]
    assert f"File too large ({out / synth.ADVECTION_FILE})" in limited.stderr
    assert "ulimit -f" in limited.stderr and "Traceback" not in limited.stderr
    assert list(out.iterdir()) == []


@pytest.mark.slow
def test_ctrl_c_during_synth_keeps_the_whole_files_and_says_how_many(tmp_path: Path) -> None:
    """Ctrl-C while `ups data synth` computes its second file: exit 130 and one paragraph
    (1 of 4 complete, run it again), no traceback; the first file is whole and readable,
    nothing else is left, no temporary either."""
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [UPS, "data", "synth", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # JSON events off a terminal: each file named before it is made
        if '"data_file_writing"' in line and '"file":"2/4"' in line.replace(" ", ""):
            proc.send_signal(signal.SIGINT)
            break
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert f"interrupted (Ctrl-C) while writing the demo data to {out}" in stderr
    assert "1 of 4 files are complete" in stderr and "Traceback" not in stderr
    assert [p.name for p in out.iterdir()] == [synth.ADVECTION_FILE]
    info = inspect_task(
        TaskConfig(name="advection", layout="single_1d", path=out / synth.ADVECTION_FILE)
    )
    assert info.n_samples == synth.SMALL.n_1d
