"""The real machines behind the FAKE providers (:mod:`tests.fake_vast`,
:mod:`tests.fake_runpod`): only a provider's control plane is fake, each machine it rents
out is a real local host.

A :class:`LocalMachine` is an sshd in its own PID and mount namespace (``unshare``), with
the machine's own disk bind-mounted over the hosts entry's workdir and the provider's
environment (its instance id, its instance-scoped key) in its init process. Its shell finds
the ups installed in this checkout's .venv, the way a rented machine runs the ups image.
Killing it kills PID 1, which the kernel turns into SIGKILL for every process of the
machine: sshd, sessions, the run, the watchdog. What differs per provider (what runs at
boot beside sshd, where the account's keys come from) is the provider fake's.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import shlex
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy_fixtures import SSHD, VENV_BIN, _keygen, free_port

SLOW_AFTER_S = 1.5
"""A slow machine's processes run at full speed this long (their imports, short commands)."""
MARKER = "UPS_FAKE_MACHINE"
"""An init-environment variable unique to each machine: how its processes are found."""


@dataclass
class LocalMachine:
    """One rented machine, booted for real on this host."""

    root: Path
    """The machine's own files: ``ssh/`` (host key, sshd config), ``disk/`` (its disk)."""
    workdir: str
    """The hosts entry's workdir: the machine's ``disk/workspace`` is mounted over it."""
    authorized_keys: Path | None = None
    """The file sshd reads the keys from (default ``ssh/authorized_keys``)."""
    marker: str = field(default_factory=lambda: secrets.token_hex(8))
    port: int | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def disk(self) -> Path:
        return self.root / "disk"

    @property
    def keys_file(self) -> Path:
        return self.authorized_keys or self.root / "ssh" / "authorized_keys"

    def boot(
        self,
        env: dict[str, str],
        main: str,
        *,
        port: int | None = None,
        seed: dict[str, str] | None = None,
        small_shm: bool = False,
        slow: float | None = None,
    ) -> None:
        """Start the machine: mount its disk over the workdir, then run ``main``, a shell
        line in which ``{sshd}`` is this machine's sshd command (add ``-D`` to keep it in
        the foreground). Returns once sshd listens, on ``port`` (default: a free one).

        ``seed``: files (relative to the disk's workspace) written before boot: test fault
        switches. ``small_shm``: a 64 MiB /dev/shm (Docker's default). ``slow``: the share of
        time its Python processes may run once they have run ``SLOW_AFTER_S`` (a machine
        that slows down under sustained load)."""
        ssh = self.root / "ssh"
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation
        for d in (ssh, self.disk / "workspace", self.disk / "home"):
            d.mkdir(parents=True, exist_ok=True)
        for name, text in (seed or {}).items():
            (self.disk / "workspace" / name).write_text(text)
        if not (ssh / "host_ed25519").exists():
            _keygen(ssh / "host_ed25519")
        self.keys_file.parent.mkdir(parents=True, exist_ok=True)
        self.keys_file.touch()
        self.port = port or free_port()
        config = ssh / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {ssh / 'host_ed25519'}\n"
            f"AuthorizedKeysFile {self.keys_file}\nPidFile {ssh / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\nMaxStartups 100\n"
            "MaxSessions 100\nSubsystem sftp internal-sftp\nLogLevel ERROR\n"
        )
        full_env = {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.disk / "home"),
            **env,
            MARKER: self.marker,
            "DISK": str(self.disk / "workspace"),
            "WORKDIR": self.workdir,
        }
        # A real machine is a fresh container: no login rc files of this machine's user. Here
        # they would run in every SSH command (pyenv's rehash takes a lock file; a machine
        # killed mid-rehash left it behind and stalled every later shell).
        rc = shlex.quote(str(Path.home() / ".bashrc"))
        shm = "mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 1; " if small_shm else ""
        init = (
            shm + f"if [ -f {rc} ]; then mount --bind /dev/null {rc} || exit 1; fi; "
            'mount --bind "$DISK" "$WORKDIR" || exit 1; '
            + main.format(sshd=f"{SSHD} -e -f {config}")
        )
        log = (self.root / "sshd.log").open("ab")
        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", init],
            env=full_env, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        _wait_port(self.port, self.proc)
        if slow is not None:
            threading.Thread(target=self._throttle, args=(slow,), daemon=True).start()

    def signal_init(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the machine's PID 1 (what ``docker stop`` signals first)."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
            for pid in children.split():
                os.kill(int(pid), sig)

    def kill(self) -> None:
        """End the machine's PID namespace: every process in it dies with its PID 1."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pids(self) -> list[int]:
        """Pids (host view) of the machine's processes: empty once it is gone. Found by its
        marker: ids repeat across fakes, and other tests' fakes run on this machine too."""
        if self.proc is None:
            return []
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if _environ(entry).get(MARKER) == self.marker:
                        out.append(int(entry.name))
        return out

    def _throttle(self, share: float, period_s: float = 0.5) -> None:
        """Stop the machine's Python processes for ``1 - share`` of every period until the
        machine ends (SIGKILL ends stopped processes too). The period is long against the
        delay this thread has in waking up to stop them again on a loaded machine (4 tests
        on 2 cores: 10-30 ms): with 50 ms, the share a burn-in measured was 0.32 of the
        known-good instead of about 0.04 (CI-like run of 13ab467), above its 0.3 floor."""
        proc = self.proc
        assert proc is not None
        # Every process of the machine, SSH sessions included (sshd gives those a fresh
        # environment), is in the PID namespace `unshare` made for its children.
        with contextlib.suppress(OSError):
            ns = os.readlink(f"/proc/{proc.pid}/ns/pid_for_children")
            for k in itertools.count():
                if proc.poll() is not None:
                    return
                if k % 4 == 0:  # new processes are found 5 times a second
                    pids = [p for p in _pids_in(ns) if _is_python(p) and _age_s(p) > SLOW_AFTER_S]
                for sig, pause in ((signal.SIGSTOP, 1.0 - share), (signal.SIGCONT, share)):
                    for pid in pids:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, sig)
                    time.sleep(period_s * pause)


def _pids_in(ns: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "pid") == ns:
                    out.append(int(entry.name))
    return out


def _age_s(pid: int) -> float:
    try:
        started = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return uptime - started / os.sysconf("SC_CLK_TCK")


def _is_python(pid: int) -> bool:
    try:
        return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _environ(proc_dir: Path) -> dict[str, str]:
    raw = (proc_dir / "environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").partition("=") for item in raw if b"=" in item)
    return {k: v for k, _, v in pairs}


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        time.sleep(0.05)  # waiting for the machine's sshd to listen
    raise RuntimeError(f"fake machine sshd did not listen on {port}")
