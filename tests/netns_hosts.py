"""Several SSH hosts on one machine: one network namespace each, joined by a bridge.

Each host is a network namespace with one interface, ``ups0``, holding an address that
exists only there (``10.77.N.1``, ``.2``...). The namespaces' veth peers sit on a bridge
in the root namespace, which has ``10.77.N.254``: the test process reaches every host
over real TCP, and the hosts reach each other the same way (torchrun's rendezvous and
gloo run between them). A real sshd runs inside each namespace, so ``fab`` connects to
the hosts as it would to rented machines. Needs root (``ip netns``), as this machine's
tests run.

    with netns_hosts(tmp_path, 2) as hosts:   # hosts[0].address == "10.77.N.1"
        ...

Everything (sshd, processes left in a namespace, namespaces, the bridge) is removed in
``finally``, also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from tests.deploy_fixtures import SshServer, start_sshd, stop_sshd

IFNAME = "ups0"
"""The interface name inside every namespace (set GLOO_SOCKET_IFNAME to it)."""


@dataclass
class NetnsHost:
    """One namespace with its sshd."""

    netns: str
    address: str
    ssh: SshServer

    def entry(self, **overrides: object) -> dict[str, object]:
        """A hosts.yaml entry for this host (kind container, its own workdir)."""
        fields: dict[str, object] = {
            "host": self.address,
            "port": 22,
            "workdir": str(self.ssh.root / "remote"),
            # gloo finds its interface from the hostname, which resolves to an address of
            # the root namespace; name the namespace's own interface instead.
            "remote_env": f"export GLOO_SOCKET_IFNAME={IFNAME}",
        }
        fields.update(overrides)
        return self.ssh.host_entry(**fields)


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", "netns", "exec", netns, "ip", *args] if netns else ["ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def _subnet() -> int:
    """A /24 under 10.77 that no interface on this machine uses yet."""
    used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True, timeout=30).stdout
    base = os.getpid() % 200 + 20
    for n in range(base, base + 200):
        if f"10.77.{n % 250}." not in used:
            return n % 250
    raise RuntimeError("no free 10.77.N.0/24 subnet")


def _kill_netns_processes(netns: str) -> None:
    pids = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30
    ).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


@contextlib.contextmanager
def netns_hosts(root: Path, count: int) -> Iterator[list[NetnsHost]]:
    """``count`` SSH hosts in their own network namespaces, all reachable from here."""
    tag = f"{os.getpid() % 100000}"
    bridge = f"upsbr{tag}"
    namespaces: list[str] = []
    hosts: list[NetnsHost] = []
    try:
        # xdist workers pick subnets side by side: choosing one and taking it is one step.
        with FileLock(str(Path(tempfile.gettempdir()) / "ups-netns-subnet.lock"), timeout=120):
            subnet = _subnet()
            _ip("link", "add", bridge, "type", "bridge")
            _ip("addr", "add", f"10.77.{subnet}.254/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i in range(count):
            netns = f"ups{tag}n{i}"
            subprocess.run(["ip", "netns", "add", netns], check=True, timeout=30)
            namespaces.append(netns)
            outer, inner = f"upsv{tag}n{i}", f"upsp{tag}n{i}"
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", netns)
            _ip("link", "set", inner, "name", IFNAME, netns=netns)
            _ip("link", "set", outer, "master", bridge)
            _ip("link", "set", outer, "up")
            address = f"10.77.{subnet}.{i + 1}"
            _ip("addr", "add", f"{address}/24", "dev", IFNAME, netns=netns)
            _ip("link", "set", IFNAME, "up", netns=netns)
            _ip("link", "set", "lo", "up", netns=netns)
            ssh = start_sshd(root / f"host{i}", address=address, port=22, netns=netns)
            (ssh.root / "remote").mkdir(exist_ok=True)
            hosts.append(NetnsHost(netns=netns, address=address, ssh=ssh))
        yield hosts
    finally:
        for host in hosts:
            with contextlib.suppress(Exception):
                stop_sshd(host.ssh)
        for netns in namespaces:
            _kill_netns_processes(netns)
            time.sleep(0.2)  # let killed processes release the namespace's sockets
            subprocess.run(["ip", "netns", "del", netns], check=False, timeout=30)
        subprocess.run(["ip", "link", "del", bridge], check=False, capture_output=True, timeout=30)
