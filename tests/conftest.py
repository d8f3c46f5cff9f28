"""Shared fixtures: small PDEBench-layout files written with plain h5py, configs, torchrun."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

pytest_plugins = ["tests.scheduling"]  # the longest tests first on the side-by-side workers


def write_advection(path: Path, n: int = 24, t: int = 11, x: int = 64, seed: int = 0) -> Path:
    """A 1D advection file in PDEBench layout: exact transport of a two-mode sine."""
    rng = np.random.default_rng(seed)
    grid = (np.arange(x) + 0.5) / x
    u = np.zeros((n, t, x), np.float32)
    for i in range(n):
        amp, phase = rng.uniform(0.2, 1, 2), rng.uniform(0, 2 * np.pi, 2)
        for k in range(t):
            shifted = (grid - 0.4 * 0.05 * k) % 1
            u[i, k] = amp[0] * np.sin(2 * np.pi * shifted + phase[0]) + amp[1] * np.sin(
                4 * np.pi * shifted + phase[1]
            )
    with h5py.File(path, "w") as f:
        f["tensor"] = u
        f["x-coordinate"] = grid.astype(np.float32)
        f["t-coordinate"] = np.linspace(0, 0.05 * t, t + 1, dtype=np.float32)
        f.attrs["beta"] = 0.4
    return path


def write_darcy(path: Path, n: int = 24, h: int = 16, seed: int = 1) -> Path:
    """A 2D Darcy file in PDEBench layout (values random: the layout is what matters here)."""
    rng = np.random.default_rng(seed)
    nu = np.where(rng.uniform(size=(n, h, h)) > 0.5, 1.0, 0.1).astype(np.float32)
    with h5py.File(path, "w") as f:
        f["nu"] = nu
        f["tensor"] = (1.0 / (1.0 + nu))[:, None].astype(np.float32)
        f["x-coordinate"] = np.linspace(0, 1, h, dtype=np.float32)
        f["y-coordinate"] = np.linspace(0, 1, h, dtype=np.float32)
        f["t-coordinate"] = np.linspace(0, 1, 10, dtype=np.float32)
        f.attrs["beta"] = 1.0
    return path


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Each test starts with structlog unconfigured: a command run in process (``ups deploy``
    logs to the sys.stderr of its test, which pytest closes) must not leave the next test
    writing to a closed stream."""
    yield
    import structlog

    from ups import log

    if log._SINKS is not None:
        log._SINKS.close()
        log._SINKS = None
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.name == log._LIBRARY_HANDLER]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)


@pytest.fixture(autouse=True)
def _background_installs(request: pytest.FixtureRequest) -> None:
    """Wait for the background installs this test needs (scripts/test.sh,
    tests/background.py): its ``background`` marker's jobs and those its markers and
    fixtures imply (``ssh``, ``docker``, ``ups_image``)."""
    from tests.background import await_background, needs

    for name in needs(request.node):
        await_background(name)


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test has its own ups state (host ledger, command log), never the user's."""
    monkeypatch.setenv("UPS_STATE_DIR", str(tmp_path / "ups-state"))


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two tiny PDEBench files, written once per test run: the same paths in every xdist
    worker, so a config naming them is the same config everywhere (:func:`uninterrupted_run`)."""

    def write(root: Path) -> None:
        write_advection(root / "1D_Advection_Sols_beta0.4.hdf5")
        write_darcy(root / "2D_DarcyFlow_beta1.0_Train.hdf5")

    root = made_once_per_run(tmp_path_factory, "tiny-data", write)
    return {
        "advection": root / "1D_Advection_Sols_beta0.4.hdf5",
        "darcy": root / "2D_DarcyFlow_beta1.0_Train.hdf5",
    }


def made_once_per_run(
    factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]
) -> Path:
    """``<run's temp dir>/NAME``, made by ``make(path)`` once per test run. The xdist workers
    share the run's temp dir (``pytest-N/``, each has ``popen-gwK/`` in it); the first to
    take the lock makes it, the others wait and reuse it; a directory left half-made by a
    killed worker is made again."""
    from filelock import FileLock

    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / name
    with FileLock(str(base / f"{name}.lock"), timeout=900):
        if not (root / ".complete").exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            make(root)
            (root / ".complete").touch()
    return root


def tiny_config(output_dir: Path, data: dict[str, Path], **sections: Any) -> dict[str, Any]:
    """The tiny two-task run config (what ``make_config`` writes); keyword sections override
    the defaults, a dict section key by key."""
    cfg: dict[str, Any] = {
        "run": {"name": "t", "output_dir": str(output_dir), "seed": 0},
        "tasks": [
            {"name": "advection", "layout": "single_1d", "path": str(data["advection"])},
            {"name": "darcy", "layout": "darcy_2d", "path": str(data["darcy"])},
        ],
        "model": {"latent_dim": 16, "depth": 1, "heads": 2, "patch_1d": 8, "patch_2d": 4},
        "training": {"epochs": 1, "batch_size": 8, "log_every": 1, "lr": 3e-3},
        "checkpoint": {"every_steps": 4, "keep_last": 3},
        "distributed": {"init_timeout_s": 60, "collective_timeout_s": 30},
        "wandb": {"mode": "offline"},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


@pytest.fixture
def make_config(tmp_path: Path, tiny_data: dict[str, Path]) -> Callable[..., Path]:
    """Write a tiny two-task run config into tmp_path; keyword sections override defaults."""

    def make(**sections: Any) -> Path:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(tiny_config(tmp_path / "runs", tiny_data, **sections)))
        return path

    return make


def uninterrupted_run(factory: pytest.TempPathFactory, config: Path) -> Path:
    """The run directory of ``config`` trained without interruption under torchrun: the
    reference a resumed or repaired run must equal. Made once per test run for each config
    and shared by every test that compares with it (the output directory, run id, W&B,
    ``keep_last``, uploads, ports, timeouts and restart settings aside, which do not change
    what is computed)."""
    cfg = yaml.safe_load(config.read_text())
    for section, key in (("run", "output_dir"), ("run", "run_id"), ("checkpoint", "keep_last"),
                         ("distributed", "master_port"), ("distributed", "init_timeout_s"),
                         ("distributed", "collective_timeout_s"), ("distributed", "stop_grace_s"),
                         ("distributed", "max_restarts"),
                         ("distributed", "restart_backoff_s")):  # fmt: skip
        cfg.get(section, {}).pop(key, None)
    for section in ("wandb", "checkpoint_sync"):
        cfg.pop(section, None)
    key = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]

    def train(root: Path) -> None:
        cfg["run"]["output_dir"] = str(root / "runs")
        cfg["wandb"] = {"mode": "disabled"}
        (root / "config.yaml").write_text(yaml.safe_dump(cfg))
        done = torchrun(root / "config.yaml")
        assert done.returncode == 0, done.stderr[-3000:]

    return only_run_dir(made_once_per_run(factory, f"uninterrupted-{key}", train) / "runs")


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str

    def events(self) -> list[dict[str, Any]]:
        return parse_events(self.stdout)


def parse_events(text: str) -> list[dict[str, Any]]:
    """JSON events in a stream; raw lines (torchrun, faulthandler) are skipped."""
    events = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    return events


def rank_events(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    return parse_events((run_dir / "logs" / f"rank{rank}.jsonl").read_text())


def worker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "UPS_"))}
    env.update({"OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def torchrun(
    config: Path,
    *args: str,
    nproc: int = 2,
    env: Mapping[str, str] | None = None,
    timeout: float = 240,
) -> Finished:
    """Run the trainer under real torchrun (gloo, CPU) and wait for it."""
    cmd = [
        PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "--monitor-interval=0.2", "-m", "ups.train.main", str(config), *args,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=worker_env(env), cwd=REPO
    )
    return Finished(proc.returncode, proc.stdout, proc.stderr)


def only_run_dir(output_dir: Path) -> Path:
    runs = [p for p in output_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 1, runs
    return runs[0]


# --- Skip policy: on a machine without a GPU every test runs; only GPU tests may skip. ---
# Under pytest-xdist these hooks run in the controller too, on the reports the workers send
# (keywords become a dict there, and a skip's longrepr may arrive as a list).

_GPU_REASON = re.compile(r"\b(gpu|cuda|nccl)\b", re.IGNORECASE)
_bad_skips: list[str] = []


def _allowed_skip(report: pytest.TestReport, reason: str) -> bool:
    """A skip is allowed for a GPU test (marker ``gpu``) or a reason about GPUs/CUDA."""
    return "gpu" in report.keywords or bool(_GPU_REASON.search(reason))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect every skip whose reason is not a missing (or present) GPU."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, tuple | list) else str(longrepr)
    if not _allowed_skip(report, reason):
        _bad_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a test skipped for a reason other than the GPU: a skip on a CPU
    machine is a test that did not run, and CI must say so."""
    if _bad_skips and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _bad_skips:
        terminalreporter.section("skipped for a reason other than a missing GPU (this fails)")
        for line in _bad_skips:
            terminalreporter.write_line(line)


# --- Tiers are checked: a test that starts a process must say so with its markers. ---
# `make test-fast` runs `-m "not slow"` and must stay quick, so every test that starts a
# process (a subprocess, a multiprocessing worker) carries `slow`, plus `ssh` when that
# process is ssh/sshd and `docker` when it is docker/dockerd. The guard watches every
# spawn during a test's setup (fixtures of any scope it starts), call and teardown, and
# fails the test naming the markers it lacks.

_NEEDS = (
    (re.compile(r"(^|/)(sshd?)$"), "ssh"),
    (re.compile(r"(^|/)(docker|dockerd|docker-compose)$"), "docker"),
)
_QUICK_TOOLS = {"mount", "umount", "ssh-keygen", "ldd", "git"}
"""System tools that finish in milliseconds and start nothing that stays: allowed unmarked
(as is ``sh -n``, a syntax check). Anything else, a Python (torch import alone takes
seconds), torchrun, fab, ups, sshd or docker, needs ``slow``."""


def _argv(args: Any) -> list[str]:
    if isinstance(args, str | bytes | os.PathLike):
        return [os.fsdecode(args)]
    return [os.fsdecode(a) if isinstance(a, str | bytes | os.PathLike) else str(a) for a in args]


def missing_markers(marks: set[str], argv: list[str]) -> list[str]:
    """The markers a test with ``marks`` lacks for spawning ``argv`` (empty: none)."""
    program = os.path.basename(argv[0]) if argv else ""
    quick = program in _QUICK_TOOLS or (program in ("sh", "bash") and argv[1:2] == ["-n"])
    needed = set() if quick else {"slow"}
    # `ip netns exec NS sshd ...`, `env X=1 docker ...`, `setsid docker ...`: look past
    # the wrappers at every word that names a program.
    for word in argv[:8]:
        for pattern, marker in _NEEDS:
            if pattern.search(word):
                needed.add(marker)
    return sorted(needed - marks)


class _SpawnGuard:
    """Records processes started while a test runs (patches stay on for the session)."""

    def __init__(self) -> None:
        self.spawned: list[list[str]] | None = None

    def record(self, argv: list[str]) -> None:
        if self.spawned is not None:
            self.spawned.append(argv)

    def install(self) -> None:
        import multiprocessing.process

        guard = self
        popen_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

        def execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any) -> Any:
            guard.record(_argv(args))
            return popen_child(self, args, *rest)

        subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]
        process_start = multiprocessing.process.BaseProcess.start

        def start(self: multiprocessing.process.BaseProcess) -> None:
            guard.record(["multiprocessing", self.name])
            process_start(self)

        multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]
        forkpty = os.forkpty  # pty.fork: a child on a pseudo-terminal

        def recorded_forkpty() -> tuple[int, int]:
            guard.record(["forkpty"])
            return forkpty()

        os.forkpty = recorded_forkpty

    def check(self, item: pytest.Item, phase: str) -> None:
        spawned, self.spawned = self.spawned or [], None
        marks = {m.name for m in item.iter_markers()}
        missing: dict[str, str] = {}  # marker -> the first command that needs it
        for argv in spawned:
            for marker in missing_markers(marks, argv):
                missing.setdefault(marker, " ".join(argv)[:160])
        if missing:
            lines = "\n".join(
                f"  @pytest.mark.{marker}: it started `{cmd}`" for marker, cmd in missing.items()
            )
            pytest.fail(
                f"{item.nodeid} started processes during {phase} without the markers they "
                f"need:\n{lines}\nA test that starts a process is marked `slow` (plus `ssh` "
                "for ssh/sshd, `docker` for docker), so `make test-fast` stays quick. Add the "
                "markers to the test.",
                pytrace=False,
            )


_guard = _SpawnGuard()


def pytest_configure(config: pytest.Config) -> None:
    _guard.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    _guard.spawned = []
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    result = yield
    _guard.check(item, "setup or call")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _guard.spawned = []
    result = yield
    _guard.check(item, "teardown")
    return result


# --- The project image, built once per test run and shared by every docker test. ---


@pytest.fixture(scope="session")
def ups_image() -> str:
    """The engine answering (scripts/docker-engine.sh) and the project image built from
    this tree (scripts/build-images.sh), once per run even with several xdist workers.
    Fails (never skips) when either cannot be done: the docker tests must run."""
    from tests.docker_fixtures import ensure_project_image

    return ensure_project_image()
