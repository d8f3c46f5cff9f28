"""A Vast instance as ups sees it: the API row, its label, and one state out of six.

The state machine is the contract the lifecycle (and the outbid recovery built on it)
reads; every field comes from ``show_instance(s)``::

    LOADING --> RUNNING --> STOPPED          (stopped by us or by the user)
       |           |------> OUTBID           (cur_state stopped, intended_status running)
       |           '------> GONE             (destroyed; the API no longer lists it)
       '------> FAILED                       (image pull error, offline host)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ups.deploy.providers import InstanceState
from ups.deploy.providers.legacy import parse_label
from ups.deploy.providers.vast.faults import classify_status

ERROR_WORDS = ("error", "denied", "manifest unknown", "not found", "failed", "unauthorized")
"""Words in ``status_msg`` that mean the instance will never run (Vast keeps it 'loading')."""


State = InstanceState
"""Vast's instances have the states every provider's have."""


@dataclass(frozen=True)
class Instance:
    id: int
    label: str
    actual_status: str | None
    intended_status: str | None
    cur_state: str | None
    status_msg: str
    ssh_host: str | None
    ssh_port: int | None
    dph_total: float
    duration_s: float
    machine_id: int | None = None

    @classmethod
    def from_api(cls, row: dict[str, Any]) -> Instance:
        port = row.get("ssh_port")
        return cls(
            id=int(row["id"]),
            label=str(row.get("label") or ""),
            actual_status=row.get("actual_status"),
            intended_status=row.get("intended_status"),
            cur_state=row.get("cur_state"),
            status_msg=str(row.get("status_msg") or "").strip(),
            ssh_host=row.get("ssh_host"),
            ssh_port=int(port) if port else None,
            dph_total=float(row.get("dph_total") or 0.0),
            duration_s=max(0.0, float(row.get("duration") or 0.0)),
            machine_id=int(row["machine_id"]) if row.get("machine_id") else None,
        )

    @property
    def state(self) -> State:
        return state_of(self)

    @property
    def run(self) -> tuple[str, str] | None:
        return parse_label(self.label)

    @property
    def cost_so_far(self) -> float:
        """Estimate: the current $/h over the time since start (stopped time bills less)."""
        return self.dph_total * self.duration_s / 3600.0


def state_of(inst: Instance | None) -> State:
    if inst is None:
        return State.GONE
    if inst.actual_status == "running" and inst.cur_state in (None, "running"):
        return State.RUNNING
    if inst.cur_state == "stopped" and inst.intended_status == "running":
        return State.OUTBID
    if inst.cur_state == "stopped" or inst.actual_status in ("exited", "stopped"):
        return State.STOPPED
    if inst.actual_status in ("offline", "unknown") or looks_failed(inst.status_msg):
        return State.FAILED
    return State.LOADING


def looks_failed(status_msg: str) -> bool:
    """A status message the fault table knows as fatal, or one with an error word in it."""
    text = status_msg.lower()
    return classify_status(status_msg) is not None or any(word in text for word in ERROR_WORDS)
