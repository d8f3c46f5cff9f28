"""A managed run's one record, persisted after every change so it outlives its process.

``runs/<id>/run.json`` (strict JSON, written atomically) holds the run's status, every
instance it ever rented (offer, machine, $/h, start, end, cost, how it ended), every
recovery (the lost instance, why, steps lost, downtime), the supervisor holding it (its
pid, host and start time), the checkpoints synced home and how the run ended. A record
written by the previous release (``supervision.json``) is still read. Whoever supervises
the run next (the same ``fab deploy`` run again, or ``ups supervise``) reads it to pick the
run up where it is; the summary and ``fab instances`` read it for cost and recoveries. A
mirror (the run's bucket, when it has one) gets every write too, so another machine can
pick the run up. Who may write it is decided by the lease
(:mod:`ups.deploy.managed.lease`): :attr:`Supervision.fence` is called before every write
and raises once the lease is lost.
"""

from __future__ import annotations

import enum
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ups import jsonio
from ups.deploy.providers import UNNAMED, Instance
from ups.fsio import atomic_write_text
from ups.outcome import Outcome

FILE = "run.json"
LEGACY_FILE = "supervision.json"
"""What the previous release called the record: read when a run has no ``run.json``."""


class RunStatus(enum.StrEnum):
    """Where a managed run stands."""

    STARTING = "starting"
    """No instance trains it yet (renting, booting, setting up)."""
    RUNNING = "running"
    RECOVERING = "recovering"
    """An instance was lost; a new one is being rented and set up."""
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    """Ended by a person (Ctrl-C, ``fab stop``, ``fab down``) or by its bounds."""


@dataclass
class Rented:
    """One instance the run rented, on any provider."""

    instance_id: str
    offer_id: str
    machine_id: str | None
    price: float
    """$/h ups pays for it (the bid for an interruptible instance)."""
    started: float
    ended: float | None = None
    end_reason: str = ""
    provider: str = UNNAMED
    """Whose instance (:data:`~ups.deploy.providers.UNNAMED` in the previous release's
    records)."""
    host: str = ""
    """The rented hosts.yaml entry it came from ("": the run's own ``host``)."""
    epoch: int | None = None
    """The lease epoch of the supervisor that created it (its label says the same)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rented:
        ids = {k: str(v) for k, v in data.items() if k in _IDS and v is not None}
        return cls(**{**data, **ids})

    def cost(self, now: float | None = None) -> float:
        end = self.ended or (time.time() if now is None else now)
        return self.price * max(0.0, end - self.started) / 3600.0


@dataclass
class Recovery:
    """One recovery of the run: what was lost, why, and what it cost in time."""

    number: int
    reason: str
    lost_instance: str | None
    """The instance that was lost (None: the run ended by itself and was relaunched)."""
    at: float
    resume_step: int = -1
    """The checkpoint step the run resumes from (-1: on the same instance, as it was)."""
    steps_lost: int = 0
    downtime_s: float | None = None
    """From detection to the first step after it (None until the run trains again)."""


_IDS = ("instance_id", "offer_id", "machine_id")
"""Ids the previous release wrote as numbers; strings on every provider now."""


@dataclass
class Moved:
    """The run moved from one rented entry (its provider) to another: why, and when."""

    from_host: str
    to_host: str
    reason: str
    at: float
    first_step_s: float | None = None
    """From the move to the first training step on the new provider (None until then)."""


@dataclass
class Supervisor:
    """The process that supervises the run (the one to signal, not a short-lived deploy)."""

    pid: int
    host: str
    started: float
    mode: str

    @classmethod
    def this_process(cls, mode: str) -> Supervisor:
        import psutil

        return cls(os.getpid(), socket.gethostname(), psutil.Process().create_time(), mode)


@dataclass
class SyncedCheckpoint:
    step: int
    at: float
    where: str
    """``local`` (copied home over SSH) or the bucket URL it was found in."""


@dataclass
class State:
    run_id: str
    host: str
    """The rented hosts.yaml entry the run was deployed with (its first provider)."""
    config: str
    """Absolute path of the run config, so ``ups supervise RUN`` can rebuild the deploy."""
    hosts_file: str | None
    overrides: list[str]
    created: float = field(default_factory=time.time)
    updated: float = 0.0
    instances: list[Rented] = field(default_factory=list)
    recoveries: int = 0
    steps_lost: int = 0
    checkpoints: list[SyncedCheckpoint] = field(default_factory=list)
    ended: str = ""
    """Empty while the run may still need supervising; else how it ended."""
    exit_code: int | None = None
    status: RunStatus = RunStatus.STARTING
    history: list[Recovery] = field(default_factory=list)
    """Every recovery, oldest first (a record of the previous release has only the count)."""
    supervisor: Supervisor | None = None
    bucket_checkpoint: int | None = None
    """The newest checkpoint step committed in the run's bucket, when it has one."""
    outcome: dict[str, Any] | None = None
    """How the run ended, as the run itself wrote it (its ``outcome.json``: outcome, cause,
    reason, step, exit code): a copy, never written here otherwise; ``ended`` and
    ``exit_code`` are what the supervisor saw (the launcher's code without one)."""
    epoch: int = 0
    """The newest lease epoch a supervisor of this run took (:mod:`.lease`): instances
    labelled with an older one that the holder did not create are ended (the fence)."""
    moves: list[Moved] = field(default_factory=list)
    """Every move of the run to another provider, oldest first."""

    def cost(self) -> float:
        """What every instance of the run cost: the one place cost is computed."""
        now = time.time()
        return sum(r.cost(now) for r in self.instances)

    def downtime_s(self) -> float:
        return sum(r.downtime_s or 0.0 for r in self.history)

    def current(self) -> Rented | None:
        """The instance the run trains on now (the newest not ended)."""
        live = [r for r in self.instances if r.ended is None]
        return live[-1] if live else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        data = dict(data)
        data["instances"] = [Rented.from_json(r) for r in data.get("instances", [])]
        data["moves"] = [Moved(**m) for m in data.get("moves", [])]
        data["checkpoints"] = [SyncedCheckpoint(**c) for c in data.get("checkpoints", [])]
        data["history"] = [
            Recovery(**{**r, "lost_instance": _str_or_none(r.get("lost_instance"))})
            for r in data.get("history", [])
        ]
        if data.get("supervisor") is not None:
            data["supervisor"] = Supervisor(**data["supervisor"])
        if "status" in data:
            data["status"] = RunStatus(data["status"])
        else:  # the previous release's record: its status follows from how it ended
            data["status"] = _legacy_status(data.get("ended", ""), data.get("exit_code"))
        return cls(**data)


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _legacy_status(ended: str, exit_code: int | None) -> RunStatus:
    if not ended:
        return RunStatus.RUNNING
    if exit_code == 0:
        return RunStatus.FINISHED
    return RunStatus.FAILED if exit_code is not None else RunStatus.STOPPED


Mirror = Callable[[str, bytes], None]
"""Called with (name, bytes) after every local write: the bucket, when the run has one."""


class Supervision:
    """The state of one run and the one way it changes: each method saves it at once."""

    def __init__(self, path: Path, state: State, mirror: Mirror | None = None) -> None:
        self.path = path
        self.state = state
        self.mirror = mirror
        self.fence: Callable[[], None] | None = None
        """The lease's check: raises when this process may no longer write the record."""
        self._lock = threading.RLock()  # the checkpoint sync thread saves too

    @classmethod
    def load_or_new(
        cls, run_dir: Path, fresh: State, mirror: Mirror | None = None
    ) -> tuple[Supervision, bool]:
        """The run's saved state (True), or ``fresh`` when it has none yet (False)."""
        saved = load(run_dir)
        return cls(run_dir / FILE, saved or fresh, mirror), saved is not None

    def save(self) -> None:
        with self._lock:
            if self.fence is not None:
                self.fence()
            self.state.updated = time.time()
            text = jsonio.dumps(asdict(self.state), indent=2) + "\n"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, text)
            if self.mirror is not None:
                self.mirror(FILE, text.encode())

    def rented(
        self,
        instance_id: str,
        offer_id: str,
        machine_id: str | None,
        price: float,
        *,
        provider: str,
        host: str,
        epoch: int | None,
    ) -> Rented:
        rec = Rented(
            instance_id, offer_id, machine_id, price, time.time(),
            provider=provider, host=host, epoch=epoch,
        )  # fmt: skip
        self.state.instances.append(rec)
        self.save()
        return rec

    def took_lease(self, epoch: int) -> None:
        """This supervisor holds the run under ``epoch`` (newer than any before)."""
        self.state.epoch = max(self.state.epoch, epoch)
        self.save()

    def moved(self, from_host: str, to_host: str, reason: str) -> Moved:
        """The run continues on another rented entry (another provider)."""
        move = Moved(from_host, to_host, reason, time.time())
        self.state.moves.append(move)
        self.save()
        return move

    def stray_ended(self, provider: str, inst: Instance, why: str) -> None:
        """An instance of the run that a supervisor of an older epoch created, ended by
        this one (the fence): kept with its cost so far and why."""
        now = time.time()
        run = inst.run
        self.state.instances.append(
            Rented(
                inst.id, "", inst.machine_id, inst.price_per_hour, now - inst.uptime_s,
                ended=now, end_reason=f"stray: {why}", provider=provider,
                host=run.host if run else "", epoch=run.epoch if run else None,
            )
        )  # fmt: skip
        self.save()

    def machine(self, instance_id: str, machine_id: str | None) -> None:
        for rec in self.state.instances:
            if rec.instance_id == instance_id:
                rec.machine_id = machine_id
        self.save()

    def instance_ended(self, instance_id: str, reason: str) -> None:
        for rec in self.state.instances:
            if rec.instance_id == instance_id and rec.ended is None:
                rec.ended, rec.end_reason = time.time(), reason
        self.save()

    def supervised_by(self, supervisor: Supervisor) -> None:
        self.state.supervisor = supervisor
        self.save()

    def status(self, status: RunStatus) -> None:
        if self.state.status is not status:
            self.state.status = status
            self.save()

    def recovery(self, reason: str, lost_instance: str | None) -> Recovery:
        """Count one recovery (the run is recovering until its first step after it)."""
        rec = Recovery(self.state.recoveries + 1, reason, lost_instance, time.time())
        self.state.recoveries += 1
        self.state.history.append(rec)
        self.state.status = RunStatus.RECOVERING
        self.save()
        return rec

    def resumes_from(self, step: int, steps_lost: int) -> None:
        """Where the latest recovery resumes, and the steps it recomputes."""
        self.state.steps_lost += steps_lost
        if self.state.history:
            self.state.history[-1].resume_step = step
            self.state.history[-1].steps_lost = steps_lost
        self.save()

    def trains_again(self, downtime_s: float | None) -> None:
        """The first step after a recovery (or the first of the run)."""
        if downtime_s is not None and self.state.history:
            self.state.history[-1].downtime_s = downtime_s
        move = self.state.moves[-1] if self.state.moves else None
        if move is not None and move.first_step_s is None:
            move.first_step_s = time.time() - move.at
        self.state.status = RunStatus.RUNNING
        self.save()

    def bucket_has(self, step: int) -> None:
        with self._lock:
            if self.state.bucket_checkpoint is None or step > self.state.bucket_checkpoint:
                self.state.bucket_checkpoint = step
                self.save()

    def synced(self, step: int, where: str = "local") -> None:
        with self._lock:
            self.state.checkpoints.append(SyncedCheckpoint(step, time.time(), where))
            self.save()

    def finished(self, how: str, exit_code: int | None, outcome: Outcome | None = None) -> None:
        self.state.ended, self.state.exit_code = how, exit_code
        if outcome is not None:
            self.state.outcome = {k: getattr(outcome, k) for k in OUTCOME_VIEW}
        self.state.status = (
            RunStatus.FINISHED
            if exit_code == 0
            else RunStatus.STOPPED
            if exit_code is None or exit_code in STOPPED_CODES
            else RunStatus.FAILED
        )
        self.save()


OUTCOME_VIEW = ("outcome", "cause", "reason", "step", "exit_code", "time")
"""The fields of ``outcome.json`` the record copies (the file stays the truth)."""
STOPPED_CODES = frozenset({75, 130, 143})
"""Exit codes of a run stopped on purpose: preempted (75), SIGINT (130), SIGTERM (143)."""


def load(run_dir: Path) -> State | None:
    """The run's record in ``run_dir`` (the previous release's name too), or None when it
    was never supervised."""
    for name in (FILE, LEGACY_FILE):
        path = run_dir / name
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        return parse(text, str(path))
    return None


def parse(text: str, where: str) -> State:
    from ups.deploy.errors import DeployError

    try:
        return State.from_json(json.loads(text))
    except (ValueError, TypeError) as err:
        raise DeployError(
            f"{where} is not a supervision state ups can read ({err}). It is rewritten on "
            "every change, so a damaged one means something else wrote it: move it aside "
            "and deploy with --run again (the run continues from its newest checkpoint)."
        ) from None


def all_runs(runs_dir: Path) -> list[State]:
    """Every supervised run under ``runs_dir`` (``fab instances``), oldest first."""
    found = []
    if runs_dir.is_dir():
        for run_dir in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
            if (state := load(run_dir)) is not None:
                found.append(state)
    return sorted(found, key=lambda s: s.created)
