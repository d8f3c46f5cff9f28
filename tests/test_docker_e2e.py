"""The image and compose files, run for real on this machine's Docker engine (CPU, gloo).

conftest's session fixture ``ups_image`` starts the engine (scripts/docker-engine.sh) and
builds the CPU images (scripts/build-images.sh) once per test run. Each test runs its own
compose project with its own host directories, through
``docker compose -f docker-compose.yml -f docker/compose.cpu.yml``. Without an engine
the tests fail: they never skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_fixtures import shared_demo_data

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("UPS_IMAGE_CPU", "ups:cpu")
COMPOSE_FILES = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "docker/compose.cpu.yml")]
CUDA_CACHE = ROOT / "tests/fixtures/cache_cuda/latents_cuda0.pt"


@pytest.fixture(scope="session")
def image(ups_image: str) -> str:
    """The CPU image (conftest's ``ups_image``)."""
    return ups_image


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo data files in PDEBench layout, written once per run on the host (shared
    with the deploy tests' copy)."""
    root = shared_demo_data(tmp_path_factory).parent
    root.chmod(0o755)  # mounted at /app/data; the container runs as uid 1000
    return root


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


@dataclass
class Project:
    """One compose project: its name, host directories and run config."""

    name: str
    dirs: dict[str, Path]
    run_id: str
    master_port: int
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.dirs["runs"] / self.run_id

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("UPS_")}
        env.update(
            UPS_IMAGE_CPU=IMAGE,
            UPS_DATA_DIR=str(self.dirs["data"]),
            UPS_CACHE_DIR=str(self.dirs["cache"]),
            UPS_RUNS_DIR=str(self.dirs["runs"]),
            UPS_STATE_DIR=str(self.dirs["state"]),
            UPS_CONFIG=".ups/e2e.yaml",
            UPS_RUN_ID=self.run_id,
        )
        return env | self.extra_env

    def write_config(self, faults: list[dict[str, Any]] | None = None, **training: Any) -> None:
        cfg = {
            "run": {"name": "e2e", "output_dir": "runs"},
            "tasks": [
                {
                    "name": "advection",
                    "layout": "single_1d",
                    "path": "data/demo/1D_Advection_Sols_beta0.4.hdf5",
                    "reduced_resolution": 2,
                    "reduced_resolution_t": 5,
                },
                {
                    "name": "darcy",
                    "layout": "darcy_2d",
                    "path": "data/demo/2D_DarcyFlow_beta1.0_Train.hdf5",
                },
            ],
            "model": {"latent_dim": 32, "depth": 1, "heads": 4},
            "training": {"epochs": 1, "batch_size": 16, "max_steps": 20, "log_every": 5} | training,
            "distributed": {"master_port": self.master_port},
            "checkpoint": {"every_steps": 10},
            "wandb": {"mode": "offline"},
            "faults": faults or [],
        }
        (self.dirs["state"] / "e2e.yaml").write_text(yaml.safe_dump(cfg))

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", "compose", "-p", self.name, *COMPOSE_FILES, *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def container(self, service: str) -> dict[str, Any]:
        ids = self.compose("ps", "-a", "-q", service, timeout=60).stdout.split()
        assert ids, f"no {service} container in {self.name}"
        out = subprocess.run(
            ["docker", "inspect", ids[0]], capture_output=True, text=True, check=True, timeout=60
        )
        info: dict[str, Any] = json.loads(out.stdout)[0]
        return info

    def logs(self, service: str) -> str:
        return self.compose("logs", "--no-color", service, timeout=60).stdout

    def events(self, rank: int = 0) -> list[dict[str, Any]]:
        path = self.run_dir / "logs" / f"rank{rank}.jsonl"
        if not path.exists():
            return []
        lines = path.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.fixture
def project(image: str, demo_data: Path, tmp_path: Path) -> Iterator[Project]:
    dirs = {"data": demo_data}
    for name in ("cache", "runs", "state"):
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        dirs[name].chmod(0o777)  # the container runs as uid 1000
    proj = Project(
        name=f"ups-e2e-{uuid.uuid4().hex[:8]}",
        dirs=dirs,
        run_id=f"e2e-{uuid.uuid4().hex[:6]}",
        master_port=_free_port(),
    )
    proj.write_config()
    try:
        yield proj
    finally:
        proj.compose("down", "--remove-orphans", "--timeout", "5", timeout=120)


def test_image_runs_torch_and_a_two_process_gloo_torchrun(image: str, tmp_path: Path) -> None:
    """Inside the image, as the non-root user, torchrun starts 2 gloo ranks that all-reduce;
    its labels carry the pins and a real commit, and its size is what the README quotes."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "result = {'rank': dist.get_rank(), 'sum': t.item(), 'uid': os.getuid(),\n"
        "          'torch': torch.__version__}\n"
        "with open(f'/probe/rank{dist.get_rank()}.json', 'w') as f:\n"
        "    json.dump(result, f)\n"
        "dist.destroy_process_group()\n"
    )
    probe.chmod(0o644)
    tmp_path.chmod(0o777)  # the container's uid 1000 writes one result file per rank
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "host", "-v", f"{tmp_path}:/probe",
         "--entrypoint", "torchrun", image, "--nproc-per-node=2", "--rdzv-backend=static",
         "--master-addr=127.0.0.1", f"--master-port={_free_port()}", "/probe/probe.py"],
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["sum"] == 3.0 and r["uid"] == 1000 for r in results)
    assert results[0]["torch"].startswith("2.13.0")

    labels = json.loads(
        subprocess.run(
            ["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", image],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )
    revision = labels["org.opencontainers.image.revision"].removesuffix("-dirty")
    known = subprocess.run(["git", "cat-file", "-e", f"{revision}^{{commit}}"], cwd=ROOT)
    assert known.returncode == 0, f"label names no commit of this repo: {revision}"
    assert labels["io.ups.pins.torch"] == "2.13.0"
    assert labels["io.ups.pins.python"] == "3.11"  # the CPU base's, pins.toml [image.cpu]

    # The size the README quotes is this image's (scripts/readme-image.py rewrites it).
    size = subprocess.run(
        [sys.executable, str(ROOT / "scripts/readme-image.py"), "--check", "--image", image],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert size.returncode == 0, size.stderr


def test_a_base_that_differs_from_pins_toml_stops_the_build(image: str, tmp_path: Path) -> None:
    """The Dockerfile's first RUN checks the base against pins.toml: with torch and the CPU
    image's Python pinned to other versions the build fails there, naming both versions of
    each, before any dependency is installed (the image build in conftest passed it)."""
    pins = (ROOT / "pins.toml").read_text()
    pins = pins.replace('torch = "2.13.0"', 'torch = "2.12.1"', 1)
    pins = pins.replace('python = "3.11"', 'python = "3.10"', 1)
    (tmp_path / "docker").mkdir()
    (tmp_path / "pins.toml").write_text(pins)
    for name in ("Dockerfile", ".dockerignore", "docker/check_base.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    base = subprocess.run(
        ["bash", str(ROOT / "scripts/build-images.sh"), "--build-args"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    base_image = re.search(r"^BASE_IMAGE=(.+)$", base, re.M)
    assert base_image is not None
    out = subprocess.run(
        ["docker", "build", "--force-rm", "--network", "host",
         "--build-arg", f"BASE_IMAGE={base_image[1]}",
         "--build-arg", "TORCH_BUILD=cpu", "-t", f"ups-badpins:{os.getpid()}", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert "python: pinned 3.10, the base has 3.11." in text, text[-3000:]
    assert "torch: pinned 2.12.1, the base has 2.13.0+cpu" in text, text[-3000:]
    assert "requirements.lock" not in text  # stopped before the dependency layer


def test_a_script_run_file_docker_stop_then_up_resumes_from_its_checkpoint(
    project: Project,
) -> None:
    """UPS_RUN_FILE: `compose up train-ddp` runs examples/ddp/train.py (preflight first, then
    `ups launch --run-file`); `docker compose stop` mid-run ends "preempted" (75) with the
    script's checkpoint in runs/<run id>/checkpoints; the next `up` resumes from it."""
    work = project.dirs["state"].parent / "work"
    shutil.copytree(ROOT / "examples" / "ddp", work)
    run_file = {
        "script": "train.py",
        "args": ["--steps", "10", "--save-every", "4", "--pause-at", "6", "--out", "final.pt"],
        "stop_grace_s": 30,
    }
    (work / "ups-run.yaml").write_text(yaml.safe_dump(run_file))
    work.chmod(0o777)  # the script writes final.pt there, as the owner of runs/
    project.extra_env = {
        "UPS_WORKDIR": str(work),
        "UPS_RUN_FILE": "ups-run.yaml",
        "UPS_MASTER_PORT": str(project.master_port),
    }
    log = project.run_dir / "logs" / "launch.log"
    up = project.compose("up", "-d", "train-ddp")
    assert up.returncode == 0, up.stderr[-2000:] + project.logs("preflight")[-3000:]
    _wait_for(
        lambda: log.exists() and "step 5 loss" in log.read_text(errors="replace"),
        timeout=240,
        what="step 5 of the script (then held at 6)",
    )
    assert "preflight OK" in project.logs("preflight")
    pre, ddp = project.container("preflight"), project.container("train-ddp")
    assert pre["State"]["ExitCode"] == 0 and pre["State"]["FinishedAt"] <= ddp["State"]["StartedAt"]
    stop = project.compose("stop", "train-ddp", timeout=180)
    assert stop.returncode == 0, stop.stderr

    assert project.container("train-ddp")["State"]["ExitCode"] == 75, project.logs("train-ddp")
    outcome = json.loads((project.run_dir / "outcome.json").read_text())
    assert outcome["outcome"] == "preempted", outcome
    saved = project.run_dir / "checkpoints" / "step_000006.pt"
    assert outcome["checkpoint"] == f"/app/runs/{project.run_id}/checkpoints/step_000006.pt"
    assert saved.exists()

    # Same host, same checks: the operator's resume skips the preflight service.
    again = project.compose("up", "--no-deps", "train-ddp")
    assert again.returncode == 0, again.stdout[-3000:]
    outcome = json.loads((project.run_dir / "outcome.json").read_text())
    assert outcome["outcome"] == "finished" and outcome["exit_code"] == 0, outcome
    assert outcome["resumed_from"]["checkpoint"].endswith("step_000006.pt"), outcome
    assert "training steps 6..10" in log.read_text(errors="replace")
    assert (work / "final.pt").exists()

    # A run file not in the mount, or a trainer override: one paragraph, exit 2, nothing run.
    for run_file, words in (("nope.yaml", []), ("ups-run.yaml", ["--set", "training.lr=1"])):
        mount = ["-e", f"UPS_RUN_FILE={run_file}", "-v", f"{work}:/app/work"]
        refused = subprocess.run(
            ["docker", "run", "--rm", *mount, IMAGE, "configs/demo.yaml", *words],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.count("\n") == 1 and "Nothing was started" in refused.stderr
        assert ("UPS_WORKDIR" if words == [] else "--set training.lr=1") in refused.stderr


def _assert_stopped_at_preflight(project: Project, up: subprocess.CompletedProcess[str]) -> str:
    assert up.returncode != 0
    assert project.container("preflight")["State"]["ExitCode"] != 0
    state = project.container("train-ddp")["State"]
    assert state["StartedAt"].startswith("0001-01-01"), "train-ddp must never start"
    assert not project.run_dir.exists(), "no run directory: torchrun never started"
    return project.logs("preflight")


def test_a_taken_master_port_stops_the_run_at_preflight(project: Project) -> None:
    """A real socket on the host's master port fails preflight; training never starts."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", project.master_port))
        holder.listen()
        up = project.compose("up", "train-ddp")
    logs = _assert_stopped_at_preflight(project, up)
    assert f"master port {project.master_port} is taken" in logs
    assert "--master-port" in logs  # the hint names the fix


def test_a_cuda_tagged_cache_file_stops_the_run_at_preflight(project: Project) -> None:
    """A latent cache saved from CUDA tensors, mounted in, fails preflight before torchrun."""
    latents = project.dirs["cache"] / "latents"
    latents.mkdir()
    latents.chmod(0o777)
    shutil.copy(CUDA_CACHE, latents / CUDA_CACHE.name)
    (latents / CUDA_CACHE.name).chmod(0o644)
    up = project.compose("up", "train-ddp")
    logs = _assert_stopped_at_preflight(project, up)
    assert CUDA_CACHE.name in logs and "cuda" in logs.lower()


def test_docker_stop_leaves_a_checkpoint_the_next_up_resumes(project: Project) -> None:
    """`docker compose stop` mid-training ends "preempted" (75) with a checkpoint; `up` resumes."""
    # Held asleep at step 11, past the first checkpoint, until the stop: not training flat
    # out on the machine's cores meanwhile.
    held = [{"kind": "pause", "rank": rank, "step": 11} for rank in (0, 1)]
    project.write_config(held, epochs=1000, max_steps=1_000_000)
    up = project.compose("up", "-d", "train-ddp")
    assert up.returncode == 0, up.stderr[-2000:]
    _wait_for(
        lambda: any(e.get("event") == "checkpoint_saved" for e in project.events()),
        timeout=240,
        what="the first checkpoint",
    )
    stop = project.compose("stop", "train-ddp", timeout=180)
    assert stop.returncode == 0, stop.stderr

    assert project.container("train-ddp")["State"]["ExitCode"] == 75
    outcome = json.loads((project.run_dir / "outcome.json").read_text())
    assert outcome["outcome"] == "preempted" and outcome["signal"] == "SIGTERM"
    step = int(outcome["step"])
    assert Path(outcome["checkpoint"]).name == f"step_{step:06d}.pt"
    assert (project.run_dir / "checkpoints" / f"step_{step:06d}.pt").exists()

    project.write_config(epochs=1000, max_steps=step + 5)
    # Same host, same checks: the operator's resume skips the preflight service.
    again = project.compose("up", "--no-deps", "train-ddp")
    assert again.returncode == 0, again.stdout[-3000:]
    resumed = [e for e in project.events() if e.get("event") == "resumed"]
    assert resumed and resumed[-1]["step"] == step
    outcome = json.loads((project.run_dir / "outcome.json").read_text())
    assert outcome["outcome"] == "finished" and outcome["step"] == step + 5
