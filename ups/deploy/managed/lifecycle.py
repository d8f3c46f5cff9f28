"""Carry out a :class:`RentalPlan`: create, wait for running and SSH, deploy, fetch, end.

Each phase is its own method so a recovery loop (outbid, vanished host) can run them
again for a new instance. Every instance this object creates, or finds by its label after
a create that errored, is in :attr:`Lifecycle.created`; :meth:`Lifecycle.teardown` ends
each one per ``on_exit`` whatever happened before (exception, Ctrl-C, SIGTERM, SIGHUP).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import paramiko

from ups.deploy.errors import DeployError, HostKeyChanged
from ups.deploy.frontend import command
from ups.deploy.managed.faults import HostFault, UserFault
from ups.deploy.managed.rental_plan import RentalPlan, container_spec
from ups.deploy.onhost.fetch import fetch as fetch_run
from ups.deploy.providers import Instance, Provider, ProviderApiError, Side
from ups.deploy.providers import InstanceState as State
from ups.deploy.transport import remote as rc
from ups.deploy.transport.connect import connect
from ups.deploy.transport.hostkeys import known_hosts_name, load_into, save_host_keys
from ups.deploy.transport.session import Target, write_private
from ups.deploy.transport.session import run as run_remote
from ups.deploy.transport.stream import STOP_REQUESTED

DESTROY_VERIFY_S = 60.0
"""How long a destroyed instance may still be listed before ups says it may be billing."""
FETCH_LEASE_S = 1800.0
"""How long a fetch may hold the watchdog back (it waits for the lease, then acts)."""


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (terminal closed) raise KeyboardInterrupt, like Ctrl-C; each of
    the three also sets :data:`~ups.deploy.transport.stream.STOP_REQUESTED`, so a KeyboardInterrupt
    that a library swallows is raised again by the log follower."""

    def handler(signum: int, frame: FrameType | None) -> None:
        STOP_REQUESTED.set()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise KeyboardInterrupt(signal.Signals(signum).name)

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        STOP_REQUESTED.clear()


@contextlib.contextmanager
def uninterruptible() -> Iterator[None]:
    """Ignore Ctrl-C/SIGTERM/SIGHUP while instances are being ended."""
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in sigs}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _unfenced() -> None:
    pass


class Lifecycle:
    def __init__(
        self,
        provider: Provider,
        plan: RentalPlan,
        known_hosts: Path,
        out: Any,
        fence: Callable[[], None] = _unfenced,
        epoch: int = 0,
    ) -> None:
        self.provider = provider
        self.fence = fence
        """The supervisor's lease check, before every create, stop and destroy and every
        SSH step that changes the host (setup, checkpoint upload, start)."""
        self.epoch = epoch
        """The supervisor's lease epoch: every instance it creates carries it in its label."""
        self.plan = plan
        self.known_hosts = known_hosts
        self.out = out
        self.created: list[str] = []
        self.timings: dict[str, float] = {}
        self._t0 = time.monotonic()

    def move_to(self, provider: Provider, plan: RentalPlan, reason: str) -> None:
        """Rent from another provider from now on: the instances created on this one are
        ended per on_exit first (never two providers billing one run)."""
        for problem in self.teardown(reason):
            self.say(f"warning: {problem}")
        self.created.clear()
        self.provider, self.plan = provider, plan

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def mark(self, phase: str) -> None:
        self.timings[phase] = time.monotonic() - self._t0

    # -- phases -------------------------------------------------------------------------
    def create(self) -> str:
        """Create an instance from the plan's offer; then end any duplicate the API made.

        A create is not idempotent: one that timed out at a gateway may have made an
        instance, and its retry a second. After every create, failed or not, the run's
        label is listed and every instance carrying it that ups does not use is destroyed.
        """
        plan = self.plan
        request = plan.create_request(self.epoch)
        self.fence()
        self.say(f"creating instance from {plan.offer.describe()} at ${plan.price:.3f}/h")
        try:
            instance_id = self.provider.create(plan.offer, request)
        except ProviderApiError:
            self.reconcile(None)  # a create that errored may still have made an instance
            raise
        self.created.append(instance_id)
        self.say(f"created instance {instance_id} ({request.label})")
        self.reconcile(instance_id)
        self.mark("create")
        return instance_id

    def reconcile(self, using: str | None) -> list[str]:
        """Destroy every instance labelled for this run that ups did not mean to have.

        ``using`` is the instance just created (None after a failed create); instances
        this deploy made on purpose earlier (a lost one kept per on_exit) are left to
        :meth:`teardown`. Returns the ids destroyed.
        """
        try:
            listed = self.provider.list(self.plan.run_id)
        except ProviderApiError as err:
            self.say(f"warning: could not list instances to look for a duplicate: {err}")
            return []
        extra = [i.id for i in listed if i.id != using and i.id not in self.created]
        for instance_id in extra:
            why = "a retried create" if using is not None else "the failed create"
            self.say(
                f"found instance {instance_id} with this run's label, made by {why} and not "
                f"used: destroying it"
            )
            self.created.append(instance_id)  # teardown retries it if this destroy fails
            try:
                self.destroy(instance_id, f"duplicate from {why}")
            except DeployError as err:
                self.say(f"warning: could not destroy duplicate instance {instance_id} yet: {err}")
        return extra

    def wait_running(self, instance_id: str, deadline: float) -> Instance:
        """Poll until RUNNING; FAILED (image pull...), GONE or the deadline raise."""
        delays = self.provider.backoff.running.delays()
        last: Instance | None = None
        while time.monotonic() < deadline:
            last = self.provider.get(instance_id)
            state = last.state if last else State.GONE
            if state is State.RUNNING and last and last.ssh_host and last.ssh_port:
                self.say(f"instance {instance_id} running; ssh {last.ssh_host}:{last.ssh_port}")
                self.mark("running")
                return last
            # OUTBID while booting is a bid not (yet) scheduled: keep waiting to the deadline.
            if state in (State.FAILED, State.GONE, State.STOPPED):
                msg = last.status_message if last else "the API no longer lists it"
                raise self._will_not_run(instance_id, state, msg or "no message", last)
            time.sleep(next(delays))  # polling the API; backoff keeps within its rate limit
        status = f"{last.state.value}, {last.status_message or 'no message'}" if last else "unknown"
        raise HostFault(
            f"instance {instance_id} did not reach running within "
            f"{self.plan.spec.boot_timeout_s:.0f} s (last status: {status}). Raise "
            "boot_timeout_s in hosts.yaml for big images, or deploy again for another offer.",
            f"never reached running in {self.plan.spec.boot_timeout_s:.0f} s ({status})",
        )

    def _will_not_run(
        self, instance_id: str, state: State, msg: str, inst: Instance | None
    ) -> HostFault | UserFault:
        """The instance's status says it never will run: whose fault, per the provider."""
        fault = self.provider.fault_of(inst) if inst is not None else None
        if fault is not None and fault.side is Side.USER:
            return UserFault(
                f"instance {instance_id} will not run ({state.value}): {msg}. That is "
                f"{fault.meaning}, which every host would repeat, so no other offer is tried. "
                f"Check 'image' in hosts.yaml ({self.plan.spec.image}): it must exist and be "
                f"public, or pushed where {self.plan.title} can pull it with a login."
            )
        meaning = fault.meaning if fault is not None else f"the instance is {state.value}"
        return HostFault(
            f"instance {instance_id} will not run ({state.value}): {msg}. That is {meaning}: "
            "a fault of this machine, not of the run.",
            f"{meaning}: {msg}",
        )

    def reached(self, inst: Instance) -> bool:
        """Whether ups has reached this instance over SSH before (its host key recorded)."""
        assert inst.ssh_host and inst.ssh_port
        return knows_host(self.known_hosts, known_hosts_name(inst.ssh_host, inst.ssh_port))

    def wait_ssh(self, inst: Instance, deadline: float) -> Target:
        """Retry SSH with backoff until it answers (keys may arrive after 'running')."""
        assert inst.ssh_host and inst.ssh_port
        spec = container_spec(self.plan.spec, inst.ssh_host, inst.ssh_port)
        forget_host_key(self.known_hosts, known_hosts_name(inst.ssh_host, inst.ssh_port))
        self.say(f"waiting for SSH on {inst.ssh_host}:{inst.ssh_port} (keys arrive after running)")
        delays = self.provider.backoff.ssh.delays()
        last: DeployError | None = None
        while time.monotonic() < deadline:
            try:
                conn = connect(spec, self.known_hosts, attempts=1)
            except HostKeyChanged:
                raise
            except DeployError as err:
                last = err
                time.sleep(next(delays))  # sshd up but keys not installed yet, or not listening
                continue
            conn.close()
            self.mark("ssh")
            self.say(f"ssh ready on {inst.ssh_host}:{inst.ssh_port}, host key recorded")
            return Target(spec=spec, known_hosts=self.known_hosts, out=self.out)
        raise HostFault(
            f"instance {inst.id} never answered SSH at {inst.ssh_host}:{inst.ssh_port} within "
            f"{self.plan.spec.boot_timeout_s:.0f} s: {last}. Check that your SSH public key is "
            f"on your {self.plan.title} account ({self.provider.account.key_page}) and 'key' in "
            "hosts.yaml.",
            f"SSH never answered within {self.plan.spec.boot_timeout_s:.0f} s",
        )

    def prepare(self, target: Target, watchdog_key: str | None) -> None:
        """Workdir, the watchdog's scoped key (0600), and the entry's setup command."""
        spec = target.spec
        self.fence()  # it changes the host: only the run's supervisor may
        conn = target.connect()
        try:
            watch_dir = self.plan.watchdog_file(spec.workdir)
            run_remote(conn, rc.argv("mkdir", "-p", watch_dir), spec)
            if watchdog_key:
                write_private(conn, self.plan.watchdog_key_file(spec.workdir), watchdog_key)
            if setup := self.plan.spec.setup:
                self.say(f"setup on instance: {setup}")
                # `setup` is the user's own shell line from hosts.yaml, like remote_env.
                result = run_remote(conn, rc.in_dir(spec.workdir, setup), spec)
                if result.exited != 0:
                    raise DeployError(
                        f"setup command {setup!r} failed on the instance (exit "
                        f"{result.exited}): {(result.stderr or result.stdout).strip()[-600:]}. "
                        "Fix 'setup' in hosts.yaml."
                    )
        finally:
            conn.close()

    def fetch(self, target: Target, exclude: Sequence[str] = ()) -> None:
        """Hold the watchdog back with a lease, then copy the run directory home (all but
        ``exclude``: the checkpoints already synced)."""
        self.fence()
        conn = target.connect()
        try:
            lease = self.plan.watchdog_lease_file(target.spec.workdir)
            until = time.time() + FETCH_LEASE_S
            run_remote(conn, rc.write_word_command(lease, f"{until:.0f}"), target.spec)
        finally:
            conn.close()
        fetch_run(target, self.plan.run_id, self.plan.local_runs, exclude)

    def teardown(self, reason: str) -> list[str]:
        """End every created instance per on_exit; return problems (never raises)."""
        on_exit = self.plan.spec.on_exit
        problems = []
        with uninterruptible():
            for instance_id in self.created:
                try:
                    self.end(instance_id, on_exit, reason)
                except DeployError as err:
                    problems.append(
                        f"could NOT {on_exit} instance {instance_id}: {err} It may still be "
                        f"billing: run {self._down()} or destroy it at "
                        f"{self.provider.account.console}."
                    )
        return problems

    def _down(self) -> str:
        """The command that destroys this run's instance."""
        return command("down", "--host", self.plan.spec.name, "--run", self.plan.run_id)

    def end(
        self, instance_id: str, on_exit: str, reason: str, provider: Provider | None = None
    ) -> None:
        """End one instance per ``on_exit`` (destroy, stop, keep) and say so with its cost
        (on ``provider``, default the one the run rents from now)."""
        provider = provider or self.provider
        inst = provider.get(instance_id)
        cost = f", about ${inst.cost_so_far:.2f} so far" if inst else ""
        if on_exit == "keep":
            self.say(
                f"KEPT instance {instance_id} ({self.plan.label}) running ({reason}){cost}; "
                f"it bills until {self._down()}."
            )
            return
        if inst is None:
            self.say(f"instance {instance_id} is already gone")
            return
        if on_exit == "stop":
            self.fence()
            provider.stop(instance_id)
            self.say(f"stopped instance {instance_id} ({reason}){cost}; its disk still bills")
            return
        self.destroy(instance_id, reason, cost, provider=provider)

    def destroy(
        self, instance_id: str, reason: str, cost: str = "", provider: Provider | None = None
    ) -> None:
        """Destroy (retried on server errors, ``ups.retry.API_RETRY``), then show the
        instance until the API no longer lists it running; raise if it still is."""
        provider = provider or self.provider
        self.fence()
        provider.destroy(instance_id)
        deadline = time.monotonic() + DESTROY_VERIFY_S
        delays = provider.backoff.destroy.delays()
        while True:
            inst = provider.get(instance_id)
            if inst is None or inst.state is not State.RUNNING:
                break
            if time.monotonic() >= deadline:
                raise ProviderApiError(
                    f"instance {instance_id} is still listed running {DESTROY_VERIFY_S:.0f} s "
                    "after the API accepted its destroy."
                )
            time.sleep(next(delays))  # polling the API until the destroy shows
        self.say(f"destroyed instance {instance_id} ({reason}){cost}")

    def discard(self, instance_id: str, reason: str) -> None:
        """Destroy an instance on a bad machine whatever ``on_exit`` says: nothing on it is
        worth keeping, and it must not bill."""
        self.destroy(instance_id, reason)
        self.created.remove(instance_id)


def knows_host(known_hosts: Path, name: str) -> bool:
    """Whether a key is recorded for this address (a supervisor reached it before)."""
    if not known_hosts.exists():
        return False
    client = paramiko.SSHClient()
    load_into(client, known_hosts)
    return name in client.get_host_keys()


def forget_host_key(known_hosts: Path, name: str) -> None:
    """Drop a recorded key for an address the provider just handed to a new instance."""
    if not known_hosts.exists():
        return
    client = paramiko.SSHClient()
    load_into(client, known_hosts)
    keys = client.get_host_keys()
    if name in keys:
        del keys[name]
        save_host_keys(keys, known_hosts)


def describe_timings(timings: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
