"""A supervisor's first step: find the run where it is, from what the Vast API lists.

The run's instances are found by their label (``ups:<host>:<run>``), not by what the
saved state believes: the API is the truth about what bills and what trains. The
youngest running one is followed; every other one is ended (never two instances train
one run). With none running, the run lost its instance while nobody supervised it
(outbid, vanished, or ended): that counts as a recovery and the run resumes on a new
instance from its newest checkpoint. A run with no instance and no saved state is new.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from ups.deploy.errors import UsageError
from ups.deploy.vast.instance import Instance, State
from ups.deploy.vast.monitor import LOST, Leg
from ups.deploy.vast.watchdog import onstart_command

if TYPE_CHECKING:
    from ups.deploy.vast.keeper import Keeper

_UNSUPERVISED = "while no supervisor ran"


def pick_up(keeper: Keeper) -> Leg | None:
    """The instance to follow (``Leg.attach``), or None: rent one (a recovery is set up)."""
    lc, sup = keeper.lc, keeper.sup
    state = sup.state
    if state.ended:
        raise UsageError(
            f"run {state.run_id} already ended ({state.ended}; {sup.path}). Start a new run "
            "with another --run ID (or without --run)."
        )
    ended = {r.instance_id for r in state.instances if r.ended is not None}
    rows = [
        inst
        for inst in (Instance.from_api(r) for r in lc.api.list() if r.get("label") == lc.plan.label)
        if inst.id not in ended or inst.state is State.RUNNING
    ]
    if not rows and all(r.ended is not None for r in state.instances):
        # New, or every instance was ended by its supervisor (Ctrl-C, max_recoveries...):
        # continue from the local checkpoint as before, no recovery counted.
        keeper.continue_local()
        return None
    # One deadline across every supervisor: max_hours counts from the run's first deploy.
    deadline = state.created + keeper.spec.max_hours * 3600.0
    lc.plan = dataclasses.replace(
        lc.plan, deadline_epoch=deadline, onstart=onstart_command(keeper.spec, deadline)
    )
    running = sorted(
        (i for i in rows if i.state is State.RUNNING and i.id not in ended),
        key=lambda i: i.duration_s,
    )
    keep = running[0] if running else None
    reasons = []
    for inst in rows:
        if inst is not keep:
            why = f"{LOST.get(inst.state, inst.state.value)} {_UNSUPERVISED}"
            if inst.state is State.RUNNING:
                why = f"a second running instance of run {state.run_id}"
            keeper.say(f"instance {inst.id} of run {state.run_id}: {why}")
            keeper.end_lost(inst.id, why)
            reasons.append(why)
    listed = {i.id for i in rows}
    for rec in state.instances:
        if rec.ended is None and rec.instance_id not in listed:
            why = f"{LOST[State.GONE]} {_UNSUPERVISED}"
            keeper.say(f"instance {rec.instance_id} of run {state.run_id}: {why}")
            sup.instance_ended(rec.instance_id, f"lost: {why}")
            reasons.append(why)
    if keep is not None:
        lc.created.append(keep.id)  # ended per on_exit when this supervisor ends
        found = [r for r in state.instances if r.instance_id == keep.id]
        # Not in the state: rented by a supervisor killed before it could save.
        rec = found[0] if found else sup.rented(keep.id, -1, keep.machine_id, keep.dph_total)
        leg = Leg(keep.id, rec.price, attach=True)
        leg.started -= max(0.0, time.time() - rec.started)
        keeper.legs.append(leg)
        keeper.say(f"picking up run {state.run_id}: instance {keep.id} is running")
        return leg
    reason = reasons[0] if reasons else f"no instance of it is left {_UNSUPERVISED}"
    keeper.lost_offers |= {r.offer_id for r in state.instances}
    keeper.count(reason)
    keeper.pending = keeper.resume_point(reason, None, time.monotonic())
    sup.recovered(keeper.recoveries, keeper.steps_lost)
    lc.plan = lc.plan.with_next_offer(lc.api, keeper.lost_offers)
    keeper.say(
        f"recovery {keeper.recoveries}/{keeper.spec.max_recoveries}: picking up run "
        f"{state.run_id} ({reason}) from step {keeper.pending.resume_step} on "
        f"{lc.plan.offer.describe()} at ${lc.plan.price:.3f}/h"
    )
    return None
