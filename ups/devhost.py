"""A host on this machine to try ``fab deploy`` on: a real sshd on 127.0.0.1.

``up`` makes a temporary directory holding generated client and host keys, an sshd
config, a ``known_hosts`` that already holds the host key, and a remote workdir whose
``data/demo`` links to the demo data (in ups's checkout); it starts sshd there and writes
a hosts file with one ``container``-kind entry (this machine's ups from this venv, as the
tests' hosts).
``down`` ends every process it started or that runs in its directory (the sshd, a run
deployed there) and removes the directory. Where it is recorded: ``STATE_DIR``.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

STATE_DIR = Path(".ups/dev-host")
"""Default record of the running dev host (``state.json``, ``hosts.yaml``), relative to
the directory ``ups dev-host`` runs in, like ``fab deploy``'s own ``.ups`` state."""
HOST_NAME = "local"
DEMO_DATA = Path("data/demo")
DEMO_CONFIG = Path("configs/demo.yaml")


class DevHostError(Exception):
    """A dev host could not be started or found; the message names the fix."""


@dataclass
class DevHost:
    root: Path
    """The temporary directory: keys, sshd config and log, ``remote/`` (the workdir)."""
    port: int
    pid: int
    hosts_file: Path

    def alive(self) -> bool:
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ups-dev-host", "-f", str(path)],
        check=True,
        timeout=30,
    )


def _sshd_binary() -> str:
    found = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    if found is None:
        raise DevHostError(
            "sshd is not installed: run `scripts/sshd-setup.sh` (or `apt-get install "
            "openssh-server`), then `ups dev-host up` again."
        )
    return found


def _sshd_config(root: Path, port: int) -> Path:
    config = root / "sshd_config"
    lines = [
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {root / 'host_ed25519'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}",
        f"PidFile {root / 'sshd.pid'}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        # The keys live in a temporary directory that sshd's ownership checks would refuse.
        "StrictModes no",
        "UsePAM no",
        "Subsystem sftp internal-sftp",
        "LogLevel ERROR",
    ]
    config.write_text("\n".join(lines) + "\n")
    return config


def host_entry(root: Path, port: int) -> dict[str, Any]:
    """The hosts.yaml entry for the dev host (today's ``container`` kind)."""
    return {
        "kind": "container",
        "host": "127.0.0.1",
        "port": port,
        "user": getpass.getuser(),
        "key": str(root / "client_ed25519"),
        # The run uses this machine's ups (this venv), not an image: the "container" is
        # this machine. The field is required by the schema and only named in plans.
        "image": "ups:cpu",
        "workdir": str(root / "remote"),
        "gpus": 0,
        "ups_bin": str(Path(sys.executable).parent / "ups"),
        "connect_timeout": 5,
    }


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DevHostError(f"sshd exited at start (code {proc.returncode}): {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)  # polling for the port to open, bounded by the deadline
    proc.kill()
    raise DevHostError(f"sshd did not listen on 127.0.0.1:{port} within 15 s: {log.read_text()}")


def _link_data(workdir: Path, data: Path | None, root: Path) -> Path | None:
    """``workdir/data/demo`` -> the demo data: given, ./data/demo, or written now when this
    folder holds the demo config that reads it (ups's checkout). In a project of your own
    (no ``configs/demo.yaml``) none is written, a minute of CPU saved: None."""
    from ups.data.synth import ADVECTION_FILE, DARCY_FILE, synthesize

    source = data or DEMO_DATA
    if not all((source / name).is_file() for name in (ADVECTION_FILE, DARCY_FILE)):
        if data is None and not DEMO_CONFIG.is_file():
            return None
        source = root / "data" / "demo"
        synthesize(source, 0)
    (workdir / "data").mkdir()
    (workdir / "data" / "demo").symlink_to(source.resolve())
    return source.resolve()


def read_state(state_dir: Path) -> DevHost | None:
    try:
        raw = json.loads((state_dir / "state.json").read_text())
    except FileNotFoundError:
        return None
    return DevHost(Path(raw["root"]), raw["port"], raw["pid"], Path(raw["hosts_file"]))


SLURM_HOST_NAME = "cluster"


def slurm_entry(root: Path, port: int, slurm_conf: Path) -> dict[str, Any]:
    """A ``kind: slurm`` entry whose login node is the dev host: the two-node cluster that
    ``scripts/slurm-setup.sh start DIR`` runs on this machine (``DIR/slurm.conf``)."""
    entry = host_entry(root, port)
    for field in ("image", "gpus"):
        entry.pop(field)
    return {
        **entry,
        "kind": "slurm",
        "remote_env": f"export SLURM_CONF={slurm_conf.resolve()}",
        "nodes": 2,
        "ranks_per_node": 1,
    }


def write_hosts(host: DevHost, slurm_conf: Path | None = None) -> None:
    """The hosts file: ``local`` (container kind), and ``cluster`` (Slurm) when asked for."""
    entries = {HOST_NAME: host_entry(host.root, host.port)}
    if slurm_conf is not None:
        entries[SLURM_HOST_NAME] = slurm_entry(host.root, host.port, slurm_conf)
    hosts = {"known_hosts": str(host.root / "known_hosts"), "hosts": entries}
    host.hosts_file.write_text(yaml.safe_dump(hosts, sort_keys=False))


def up(
    state_dir: Path = STATE_DIR, data: Path | None = None, slurm_conf: Path | None = None
) -> DevHost:
    """Start the dev host (or return the running one) and record it in ``state_dir``;
    with ``slurm_conf``, its hosts file names the local Slurm cluster too."""
    running = read_state(state_dir)
    if running is not None and running.alive():
        if slurm_conf is not None:
            write_hosts(running, slurm_conf)
        return running
    if running is not None:
        down(state_dir)  # recorded but dead (machine rebooted): clear what is left
    sshd = _sshd_binary()
    # sshd refuses to start without its privilege separation directory.
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ups-dev-host-"))
    try:
        _keygen(root / "client_ed25519")
        _keygen(root / "host_ed25519")
        (root / "authorized_keys").write_text((root / "client_ed25519.pub").read_text())
        port = _free_port()
        log = root / "sshd.log"
        with log.open("wb") as out:
            # Its own session: Ctrl-C in the shell that ran `up` does not reach it.
            proc = subprocess.Popen(
                [sshd, "-D", "-e", "-f", str(_sshd_config(root, port))],
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        _wait_listening(proc, port, log)
        host_pub = (root / "host_ed25519.pub").read_text().split()
        (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
        workdir = root / "remote"
        workdir.mkdir()
        _link_data(workdir, data, root)
        state_dir.mkdir(parents=True, exist_ok=True)
        host = DevHost(root, port, proc.pid, (state_dir / "hosts.yaml").resolve())
        write_hosts(host, slurm_conf)
        record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(host).items()}
        (state_dir / "state.json").write_text(json.dumps(record, indent=2) + "\n")
        return host
    except BaseException:
        _end_processes_under(root)
        shutil.rmtree(root, ignore_errors=True)
        raise


def _processes_of(host: DevHost) -> list[psutil.Process]:
    """The sshd, its sessions, and every process working in or run from its directory."""
    found: dict[int, psutil.Process] = {}
    try:
        sshd = psutil.Process(host.pid)
        found[sshd.pid] = sshd
        for child in sshd.children(recursive=True):
            found[child.pid] = child
    except psutil.NoSuchProcess:
        pass
    for proc in _under(host.root):
        found[proc.pid] = proc
    return list(found.values())


def _under(root: Path) -> list[psutil.Process]:
    prefix = str(root.resolve())
    hits = []
    for proc in psutil.process_iter():
        try:
            cwd = proc.cwd()
            cmdline = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if proc.pid != os.getpid() and (cwd.startswith(prefix) or prefix in cmdline):
            hits.append(proc)
    return hits


def _end(procs: list[psutil.Process], grace_s: float) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace_s``; the pids that had to be killed."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=10)
    return [p.pid for p in alive]


def _end_processes_under(root: Path) -> None:
    _end(_under(root), grace_s=5)


def unfetched(host: DevHost) -> list[str]:
    """The runs deployed to the dev host that ``fab fetch`` has not copied home since they
    last changed (or still running), as ``RUN_ID (how it stands)``: what ``down`` would
    delete for good."""
    from ups.deploy.transport.remote import STATE_DIR as DEPLOY_STATE
    from ups.deploy.transport.remote import RemoteRun
    from ups.outcome import read_outcome

    workdir = host.root / "remote"
    found = []
    states = workdir / DEPLOY_STATE
    for state in sorted(states.iterdir()) if states.is_dir() else []:
        if not state.is_dir() or state.is_symlink():
            continue
        output_dir = state / "output_dir"
        remote = RemoteRun(
            workdir=str(workdir),
            run_id=state.name,
            output_dir=output_dir.read_text().strip() if output_dir.is_file() else "runs",
        )
        run_dir = Path(remote.run_dir)
        files = [p for p in run_dir.rglob("*") if p.is_file()] if run_dir.is_dir() else []
        changed = max((p.stat().st_mtime for p in files), default=0.0)
        mark = Path(remote.fetched_mark)
        if mark.is_file() and mark.stat().st_mtime >= changed:
            continue
        outcome = read_outcome(run_dir)
        how = outcome.outcome if outcome is not None else "no outcome yet: running or killed"
        found.append(f"{state.name} ({how})")
    return found


def down(state_dir: Path = STATE_DIR, grace_s: float = 30) -> DevHost | None:
    """End everything the dev host started and remove it; None when none was recorded."""
    host = read_state(state_dir)
    if host is None:
        return None
    # A run still training there gets SIGTERM first (its preemption checkpoint), then
    # SIGKILL; a second sweep catches what a dying run started meanwhile.
    _end(_processes_of(host), grace_s)
    _end(_processes_of(host), grace_s=5)
    shutil.rmtree(host.root, ignore_errors=True)
    for name in ("state.json", "hosts.yaml"):
        (state_dir / name).unlink(missing_ok=True)
    return host
