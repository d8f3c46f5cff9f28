"""A real sshd on 127.0.0.1 with generated keys, and a hosts file that points at it.

Import the fixtures from test modules (``from tests.deploy_fixtures import sshd, ...``).
sshd runs as the current user (root here), so the "remote" side is this machine: the
``container`` host kind runs the ups installed in this checkout's .venv.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import made_once_per_run

REPO = Path(__file__).resolve().parents[1]
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        timeout=30,
    )


@dataclass
class SshServer:
    """A running sshd: where it listens and the client key that logs in."""

    root: Path
    port: int
    client_key: Path
    host_key: Path
    proc: subprocess.Popen[bytes]

    def session_pids(self) -> list[int]:
        """Pids of the sshd children serving connections (one per connection)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self.proc.pid:
                pids.append(int(entry.name))
        return pids

    def drop_sessions(self) -> int:
        """Kill every sshd child serving a connection, as a network drop would."""
        pids = self.session_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def host_entry(self, **overrides: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "user": os.environ.get("USER", "root"),
            "key": str(self.client_key),
            "kind": "container",
            "image": os.environ.get("UPS_IMAGE_CPU", "ups:cpu"),
            "workdir": str(self.root / "remote"),
            "gpus": 0,
            "ups_bin": str(VENV_BIN / "ups"),
            "connect_timeout": 5,
            "keepalive_s": 2,
        }
        entry.update(overrides)
        return entry

    def write_hosts(self, path: Path, hosts: dict[str, dict[str, Any]] | None = None) -> Path:
        """Write a hosts file with ``test`` (this sshd) plus ``hosts``; return its path."""
        data = {
            "known_hosts": str(path.parent / "known_hosts"),
            "hosts": {"test": self.host_entry(), **(hosts or {})},
        }
        path.write_text(yaml.safe_dump(data))
        return path


def write_sshd_config(
    path: Path, *, port: int, address: str, host_key: Path, authorized_keys: Path
) -> Path:
    """An sshd_config for a test sshd: key logins only, as root, on ``address:port``."""
    path.write_text(
        "\n".join(
            [
                f"Port {port}",
                f"ListenAddress {address}",
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {authorized_keys}",
                f"PidFile {path.parent / 'sshd.pid'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "StrictModes no",
                "UsePAM no",
                "MaxStartups 100",
                "MaxSessions 100",
                "Subsystem sftp internal-sftp",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    return path


def spawn_sshd(
    config: Path,
    log: Path,
    wrap: Callable[[list[str]], list[str]] = list,
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """Start ``sshd -D -f CONFIG``, its output appended to ``log``: every sshd of the tests
    starts here (``wrap`` puts a namespace or a shell around the command). It waits for
    scripts/test.sh's sshd install and makes the privilege separation directory sshd
    refuses to start without, so no test depends on another having made it."""
    from tests.background import await_background

    await_background("sshd")
    if not Path(SSHD).exists():
        pytest.skip("sshd missing: run scripts/sshd-setup.sh")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    out = log.open("ab")
    try:
        argv = wrap([SSHD, "-D", "-e", "-f", str(config)])
        return subprocess.Popen(argv, stdout=out, stderr=out, **popen)
    finally:
        out.close()


def start_sshd(
    root: Path,
    host_key: Path | None = None,
    port: int | None = None,
    *,
    address: str = "127.0.0.1",
    netns: str | None = None,
) -> SshServer:
    """Start sshd on ``address:port`` (inside network namespace ``netns`` when given)."""
    root.mkdir(parents=True, exist_ok=True)
    client_key = root / "client_ed25519"
    if not client_key.exists():
        _keygen(client_key)
    if host_key is None:
        host_key = root / "host_ed25519"
        _keygen(host_key)
    (root / "authorized_keys").write_text((client_key.with_suffix(".pub")).read_text())
    port = port or free_port()
    config = write_sshd_config(
        root / "sshd_config", port=port, address=address, host_key=host_key,
        authorized_keys=root / "authorized_keys",
    )  # fmt: skip
    prefix = ["ip", "netns", "exec", netns] if netns else []
    proc = spawn_sshd(config, root / "sshd.log", wrap=lambda argv: [*prefix, *argv])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(root / 'sshd.log').read_text()}")
        try:
            socket.create_connection((address, port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)  # polling for the port to open, bounded by the deadline
    else:
        proc.kill()
        raise RuntimeError("sshd did not start listening in 15 s")
    return SshServer(root=root, port=port, client_key=client_key, host_key=host_key, proc=proc)


def stop_sshd(server: SshServer) -> None:
    server.drop_sessions()
    server.proc.terminate()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(timeout=10)


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SshServer]:
    """A fresh sshd on a free loopback port, stopped after the test."""
    server = start_sshd(tmp_path / "sshd")
    (server.root / "remote").mkdir()
    try:
        yield server
    finally:
        stop_sshd(server)


FAB = VENV_BIN / "fab"


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo HDF5 files, synthesized with the real ``ups data synth`` once per test run."""
    return shared_demo_data(tmp_path_factory)


def shared_demo_data(factory: pytest.TempPathFactory) -> Path:
    """``<run's temp dir>/demo-data/demo``, written once per run (:func:`made_once_per_run`;
    30-45 s on a loaded 2-core machine). Read-only for the tests: the files are the same for
    every test (the synth is seeded)."""

    def synth(root: Path) -> None:
        subprocess.run(
            [str(VENV_BIN / "ups"), "data", "synth", "--out", str(root / "demo")],
            check=True,
            capture_output=True,
            timeout=900,  # once per run, possibly while the heaviest tests start beside it
        )

    return made_once_per_run(factory, "demo-data", synth) / "demo"


def demo_config(
    path: Path, *, max_steps: int = 30, nproc: int = 2, extra: dict[str, Any] | None = None
) -> Path:
    """The repo's demo config, shortened to ``max_steps``, with data under ``data/demo``.

    ``nproc``: ranks per node, the demo's 2 by default (what users run). Pass 1 where the
    ranks are not the point: how an instance is rented, recovered, moved or ended, or what
    commands a deploy runs. Each rank costs about 5 CPU-seconds before its first step
    (torch, and the dynamo that DDP's constructor imports). The tests of what happens
    between ranks keep 2 (the SSH deploy's streaming and rank failure, Docker, Slurm; the
    launch, lifecycle and fault tests use their own configs).
    """
    cfg = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    cfg["training"]["max_steps"] = max_steps
    cfg["distributed"]["nproc_per_node"] = nproc
    cfg["training"]["log_every"] = 5
    cfg["checkpoint"]["every_steps"] = 10
    # W&B as users run it without a key: offline, writing its files (and its links) into
    # the run directory. Never "disabled": fetch must cope with what W&B writes.
    cfg["wandb"]["mode"] = "offline"
    # Other suites on this machine use 29500; a free port keeps runs from colliding.
    cfg["distributed"]["master_port"] = free_port()
    for key, value in (extra or {}).items():
        cfg[key] = value
    path.write_text(yaml.safe_dump(cfg))
    return path


def demo_reference(factory: pytest.TempPathFactory, config: Path, demo_data: Path) -> Path:
    """The run directory of the demo ``config`` trained uninterrupted here, with
    `ups launch --skip-preflight` (the ranks of ``distributed.nproc_per_node`` on this
    machine): what a run stopped, requeued or moved between hosts must end equal to. Made
    once per test run for each config and shared by every test that compares with it (the
    master port and ``checkpoint_sync`` aside, which do not change what is computed)."""
    import hashlib
    import json

    cfg = yaml.safe_load(config.read_text())
    port = cfg["distributed"].pop("master_port")
    cfg.pop("checkpoint_sync", None)  # where checkpoints are uploaded changes nothing computed
    key = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]

    def launch(ref: Path) -> None:
        from tests.conftest import worker_env
        from tests.launch_helpers import launch_cmd

        (ref / "data").mkdir()
        (ref / "data" / "demo").symlink_to(demo_data)
        plain = ref / "config.yaml"
        plain.write_text(yaml.safe_dump({**cfg, "distributed": {**cfg["distributed"],
                                                                "master_port": port}}))  # fmt: skip
        done = subprocess.run(
            launch_cmd(str(plain), "--run-id", "ref", "--skip-preflight"), cwd=ref,
            env=worker_env(), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:]

    return made_once_per_run(factory, f"demo-reference-{key}", launch) / "runs" / "ref"


def paused_at(step: int, ranks: int = 2) -> list[dict[str, Any]]:
    """Faults (config ``faults``) that hold every rank, asleep, at ``step`` until the run is
    stopped (kind ``pause``): a run stopped from outside (`fab stop`, the Vast watchdog)
    waits for that without training flat out on the machine's cores meanwhile."""
    return [{"kind": "pause", "rank": rank, "step": step} for rank in range(ranks)]


def link_data(workdir: Path, data: Path) -> None:
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    (workdir / "data" / "demo").symlink_to(data)


def fab(
    *args: str, timeout: float = 240, cwd: Path = REPO, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """Run the real ``fab`` binary from the venv, in the repo root or ``cwd`` (a folder with a
    fabfile.py: ``ups init`` writes one)."""
    return subprocess.run(
        [str(FAB), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, **kwargs
    )
