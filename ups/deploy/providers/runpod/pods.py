"""A RunPod pod as ups reads it (typed :class:`Instance`), and the pod ups asks for.

States, from the pod's ``desiredStatus``, ``podType`` and ``runtime``::

    CREATED/RESTARTING, or RUNNING without a runtime  -> LOADING
    RUNNING with its public SSH port                  -> RUNNING
    EXITED, on demand                                 -> STOPPED
    EXITED, interruptible (INTERRUPTABLE)             -> OUTBID   (a spot interruption)
    DEAD                                              -> FAILED
    TERMINATED, or no longer listed                   -> GONE

RunPod's API does not say who stopped a spot pod; ups stops one only at the end of its run
(``on_exit: stop``), so an EXITED spot pod it still supervises was interrupted.

The pod runs one command (``dockerArgs``): :func:`start_command` makes it put the
account's SSH keys (RunPod's ``PUBLIC_KEY``) where sshd reads them, start sshd if the
image did not, run ups's boot script (the watchdog) and stay up as the container's PID 1,
passing the SIGTERM a stop (or a spot interruption) sends it on to every process; its
trap comes first, so a stop at any moment of the pod's start is passed on too. It
travels base64-coded: the SDK puts it between double quotes in its GraphQL query as it is.
"""

from __future__ import annotations

import base64
from typing import Any

from ups.deploy.providers.base import Instance, InstanceState

PROVIDER = "runpod"
SSH_PORT = 22


def instance_of(pod: dict[str, Any]) -> Instance:
    host, port = ssh_address(pod)
    return Instance(
        id=str(pod["id"]),
        provider=PROVIDER,
        label=str(pod.get("name") or ""),
        state=state_of(pod, port is not None),
        status_message=str(pod.get("lastStatusChange") or ""),
        ssh_host=host,
        ssh_port=port,
        price_per_hour=float(pod.get("costPerHr") or 0.0),
        uptime_s=float(pod.get("uptimeSeconds") or 0.0),
        machine_id=str(pod["machineId"]) if pod.get("machineId") else None,
        data={"gpu_count": int(pod.get("gpuCount") or 1), "pod_type": pod.get("podType")},
    )


def state_of(pod: dict[str, Any], reachable: bool) -> InstanceState:
    desired = str(pod.get("desiredStatus") or "").upper()
    if desired == "RUNNING":
        return InstanceState.RUNNING if reachable else InstanceState.LOADING
    if desired == "EXITED":
        spot = str(pod.get("podType") or "").upper() == "INTERRUPTABLE"
        return InstanceState.OUTBID if spot else InstanceState.STOPPED
    if desired == "DEAD":
        return InstanceState.FAILED
    if desired == "TERMINATED":
        return InstanceState.GONE
    return InstanceState.LOADING


def ssh_address(pod: dict[str, Any]) -> tuple[str | None, int | None]:
    """The public address and port RunPod maps to the pod's port 22 ("SSH over exposed
    TCP"); (None, None) until the pod has a runtime."""
    runtime = pod.get("runtime") or {}
    for port in runtime.get("ports") or []:
        if (
            port.get("privatePort") == SSH_PORT
            and port.get("isIpPublic")
            and str(port.get("type")).lower() == "tcp"
            and port.get("ip")
            and port.get("publicPort")
        ):
            return str(port["ip"]), int(port["publicPort"])
    return None, None


PASS_ON_TERM = (
    "kill -TERM -1 2>/dev/null; while kill -0 -1 2>/dev/null; do sleep 0.1; done; exit 143"
)
"""PID 1's SIGTERM handler: SIGTERM to every other process of the pod, wait for them all."""


def start_command(onstart: str) -> str:
    """The pod's command (``dockerArgs``): keys, sshd, ups's boot script, then stay up."""
    script = "\n".join(
        [
            # PID 1 of the container: RunPod's SIGTERM before a stop (5 s before SIGKILL
            # on a spot pod) reaches every process, so `ups launch` checkpoints; PID 1 then
            # stays until every other process of the pod has ended (its own children are
            # not all of them: the watchdog and the run are detached), since the pod ends,
            # and the kernel kills what is left, when PID 1 exits. Set first: the kernel
            # drops a signal to a PID namespace's init that has no handler, so a stop
            # before this line would warn nothing the pod has started.
            f"trap '{PASS_ON_TERM}' TERM",
            "mkdir -p ~/.ssh && chmod 700 ~/.ssh",
            "printf '%s\\n' \"${PUBLIC_KEY:-}\" >> ~/.ssh/authorized_keys",
            "chmod 600 ~/.ssh/authorized_keys",
            "pgrep -x sshd > /dev/null || service ssh start || /usr/sbin/sshd",
            onstart.rstrip("\n"),
            "sleep infinity & wait",
            "",
        ]
    )
    coded = base64.b64encode(script.encode()).decode()
    path = "$HOME/.ups-start.sh"  # on the container disk, like the command itself
    return f"bash -c 'echo {coded} | base64 -d > {path} && exec bash {path}'"
