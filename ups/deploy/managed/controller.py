"""Keep one run going across rented instances: notice a lost instance, rent another, resume.

While a run is followed, a :class:`~ups.deploy.managed.watch.Monitor` asks the API about
the instance every ``monitor_s`` and new checkpoints are copied home
(:mod:`ups.deploy.managed.checkpoints`). The instance is lost when the API shows it outbid or
stopped, no longer lists it, or SSH stays unreachable for ``ssh_lost_s``. :class:`Keeper`
then ends it (stop or destroy, so it can never train the run beside its successor),
rents where the run's recovery policy says (the next matching offer under the same cap,
or another provider when this one has none: :mod:`ups.deploy.managed.acquire`), runs
setup and preflight there, uploads the newest good checkpoint with the local log, and
resumes the same run id. While it supervises, :class:`~ups.deploy.managed.fence.Sweeper`
ends any instance of the run that a supervisor of an older lease epoch created. A
run that ends by itself is relaunched only when ``ups/retry.py`` calls its cause
retryable. ``max_recoveries`` and ``max_hours`` (one deadline across all instances)
bound everything; past them the deploy exits 8.

What ``fab deploy`` on a rented entry runs around it (every instance ended on every path) is
:func:`ups.deploy.managed.run.run`.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Mapping

import psutil

from ups.bucket import Bucket
from ups.deploy.entries import RentedHost
from ups.deploy.errors import DeployError, PreflightFailed, UsageError
from ups.deploy.frontend import command
from ups.deploy.managed.acquire import Where, move_on, rent
from ups.deploy.managed.checkpoints import CheckpointSync, Synced, newest_good
from ups.deploy.managed.errors import InstanceFailed, RecoveriesExhausted
from ups.deploy.managed.faults import HostFault, preflight_reason, preflight_side
from ups.deploy.managed.fence import Sweeper
from ups.deploy.managed.lifecycle import Lifecycle
from ups.deploy.managed.measured import record_figures
from ups.deploy.managed.reconcile import reconcile
from ups.deploy.managed.record import RunStatus, Supervision
from ups.deploy.managed.renewal import renewal_for
from ups.deploy.managed.rental_plan import container_spec
from ups.deploy.managed.resume import ResumePoints
from ups.deploy.managed.wandb_home import sync_home
from ups.deploy.managed.watch import (
    RECOVERY_EVENT,
    InstanceLost,
    Leg,
    LocalLog,
    Monitor,
    Pending,
    _event,
)
from ups.deploy.onhost import operate
from ups.deploy.onhost.follow import follow
from ups.deploy.onhost.plan import DeployPlan
from ups.deploy.onhost.runs import existing, read_result
from ups.deploy.providers import Instance, Provider, Side, Trigger
from ups.deploy.providers import InstanceState as State
from ups.deploy.transport import remote as rc
from ups.deploy.transport.session import Target
from ups.deploy.transport.session import run as run_remote
from ups.outcome import Outcome
from ups.retry import retry_verdict

__all__ = ["RECOVERY_EVENT", "Keeper", "host_or_user"]
_LOST_ERRORS = (DeployError, OSError, EOFError)


class Keeper:
    """Runs the plan on one instance after another until the run ends or the bounds do."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        env: dict[str, str],
        watchdog_keys: Mapping[str, str | None],
        sup: Supervision,
        where: Where,
        bucket: Bucket | None = None,
    ):
        self.lc = lifecycle
        self.where = where
        """Where the run rents: its entries, its recovery policy, what it left out."""
        self.sup = sup
        self.bucket = bucket
        self.env = env
        self.watchdog_keys = watchdog_keys
        """Per rented entry: the scoped key its watchdog acts with (None: the instance's)."""
        plan = lifecycle.plan
        self.run_id = plan.run_id
        self.run_dir = plan.local_runs / plan.run_id
        self.log = LocalLog(self.run_dir / "logs" / "launch.log")
        self.points = ResumePoints(
            self.run_id,
            self.run_dir,
            self.log,
            sup,
            bucket,
            self.say,
            script=lifecycle.plan.workload is not None,
        )
        self.legs: list[Leg] = []
        """The instances this supervisor worked on (the record has every one of the run)."""
        self.started = process_started()
        self.synced: list[Synced] = []
        self.pending: Pending | None = None
        self.outcome: Outcome | None = None
        """The run's own ``outcome.json`` as it last ended (the truth the record copies)."""

    @property
    def spec(self) -> RentedHost:
        return self.lc.plan.spec

    @property
    def recoveries(self) -> int:
        return self.sup.state.recoveries

    def say(self, text: str) -> None:
        self.lc.say(text)

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> int:
        leg = self.pick_up()
        sweeper = Sweeper(
            self.where.market,
            self.run_id,
            self.lc.epoch,
            mine=self.mine,
            end=self.end_stray,
            every_s=self.spec.monitor_s,
        )
        sweeper.start()
        try:
            while True:
                try:
                    if leg is not None:
                        return self.on_instance(leg)
                    return rent(self.lc, self.on_rented, self.where)
                except InstanceLost as lost:
                    self.recover(self.legs[-1], lost.reason)
                    leg = None
        finally:
            sweeper.stop()

    def mine(self) -> set[tuple[str, str]]:
        """The instances this supervisor created or adopted: (provider, id)."""
        return {(self.lc.provider.name, i) for i in self.lc.created} | {
            (r.provider, r.instance_id) for r in self.sup.state.instances if r.ended is None
        }

    def end_stray(self, provider: Provider, inst: Instance, why: str) -> None:
        """End an instance of the run that a supervisor of an older epoch created, and
        record it with its cost (the fence)."""
        self.say(f"instance {inst.id} ({provider.name}, {inst.label}): {why}; destroying it")
        self.lc.destroy(inst.id, why, provider=provider)
        self.sup.stray_ended(provider.name, inst, why)

    def pick_up(self) -> Leg | None:
        """The first step of every supervisor: the instance to follow (``Leg.attach``), or
        None: rent one (a recovery is set up when the run lost its instance unwatched)."""
        lc, sup = self.lc, self.sup
        state = sup.state
        if state.ended:
            raise UsageError(
                f"run {state.run_id} already ended ({state.ended}; {sup.path}). Start a new "
                "run with another --run ID (or without --run)."
            )
        found = self.where.market.instances(state.run_id)
        owner = {inst.id: provider for provider, inst in found}
        verdict = reconcile(state, [inst for _, inst in found])
        if verdict.continue_local:
            self.continue_local()
            return None
        # One deadline across every supervisor: max_hours counts from the run's first deploy.
        deadline = state.created + self.spec.max_hours * 3600.0
        lc.plan = lc.plan.with_deadline(deadline)
        for instance_id, why in verdict.end:
            self.say(f"instance {instance_id} of run {state.run_id}: {why}")
            self.end_lost(instance_id, why, owner.get(instance_id))
        for instance_id, why in verdict.gone:
            self.say(f"instance {instance_id} of run {state.run_id}: {why}")
            sup.instance_ended(instance_id, f"lost: {why}")
        keep = verdict.follow
        if keep is not None:
            self.follow_entry(keep, owner[keep.id])
            lc.created.append(keep.id)  # ended per on_exit when this supervisor ends
            recorded = [r for r in state.instances if r.instance_id == keep.id]
            # Not in the record: rented by a supervisor killed before it could save.
            if not recorded:
                run = keep.run
                sup.rented(
                    keep.id, "", keep.machine_id, keep.price_per_hour,
                    provider=keep.provider, host=run.host if run else "",
                    epoch=run.epoch if run else None,
                )  # fmt: skip
            leg = Leg(keep.id, attach=True)
            self.legs.append(leg)
            self.say(f"picking up run {state.run_id}: instance {keep.id} is {keep.state.value}")
            return leg
        reason = verdict.recovery or ""
        faulty = set(verdict.host_faults)
        self.where.offers |= {
            (r.provider, r.offer_id) for r in state.instances if r.instance_id in faulty
        }
        lost = verdict.end[0][0] if verdict.end else verdict.gone[0][0] if verdict.gone else None
        self.count(reason, lost)
        self.pending = self.points.after_loss(reason, lost, time.monotonic())
        move_on(lc, self.where, Trigger.LOST, reason, 1)
        self.say(
            f"recovery {self.recoveries}/{self.spec.max_recoveries}: picking up run "
            f"{state.run_id} ({reason}) from step {self.pending.resume_step} on "
            f"{lc.plan.offer.describe()} at ${lc.plan.price:.3f}/h"
        )
        return None

    def follow_entry(self, inst: Instance, provider: Provider) -> None:
        """Point the lifecycle at the entry (and provider) of an instance to follow."""
        run = inst.run
        name = run.host if run else ""
        if name in self.where.market.names and name != self.lc.plan.spec.name:
            spec = self.where.market.entry(name)
            self.lc.provider = provider
            self.lc.plan = self.lc.plan.at_entry(spec, provider)

    def leg(self, instance_id: str) -> Leg:
        """Record a new instance of this run (its price and start: its cost) before
        anything else can fail."""
        leg = Leg(instance_id)
        self.legs.append(leg)
        plan = self.lc.plan
        offer = plan.offer
        self.sup.rented(
            instance_id, offer.id, offer.machine_id, plan.price,
            provider=offer.provider, host=plan.spec.name, epoch=self.lc.epoch,
        )  # fmt: skip
        return leg

    def on_rented(self, instance_id: str) -> int:
        """Train on a freshly rented instance; a bad host is ended in the state too (the
        rental destroys it and takes the next offer)."""
        try:
            return self.on_instance(self.leg(instance_id))
        except HostFault as fault:
            self.sup.instance_ended(instance_id, f"bad host: {fault.reason}")
            raise

    def since_start(self) -> str:
        return f"{time.time() - self.started:.1f} s after this supervisor started"

    def on_instance(self, leg: Leg) -> int:
        """Boot, resume and follow on one instance; a loss raises :class:`InstanceLost`."""
        monitor = Monitor(self.lc.provider, leg.instance_id, self.spec.monitor_s)
        try:
            target = self.attach(leg) if leg.attach else self.boot(leg)
            monitor.start()
            return self.train(target, monitor, attach=leg.attach)  # attach() may clear it
        except InstanceFailed as err:
            # Never running, image pull failed, SSH never answering: deterministic, not a
            # loss. Outbid or gone while booting is one.
            if monitor.check() is None or monitor.state is State.FAILED:
                raise
            raise InstanceLost(leg.instance_id, monitor.lost or "lost") from err
        except _LOST_ERRORS as err:
            reason = monitor.check()
            if reason is None:
                raise
            raise InstanceLost(leg.instance_id, reason) from err
        finally:
            monitor.stop()

    def boot(self, leg: Leg) -> Target:
        deadline = time.monotonic() + self.spec.boot_timeout_s
        inst = self.lc.wait_running(leg.instance_id, deadline)
        self.sup.machine(leg.instance_id, inst.machine_id)
        self._mark("running")
        target = self.lc.wait_ssh(inst, deadline)
        self.lc.prepare(target, self.watchdog_keys.get(self.spec.name))
        self.upload(target)
        return target

    def attach(self, leg: Leg) -> Target:
        """The instance a previous supervisor rented, as it is: its host key as recorded
        when that supervisor first reached it, else reached now (keys may still be arriving);
        the steps that supervisor had not done are done first."""
        deadline = time.monotonic() + self.spec.boot_timeout_s
        inst = self.lc.wait_running(leg.instance_id, deadline)
        assert inst.ssh_host and inst.ssh_port  # wait_running returns only with an address
        if self.lc.reached(inst):
            spec = container_spec(self.spec, inst.ssh_host, inst.ssh_port)
            target = Target(spec=spec, known_hosts=self.lc.known_hosts, out=self.lc.out)
        else:  # its supervisor was stopped before SSH: the keys may still be arriving
            target = self.lc.wait_ssh(inst, deadline)
        conn = target.connect()
        try:
            there = existing(target, conn, self.run_id)
        finally:
            conn.close()
        if there is None:
            # Rented by a supervisor stopped before it set the instance up: do every step
            # it had not done (setup, the checkpoint to resume from), then train as usual.
            self.say(
                f"instance {leg.instance_id} was rented for run {self.run_id} but not set up "
                "(its supervisor was interrupted): setting it up now"
            )
            self.sup.machine(leg.instance_id, inst.machine_id)
            self.lc.prepare(target, self.watchdog_keys.get(self.spec.name))
            if self.pending is None:  # the interrupted recovery cut and marked the log
                self.pending = self.points.adopted()
            self.upload(target)
            leg.attach = False  # nothing runs there to follow: launch it
        return target

    def plan_on(self, target: Target) -> DeployPlan:
        return self.lc.plan.replan(target.spec, self.run_id)

    def train(self, target: Target, monitor: Monitor, attach: bool = False) -> int:
        """Launch and follow; relaunch here while the run ends with a retryable cause.

        ``attach``: the instance was rented by an earlier supervisor; a run already there
        (alive or ended) is followed from where the local log stops, never launched again.
        """
        spec = self.spec  # the rented entry: the instance's container host has no rental knobs
        while True:
            conn = target.connect()
            try:
                found = existing(target, conn, self.run_id) if attach else None
                if found is None:
                    self.lc.fence()  # preflight and start change the host
                    plan, _ = operate.prepare(
                        target,
                        conn,
                        self.plan_on(target),
                        env=self.env,
                        replan=lambda run_id: self.lc.plan.replan(target.spec, run_id),
                        workload=self.lc.plan.workload,
                        on_preflight=lambda report: record_figures(self.lc.plan, report, self.say),
                    )
                    operate.launch(target, conn, plan)
                else:
                    plan = self.plan_on(target)
            except PreflightFailed as err:
                record_figures(self.lc.plan, err.report, self.say)
                raise host_or_user(err) from None
            finally:
                conn.close()
            if found is None:
                self._mark("started")
            else:
                self.say(
                    f"following run {self.run_id} on instance {monitor.instance_id} "
                    f"({'alive' if found.alive else 'ended'}), {self.since_start()}"
                )
            attach = False
            sync = CheckpointSync(
                target,
                posixpath.join(plan.remote.run_dir, "checkpoints"),
                self.run_dir / "checkpoints",
                self.say,
                then=lambda got: self.sup.synced(got.step),
            )
            sync.start(spec.sync_every_s)
            renewal = renewal_for(target, plan, self.say)
            try:
                code = follow(
                    target,
                    plan.remote,
                    offset=self.log.size(),  # the remote log is the local one plus new lines
                    connect=lambda: monitor.connect(target),
                    each_line=self.on_line,
                    give_up_after_s=spec.ssh_lost_s,
                )
            except DeployError as err:  # SSH silent past ssh_lost_s: useless, and billing
                reason = monitor.check() or f"SSH unreachable for {spec.ssh_lost_s:.0f} s"
                raise InstanceLost(monitor.instance_id, reason) from err
            finally:
                if renewal is not None:
                    renewal.stop()
                sync.stop()
                sync.close()
                self.synced += sync.synced
            before = len(sync.synced)
            sync.top_up()
            self.synced += sync.synced[before:]
            if not self.relaunch_here(target, plan, code):
                return code

    def relaunch_here(self, target: Target, plan: DeployPlan, code: int) -> bool:
        """After the run ended by itself: fetch and stop, or mark the log and go again."""
        conn = target.connect()
        try:
            _, outcome = read_result(conn, plan.remote, target.spec)
        finally:
            conn.close()
        self.outcome = outcome
        retryable, why = retry_verdict(outcome, code)
        if code != 0 and retryable and time.time() < self.lc.plan.deadline_epoch:
            self.count(f"the run ended: {why}", None)
            line = self.log.mark(
                recovery=self.recoveries, reason=why, instance=self.legs[-1].instance_id
            )
            conn = target.connect()
            try:
                command = f"printf '%s' {rc.q(line.decode())} >> {rc.q(plan.remote.launch_log)}"
                run_remote(conn, command, target.spec)
            finally:
                conn.close()
            self.pending = Pending(self.recoveries, why, -1, None, 0, time.monotonic())
            self.say(
                f"recovery {self.recoveries}: relaunching run {self.run_id} on the same "
                f"instance ({why})"
            )
            return True
        if code != 0:
            self.say(
                f"run {self.run_id} is not relaunched: {why}. Fix the cause, then deploy again "
                f"with --run {self.run_id} to continue from its newest checkpoint."
            )
        synced = [
            f"checkpoints/{p.name}" for p in (self.run_dir / "checkpoints").glob("step_*.pt*")
        ]
        self.lc.fetch(target, exclude=synced)
        if self.lc.plan.wandb_sync:
            sync_home(self.run_dir, self.env, self.say)
        return False

    def on_line(self, line: bytes) -> None:
        self.log.write(line)
        p = self.pending
        training = self.sup.state.status is not RunStatus.RUNNING or p is not None
        if not training or _event(line).get("event") not in ("resumed", "train_step"):
            return
        if p is None:
            self.sup.trains_again(None)
        else:
            p.mark("first_step")
            self.pending = None
            self.sup.trains_again(p.marks["first_step"] if p.number else None)
            split = ", ".join(f"{k} {v:.1f} s" for k, v in p.marks.items())
            self.say(
                f"recovery {p.number}: run {self.run_id} resumed; since detection: {split}; "
                f"{self.since_start()}"
            )

    def _mark(self, phase: str) -> None:
        if self.pending is not None:
            self.pending.mark(phase)

    # -- recovery -----------------------------------------------------------------------
    def count(self, reason: str, lost_instance: str | None) -> None:
        """Count one recovery in the record; raise :class:`RecoveriesExhausted` past the
        bounds."""
        newest = newest_good(self.run_dir / "checkpoints")
        kept = (
            f"Its newest checkpoint (step {newest[0]}) is in {newest[1].parent}"
            if newest
            else f"No checkpoint of it was synced to {self.run_dir}"
        )
        again = (
            f"{command('deploy', '--host', self.spec.name, '--run', self.run_id)} continues "
            "it from there (it uploads the newest checkpoint)."
        )
        if self.recoveries >= self.spec.max_recoveries:
            raise RecoveriesExhausted(
                f"run {self.run_id} needs another recovery ({reason}) but max_recoveries "
                f"{self.spec.max_recoveries} is used up: not relaunching. {kept}; every "
                f"instance was ended per on_exit. Raise max_recoveries in hosts.yaml; {again}"
            )
        if time.time() >= self.lc.plan.deadline_epoch:
            raise RecoveriesExhausted(
                f"run {self.run_id} needs another recovery ({reason}) but max_hours "
                f"{self.spec.max_hours:g} is used up across its instances. {kept}. {again}"
            )
        self.sup.recovery(reason, lost_instance)

    def recover(self, leg: Leg, reason: str) -> None:
        """End the lost instance, cut the log back to the checkpoint, pick the next offer."""
        detected = time.monotonic()
        self.end_lost(leg.instance_id, reason)
        spent = sum(r.cost() for r in self.sup.state.instances if r.instance_id == leg.instance_id)
        self.say(f"instance {leg.instance_id} lost: {reason} (about ${spent:.4f} spent on it)")
        self.where.lost(self.lc.plan.offer, self.lc.provider)
        self.count(reason, leg.instance_id)
        self.pending = self.points.after_loss(reason, leg.instance_id, detected)
        move_on(self.lc, self.where, Trigger.LOST, reason, 1)
        where = (
            "from its newest checkpoint in the bucket (ups launch restores it there as UPS_RESUME)"
            if self.lc.plan.workload is not None
            else f"from step {self.pending.resume_step} ({self.pending.steps_lost} steps to "
            "recompute)"
        )
        self.say(
            f"recovery {self.recoveries}/{self.spec.max_recoveries}: resuming run {self.run_id} "
            f"{where} on {self.lc.plan.offer.describe()} at ${self.lc.plan.price:.3f}/h"
        )

    def end_lost(self, instance_id: str, reason: str, provider: Provider | None = None) -> None:
        """Stop or destroy a lost instance and record that it ended."""
        stale = "stop" if self.spec.on_exit == "keep" else self.spec.on_exit
        try:  # never two instances training one run: a resumed bid instance must not
            self.lc.end(instance_id, stale, f"lost: {reason}", provider=provider)
        except DeployError as err:
            self.say(f"warning: could not {stale} lost instance {instance_id} yet: {err}")
        self.sup.instance_ended(instance_id, f"lost: {reason}")

    def continue_local(self) -> None:
        """A run directory here with a checkpoint continues from it (the bucket's newest
        first, when it is newer); else a fresh log."""
        if self.points.newest()[1] is None:
            self.log.reset()
            return
        self.pending = self.points.after_loss(
            "continued from the local run directory", None, time.monotonic(), counted=False
        )
        self.say(
            f"continuing run {self.run_id} from its local checkpoint at step "
            f"{self.pending.resume_step}"
        )

    def upload(self, target: Target) -> None:
        """Put the checkpoint to resume from and the log so far on the new instance."""
        p = self.pending
        if p is None or p.resume_step < 0:
            return
        self.lc.fence()  # it changes the host
        remote = self.plan_on(target).remote
        ckpts = posixpath.join(remote.run_dir, "checkpoints")
        conn = target.connect()
        try:
            run_remote(
                conn, rc.mkdir_command(ckpts, posixpath.dirname(remote.launch_log)), target.spec
            )
            sftp = conn.sftp()
            if p.checkpoint is not None:
                for path in (p.checkpoint.with_name(p.checkpoint.name + ".sha256"), p.checkpoint):
                    sftp.put(str(path), posixpath.join(ckpts, path.name))
            sftp.put(str(self.log.path), remote.launch_log)
        finally:
            conn.close()
        what = f"checkpoint step {p.resume_step}" if p.checkpoint else "no checkpoint (from step 0)"
        self.say(f"uploaded {what} and the run's log ({self.log.size()} bytes)")
        p.mark("uploaded")

    def summary(self) -> str:
        """The run's account, from its record: every instance it rented (this supervisor's
        or an earlier one's), each with its cost, and the total."""
        state = self.sup.state
        each = ", ".join(
            f"{r.provider} {r.instance_id} ${r.cost():.4f}{'' if r.ended else ' (running)'}"
            for r in state.instances
        )
        sent = sum(s.sent for s in self.synced)
        moves = "".join(
            f"; moved from {m.from_host} to {m.to_host}: {m.reason}"
            + (f" (first step {m.first_step_s:.1f} s later)" if m.first_step_s else "")
            for m in state.moves
        )
        return (
            f"run summary: run {self.run_id}: {len(state.instances)} instance(s) used "
            f"({each}), {state.recoveries} recovery(ies), about ${state.cost():.4f} in all; "
            f"time lost to recoveries {state.downtime_s():.1f} s and {state.steps_lost} steps "
            f"recomputed; {len(self.synced)} checkpoint(s) synced ({sent} bytes){moves}"
        )


def host_or_user(err: PreflightFailed) -> DeployError:
    """A preflight failure of the machine's own checks is a host fault (next offer); one
    of the config, data or image is the user's (it stops the deploy)."""
    if preflight_side(err.report) is Side.HOST:
        return HostFault(str(err), preflight_reason(err.report))
    return err


def process_started() -> float:
    """When this process started (epoch): the clock of "seconds after the supervisor
    started", imports included."""
    return psutil.Process().create_time()
