"""The rental plan: which offer, at what price, what is created, then the container plan.

Building it searches offers (one read-only API call) and creates nothing; ``--dry-run``
prints it. Once the instance answers SSH, the instance is a ``container`` host and
:attr:`RentalPlan.deploy` (the ordinary container plan) runs there unchanged. The plan is
the same for every provider: the entry names its provider, the registry opens it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from ups.config import Config
from ups.deploy.entries import AddressedHost, ContainerHost, RentedHost
from ups.deploy.managed.offers import search
from ups.deploy.onhost.plan import DeployPlan, build_plan, build_script_plan, load_run_config
from ups.deploy.providers import (
    ORDER_MEASURED,
    CreateRequest,
    Offer,
    OfferRequirements,
    Provider,
    label_for,
)
from ups.deploy.providers.watchdog import KEY_FILE, LEASE_FILE, onstart_command, watch_path
from ups.runid import new_run_id
from ups.workload import ScriptWorkload

PENDING_ADDRESS = "(instance ssh address)"
WANDB_KEY = "WANDB_API_KEY"


def container_spec(
    spec: RentedHost, host: str = PENDING_ADDRESS, port: int | None = None
) -> ContainerHost:
    """The rented entry as the container host it becomes once the instance has an address."""
    return spec.as_container(host, port)


@dataclass
class RentalPlan:
    spec: RentedHost
    """The rented entry the next instance comes from (it names the provider)."""
    title: str
    """Its provider as people write it (its account's title)."""
    offer: Offer
    price: float
    bid: float | None
    onstart: str
    deadline_epoch: float
    local_runs: Path
    """Where the run directory is fetched to (the config's output_dir, locally)."""
    deploy: DeployPlan
    config: Path
    """The config file, or a script's run file."""
    cfg: Config | None
    """None for your own script (``workload``)."""
    overrides: tuple[str, ...]
    skip_preflight: bool
    env: dict[str, str]
    avoided: tuple[str, ...] = ()
    """Machines left out of the search: failed here within ``ledger_ttl_h`` (host ledger)."""
    wandb_sync: bool = False
    """W&B would log online, but logs offline on the instance: synced from here at the end."""
    ranking: tuple[str, ...] = ()
    """``order: measured``: the best offers by expected $ per sample, the chosen first."""
    workload: ScriptWorkload | None = None
    """Your own script: each instance gets its workdir and setup as a container host does."""
    picks_up: str | None = None
    """The instance the run's record says it trains on: a supervisor follows it when it
    still runs, and rents ``offer`` only when it is gone."""

    def replan(self, spec: AddressedHost, run_id: str | None) -> DeployPlan:
        """The container plan for the instance once it has an address (``spec``)."""
        if self.workload is not None:
            script = build_script_plan(
                spec,
                self.workload,
                run_id=run_id or self.run_id,
                follow=self.deploy.follow,
                skip_preflight=self.skip_preflight,
                env=self.env,
            )
            return rented(script, self.cfg, self.deadline_epoch, self.workload)
        assert self.cfg is not None  # a trainer run has its config
        plan = build_plan(
            spec,
            self.config,
            cfg=self.cfg,
            run_id=run_id or self.run_id,
            overrides=self.overrides,
            follow=self.deploy.follow,
            skip_preflight=self.skip_preflight,
            env=self.env,
        )
        return rented(plan, self.cfg, self.deadline_epoch)

    @property
    def run_id(self) -> str:
        return self.deploy.run_id

    def label(self, epoch: int | None = None) -> str:
        """The label of an instance this plan creates under lease ``epoch``."""
        return label_for(self.spec.name, self.run_id, epoch)

    def with_deadline(self, deadline: float) -> RentalPlan:
        """The same plan with the instance's watchdog ending it at ``deadline`` (epoch)."""
        return dataclasses.replace(
            self,
            deadline_epoch=deadline,
            onstart=onstart_command(self.spec, deadline),
            deploy=rented(self.deploy, self.cfg, deadline, self.workload),
        )

    def watchdog_file(self, workdir: str, name: str = "") -> str:
        """A file of the instance's watchdog (its directory when ``name`` is empty)."""
        return watch_path(workdir, name)

    def watchdog_key_file(self, workdir: str) -> str:
        """Where the watchdog's scoped API key is written on the instance (0600)."""
        return watch_path(workdir, KEY_FILE)

    def watchdog_lease_file(self, workdir: str) -> str:
        """The lease a fetch takes on the instance to hold its watchdog back."""
        return watch_path(workdir, LEASE_FILE)

    def with_next_offer(
        self, provider: Provider, exclude: Collection[str], machines: Collection[str] = ()
    ) -> RentalPlan:
        """The same plan on the next matching offer under the same cap (for a recovery, or
        after a bad host).

        ``exclude`` holds offers not to take again (lost instances), ``machines`` the
        machines that failed this deploy; the host ledger's are left out as well. The
        watchdog keeps the original deadline, so ``max_hours`` counts across every instance
        of the run.
        """
        offer, avoided, ranking = search(provider, self.spec, machines, exclude, self.cfg)
        return dataclasses.replace(
            self,
            offer=offer,
            price=offer.price(self.spec.interruptible),
            bid=offer.bid(self.spec.interruptible),
            avoided=avoided,
            ranking=ranking,
        )

    def at_entry(self, spec: RentedHost, provider: Provider) -> RentalPlan:
        """The same run on another rented entry, with its own watchdog script; the offer
        stays until :meth:`with_next_offer` (the deadline and the run stay)."""
        moved = dataclasses.replace(
            self, spec=spec, title=provider.account.title, avoided=(), ranking=()
        )
        return moved.with_deadline(self.deadline_epoch)

    def on_entry(self, spec: RentedHost, provider: Provider) -> RentalPlan:
        """The same run on another rented entry (failover to its provider), on that
        entry's first offer under its cap."""
        return self.at_entry(spec, provider).with_next_offer(provider, ())

    def watchdog_key_line(self) -> str:
        if self.spec.watchdog_key_file:
            return (
                f"the key in {self.spec.watchdog_key_file} (0600 on the instance): what you "
                "granted it, until you revoke it"
            )
        return (
            f"none sent: the instance's own key (set by {self.title}; acts on that instance only)"
        )

    def wandb_line(self) -> str:
        if self.cfg is None:
            return "not ups's: your script logs where it logs (secrets by name in `env`)"
        if self.cfg.wandb.online_on_host:
            return "online on the instance: WANDB_API_KEY goes there (wandb.online_on_host)"
        if self.wandb_sync:
            return (
                "offline on the instance (no key there); its directory is synced from this "
                "machine when the run comes home (`wandb sync`)"
            )
        return f"{self.cfg.wandb.mode} (wandb.mode)"

    def create_request(self, epoch: int) -> CreateRequest:
        """What the provider is asked to create under lease ``epoch``: no secret in it."""
        return CreateRequest(
            run_id=self.run_id,
            host=self.spec.name,
            epoch=epoch,
            image=self.spec.image,
            disk_gb=self.spec.disk_gb,
            onstart=self.onstart,
            bid_per_hour=self.bid,
        )

    def order_said(self) -> str:
        if self.spec.order != ORDER_MEASURED:
            return self.spec.order
        if self.ranking:
            return "measured (expected $ per sample, from the host ledger)"
        return "measured: no figures for this run's workload yet, so price"

    def render(self) -> str:
        s = self.spec
        kind = f"interruptible, bid ${self.bid:.3f}/h" if self.bid is not None else "on demand"
        hours = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.deadline_epoch))
        where = (
            f"picks up its instance {self.picks_up} if it still runs; else a new {self.title} "
            "instance"
            if self.picks_up is not None
            else f"on a new {self.title} instance"
        )
        if_new = "if new: " if self.picks_up is not None else ""
        lines = [
            f"rental plan: run {self.run_id} {where} ({s.name})",
            f"  offer:    {if_new}{self.offer.describe()} at ${self.price:.3f}/h ({kind}); "
            f"cap ${s.max_price_per_hour:.3f}/h",
            f"  wanted:   {OfferRequirements.of(s).describe()} ordered by {self.order_said()}",
            *(
                [f"  why:      {self.ranking[0]}", "  ranking:  (best 5, expected $ per sample)"]
                + [f"    {i}. {line}" for i, line in enumerate(self.ranking[:5], 1)]
                if self.ranking
                else []
            ),
            *(
                [
                    f"  avoiding: machine(s) {', '.join(map(str, self.avoided))} (failed here "
                    f"within ledger_ttl_h {s.ledger_ttl_h:g} h; `ups hosts` lists why)"
                ]
                if self.avoided
                else []
            ),
            f"  create:   image {s.image}, disk {s.disk_gb:g} GB, label "
            f"{self.label()}@<lease epoch>",
            f"  watchdog: on the instance from boot; ends it ({s.on_exit}) at {hours} "
            f"(max_hours {s.max_hours:g}), or {s.start_timeout_s:.0f} s after boot if no run "
            "started there (start_timeout_s)",
            f"    watchdog key: {self.watchdog_key_line()}",
            f"  then:     wait for running and SSH (up to {s.boot_timeout_s:.0f} s), record the "
            "host key" + (f", run setup: {s.setup}" if s.setup else ""),
            f"  at end:   fetch {self.deploy.remote.run_dir} -> {self.local_runs / self.run_id}, "
            f"then {s.on_exit} the instance (also on any failure or Ctrl-C)",
            f"  W&B:      {self.wandb_line()}",
            "",
            self.deploy.render(),
        ]
        return "\n".join(lines)


def build_rental_plan(
    spec: RentedHost,
    config: Path,
    provider: Provider,
    *,
    run_id: str | None = None,
    overrides: tuple[str, ...] = (),
    follow: bool = True,
    skip_preflight: bool = False,
    env: dict[str, str] | None = None,
    now: float | None = None,
    workload: ScriptWorkload | None = None,
) -> RentalPlan:
    if workload is not None:
        return _script_plan(spec, workload, provider, run_id, follow, skip_preflight, env, now)
    if spec.checkpoint_sync != "local" and not any(
        o.startswith("checkpoint_sync.url=") for o in overrides
    ):  # hosts.yaml names the bucket; an explicit --set still wins
        overrides = (*overrides, f"checkpoint_sync.url={spec.checkpoint_sync}")
    if not any(o.startswith("preflight.burn_in=") for o in overrides):
        overrides = (*overrides, f"preflight.burn_in={spec.burn_in}")
    cfg = load_run_config(config, overrides)
    wandb_sync = wandb_offline_here(cfg)
    if wandb_sync:  # no key on the host: synced from here
        overrides = (*overrides, "wandb.mode=offline")
        cfg = load_run_config(config, overrides)
    env = dict(env if env is not None else {})
    run_id = run_id or cfg.run.run_id or new_run_id(cfg.run.name)
    offer, avoided, ranking = search(provider, spec, cfg=cfg)
    deadline = (time.time() if now is None else now) + spec.max_hours * 3600.0
    deploy = build_plan(
        container_spec(spec),
        config,
        cfg=cfg,
        run_id=run_id,
        overrides=overrides,
        follow=follow,
        skip_preflight=skip_preflight,
        env=env,
    )
    deploy = rented(deploy, cfg, deadline)
    return RentalPlan(
        spec=spec,
        title=provider.account.title,
        offer=offer,
        price=offer.price(spec.interruptible),
        bid=offer.bid(spec.interruptible),
        onstart=onstart_command(spec, deadline),
        deadline_epoch=deadline,
        local_runs=cfg.run.output_dir,
        deploy=deploy,
        config=config,
        cfg=cfg,
        overrides=overrides,
        skip_preflight=skip_preflight,
        env=env,
        avoided=avoided,
        wandb_sync=wandb_sync,
        ranking=ranking,
    )


def _script_plan(
    spec: RentedHost,
    workload: ScriptWorkload,
    provider: Provider,
    run_id: str | None,
    follow: bool,
    skip_preflight: bool,
    env: dict[str, str] | None,
    now: float | None,
) -> RentalPlan:
    """The rental of your own script: the same offer search, watchdog and deadline; the
    container plan is the script's (workdir sync, setup, ``ups launch --run-file``). The
    bucket is the run file's ``checkpoint_sync``, else the host entry's."""
    if workload.checkpoint_sync is None and spec.checkpoint_sync != "local":
        workload = dataclasses.replace(workload, checkpoint_sync=spec.checkpoint_sync)
    env = dict(env if env is not None else {})
    run_id = run_id or new_run_id(workload.name)
    offer, avoided, ranking = search(provider, spec)
    deadline = (time.time() if now is None else now) + spec.max_hours * 3600.0
    deploy = build_script_plan(
        container_spec(spec),
        workload,
        run_id=run_id,
        follow=follow,
        skip_preflight=skip_preflight,
        env=env,
    )
    return RentalPlan(
        spec=spec,
        title=provider.account.title,
        offer=offer,
        price=offer.price(spec.interruptible),
        bid=offer.bid(spec.interruptible),
        onstart=onstart_command(spec, deadline),
        deadline_epoch=deadline,
        local_runs=Path("runs"),
        deploy=rented(deploy, None, deadline, workload),
        config=Path(workload.source),
        cfg=None,
        overrides=(),
        skip_preflight=skip_preflight,
        env=env,
        avoided=avoided,
        ranking=ranking,
        workload=workload,
    )


def rented(
    plan: DeployPlan, cfg: Config | None, deadline: float, workload: ScriptWorkload | None = None
) -> DeployPlan:
    """A container plan for a rented host: its bucket credentials are minted for the run
    and live until the run's ``deadline`` (plus a margin), unless the config (or a script's
    run file) says ``credentials: account``; ``WANDB_API_KEY`` stays here unless
    ``wandb.online_on_host`` (a script's secrets are the ones its run file names)."""
    if cfg is not None and not cfg.wandb.online_on_host:
        plan = dataclasses.replace(plan, secrets=[s for s in plan.secrets if s != WANDB_KEY])
    account = (
        workload.sync_credentials == "account"
        if workload is not None
        else cfg is not None and cfg.checkpoint_sync.credentials == "account"
    )
    access = plan.bucket_access
    if access is None or account:
        return plan
    scoped = dataclasses.replace(access, mode="scoped", until=deadline)
    return dataclasses.replace(plan, bucket_access=scoped)


def wandb_offline_here(cfg: Config) -> bool:
    """Whether the run would log to W&B online but logs offline on the rented host
    (its directory is synced from this machine when it comes home)."""
    return cfg.wandb.mode in ("auto", "online") and not cfg.wandb.online_on_host
