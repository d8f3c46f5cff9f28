"""A Vast instance as ups sees it: the API row as a typed
:class:`~ups.deploy.providers.base.Instance`, in one state out of six.

The state follows from three of the row's fields (``show_instance(s)``)::

    LOADING --> RUNNING --> STOPPED          (stopped by us or by the user)
       |           |------> OUTBID           (cur_state stopped, intended_status running)
       |           '------> GONE             (destroyed; the API no longer lists it)
       '------> FAILED                       (image pull error, offline host)
"""

from __future__ import annotations

from typing import Any

from ups.deploy.providers.base import Instance, InstanceState
from ups.deploy.providers.vast.faults import classify_status

ERROR_WORDS = ("error", "denied", "manifest unknown", "not found", "failed", "unauthorized")
"""Words in ``status_msg`` that mean the instance will never run (Vast keeps it 'loading')."""

State = InstanceState
"""Vast's instances have the states every provider's have."""


def instance_of(row: dict[str, Any]) -> Instance:
    """One API row as a typed instance (the row itself rides along in ``data``)."""
    port = row.get("ssh_port")
    return Instance(
        id=str(row["id"]),
        provider="vast",
        label=str(row.get("label") or ""),
        state=state_of(row),
        status_message=str(row.get("status_msg") or "").strip(),
        ssh_host=row.get("ssh_host"),
        ssh_port=int(port) if port else None,
        price_per_hour=float(row.get("dph_total") or 0.0),
        uptime_s=max(0.0, float(row.get("duration") or 0.0)),
        machine_id=str(row["machine_id"]) if row.get("machine_id") else None,
        data=row,
    )


def state_of(row: dict[str, Any] | None) -> State:
    """The state of one API row (None: the API no longer lists it)."""
    if row is None:
        return State.GONE
    actual, cur = row.get("actual_status"), row.get("cur_state")
    if actual == "running" and cur in (None, "running"):
        return State.RUNNING
    if cur == "stopped" and row.get("intended_status") == "running":
        return State.OUTBID
    if cur == "stopped" or actual in ("exited", "stopped"):
        return State.STOPPED
    if actual in ("offline", "unknown") or looks_failed(str(row.get("status_msg") or "")):
        return State.FAILED
    return State.LOADING


def looks_failed(status_msg: str) -> bool:
    """A status message the fault table knows as fatal, or one with an error word in it."""
    text = status_msg.lower()
    return classify_status(status_msg) is not None or any(word in text for word in ERROR_WORDS)
