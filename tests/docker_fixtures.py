"""The project image on the machine's engine, two private engines and a tiny test image.

``ensure_project_image`` (behind conftest's session fixture ``ups_image``) starts the
machine's engine and builds ``ups:cpu`` once per test run, for every test that runs the
real image. The deploy tests also need a remote daemon that lacks an image, so they
start private engines: each has its own data root, exec root and socket (vfs storage,
no iptables, no bridge, as scripts/docker-engine.sh runs the machine's dockerd).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def dockerd() -> str | None:
    """The dockerd binary, looked up when needed: scripts/test.sh may still be installing it
    while the tests are collected."""
    return shutil.which("dockerd") or (
        "/usr/sbin/dockerd" if Path("/usr/sbin/dockerd").exists() else None
    )


ROOT = Path(__file__).resolve().parents[1]
PROJECT_IMAGE = os.environ.get("UPS_IMAGE_CPU", "ups:cpu")


def ensure_project_image() -> str:
    """Start the engine (scripts/docker-engine.sh) and build the project image from this
    tree (scripts/build-images.sh), once per test run: xdist workers take a file lock, and
    the first one writes the run's id (``PYTEST_XDIST_TESTRUNUID``, the same in every
    worker) into a marker beside it; the others find it there and build nothing. Raises
    pytest's failure with the script's output tail. Under scripts/test.sh the image was
    built in the background (its job ``ups-image``): this waits for that build instead."""
    from filelock import FileLock

    from tests.background import await_background

    if await_background("docker") and await_background("ups-image"):
        return PROJECT_IMAGE
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    key = hashlib.sha256(f"{ROOT}\0{PROJECT_IMAGE}".encode()).hexdigest()[:16]
    lock_dir = Path(tempfile.gettempdir())
    marker = lock_dir / f"ups-image-{key}.built"
    with FileLock(str(lock_dir / f"ups-image-{key}.lock"), timeout=1800):
        if marker.exists() and marker.read_text() == run_id:
            return PROJECT_IMAGE
        for script, timeout in (("docker-engine.sh", 600), ("build-images.sh", 1200)):
            try:
                out = subprocess.run(
                    ["bash", str(ROOT / "scripts" / script)],
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    env={**os.environ, "UPS_IMAGE_CPU": PROJECT_IMAGE},
                )
            except subprocess.TimeoutExpired:
                pytest.fail(f"scripts/{script} did not finish within {timeout} s")
            if out.returncode != 0:
                pytest.fail(
                    f"scripts/{script} failed (exit {out.returncode}):\n{out.stderr[-3000:]}"
                )
        marker.write_text(run_id)
    return PROJECT_IMAGE


TOOLS = ["/bin/dash", "/bin/sleep", "/bin/mkdir", "/bin/cat"]


@dataclass
class Engine:
    root: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"unix://{self.root / 'sock'}"

    def client(self) -> Any:
        import docker

        return docker.DockerClient(base_url=self.url, version="1.41", timeout=300)


def start_engine(root: Path) -> Engine:
    from tests.background import await_background

    await_background("docker")  # dockerd is installed by scripts/docker-engine.sh
    root.mkdir(parents=True, exist_ok=True)
    log = (root / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        [
            str(dockerd()),
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "exec"),
            "--pidfile",
            str(root / "pid"),
            "-H",
            f"unix://{root / 'sock'}",
            "--storage-driver=vfs",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    engine = Engine(root=root, proc=proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((root / "dockerd.log").read_text()[-2000:])
        try:
            engine.client().ping()
            return engine
        except Exception:
            time.sleep(0.2)  # polling for the daemon's socket, bounded by the deadline
    proc.kill()
    raise RuntimeError("dockerd did not answer within 60 s")


def stop_engine(engine: Engine) -> None:
    engine.proc.terminate()
    try:
        engine.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        engine.proc.kill()
        engine.proc.wait(timeout=10)
    # dockerd leaves its exec-root netns bind mount behind; without this the dir can't go.
    for line in Path("/proc/mounts").read_text().splitlines():
        mountpoint = line.split()[1]
        if mountpoint.startswith(str(engine.root) + "/"):
            subprocess.run(["umount", "-l", mountpoint], check=False, timeout=30)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Engine, Engine]]:
    """(local, remote) private Docker engines, stopped after the module."""
    from tests.background import await_background

    await_background("docker")
    if dockerd() is None or os.geteuid() != 0:
        pytest.fail("needs dockerd and root (scripts/docker-engine.sh installs dockerd)")
    base = Path(tempfile.mkdtemp(prefix="ups-dk-", dir="/tmp"))  # short: socket path limit
    local = start_engine(base / "local")
    try:
        remote = start_engine(base / "remote")
    except Exception:
        stop_engine(local)
        raise
    try:
        yield local, remote
    finally:
        stop_engine(remote)
        stop_engine(local)
        shutil.rmtree(base, ignore_errors=True)


def _libs(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = set()
    for line in out.splitlines():
        parts = line.split()
        for p in parts:
            if p.startswith("/"):
                libs.add(p)
    return libs


def import_tiny_base(client: Any, tag: str) -> None:
    """A few-MB image with /bin/sh and coreutils from this machine (no registry needed)."""
    files = set(TOOLS)
    for tool in TOOLS:
        files |= _libs(tool)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(files):
            tar.add(os.path.realpath(path), arcname=path.lstrip("/"))
        sh = tarfile.TarInfo("bin/sh")
        sh.type, sh.linkname = tarfile.SYMTYPE, "dash"
        tar.addfile(sh)
    repo, _, version = tag.partition(":")
    client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=version)


TRAIN_SH = """#!/bin/sh
# Stand-in for `ups launch` in the tiny image: JSON lines into the run's launch.log.
d=/app/runs/$UPS_RUN_ID/logs
mkdir -p "$d"
outcome() {{
  printf '{{"run_id":"%s","outcome":"%s","exit_code":%d,"reason":"%s"}}\\n' \\
    "$UPS_RUN_ID" "$1" "$2" "$3" > "/app/runs/$UPS_RUN_ID/outcome.json"
  exit "$2"
}}
trap 'echo "SIGTERM: checkpoint written" >> "$d/launch.log"; outcome preempted 75 SIGTERM' TERM
i=0
while [ $i -lt {lines} ]; do
  printf '{{"event":"step","level":"info","step":%d,"version":"{version}"}}\\n' $i \\
    >> "$d/launch.log"
  i=$((i+1))
  sleep 0.05
done
echo 'raw line from the container' >> "$d/launch.log"
outcome {kind} {exit_code} "all steps ran"
"""


def build_app(
    client: Any, ctx: Path, tag: str, *, version: str, exit_code: int = 0, lines: int = 20
) -> Any:
    """Build FROM the tiny base: a deps layer (4 MB) then a code layer (train.sh)."""
    ctx.mkdir(parents=True, exist_ok=True)
    deps = ctx / "deps.bin"
    if not deps.exists():
        deps.write_bytes(os.urandom(4 << 20))
    (ctx / "train.sh").write_text(
        TRAIN_SH.format(
            lines=lines,
            version=version,
            exit_code=exit_code,
            kind="finished" if exit_code == 0 else "failed",
        )
    )
    (ctx / "Dockerfile").write_text(
        "FROM ups-deploytest-base:1\nCOPY deps.bin /opt/deps.bin\nCOPY train.sh /app/train.sh\n"
    )
    image, _ = client.images.build(path=str(ctx), tag=tag, rm=True)
    return image


COMPOSE = """services:
  preflight:
    image: ${UPS_IMAGE}
    network_mode: host
    command: ["/bin/sh", "-c", "echo 'preflight OK (tiny image)'; exit ${FAKE_PREFLIGHT_EXIT:-0}"]
  train-ddp:
    image: ${UPS_IMAGE}
    network_mode: host
    environment:
      UPS_RUN_ID: ${UPS_RUN_ID}
    volumes:
      - ./runs:/app/runs
    command: ["/bin/sh", "/app/train.sh"]
"""
