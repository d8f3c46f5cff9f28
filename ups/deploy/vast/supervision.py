"""A vast run's supervision state, persisted after every change so it outlives its process.

``runs/<id>/supervision.json`` (strict JSON, written atomically) says which instances the
run rented (offer, machine, price, when, why each ended), how many recoveries it used, the
checkpoints synced home and how the run ended. Whoever supervises the run next (the same
``fab deploy`` run again, or ``ups supervise``) reads it to pick the run up where it is;
``fab instances`` reads it to show cost and recoveries. A mirror (the run's bucket, when it
has one) gets every write too, so another machine can pick the run up. Who may write it is
decided by the lease (:mod:`ups.deploy.vast.lease`): :attr:`Supervision.fence` is called
before every write and raises once the lease is lost.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ups import jsonio
from ups.fsio import atomic_write_text

FILE = "supervision.json"


@dataclass
class Rented:
    """One instance the run rented."""

    instance_id: int
    offer_id: int
    machine_id: int | None
    price: float
    """$/h ups pays for it (the bid for an interruptible instance)."""
    started: float
    ended: float | None = None
    end_reason: str = ""

    def cost(self, now: float | None = None) -> float:
        end = self.ended or (time.time() if now is None else now)
        return self.price * max(0.0, end - self.started) / 3600.0


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
    """The hosts.yaml entry (``kind: vast``) the run was deployed with."""
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

    def cost(self) -> float:
        now = time.time()
        return sum(r.cost(now) for r in self.instances)

    def current(self) -> Rented | None:
        """The instance the run trains on now (the newest not ended)."""
        live = [r for r in self.instances if r.ended is None]
        return live[-1] if live else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        data = dict(data)
        data["instances"] = [Rented(**r) for r in data.get("instances", [])]
        data["checkpoints"] = [SyncedCheckpoint(**c) for c in data.get("checkpoints", [])]
        return cls(**data)


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
        self, instance_id: int, offer_id: int, machine_id: int | None, price: float
    ) -> Rented:
        rec = Rented(instance_id, offer_id, machine_id, price, time.time())
        self.state.instances.append(rec)
        self.save()
        return rec

    def machine(self, instance_id: int, machine_id: int | None) -> None:
        for rec in self.state.instances:
            if rec.instance_id == instance_id:
                rec.machine_id = machine_id
        self.save()

    def instance_ended(self, instance_id: int, reason: str) -> None:
        for rec in self.state.instances:
            if rec.instance_id == instance_id and rec.ended is None:
                rec.ended, rec.end_reason = time.time(), reason
        self.save()

    def recovered(self, recoveries: int, steps_lost: int) -> None:
        self.state.recoveries, self.state.steps_lost = recoveries, steps_lost
        self.save()

    def synced(self, step: int, where: str = "local") -> None:
        with self._lock:
            self.state.checkpoints.append(SyncedCheckpoint(step, time.time(), where))
            self.save()

    def finished(self, how: str, exit_code: int | None) -> None:
        self.state.ended, self.state.exit_code = how, exit_code
        self.save()


def load(run_dir: Path) -> State | None:
    """The saved state of the run in ``run_dir``, or None when it was never supervised."""
    path = run_dir / FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return parse(text, str(path))


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
        for path in sorted(runs_dir.glob(f"*/{FILE}")):
            found.append(parse(path.read_text(), str(path)))
    return sorted(found, key=lambda s: s.created)
