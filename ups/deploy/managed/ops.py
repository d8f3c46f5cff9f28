"""What a rented entry does (on every provider): plan and run a managed deploy,
``instances``, ``down``, attach, ``ups supervise``."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ups.bucket import Bucket, BucketError
from ups.console.format import render_line
from ups.deploy.entries import ContainerHost, RentedHost
from ups.deploy.errors import DeployError, HostGone, UsageError
from ups.deploy.frontend import command
from ups.deploy.hosts import get_host
from ups.deploy.managed import background, lease
from ups.deploy.managed import record as supervision
from ups.deploy.managed import store as bucket_state
from ups.deploy.managed.acquire import Where
from ups.deploy.managed.ledger import Ledger, render
from ups.deploy.managed.lifecycle import Lifecycle, describe_timings
from ups.deploy.managed.market import Market
from ups.deploy.managed.offers import NoneUnderCap
from ups.deploy.managed.recovery import policy_for
from ups.deploy.managed.rental_plan import RentalPlan, build_rental_plan
from ups.deploy.managed.run import run
from ups.deploy.onhost.operate import bucket_keys
from ups.deploy.onhost.plan import load_run_config
from ups.deploy.providers import Instance, NoOffer, Provider, ProviderApiError, RecoveryPolicy
from ups.deploy.providers import InstanceState as State
from ups.runid import run_id_problem
from ups.workload import ScriptWorkload, WorkloadError, load_run_file

ACCOUNT_WARNING = (
    "warning: checkpoint_sync.credentials: account sends this machine's own S3 keys to the "
    "rented host: its owner can read, overwrite and delete everything those keys reach "
    "({url} and beyond) until you revoke them (docs/security.md)\n"
)

WANDB_WARNING = (
    "warning: wandb.online_on_host sends WANDB_API_KEY to the rented host: its owner can use "
    "your W&B account until you revoke the key (docs/security.md)\n"
)


def _watchdog_key(spec: RentedHost) -> str | None:
    if not spec.watchdog_key_file:
        return None
    path = Path(spec.watchdog_key_file).expanduser()
    try:
        return path.read_text().strip() or None
    except OSError as err:
        raise ProviderApiError(
            f"watchdog_key_file {path} of host {spec.name!r} cannot be read ({err.strerror}). "
            "Save the scoped key there (its provider's page under docs/) or remove the "
            "setting to let the watchdog use the instance's own key."
        ) from None


@dataclass
class ManagedDeploy:
    """The rental plan and what carrying it out needs; :meth:`run` rents and deploys it."""

    market: Market
    """The entries the run may rent from (the plan's first), each with its provider."""
    policy: RecoveryPolicy
    plan: RentalPlan
    known_hosts: Path
    out: TextIO
    env: dict[str, str]
    skip_preflight: bool
    watchdog_keys: dict[str, str | None]
    """Per rented entry of the run, its watchdog's scoped key (read before renting)."""
    mirror: Path | None
    spec: RentedHost
    config: Path
    overrides: tuple[str, ...]
    hosts_file: str | None
    mode: str
    passed_over: tuple[str, ...] = ()
    """Entries before the plan's that had no offer when it was made, each with why."""

    def choose_run(self) -> None:
        """Nothing to decide on a host: the run's record says which run continues, and
        which instance it trains on (the plan then says it is picked up, not rented)."""
        state = supervision.load(self.plan.local_runs / self.plan.run_id)
        current = state.current() if state is not None and not state.ended else None
        if current is not None:
            self.plan = dataclasses.replace(self.plan, picks_up=current.instance_id)

    def render(self) -> str:
        text = self.plan.render()
        here = self.plan.spec.name
        others = [e for e in self.market.entries if e.name != here]
        if not others:
            return text
        head, _, rest = text.partition("\n  W&B:")
        lines = [f"\n  passed:   {why}" for why in self.passed_over]
        moves = ", then ".join(
            f"{e.name} ({e.kind}, cap ${e.max_price_per_hour or 0:.3f}/h)" for e in others
        )
        lines.append(
            f"\n  failover: {moves}: when {here} has no offer under its cap or "
            f"{self.plan.spec.max_offers} bad hosts in a row (policy {self.policy.name}); the "
            "run resumes there from its newest checkpoint"
        )
        return head + "".join(lines) + "\n  W&B:" + rest

    def run(self) -> int:
        """Supervise the run: take its lease, rent (or pick up) and follow it; a detached
        deploy (``follow`` off) leaves a supervisor behind in the background."""
        plan, spec, out = self.plan, self.spec, self.out
        if (access := plan.deploy.bucket_access) is not None:
            started = time.monotonic()
            bucket_keys(access)  # before renting: none found, or none minted, costs nothing
            if access.mode == "account":
                out.write(ACCOUNT_WARNING.format(url=access.url))
            else:
                out.write(
                    f"bucket credentials for the instance: minted with {access.method} in "
                    f"{time.monotonic() - started:.2f} s, scoped to {access.prefix_url}\n"
                )
        if plan.cfg and plan.cfg.wandb.online_on_host and "WANDB_API_KEY" in plan.deploy.secrets:
            out.write(WANDB_WARNING)
        detach = not plan.deploy.follow
        run_dir = plan.local_runs / plan.run_id
        fresh = supervision.State(
            run_id=plan.run_id,
            host=spec.name,
            config=str(self.config.resolve()),
            hosts_file=str(Path(self.hosts_file).resolve()) if self.hosts_file else None,
            overrides=list(self.overrides),
        )
        bucket = bucket_state.open_for(plan.cfg, plan.workload)

        def say(text: str) -> None:
            out.write(text + "\n")

        mirror_to = bucket_state.mirror(bucket, plan.run_id, say) if bucket else None
        sup, known = supervision.Supervision.load_or_new(run_dir, fresh, mirror_to)
        mode = lease.DETACHING if detach else self.mode  # a detached deploy only starts it
        held = lease.Lease(run_dir, plan.run_id, mode, bucket, say=say, stop_main=True)
        held.take(
            follow_hint=command("logs", "--host", spec.name, "--run", plan.run_id),
            after_epoch=sup.state.epoch,
        )
        sup.fence = held.check
        try:
            if not known and bucket is not None:
                known = _adopt(sup, bucket, say)
            held.epoch = max(held.epoch, sup.state.epoch + 1)  # newer than the record's too
            if detach and known:  # the run exists: its background supervisor picks it up
                if sup.state.ended:
                    raise UsageError(
                        f"run {plan.run_id} already ended ({sup.state.ended}; {sup.path}). "
                        "Start a new run with another --run ID (or without --run)."
                    )
                code = 0
            else:
                sup.took_lease(held.epoch)
                if self.passed_over and not sup.state.instances:
                    sup.moved(spec.name, plan.spec.name, "; ".join(self.passed_over))
                provider = self.market.provider(plan.spec)
                lifecycle = Lifecycle(
                    provider, plan, self.known_hosts, out, held.check, epoch=held.epoch
                )
                sup.supervised_by(supervision.Supervisor.this_process(self.mode))
                where = Where(self.market, self.policy, on_move=sup.moved)
                code = run(
                    lifecycle,
                    env=self.env,
                    skip_preflight=self.skip_preflight,
                    watchdog_keys=self.watchdog_keys,
                    sup=sup,
                    where=where,
                    bucket=bucket,
                    mirror=self.mirror,
                )
                lifecycle.say(f"timings since start: {describe_timings(lifecycle.timings)}")
        finally:
            held.release()
        if detach:
            pid = background.start(plan.local_runs, plan.run_id)
            out.write(
                f"supervisor pid {pid} follows run {plan.run_id} in the background (log "
                f"{run_dir / background.LOG}): it syncs checkpoints and recovers the run if the "
                f"instance is lost. {command('instances', '--host', spec.name)} shows it.\n"
            )
        return code


def _adopt(sup: supervision.Supervision, bucket: Bucket, say: Callable[[str], None]) -> bool:
    """A run this machine never supervised, but another machine did (its state is in the
    bucket): take up that record (instances, recoveries, cost) under this machine's paths."""
    theirs = bucket_state.saved_state(bucket, sup.state.run_id, say)
    if theirs is None:
        return False
    mine = sup.state
    sup.state = dataclasses.replace(
        theirs, config=mine.config, hosts_file=mine.hosts_file, overrides=mine.overrides
    )
    sup.save()
    say(
        f"run {mine.run_id} was supervised elsewhere: its state is taken from "
        f"{bucket.url_of(f'{mine.run_id}/{supervision.FILE}')}"
    )
    return True


def plan(
    spec: RentedHost,
    known_hosts: Path,
    config: Path,
    out: TextIO,
    *,
    run_id: str | None,
    overrides: tuple[str, ...] = (),
    follow: bool,
    skip_preflight: bool,
    mirror: Path | None,
    hosts_file: str | None = None,
    mode: str = "following",
    workload: ScriptWorkload | None = None,
) -> ManagedDeploy:
    """Search offers and plan the rental and the deploy on it (creates nothing). ``mode``
    says how the run will be supervised: ``following`` in a terminal, or ``detached`` for
    ``ups supervise``. An entry that lists ``failover`` entries is planned on the first of
    them (itself first) that has an offer under its cap."""
    env = dict(os.environ)
    market = Market(entries_of(spec, hosts_file))
    # Read before renting: a bad path costs nothing. Each provider's watchdog its own key.
    watchdog_keys = {entry.name: _watchdog_key(entry) for entry in market.entries}
    missed: list[str] = []
    passed: list[str] = []
    for entry in market.entries:
        try:
            rental = build_rental_plan(
                entry,
                config,
                market.provider(entry),
                run_id=run_id,
                overrides=overrides,
                follow=follow,
                skip_preflight=skip_preflight,
                env=env,
                workload=workload,
            )
            break
        except NoOffer as err:
            missed.append(f"{entry.name}: {err}")
            passed.append(f"{entry.name}: {err.short if isinstance(err, NoneUnderCap) else err}")
    else:
        raise NoOffer(" ".join(missed) if len(missed) == 1 else "; ".join(missed))
    return ManagedDeploy(
        market,
        policy_for(market.entries),
        rental,
        known_hosts,
        out,
        env,
        skip_preflight,
        watchdog_keys,
        mirror,
        spec=spec,
        config=config,
        overrides=overrides,
        hosts_file=hosts_file,
        mode=mode,
        passed_over=tuple(passed),
    )


def entries_of(spec: RentedHost, hosts_file: str | None) -> list[RentedHost]:
    """The entry and the entries it fails over to, in order (hosts.py checked they exist).
    They keep one bucket: the run resumes on the next provider from its checkpoints."""
    found = [spec]
    for name in spec.failover:
        other, _known = get_host(name, hosts_file)
        assert isinstance(other, RentedHost), other
        found.append(other)
    buckets = {entry.checkpoint_sync for entry in found}
    if len(buckets) > 1:
        listed = ", ".join(f"{e.name}: {e.checkpoint_sync}" for e in found)
        raise UsageError(
            f"host {spec.name!r} fails over to {', '.join(spec.failover)}, but their "
            f"checkpoint_sync differ ({listed}). A run that moves between providers keeps "
            "one bucket, where the next one resumes it from: give them the same s3:// URL."
        )
    return found


def _provider(spec: RentedHost) -> Provider:
    return Market([spec]).provider(spec)


def ups_instances(provider: Provider, host: str | None = None) -> list[Instance]:
    """Every instance with a ups label (for ``host`` only when given), reconciled live."""
    found = [(i, i.run) for i in provider.list()]
    return [i for i, run in found if run and (host is None or run.host == host)]


def instances(
    spec: RentedHost, out: TextIO, ledger: bool = False, runs_dir: Path = Path("runs")
) -> int:
    """The ups instances on the account, with each run's supervisor under ``runs_dir``; with
    ``ledger`` also the machines that failed."""
    if ledger:
        book = Ledger()
        out.write(f"host ledger: {book.path}\n{render(book.read(), spec.ledger_ttl_h)}\n\n")
    provider = _provider(spec)
    rows = ups_instances(provider)
    runs = supervision.all_runs(runs_dir)
    if runs:
        out.write(describe_runs(runs, runs_dir) + "\n")
    if not rows:
        out.write(f"no ups instances on this {provider.account.title} account\n")
        return 0
    header = f"{'id':>10}  {'state':<8} {'host':<10} {'run':<32} {'$/h':>7} {'cost':>8}  ssh"
    lines = [header]
    total = 0.0
    for inst in rows:
        run = inst.run
        host, run_id = (run.host, run.run_id) if run else ("?", "?")
        ssh = f"{inst.ssh_host}:{inst.ssh_port}" if inst.ssh_host else "-"
        total += inst.cost_so_far
        lines.append(
            f"{inst.id:>10}  {inst.state.value:<8} {host:<10} {run_id:<32} "
            f"{inst.price_per_hour:>7.3f} {inst.cost_so_far:>8.2f}  {ssh}"
        )
    lines.append(f"{len(rows)} instance(s), about ${total:.2f} so far ($/h x time since start)")
    out.write("\n".join(lines) + "\n")
    return 0


def describe_runs(runs: list[supervision.State], runs_dir: Path) -> str:
    """One line per supervised run: who supervises it, its newest checkpoint, cost so far."""
    now = time.time()
    header = (
        f"{'run':<32} {'supervisor':<34} {'recoveries':>10}  {'last checkpoint':<24} {'cost':>8}"
    )
    lines = [f"supervised runs in {runs_dir}/:", header]
    for st in runs:
        held = lease.holder(runs_dir / st.run_id)
        who = (
            f"{held.mode} (pid {held.pid})"
            if held
            else ("ended: " + st.ended if st.ended else "none")
        )
        last = st.checkpoints[-1] if st.checkpoints else None
        ckpt = f"step {last.step}, {now - last.at:.0f} s ago ({last.where})" if last else "-"
        lines.append(
            f"{st.run_id:<32} {who:<34} {st.recoveries:>10}  {ckpt:<24} ${st.cost():>7.4f}"
            + _in_bucket(st)
        )
    return "\n".join(lines)


def _state_bucket(st: supervision.State) -> Bucket | None:
    """The bucket of a supervised run: its script's run file's, or its config's."""
    try:
        workload = load_run_file(Path(st.config), local=False)
    except WorkloadError:  # not a run file: the run's ups config
        return bucket_state.open_for(load_run_config(Path(st.config), tuple(st.overrides)))
    return bucket_state.open_for(None, workload)


def _in_bucket(st: supervision.State) -> str:
    """``; bucket: step N`` for a run whose config names a bucket (one listing)."""
    from ups.bucket import newest_checkpoint

    try:
        bucket = _state_bucket(st)
        ref = newest_checkpoint(bucket, st.run_id) if bucket else None
    except (DeployError, BucketError, OSError) as err:
        return f"; bucket: unknown ({err})"
    if bucket is None:
        return ""
    if ref is None:
        return f"; {bucket.url_of(st.run_id)}: no checkpoint"
    try:
        at = bucket.modified(ref.commit_key)
    except BucketError:
        at = None
    age = f", {time.time() - at:.0f} s ago" if at is not None else ""
    return f"; {bucket.url_of(st.run_id)}: step {ref.step}{age}"


def down(spec: RentedHost, out: TextIO, run_id: str | None) -> int:
    """Destroy the instances of ``run_id`` (or every one this host entry created)."""
    provider = _provider(spec)
    runs_dir = Path("runs")
    targets = [
        i
        for i in ups_instances(provider, spec.name)
        if run_id is None or (i.run is not None and i.run.run_id == run_id)
    ]
    for st in supervision.all_runs(runs_dir):
        if st.host == spec.name and run_id in (None, st.run_id):
            _stop_supervisor(runs_dir / st.run_id, out)
    if not targets:
        what = f"run {run_id}" if run_id else f"host {spec.name}"
        out.write(f"no instances for {what}: nothing to destroy\n")
        return 0
    for inst in targets:
        by = ""
        if provider.get(inst.id) is None:
            by = " by its supervisor"  # on_exit destroy: it ended the instance on SIGTERM
        else:
            provider.destroy(inst.id)
        out.write(
            f"destroyed instance {inst.id} ({inst.label}){by}, about "
            f"${inst.cost_so_far:.2f} so far\n"
        )
        run = inst.run
        if run is not None and (saved := supervision.load(runs_dir / run.run_id)):
            # Ended on purpose: a later deploy of the run continues it without counting a
            # recovery.
            supervision.Supervision(runs_dir / run.run_id / supervision.FILE, saved).instance_ended(
                inst.id, "destroyed by fab down"
            )
    return 0


def _stop_supervisor(run_dir: Path, out: TextIO) -> None:
    """SIGTERM the run's background supervisor here (it ends its instance per on_exit and
    exits), so it does not recover the run that `fab down` is ending."""
    held = lease.holder(run_dir)
    if held is None or held.host != socket.gethostname():
        return
    os.kill(held.pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while lease.holder(run_dir) is not None and time.monotonic() < deadline:
        time.sleep(0.2)  # the supervisor ending its instance, then exiting
    out.write(f"stopped the {held.describe()}\n")


def attach(spec: RentedHost, run_id: str | None) -> ContainerHost:
    """The container host a running instance of this entry is (for logs, status, stop, fetch).

    The newest running instance labelled for ``run_id`` (any run when None); its host key
    was recorded when deploy first reached it.
    """
    provider = _provider(spec)
    running = [
        i
        for i in ups_instances(provider, spec.name)
        if i.state is State.RUNNING and (run_id is None or (i.run and i.run.run_id == run_id))
    ]
    if not running:
        what = f"run {run_id}" if run_id else f"host {spec.name!r}"
        raise HostGone(
            f"no running {provider.account.title} instance for {what}: {command('instances')} "
            f"lists what exists; {command('deploy', '--host', spec.name)} rents one.",
            replay=saved_log(run_id, spec) if run_id else None,
        )
    inst = min(running, key=lambda i: i.uptime_s)
    assert inst.ssh_host and inst.ssh_port
    return spec.as_container(inst.ssh_host, inst.ssh_port)


def saved_log(
    run_id: str, spec: RentedHost, runs_dir: Path = Path("runs")
) -> Callable[[TextIO], int] | None:
    """``fab logs`` for a run whose instance is gone: the log its instance uploaded to the
    run's bucket, else the one its supervisor streamed into the local run directory. The
    bucket is the run config's (from the local supervision state) or, on a machine without
    the run directory, the entry's ``checkpoint_sync``."""
    state = supervision.load(runs_dir / run_id)
    local = runs_dir / run_id / "logs" / "launch.log"
    entry_bucket = spec.checkpoint_sync if spec.checkpoint_sync.startswith("s3://") else None
    if state is None and entry_bucket is None and not local.exists():
        return None

    def bucket_of() -> Bucket | None:
        if state is not None:
            found = _state_bucket(state)
            if found is not None:
                return found
        return Bucket.open(entry_bucket) if entry_bucket else None

    def replay(out: TextIO) -> int:
        data, source, code = None, str(local), None
        try:
            bucket = bucket_of()
            key = f"{run_id}/logs/launch.log"
            if bucket is not None and (data := bucket.get_bytes(key)) is not None:
                source = bucket.url_of(key)
                raw = bucket.get_bytes(f"{run_id}/{supervision.FILE}") if state is None else None
                if raw is not None:
                    where = bucket.url_of(f"{run_id}/{supervision.FILE}")
                    code = supervision.parse(raw.decode(), where).exit_code
        except (DeployError, BucketError) as err:
            out.write(f"warning: the run's bucket could not be read ({err})\n")
        if data is None:
            if not local.exists():
                raise DeployError(
                    f"run {run_id} has no running instance and no saved log (not in the run's "
                    f"bucket, not in {local})"
                )
            data = local.read_bytes()
        out.write(f"run {run_id} has no running instance; its log as saved in {source}:\n")
        for line in data.decode("utf-8", "replace").splitlines():
            out.write(render_line(line, colors=out.isatty()) + "\n")
        if state is not None and state.exit_code is not None:
            code = state.exit_code
        return code or 0

    return replay


def supervise(run_id: str, runs_dir: Path, out: TextIO) -> int:
    """Supervise run ``run_id`` from its saved state, as a followed deploy would."""
    if problem := run_id_problem(run_id):
        raise UsageError(f"RUN_ID: {problem}.")
    state = supervision.load(runs_dir / run_id)
    if state is None:
        raise UsageError(
            f"no supervised run {run_id!r} in {runs_dir} (no {supervision.FILE}). "
            f"{command('deploy', '--host HOST', '--run', run_id, '--detach')} starts one."
        )
    spec, known_hosts = get_host(state.host, state.hosts_file)
    if not isinstance(spec, RentedHost):
        raise UsageError(f"host {state.host!r} of run {run_id} is no longer a rented entry.")
    deploy = plan(
        spec,
        known_hosts,
        Path(state.config),
        out,
        run_id=run_id,
        overrides=tuple(state.overrides),
        follow=True,
        skip_preflight=False,
        mirror=None,
        hosts_file=state.hosts_file,
        mode="detached",
    )
    deploy.choose_run()
    out.write(deploy.render() + "\n")
    out.flush()
    return deploy.run()
