"""Demo data in the exact PDEBench layouts, small enough to synthesize in under a minute.

Sizes: chosen so ``ups demo`` trains for a few minutes on 2 CPU cores and synthesis takes
about 25 s there, two thirds of it the Darcy solves (``demo_data_ready`` gives the
seconds). ``small=False`` gives the released grid sizes with fewer samples:

==============================  =========================  ==================================
file                            small                      what
==============================  =========================  ==================================
1D_Advection_Sols_beta0.4.hdf5  N=128, 201 frames, X=256   u0((x - beta t) mod 1), analytic
1D_Burgers_Sols_Nu0.01.hdf5     N=128, 201 frames, X=256   MUSCL-Rusanov finite volumes, SSP-RK2
2D_DarcyFlow_beta1.0_Train.hdf5 N=256, 64 x 64             Jacobi-preconditioned CG, rtol 1e-6
2D_diff-react_NA_NA.h5          N=32, 101 frames, 32 x 32  FitzHugh-Nagumo, explicit Euler
==============================  =========================  ==================================

Every file is a deterministic function of ``seed``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from ups.fsio import atomic_open

ADVECTION_FILE = "1D_Advection_Sols_beta0.4.hdf5"
BURGERS_FILE = "1D_Burgers_Sols_Nu0.01.hdf5"
DARCY_FILE = "2D_DarcyFlow_beta1.0_Train.hdf5"
DIFFREACT_FILE = "2D_diff-react_NA_NA.h5"

DT_SAVE = 0.01
N_FRAMES_1D = 201
DARCY_RTOL = 1e-6


@dataclass(frozen=True)
class Sizes:
    n_1d: int
    x_1d: int
    n_darcy: int
    hw_darcy: int
    n_dr: int
    hw_dr: int


SMALL = Sizes(n_1d=128, x_1d=256, n_darcy=512, hw_darcy=64, n_dr=32, hw_dr=32)
FULL_GRID = Sizes(n_1d=64, x_1d=1024, n_darcy=64, hw_darcy=128, n_dr=8, hw_dr=128)


def cell_centres(n: int) -> np.ndarray:
    """``(i + 0.5) / n`` for ``i < n``: the PDEBench grid on [0, 1]."""
    return (np.arange(n) + 0.5) / n


@dataclass(frozen=True)
class InitialConditions:
    """PDEBench 1D initial conditions as a function of x, for n samples.

    Sum over modes m = 1..4 of ``A_m sin(k_m x + phi_m)`` with ``k_m = 2 pi m s_m``, where
    ``s_m`` counts how many of 2 random draws picked mode m; then 10% of the samples take
    ``abs()``, every sample a random sign, and 10% a tanh window.
    """

    k: np.ndarray  # (n, 4) wavenumbers
    amp: np.ndarray  # (n, 4)
    phase: np.ndarray  # (n, 4)
    absolute: np.ndarray  # (n,) bool
    sign: np.ndarray  # (n,)
    window: np.ndarray  # (n,) bool
    left: np.ndarray  # (n,) window edges
    right: np.ndarray

    @classmethod
    def draw(cls, n: int, rng: np.random.Generator) -> InitialConditions:
        draws = rng.integers(0, 4, size=(n, 2))
        counts = (draws[:, :, None] == np.arange(4)).sum(axis=1)
        return cls(
            k=2 * np.pi * np.arange(1, 5) * counts,
            amp=rng.uniform(0.0, 1.0, size=(n, 4)),
            phase=rng.uniform(0.0, 2 * np.pi, size=(n, 4)),
            absolute=rng.uniform(size=n) < 0.1,
            sign=rng.choice([-1.0, 1.0], size=n),
            window=rng.uniform(size=n) < 0.1,
            left=rng.uniform(0.1, 0.45, size=n),
            right=rng.uniform(0.55, 0.9, size=n),
        )

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """u0 at points ``x`` of shape (X,) or (n, X), analytically; returns (n, X)."""
        x = np.broadcast_to(x, (self.k.shape[0], x.shape[-1]))
        waves = self.amp[:, :, None] * np.sin(
            self.k[:, :, None] * x[:, None, :] + self.phase[:, :, None]
        )
        u = waves.sum(axis=1)
        u = np.where(self.absolute[:, None], np.abs(u), u) * self.sign[:, None]
        mask = 0.5 * (
            np.tanh((x - self.left[:, None]) / 0.01) - np.tanh((x - self.right[:, None]) / 0.01)
        )
        out: np.ndarray = np.where(self.window[:, None], u * mask, u)
        return out


def advection(ic: InitialConditions, x: np.ndarray, beta: float, times: np.ndarray) -> np.ndarray:
    """The exact periodic solution ``u0((x - beta t) mod 1)``, shape (n, T, X)."""
    return np.stack([ic(np.mod(x - beta * t, 1.0)) for t in times], axis=1)


def _minmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(a * b > 0, np.sign(a) * np.minimum(np.abs(a), np.abs(b)), 0.0)


def _burgers_rhs(u: np.ndarray, dx: float, diff: float) -> np.ndarray:
    """Conservative semi-discretisation of ``-(u^2/2)_x + diff u_xx``, periodic in x."""
    slope = _minmod(u - np.roll(u, 1, axis=1), np.roll(u, -1, axis=1) - u)
    left = u + 0.5 * slope  # state left of face i+1/2
    right = np.roll(u - 0.5 * slope, -1, axis=1)
    speed = np.maximum(np.abs(left), np.abs(right))
    flux = 0.25 * (left**2 + right**2) - 0.5 * speed * (right - left)
    flux -= diff * (np.roll(u, -1, axis=1) - u) / dx
    return -(flux - np.roll(flux, 1, axis=1)) / dx


def burgers(u0: np.ndarray, dx: float, nu: float, n_frames: int, dt_save: float) -> np.ndarray:
    """Solve ``u_t + (u^2/2)_x = (nu/pi) u_xx`` (periodic), frames every ``dt_save``."""
    diff = nu / np.pi
    out = np.empty((u0.shape[0], n_frames, u0.shape[1]))
    out[:, 0] = u = u0.copy()
    for j in range(1, n_frames):
        umax = max(float(np.abs(u).max()), 1e-6)
        dt_max = min(0.4 * dx / umax, 0.2 * dx * dx / diff)
        substeps = int(np.ceil(dt_save / dt_max))
        dt = dt_save / substeps
        for _ in range(substeps):  # SSP-RK2 (Heun)
            stage = u + dt * _burgers_rhs(u, dx, diff)
            u = 0.5 * (u + stage + dt * _burgers_rhs(stage, dx, diff))
        out[:, j] = u
    return out


def smooth_field(n: int, size: int, length: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian-filtered white noise on a periodic ``size``-square grid, correlation ``length``."""
    k = np.fft.fftfreq(size) * size
    k2 = k[:, None] ** 2 + k[None, :] ** 2
    kernel = np.exp(-0.5 * (2 * np.pi * length) ** 2 * k2)
    noise = rng.standard_normal((n, size, size))
    return np.fft.ifft2(np.fft.fft2(noise) * kernel).real


@dataclass(frozen=True)
class DarcyOperator:
    """``-div(a grad u)`` on cell centres of [0,1]^2 with u = 0 on the boundary.

    A 5-point stencil with harmonic-mean face coefficients; a boundary face sees the ghost
    value -u, so it counts twice on the diagonal. Symmetric positive definite.
    """

    diag: np.ndarray  # (n, H, W)
    down: np.ndarray  # coefficient of u[i-1, j]; zero on the first row
    up: np.ndarray  # coefficient of u[i+1, j]
    left: np.ndarray  # coefficient of u[i, j-1]
    right: np.ndarray  # coefficient of u[i, j+1]

    @classmethod
    def build(cls, a: np.ndarray) -> DarcyOperator:
        inv_h2 = float(a.shape[-1]) ** 2
        edge = np.pad(a, ((0, 0), (1, 1), (1, 1)), mode="edge")
        c = edge[:, 1:-1, 1:-1]

        def face(nb: np.ndarray) -> np.ndarray:
            out: np.ndarray = 2 * c * nb / (c + nb) * inv_h2
            return out

        down, up = face(edge[:, :-2, 1:-1]), face(edge[:, 2:, 1:-1])
        left, right = face(edge[:, 1:-1, :-2]), face(edge[:, 1:-1, 2:])
        diag = down + up + left + right
        diag[:, 0] += down[:, 0]
        diag[:, -1] += up[:, -1]
        diag[:, :, 0] += left[:, :, 0]
        diag[:, :, -1] += right[:, :, -1]
        down[:, 0], up[:, -1], left[:, :, 0], right[:, :, -1] = 0, 0, 0, 0
        return cls(diag, down, up, left, right)

    def __call__(self, u: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.diag * u
        out[:, 1:] -= self.down[:, 1:] * u[:, :-1]
        out[:, :-1] -= self.up[:, :-1] * u[:, 1:]
        out[:, :, 1:] -= self.left[:, :, 1:] * u[:, :, :-1]
        out[:, :, :-1] -= self.right[:, :, :-1] * u[:, :, 1:]
        return out


def darcy_residual(u: np.ndarray, a: np.ndarray, beta: float) -> np.ndarray:
    """Per-sample ``||beta + div(a grad u)|| / ||beta||`` (the solver's stopping measure)."""
    r = beta - DarcyOperator.build(a)(u)
    rms: np.ndarray = np.sqrt((r**2).mean(axis=(1, 2))) / abs(beta)
    return rms


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.einsum("nij,nij->n", a, b)
    return out


def darcy(a: np.ndarray, beta: float, rtol: float = DARCY_RTOL, max_iter: int = 5000) -> np.ndarray:
    """Solve ``-div(a grad u) = beta`` on [0,1]^2, u = 0 on the boundary, for every sample.

    Jacobi-preconditioned conjugate gradients vectorised over samples, each sample stopping
    at relative residual ``rtol``. Raises RuntimeError if a sample does not converge.
    """
    op = DarcyOperator.build(a)
    inv_diag = 1.0 / op.diag
    u = np.zeros_like(a)
    r = np.full_like(a, beta)
    z = r * inv_diag
    p = z.copy()
    rz = _dot(r, z)
    stop = rtol * abs(beta) * np.sqrt(a[0].size)
    live = np.arange(a.shape[0])  # the samples still iterating; a converged one is done
    for _ in range(max_iter):
        active = np.sqrt(_dot(r, r)) > stop
        if not active.all():  # drop the converged: every array below is per sample
            keep = np.flatnonzero(active)
            live = live[keep]
            if live.size == 0:
                return u
            op = DarcyOperator(op.diag[keep], op.down[keep], op.up[keep], op.left[keep],
                               op.right[keep])  # fmt: skip
            inv_diag, r, z, p, rz = inv_diag[keep], r[keep], z[keep], p[keep], rz[keep]
        ap = op(p)
        alpha = (rz / np.maximum(_dot(p, ap), 1e-300))[:, None, None]
        u[live] += alpha * p
        r -= alpha * ap
        np.multiply(r, inv_diag, out=z)
        rz_new = _dot(r, z)
        p *= (rz_new / np.maximum(rz, 1e-300))[:, None, None]
        p += z
        rz = rz_new
    raise RuntimeError(f"Darcy CG did not reach rtol {rtol} in {max_iter} iterations")


def fitzhugh_nagumo(u0: np.ndarray, v0: np.ndarray, times: np.ndarray, h: float) -> np.ndarray:
    """2D diffusion-reaction (PDEBench parameters), no-flux boundary; (n, T, H, W, 2)."""
    du, dv, k = 1e-3, 5e-3, 5e-3

    def lap(f: np.ndarray) -> np.ndarray:
        p = np.pad(f, ((0, 0), (1, 1), (1, 1)), mode="edge")
        out: np.ndarray = (
            p[:, 2:, 1:-1] + p[:, :-2, 1:-1] + p[:, 1:-1, 2:] + p[:, 1:-1, :-2] - 4 * f
        )
        return out / h**2

    out = np.empty((*u0.shape[:1], times.size, *u0.shape[1:], 2))
    u, v = u0.copy(), v0.copy()
    out[:, 0, ..., 0], out[:, 0, ..., 1] = u, v
    dt_max = min(0.2 * h * h / dv, 0.01)
    for j in range(1, times.size):
        steps = int(np.ceil((times[j] - times[j - 1]) / dt_max))
        dt = (times[j] - times[j - 1]) / steps
        for _ in range(steps):
            u, v = (
                u + dt * (du * lap(u) + u - u**3 - k - v),
                v + dt * (dv * lap(v) + u - v),
            )
        out[:, j, ..., 0], out[:, j, ..., 1] = u, v
    return out


@contextmanager
def _new_h5(path: Path) -> Iterator[h5py.File]:
    """An HDF5 file that appears at ``path`` whole when the block ends, or not at all: a
    Ctrl-C or a full disk while it is written leaves the previous file (or none), never a
    truncated one that the next ``ups demo`` would take for its data (ups.fsio)."""
    with atomic_open(path, readable=True) as raw, h5py.File(raw, "w") as f:
        yield f


def _write_1d(path: Path, u: np.ndarray, x: np.ndarray, attr: str, value: float) -> None:
    with _new_h5(path) as f:
        f.create_dataset("tensor", data=u.astype(np.float32))
        f.create_dataset("x-coordinate", data=x.astype(np.float32))
        t = np.arange(u.shape[1] + 1) * DT_SAVE
        f.create_dataset("t-coordinate", data=t.astype(np.float32))
        f.attrs[attr] = value


def synth_advection(out_dir: Path, rng: np.random.Generator, sizes: Sizes) -> Path:
    x = cell_centres(sizes.x_1d)
    times = np.arange(N_FRAMES_1D) * DT_SAVE
    path = out_dir / ADVECTION_FILE
    u = advection(InitialConditions.draw(sizes.n_1d, rng), x, 0.4, times)
    _write_1d(path, u, x, "beta", 0.4)
    return path


def synth_burgers(out_dir: Path, rng: np.random.Generator, sizes: Sizes) -> Path:
    x = cell_centres(sizes.x_1d)
    u0 = InitialConditions.draw(sizes.n_1d, rng)(x)
    path = out_dir / BURGERS_FILE
    _write_1d(path, burgers(u0, 1.0 / x.size, 0.01, N_FRAMES_1D, DT_SAVE), x, "Nu", 0.01)
    return path


def synth_darcy(out_dir: Path, rng: np.random.Generator, sizes: Sizes, beta: float = 1.0) -> Path:
    n, s = sizes.n_darcy, sizes.hw_darcy
    field = smooth_field(n, s, 0.06, rng)
    a = np.where(field > field.mean(axis=(1, 2), keepdims=True), 1.0, 0.1)
    u = darcy(a, beta)
    path = out_dir / DARCY_FILE
    with _new_h5(path) as f:
        f.create_dataset("nu", data=a.astype(np.float32))
        f.create_dataset("tensor", data=u[:, None].astype(np.float32))
        f.create_dataset("x-coordinate", data=cell_centres(s).astype(np.float32))
        f.create_dataset("y-coordinate", data=cell_centres(s).astype(np.float32))
        f.create_dataset("t-coordinate", data=np.linspace(0, 1, 10, dtype=np.float32))
        f.attrs["beta"] = beta
    return path


def synth_diffreact(out_dir: Path, rng: np.random.Generator, sizes: Sizes) -> Path:
    n, s = sizes.n_dr, sizes.hw_dr
    grid = -1 + 2 * cell_centres(s)
    times = np.linspace(0.0, 5.0, 101)
    init = rng.standard_normal((2, n, s, s))
    data = fitzhugh_nagumo(init[0], init[1], times, 2.0 / s)
    path = out_dir / DIFFREACT_FILE
    with _new_h5(path) as f:
        for i in range(n):
            g = f.create_group(f"{i:04d}")
            g.create_dataset("data", data=data[i].astype(np.float32))
            g.create_dataset("grid/x", data=grid.astype(np.float32))
            g.create_dataset("grid/y", data=grid.astype(np.float32))
            g.create_dataset("grid/t", data=times.astype(np.float32))
    return path


Writer = Callable[[Path, np.random.Generator, Sizes], Path]

DEMO_FILES: tuple[tuple[str, Writer, int], ...] = (
    (ADVECTION_FILE, synth_advection, 0),
    (BURGERS_FILE, synth_burgers, 0),
    (DARCY_FILE, synth_darcy, 1),
    (DIFFREACT_FILE, synth_diffreact, 2),
)
"""Each demo file, the function that writes it and the index of its random stream (the
two 1D files draw from one stream, in this order)."""


def synthesize(
    out_dir: Path,
    seed: int = 0,
    *,
    small: bool = True,
    sizes: Sizes | None = None,
    progress: Callable[[int, int, Path], None] | None = None,
) -> list[Path]:
    """Write the demo files into ``out_dir`` (created) and return their paths.

    ``sizes`` overrides ``small`` (tests use tiny grids). ``progress(done, total, path)``
    is called before each file is computed and written (seconds each at demo size).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = sizes or (SMALL if small else FULL_GRID)
    rngs = [np.random.default_rng([seed, i]) for i in range(3)]
    paths = []
    for done, (name, write, stream) in enumerate(DEMO_FILES):
        if progress is not None:
            progress(done, len(DEMO_FILES), out_dir / name)
        paths.append(write(out_dir, rngs[stream], sizes))
    return paths
