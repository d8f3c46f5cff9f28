"""Ports: the master (and rendezvous) port must be bindable before torchrun starts.

"Address already in use" on 29500 is the classic leftover-process failure.
The helpers here are shared with ``ups launch``, which picks a free port instead of failing.
"""

from __future__ import annotations

import socket

import psutil

from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status, worst


def is_bindable(port: int, host: str = "0.0.0.0") -> bool:
    """True when a TCP server socket could bind ``host:port`` now.

    Uses SO_REUSEADDR like torch's TCPStore, so sockets in TIME_WAIT do not count as taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_free_port(preferred: int, host: str = "0.0.0.0") -> int:
    """``preferred`` when it is bindable, else a free port the kernel hands out."""
    if preferred and is_bindable(preferred, host):
        return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_holder(port: int) -> str | None:
    """``"pid 1234 (python -m ...)"`` for the process holding ``port``, when it can be found.

    psutil reads the kernel's socket tables and maps each socket to its process (what this
    module once did by hand with /proc/net/tcp and /proc/*/fd). Listening sockets come
    first. Returns None when no socket is found, and a description without a pid when the
    owner is invisible (another user without root, or another PID namespace).
    """
    try:
        conns = [c for c in psutil.net_connections(kind="tcp") if c.laddr and c.laddr.port == port]
    except psutil.AccessDenied:  # macOS without root; Linux reads /proc and needs no privilege
        return None
    if not conns:
        return None
    conns.sort(key=lambda c: c.status != psutil.CONN_LISTEN)
    for conn in conns:
        if conn.pid is None:
            continue
        try:
            cmdline = " ".join(psutil.Process(conn.pid).cmdline()) or "?"
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            cmdline = "?"
        return f"pid {conn.pid} ({cmdline[:120]})"
    return f"a {conns[0].status} socket whose process is not visible here"


_PortOutcome = tuple[Status, str, str | None, dict[str, object]]


def _check_port(role: str, port: int, fallback: bool) -> _PortOutcome:
    if is_bindable(port):
        return Status.PASS, f"{role} port {port} is free", None, {"port": port, "free": True}
    holder = port_holder(port)
    free = pick_free_port(0)
    held_by = f", held by {holder}" if holder else ""
    details: dict[str, object] = {"port": port, "free": False, "holder": holder, "suggested": free}
    flag = "--master-port" if role == "master" else "--rdzv-port"
    key = f" (or --set distributed.master_port={free})" if role == "master" else ""
    hint = f"use a free port: {flag} {free}{key}"
    if holder and holder.startswith("pid "):
        hint += f", or stop the leftover process: kill {holder.split()[1]}"
    if fallback:
        return Status.WARN, f"{role} port {port} is taken{held_by}; using {free}", hint, details
    return Status.FAIL, f"{role} port {port} is taken{held_by}", hint, details


def run(ctx: Context) -> CheckResult:
    ports = [("master", ctx.master_port)]
    if ctx.opts.rdzv_port is not None:
        ports.append(("rendezvous", ctx.opts.rdzv_port))
    outcomes = [(role, _check_port(role, port, ctx.opts.port_fallback)) for role, port in ports]
    hints = [o[2] for _, o in outcomes if o[2]]
    return CheckResult(
        name="ports",
        status=worst([o[0] for _, o in outcomes]),
        message="; ".join(o[1] for _, o in outcomes),
        value=ctx.master_port,
        hint="; ".join(hints) or None,
        details={role: o[3] for role, o in outcomes},
    )
