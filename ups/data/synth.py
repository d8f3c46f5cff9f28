"""Demo data in the exact PDEBench layouts, small enough to synthesize in seconds.

Sizes (chosen so ``ups demo`` trains for a few minutes on 2 CPU cores and synthesis takes
well under 20 s; ``small=False`` gives the released grid sizes with fewer samples):

==============================  =========================  ==================================
file                            small                      what
==============================  =========================  ==================================
1D_Advection_Sols_beta0.4.hdf5  N=128, 201 frames, X=256   exact solution u0((x - beta t) mod 1)
1D_Burgers_Sols_Nu0.01.hdf5     N=128, 201 frames, X=256   MUSCL-Rusanov finite volumes, SSP-RK2
2D_DarcyFlow_beta1.0_Train.hdf5 N=256, 64 x 64             Jacobi-preconditioned CG, rtol 1e-6
2D_diff-react_NA_NA.h5          N=32, 101 frames, 32 x 32  FitzHugh-Nagumo, explicit Euler
==============================  =========================  ==================================

Every file is a deterministic function of ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

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


SMALL = Sizes(n_1d=128, x_1d=256, n_darcy=256, hw_darcy=64, n_dr=32, hw_dr=32)
FULL_GRID = Sizes(n_1d=64, x_1d=1024, n_darcy=64, hw_darcy=128, n_dr=8, hw_dr=128)


def cell_centres(n: int) -> np.ndarray:
    """``(i + 0.5) / n`` for ``i < n``: the PDEBench grid on [0, 1]."""
    return (np.arange(n) + 0.5) / n


def initial_conditions(x: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """PDEBench 1D initial conditions (REFERENCE §3), shape (n, len(x)), float64.

    Sum over modes m = 1..4 of ``A_m sin(k_m x + phi_m)`` with ``k_m = 2 pi m s_m``, where
    ``s_m`` counts how many of 2 random draws picked mode m; then 10% take ``abs()``, every
    sample a random sign, and 10% a tanh window.
    """
    modes = np.arange(1, 5)
    draws = rng.integers(0, 4, size=(n, 2))
    counts = (draws[:, :, None] == np.arange(4)).sum(axis=1)
    k = 2 * np.pi * modes * counts
    amp = rng.uniform(0.0, 1.0, size=(n, 4))
    phase = rng.uniform(0.0, 2 * np.pi, size=(n, 4))
    u = (amp[:, :, None] * np.sin(k[:, :, None] * x + phase[:, :, None])).sum(axis=1)
    absolute = rng.uniform(size=n) < 0.1
    u[absolute] = np.abs(u[absolute])
    u *= rng.choice([-1.0, 1.0], size=n)[:, None]
    window = rng.uniform(size=n) < 0.1
    left = rng.uniform(0.1, 0.45, size=n)[:, None]
    right = rng.uniform(0.55, 0.9, size=n)[:, None]
    mask = 0.5 * (np.tanh((x - left) / 0.01) - np.tanh((x - right) / 0.01))
    out: np.ndarray = np.where(window[:, None], u * mask, u)
    return out


def advection(u0: np.ndarray, x: np.ndarray, beta: float, times: np.ndarray) -> np.ndarray:
    """Exact periodic transport of ``u0`` (given on cell centres ``x``), shape (n, T, X).

    ``u0`` is re-evaluated at ``(x - beta t) mod 1`` by periodic linear interpolation only where
    the shift is not a whole number of cells; the tests use whole-cell shifts.
    """
    nx = x.size
    out = np.empty((u0.shape[0], times.size, nx))
    for j, t in enumerate(times):
        shift = beta * t * nx
        whole = int(np.floor(shift))
        frac = shift - whole
        a = np.roll(u0, whole, axis=1)
        out[:, j] = a if frac < 1e-9 else (1 - frac) * a + frac * np.roll(a, 1, axis=1)
    return out


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


def _darcy_op(u: np.ndarray, ax: np.ndarray, ay: np.ndarray, h: float) -> np.ndarray:
    """``-div(a grad u)`` on cell centres with u = 0 on the boundary (ghost cells -u)."""
    padded = np.pad(u, ((0, 0), (1, 1), (1, 1)))
    padded[:, 0, :], padded[:, -1, :] = -padded[:, 1, :], -padded[:, -2, :]
    padded[:, :, 0], padded[:, :, -1] = -padded[:, :, 1], -padded[:, :, -2]
    gx = np.diff(padded[:, :, 1:-1], axis=1)  # faces along axis 1
    gy = np.diff(padded[:, 1:-1, :], axis=2)
    return -(np.diff(ax * gx, axis=1) + np.diff(ay * gy, axis=2)) / (h * h)


def _face_coefficients(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Harmonic means on interior faces; boundary faces take the cell's own value."""
    edge = np.pad(a, ((0, 0), (1, 1), (1, 1)), mode="edge")
    ax = 2 * edge[:, :-1, 1:-1] * edge[:, 1:, 1:-1] / (edge[:, :-1, 1:-1] + edge[:, 1:, 1:-1])
    ay = 2 * edge[:, 1:-1, :-1] * edge[:, 1:-1, 1:] / (edge[:, 1:-1, :-1] + edge[:, 1:-1, 1:])
    return ax, ay


def darcy_residual(u: np.ndarray, a: np.ndarray, beta: float) -> np.ndarray:
    """Per-sample ``||beta + div(a grad u)|| / ||beta||`` (the solver's stopping measure)."""
    ax, ay = _face_coefficients(a)
    h = 1.0 / a.shape[-1]
    r = beta - _darcy_op(u, ax, ay, h)
    rms: np.ndarray = np.sqrt((r**2).sum(axis=(1, 2)) / (beta**2 * a[0].size))
    return rms


def darcy(a: np.ndarray, beta: float, rtol: float = DARCY_RTOL, max_iter: int = 5000) -> np.ndarray:
    """Solve ``-div(a grad u) = beta`` on [0,1]^2, u = 0 on the boundary, for every sample.

    Jacobi-preconditioned conjugate gradients vectorised over samples, each sample stopping
    at relative residual ``rtol``. Raises RuntimeError if a sample does not converge.
    """
    ax, ay = _face_coefficients(a)
    h = 1.0 / a.shape[-1]
    # Diagonal of the operator; a boundary face counts twice since its ghost value is -u.
    diag = ax[:, 1:] + ax[:, :-1] + ay[:, :, 1:] + ay[:, :, :-1]
    diag[:, 0, :] += ax[:, 0]
    diag[:, -1, :] += ax[:, -1]
    diag[:, :, 0] += ay[:, :, 0]
    diag[:, :, -1] += ay[:, :, -1]
    diag /= h * h
    b = np.full_like(a, beta)
    u = np.zeros_like(a)
    r = b.copy()
    z = r / diag
    p = z.copy()
    rz = (r * z).sum(axis=(1, 2))
    bnorm = np.sqrt((b**2).sum(axis=(1, 2)))
    for _ in range(max_iter):
        active = np.sqrt((r**2).sum(axis=(1, 2))) > rtol * bnorm
        if not active.any():
            return u
        ap = _darcy_op(p, ax, ay, h)
        alpha = np.where(active, rz / np.maximum((p * ap).sum(axis=(1, 2)), 1e-300), 0.0)
        u += alpha[:, None, None] * p
        r -= alpha[:, None, None] * ap
        z = r / diag
        rz_new = (r * z).sum(axis=(1, 2))
        p = z + (rz_new / np.maximum(rz, 1e-300))[:, None, None] * p
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


def _write_1d(path: Path, u: np.ndarray, x: np.ndarray, attr: str, value: float) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("tensor", data=u.astype(np.float32))
        f.create_dataset("x-coordinate", data=x.astype(np.float32))
        t = np.arange(u.shape[1] + 1) * DT_SAVE
        f.create_dataset("t-coordinate", data=t.astype(np.float32))
        f.attrs[attr] = value


def synth_1d(out_dir: Path, rng: np.random.Generator, sizes: Sizes) -> list[Path]:
    x = cell_centres(sizes.x_1d)
    times = np.arange(N_FRAMES_1D) * DT_SAVE
    u0 = initial_conditions(x, sizes.n_1d, rng)
    adv, burg = out_dir / ADVECTION_FILE, out_dir / BURGERS_FILE
    _write_1d(adv, advection(u0, x, 0.4, times), x, "beta", 0.4)
    u0 = initial_conditions(x, sizes.n_1d, rng)
    _write_1d(burg, burgers(u0, 1.0 / x.size, 0.01, N_FRAMES_1D, DT_SAVE), x, "Nu", 0.01)
    return [adv, burg]


def synth_darcy(out_dir: Path, rng: np.random.Generator, sizes: Sizes, beta: float = 1.0) -> Path:
    n, s = sizes.n_darcy, sizes.hw_darcy
    field = smooth_field(n, s, 0.06, rng)
    a = np.where(field > field.mean(axis=(1, 2), keepdims=True), 1.0, 0.1)
    u = darcy(a, beta)
    path = out_dir / DARCY_FILE
    with h5py.File(path, "w") as f:
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
    with h5py.File(path, "w") as f:
        for i in range(n):
            g = f.create_group(f"{i:04d}")
            g.create_dataset("data", data=data[i].astype(np.float32))
            g.create_dataset("grid/x", data=grid.astype(np.float32))
            g.create_dataset("grid/y", data=grid.astype(np.float32))
            g.create_dataset("grid/t", data=times.astype(np.float32))
    return path


def synthesize(out_dir: Path, seed: int = 0, *, small: bool = True) -> list[Path]:
    """Write the demo files into ``out_dir`` (created) and return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = SMALL if small else FULL_GRID
    rngs = [np.random.default_rng([seed, i]) for i in range(3)]
    paths = synth_1d(out_dir, rngs[0], sizes)
    paths.append(synth_darcy(out_dir, rngs[1], sizes))
    paths.append(synth_diffreact(out_dir, rngs[2], sizes))
    return paths
