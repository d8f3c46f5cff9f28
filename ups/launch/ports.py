"""Master ports that several ``ups launch`` on one host never share.

Two launches started in the same second both saw 29500 free, both planned it, and the
second torchrun died with EADDRINUSE seconds later, after preflight. Checking
that a port can be bound is not enough: nothing holds it between the check and the
moment torchrun's agent binds its store.

Why a lock and not a held socket or a retry: torchrun's agent binds the store itself
(in the child process, ``ups.launch.torchrun_child``), so this process cannot keep a bound
socket and hand it over; and retrying torchrun after EADDRINUSE would need to tell a
bind failure of the store apart from a worker's failure, and would restart the plan
after preflight ran on the old port. Instead each launch takes an exclusive ``flock``
on ``<lock dir>/<port>.lock`` when it plans the port, and keeps it until it exits: a
second launch that finds the lock taken picks another port before its own preflight.
The kernel drops the lock when the process ends, even on SIGKILL, so a crashed launch
never leaves a port reserved. The lock directory is under /dev/shm, which compose's
``ipc: host`` shares between containers and the host, so launches in containers and on
the host see each other's reservations.

A process that is not ``ups launch`` takes no lock and can still bind the port between
the check and torchrun. torchrun's agent then fails to bind its store before any worker
starts (``torchrun_child`` reports status ``port_in_use``), and launch runs torchrun again on
a fresh reserved port (``ups.launch.execute``, a bounded number of times, each switch an
info event). The lock stays the first line: it keeps launches from even trying a port
another launch holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

from ups.preflight.checks.ports import is_bindable

_held: dict[int, int] = {}
"""port -> fd of its lock file, open for the life of this process (closing drops the lock)."""

_ATTEMPTS = 64


def lock_dir() -> Path:
    """Where reservations live: ``$UPS_PORT_LOCK_DIR``, else /dev/shm/ups-ports, else /tmp."""
    configured = os.environ.get("UPS_PORT_LOCK_DIR")
    if configured:
        return Path(configured)
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / "ups-ports"


def _try_lock(port: int) -> bool:
    """Take the host-wide lock for ``port``; False when another process holds it."""
    if port in _held:
        return True
    directory = lock_dir()
    if not directory.is_dir():
        with contextlib.suppress(FileExistsError):
            directory.mkdir(parents=True)
            directory.chmod(0o1777)  # launches under other uids (containers) share it
    path = directory / f"{port}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)  # umask: others must be able to open it for their own lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    _held[port] = fd
    return True


def _kernel_free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def reserve_port(preferred: int) -> int:
    """``preferred`` when no other launch holds it and it can be bound, else a free port;
    either way reserved for this process until it exits. Raises RuntimeError after
    many busy candidates (a host out of ports)."""
    candidates = [preferred] if preferred else []
    for _ in range(_ATTEMPTS):
        port = candidates.pop(0) if candidates else _kernel_free_port()
        if not _try_lock(port):
            continue
        if is_bindable(port):
            return port
        release(port)
    raise RuntimeError(f"no free master port found after {_ATTEMPTS} tries (from {preferred})")


def release(port: int) -> None:
    """Drop this process's reservation of ``port`` (tests; exit drops every one)."""
    fd = _held.pop(port, None)
    if fd is not None:
        os.close(fd)
