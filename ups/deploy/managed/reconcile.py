"""A supervisor's first step, as a pure function: the run's record against what the
provider lists.

The run's instances are found by their label (``ups:<host>:<run>@<epoch>``, on every
provider the run may rent from), not by what the
record believes: the provider is the truth about what bills and what trains. The
youngest running one is followed (else the youngest still loading: a supervisor stopped
right after the create rented it, and it is healthy); every other one is ended (never
two instances train one run). Only an instance that failed on its host is a host fault:
its offer is not taken again. One that was outbid, stopped or destroyed by its owner is
not the host's fault. With none running, the run lost its instance while nobody supervised it
(outbid, vanished, or ended): that counts as a recovery and the run resumes on a new
instance from its newest checkpoint. A run with no instance left and every recorded one
ended by its supervisor continues from its local checkpoint, no recovery counted.
:meth:`ups.deploy.managed.controller.Keeper.pick_up` carries the verdict out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ups.deploy.managed.record import State as Record
from ups.deploy.managed.watch import LOST
from ups.deploy.providers import Instance
from ups.deploy.providers import InstanceState as State

UNSUPERVISED = "while no supervisor ran"


@dataclass(frozen=True)
class Verdict:
    """What a supervisor that starts on a run must do, in this order."""

    end: list[tuple[str, str]] = field(default_factory=list)
    """Listed instances to end, each with why (lost while unwatched, or a second one)."""
    gone: list[tuple[str, str]] = field(default_factory=list)
    """Recorded instances the provider no longer lists: closed in the record."""
    follow: Instance | None = None
    """The running instance to follow, if any."""
    recovery: str | None = None
    """Why a new instance must be rented (a recovery is counted), or None."""
    host_faults: list[str] = field(default_factory=list)
    """Ended instances whose end was their host's (failed there): not rented again."""

    @property
    def continue_local(self) -> bool:
        """Nothing to follow and nothing lost: a new run, or one every supervisor ended."""
        return self.follow is None and self.recovery is None


def reconcile(record: Record, listed: Sequence[Instance]) -> Verdict:
    """The verdict for ``record`` given the instances listed under the run's label."""
    ended = {r.instance_id for r in record.instances if r.ended is not None}
    rows = [i for i in listed if i.id not in ended or i.state is State.RUNNING]
    if not rows and all(r.ended is not None for r in record.instances):
        return Verdict()
    keep = None
    for state in (State.RUNNING, State.LOADING):
        alive = sorted(
            (i for i in rows if i.state is state and i.id not in ended),
            key=lambda i: i.uptime_s,
        )
        if alive:
            keep = alive[0]
            break
    end = []
    for inst in rows:
        if inst is not keep:
            why = f"{LOST.get(inst.state, inst.state.value)} {UNSUPERVISED}"
            if inst.state in (State.RUNNING, State.LOADING):
                why = f"a second {inst.state.value} instance of run {record.run_id}"
            end.append((inst.id, why))
    host_faults = [i.id for i in rows if i is not keep and i.state is State.FAILED]
    ids = {i.id for i in rows}
    gone = [
        (r.instance_id, f"{LOST[State.GONE]} {UNSUPERVISED}")
        for r in record.instances
        if r.ended is None and r.instance_id not in ids
    ]
    if keep is not None:
        return Verdict(end=end, gone=gone, follow=keep, host_faults=host_faults)
    reasons = [why for _, why in end + gone]
    return Verdict(
        end=end,
        gone=gone,
        recovery=reasons[0] if reasons else f"no instance of it is left {UNSUPERVISED}",
        host_faults=host_faults,
    )
