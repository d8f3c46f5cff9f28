"""FAKE Vast REST API on 127.0.0.1, serving exactly the paths the real ``vastai`` SDK calls.

Only Vast's control plane is fake. Each instance it creates is a real local machine
(:mod:`tests.fake_machines`: an sshd as PID 1 of its own PID and mount namespace, its disk
over the hosts entry's workdir) with ``CONTAINER_ID``/``CONTAINER_API_KEY`` in its init
environment (as on Vast) and the onstart script run at boot. Stopping or destroying it
kills every process of the instance: sshd, sessions, the run, the watchdog.

The HTTP side (the paths, the offers, the search query's operators) is
:mod:`tests.fake_vast_api`; this module is the account's state and its real instances.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import shlex
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_fixtures import VENV_BIN, _keygen
from tests.fake_machines import LocalMachine
from tests.fake_vast_api import OFFER_FIELDS, default_offers, handler, matches

PULL_ERROR = (
    "Error response from daemon: pull access denied for {image}, repository does not exist "
    "or may require 'docker login': denied: requested access to the resource is denied"
)


@dataclass
class FakeInstance:
    id: int
    offer: dict[str, Any]
    image: str
    label: str
    onstart: str
    env: dict[str, str]
    disk_gb: float
    bid: float | None
    container_key: str
    machine: LocalMachine
    """The real machine the instance is (:mod:`tests.fake_machines`)."""
    start_date: float = field(default_factory=time.time)
    actual_status: str | None = "loading"
    intended_status: str = "running"
    cur_state: str = "running"
    status_msg: str = ""
    billed_s: dict[str, float] = field(default_factory=lambda: {"running": 0.0, "stopped": 0.0})
    seed: dict[str, str] = field(default_factory=dict)
    """Files (relative to the disk's workspace) written before boot: test fault switches."""
    _since: float = field(default_factory=time.monotonic)

    @property
    def root(self) -> Path:
        return self.machine.root

    @property
    def port(self) -> int | None:
        return self.machine.port

    @property
    def dph_total(self) -> float:
        if self.bid is not None:
            return self.bid
        return float(self.offer["dph_total"])

    def tick(self) -> None:
        """Bill the time since the last tick in the state the instance was in."""
        now = time.monotonic()
        key = "running" if self.actual_status in ("running", "loading") else "stopped"
        self.billed_s[key] += now - self._since
        self._since = now

    def row(self) -> dict[str, Any]:
        ports = {"22/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(self.port)}]}
        return {
            "id": self.id, "label": self.label, "actual_status": self.actual_status,
            "intended_status": self.intended_status, "cur_state": self.cur_state,
            "next_state": self.cur_state, "status_msg": self.status_msg,
            "ssh_host": "127.0.0.1" if self.port else None, "ssh_port": self.port,
            "public_ipaddr": "127.0.0.1", "ports": ports if self.port else {},
            "dph_total": self.dph_total, "is_bid": self.bid is not None,
            "start_date": self.start_date, "extra_env": [[k, v] for k, v in self.env.items()],
            "image_uuid": self.image, "gpu_name": self.offer["gpu_name"],
            "num_gpus": self.offer["num_gpus"], "disk_space": self.disk_gb,
            "machine_id": self.offer["machine_id"], "host_id": self.offer.get("host_id"),
            "onstart": self.onstart,
        }  # fmt: skip


@dataclass
class Switches:
    """Fault injection; tests flip these between requests."""

    reject_auth: bool = False
    rate_limit_next: int = 0
    create_error_after_create: bool = False
    never_running: bool = False
    image_pull_fails: bool = False
    boot_s: float = 0.5
    key_delay_s: float = 1.0
    container_key_can_destroy: bool = False
    auth_error_status: int = 401
    """The HTTP status of a refused key's ``auth_error`` answer (Vast sends 404 on some paths)."""


@dataclass
class HostFaults:
    """Faults of particular machines and images, as a bad Vast host shows them (tests set
    these before the deploy; each is keyed by what the real fault follows)."""

    status_msg: dict[int, str] = field(default_factory=dict)
    """machine_id -> the status message its instances show instead of ever running (a
    host-side container error such as the NVML one)."""
    small_shm: set[int] = field(default_factory=set)
    """machine_ids whose instances get a 64 MiB /dev/shm (Docker's default): they run and
    answer SSH, and ups's real shm preflight check fails there."""
    slow: dict[int, float] = field(default_factory=dict)
    """machine_id -> the share of time its instances' Python processes may run once they
    have run ``SLOW_AFTER_S``: the rest of every 50 ms they are stopped (SIGSTOP/SIGCONT),
    a machine that slows down under sustained load. ups's real burn-in measures it."""
    missing_images: set[str] = field(default_factory=set)
    """Images no registry has: every host shows ``manifest unknown`` for them."""
    create_retry_after_create: int = 0
    """The next N creates make the instance, then answer 504 (a gateway timeout), so the
    client retries them."""
    destroy_fails: int = 0
    """The next N destroys answer 500 and leave the instance as it was."""
    taken_offers: set[int] = field(default_factory=set)
    """Offers someone else rents between our search and our create: the create is refused
    the way Vast refuses it (HTTP 400, ``no_such_ask``)."""


class FakeVast:
    """The FAKE Vast control plane plus real instances; use as a context manager."""

    def __init__(self, root: Path, workdir: Path, account_keys: list[Path]) -> None:
        self.root = root
        self.workdir = workdir
        self.account_keys = account_keys
        self.api_key = "fake-account-" + secrets.token_hex(8)
        self.scoped_keys: set[str] = set()
        self.offers = default_offers()
        self.switches = Switches()
        self.host_faults = HostFaults()
        self.instances: dict[int, FakeInstance] = {}
        self.destroyed: dict[int, FakeInstance] = {}
        self.vanished: dict[int, FakeInstance] = {}
        self.disk_seeds: list[dict[str, str]] = []
        """Per created instance, in creation order: files put on its disk before boot."""
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.RLock()
        self._ids = itertools.count(7000001)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeVast:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        for inst in list(self.instances.values()):
            self._kill(inst)

    # -- what tests look at -------------------------------------------------------------
    def live(self) -> list[FakeInstance]:
        with self.lock:
            return list(self.instances.values())

    def wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.live():
                return True
            time.sleep(0.5)  # polling the fake's own state
        return False

    # -- the API ------------------------------------------------------------------------
    def authorize(self, key: str, method: str, path: str) -> str | None:
        """None when allowed, else the reason (401 body)."""
        if self.switches.reject_auth:
            return "Invalid user key"
        if key == self.api_key or key in self.scoped_keys:
            return None
        for inst in self.live():
            if key == inst.container_key:
                own = re.fullmatch(rf"/api/v0/instances/{inst.id}/", path)
                if own and (method != "DELETE" or self.switches.container_key_can_destroy):
                    return None
                return "instance key may only manage its own instance"
        return "Invalid user key"

    def search(self, q: dict[str, Any]) -> tuple[int, Any]:
        storage = float(q.pop("allocated_storage", 5.0))
        order = q.pop("order", [["score", "desc"]])
        for key in ("type", "limit", "disable_bundling"):
            q.pop(key, None)
        unknown = sorted(set(q) - OFFER_FIELDS)
        if unknown:
            return 400, {"success": False, "error": "invalid_args",
                         "msg": f"unknown search field(s): {', '.join(unknown)}"}  # fmt: skip
        rows = []
        for offer in self.offers:
            row = {**offer, "dph_total": round(
                offer["dph_base"] + offer["storage_cost"] * storage / 730.0, 4)}  # fmt: skip
            if all(matches(row.get(k), cond) for k, cond in q.items()):
                rows.append(row)
        for key, direction in reversed(order):
            if key in ("score",):
                continue
            rows.sort(key=lambda r: r.get(key) or 0, reverse=direction == "desc")
        return 200, {"offers": rows}

    def create(self, offer_id: int, body: dict[str, Any]) -> tuple[int, Any]:
        offer = next((o for o in self.offers if o["id"] == offer_id), None)
        if offer is None:
            return 404, {"success": False, "error": "no_such_ask", "msg": "offer not found"}
        if offer_id in self.host_faults.taken_offers:
            msg = f"Instance type by id {offer_id} is no longer available."
            return 400, {"success": False, "error": "no_such_ask", "msg": msg}
        _status, found = self.search({"id": {"eq": offer_id}, "allocated_storage": body["disk"]})
        instance_id = next(self._ids)
        inst = FakeInstance(
            id=instance_id, offer=found["offers"][0], image=str(body.get("image")),
            label=str(body.get("label") or ""), onstart=str(body.get("onstart") or ""),
            env=dict(body.get("env") or {}), disk_gb=float(body["disk"]),
            bid=body.get("price"), container_key="fake-container-" + secrets.token_hex(8),
            machine=LocalMachine(self.root / "instances" / str(instance_id), str(self.workdir)),
        )  # fmt: skip
        with self.lock:
            inst.seed = self.disk_seeds.pop(0) if self.disk_seeds else {}
            self.instances[inst.id] = inst
        threading.Thread(target=self._boot, args=(inst,), daemon=True).start()
        if self.host_faults.create_retry_after_create > 0:
            self.host_faults.create_retry_after_create -= 1
            return 504, {"success": False, "error": "gateway_timeout", "msg": "gateway timeout"}
        if self.switches.create_error_after_create:
            return 500, {"success": False, "error": "server_error", "msg": "gateway timeout"}
        return 200, {"success": True, "new_contract": inst.id}

    def set_state(self, inst: FakeInstance, body: dict[str, Any]) -> dict[str, Any]:
        if "label" in body:
            inst.label = str(body["label"])
        if body.get("state") == "stopped":
            inst.tick()
            self._kill(inst)
            inst.actual_status, inst.cur_state = "exited", "stopped"
            inst.intended_status = "stopped"
        return {"success": True}

    def outbid(self, instance_id: int) -> None:
        """What Vast shows when a higher bid takes the machine: stopped, still wanted running.

        The instance is stopped for real (every process in it killed, SSH refused) and the
        machine is rented by the higher bidder, so its offer leaves the search results.
        """
        inst = self.instances[instance_id]
        inst.tick()
        self._kill(inst)
        inst.actual_status, inst.cur_state, inst.intended_status = "exited", "stopped", "running"
        self._take_offer(inst, "rented", True)

    def vanish(self, instance_id: int) -> None:
        """A host that dies with its machine: gone from the API, its SSH port refusing."""
        with self.lock:
            inst = self.instances.pop(instance_id)
            self.vanished[instance_id] = inst
        inst.tick()
        self._kill(inst)
        self._take_offer(inst, "rentable", False)

    def resume(self, instance_id: int) -> None:
        """Vast starting an outbid instance again once its bid wins: it boots as before."""
        inst = self.instances[instance_id]
        inst.tick()
        inst.cur_state = "running"
        self._start(inst)
        inst.actual_status = "running"
        (inst.root / "ssh" / "authorized_keys").write_text(
            "".join(k.with_suffix(".pub").read_text() for k in self.account_keys)
        )

    def _take_offer(self, inst: FakeInstance, key: str, value: bool) -> None:
        with self.lock:
            for offer in self.offers:
                if offer["id"] == inst.offer["id"]:
                    offer[key] = value

    def destroy(self, instance_id: int) -> None:
        """Kill the instance's processes, then drop it from the listing: a test that sees
        the listing empty (``wait_empty``) may assert that nothing of it still runs."""
        with self.lock:
            inst = self.instances[instance_id]
        inst.tick()
        self._kill(inst)
        with self.lock:
            self.instances.pop(instance_id, None)
            self.destroyed[instance_id] = inst

    # -- real instances -----------------------------------------------------------------
    def _boot(self, inst: FakeInstance) -> None:
        time.sleep(self.switches.boot_s)  # image pull and container start
        if self.switches.image_pull_fails:
            inst.status_msg = PULL_ERROR.format(image=inst.image)
            return
        if self.switches.never_running or inst.id not in self.instances:
            return
        if self._host_fault(inst):
            return
        self._start(inst)
        inst.tick()
        inst.actual_status = "running"
        time.sleep(self.switches.key_delay_s)  # Vast installs the account keys after this
        keys = "".join(k.with_suffix(".pub").read_text() for k in self.account_keys)
        (inst.root / "ssh" / "authorized_keys").write_text(keys)

    def _host_fault(self, inst: FakeInstance) -> bool:
        """Show the instance's image or machine fault instead of running; True when one."""
        faults = self.host_faults
        if inst.image in faults.missing_images:
            inst.status_msg = (
                f"Error response from daemon: manifest for {inst.image} not found: "
                "manifest unknown: manifest unknown"
            )
            return True
        msg = faults.status_msg.get(int(inst.offer["machine_id"]))
        if msg:
            inst.actual_status = "created"
            inst.status_msg = msg
            return True
        return False

    def _start(self, inst: FakeInstance) -> None:
        env = {
            **inst.env, "CONTAINER_ID": str(inst.id), "CONTAINER_API_KEY": inst.container_key,
            "ONSTART": inst.onstart, "ONSTART_LOG": str(inst.root / "onstart.log"),
        }  # fmt: skip
        machine_id = int(inst.offer["machine_id"])
        inst.machine.boot(
            env,
            '(setsid sh -c "$ONSTART" > "$ONSTART_LOG" 2>&1 < /dev/null &); exec {sshd} -D',
            seed=inst.seed,
            small_shm=machine_id in self.host_faults.small_shm,
            slow=self.host_faults.slow.get(machine_id),
        )

    def _kill(self, inst: FakeInstance) -> None:
        """End the instance's PID namespace: every process in it dies with its PID 1."""
        inst.machine.kill()
        inst.actual_status = "exited" if inst.actual_status == "running" else inst.actual_status

    def namespace_pids(self, inst: FakeInstance) -> list[int]:
        """Pids (host view) of processes in the instance's namespace: empty once it is gone."""
        return inst.machine.pids()

    def cleanup_disks(self) -> None:
        shutil.rmtree(self.root / "instances", ignore_errors=True)


CLIENT_KEY = "client_ed25519"


@pytest.fixture
def fake_vast(tmp_path: Path) -> Iterator[FakeVast]:
    """The FAKE Vast API with its real instances; every instance is killed afterwards."""
    root = tmp_path / "fake-vast"
    workdir = tmp_path / "workspace"
    for d in (root, workdir):
        d.mkdir(parents=True)
    _keygen(root / CLIENT_KEY)
    with FakeVast(root, workdir, [root / CLIENT_KEY]) as fake:
        yield fake


def vast_entry(fake: FakeVast, **overrides: Any) -> dict[str, Any]:
    """A `kind: vast` hosts entry pointed at the fake (SSH as this user, ups from .venv)."""
    entry: dict[str, Any] = {
        "kind": "vast",
        "offer": "gpu_name=RTX_4090 num_gpus=2",
        "order": "dph_total",
        "max_price_per_hour": 1.0,
        "disk_gb": 32,
        "image": "ghcr.io/example/ups:0.1.0",
        "max_hours": 1,
        "on_exit": "destroy",
        "user": os.environ.get("USER", "root"),
        "key": str(fake.root / CLIENT_KEY),
        "workdir": str(fake.workdir),
        "gpus": 0,
        "ups_bin": str(VENV_BIN / "ups"),
        "vast_url": fake.url,
        "connect_timeout": 5,
        "keepalive_s": 2,
        "boot_timeout_s": 120,
        "watchdog_grace_s": 5,
    }
    if os.environ.get("PYTHONPATH"):
        # A worktree sharing another checkout's .venv: its instances run this checkout's
        # code too, as the launcher's own subprocesses do (an SSH session has no inherited env).
        entry["remote_env"] = f"export PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])}"
    entry.update(overrides)
    return entry


def write_vast_hosts(fake: FakeVast, path: Path, **overrides: Any) -> Path:
    data = {
        "known_hosts": str(path.parent / "known_hosts"),
        "hosts": {"vast": vast_entry(fake, **overrides)},
    }
    path.write_text(yaml.safe_dump(data))
    return path


def fab_env(fake: FakeVast, home: Path, **extra: str) -> dict[str, str]:
    """The environment `fab` runs in: the fake's account key, a HOME with no key files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAST_", "UPS_", "WANDB_"))}
    env.update({"VAST_API_KEY": fake.api_key, "HOME": str(home), "XDG_CONFIG_HOME": str(home),
                "XDG_STATE_HOME": str(home / ".local" / "state")})  # fmt: skip
    env.update(extra)
    return env
