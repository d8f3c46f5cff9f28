"""FAKE RunPod GraphQL API on 127.0.0.1, answering exactly what the real ``runpod`` SDK
sends: ``POST {RUNPOD_API_BASE_URL}/graphql`` with ``{"query": ...}`` and
``Authorization: Bearer KEY`` (runpod 1.12 ``runpod/api/graphql.py``).

The queries are executed by graphql-core against a schema (:data:`SCHEMA`) holding the
types and fields of RunPod's API that the SDK's own query builders
(``runpod/api/queries``, ``runpod/api/mutations/pods.py``) and ups ask for: a field or an
argument the schema lacks fails the request, as on RunPod. Only the control plane is
fake: each pod is a real local machine (:mod:`tests.fake_machines`) whose container
command is the create request's ``dockerArgs``, started after the image's sshd, with
RunPod's pod environment (``RUNPOD_POD_ID``, the pod-scoped ``RUNPOD_API_KEY``,
``PUBLIC_KEY`` with the account's SSH keys, ``RUNPOD_PUBLIC_IP``, ``RUNPOD_TCP_PORT_22``).
Its volume (``volumeMountPath``, where ups's workdir is) outlives a stop; its container
disk (``HOME``) does not. An interruptible pod preempted gets SIGTERM, 5 s (RunPod's
warning), SIGKILL, and stays listed EXITED with its volume billed.

Faults a test switches on (:class:`Switches`): a rejected key (HTTP 401, or the API's
words in a 200 answer), 429s, 5xx gateway pages, no capacity at create; and files put on a
pod's volume before it boots (:attr:`FakeRunPod.disk_seeds`: a run's ``UPS_FAULTS``).
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shlex
import shutil
import signal
import string
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import graphql
import pytest
import yaml

from tests.deploy_fixtures import VENV_BIN, _keygen
from tests.fake_machines import LocalMachine

SCHEMA_SDL = """
scalar Void

enum CloudTypeEnum { ALL SECURE COMMUNITY }

type Query {
  myself: User
  pod(input: PodFilter!): Pod
  gpuTypes(input: GpuTypeFilter): [GpuType]
}

type Mutation {
  podFindAndDeployOnDemand(input: PodFindAndDeployOnDemandInput): Pod
  podRentInterruptable(input: PodRentInterruptableInput!): Pod
  podStop(input: PodStopInput!): Pod
  podResume(input: PodResumeInput!): Pod
  podTerminate(input: PodTerminateInput!): Void
}

type User { id: String, pods: [Pod] }

type Pod {
  id: String!
  name: String
  containerDiskInGb: Int
  costPerHr: Float
  desiredStatus: String
  dockerArgs: String
  dockerId: String
  env: [String]
  gpuCount: Int
  imageName: String
  lastStatusChange: String
  machineId: String
  memoryInGb: Float
  podType: String
  port: Int
  ports: String
  uptimeSeconds: Int
  vcpuCount: Float
  volumeInGb: Float
  volumeMountPath: String
  runtime: PodRuntime
  machine: PodMachineInfo
}

type PodRuntime { uptimeInSeconds: Int, ports: [PodRuntimePorts] }

type PodRuntimePorts {
  ip: String
  isIpPublic: Boolean
  privatePort: Int
  publicPort: Int
  type: String
}

type PodMachineInfo { gpuDisplayName: String, podHostId: String, location: String }

type GpuType {
  id: String
  displayName: String
  memoryInGb: Int
  maxGpuCount: Int
  manufacturer: String
  cudaCores: Int
  secureCloud: Boolean
  communityCloud: Boolean
  securePrice: Float
  communityPrice: Float
  oneMonthPrice: Float
  threeMonthPrice: Float
  oneWeekPrice: Float
  communitySpotPrice: Float
  secureSpotPrice: Float
  lowestPrice(input: GpuLowestPriceInput): LowestPrice
}

type LowestPrice {
  gpuName: String
  minimumBidPrice: Float
  uninterruptablePrice: Float
  stockStatus: String
}

input PodFilter { podId: String! }
input GpuTypeFilter { id: String }
input GpuLowestPriceInput {
  gpuCount: Int!
  secureCloud: Boolean
  countryCode: String
  dataCenterId: String
}
input EnvironmentVariableInput { key: String!, value: String }

input PodFindAndDeployOnDemandInput {
  name: String, imageName: String, cloudType: CloudTypeEnum, startSsh: Boolean,
  startJupyter: Boolean, gpuTypeId: String, supportPublicIp: Boolean, gpuCount: Int,
  volumeInGb: Int, minVcpuCount: Int, minMemoryInGb: Int, allowedCudaVersions: [String],
  dataCenterId: String, dockerArgs: String, countryCode: String, containerDiskInGb: Int,
  ports: String, volumeMountPath: String, env: [EnvironmentVariableInput],
  templateId: String, networkVolumeId: String, minDownload: Int, minUpload: Int
}

input PodRentInterruptableInput {
  name: String, imageName: String, cloudType: CloudTypeEnum, startSsh: Boolean,
  startJupyter: Boolean, gpuTypeId: String, bidPerGpu: Float!, supportPublicIp: Boolean,
  gpuCount: Int, volumeInGb: Int, minVcpuCount: Int, minMemoryInGb: Int,
  allowedCudaVersions: [String], dataCenterId: String, dockerArgs: String,
  countryCode: String, containerDiskInGb: Int, ports: String, volumeMountPath: String,
  env: [EnvironmentVariableInput], templateId: String, networkVolumeId: String,
  minDownload: Int, minUpload: Int, terminateAfter: String, stopAfter: String,
  cudaVersion: String, volumeKey: String
}

input PodStopInput { podId: String!, incrementVersion: Boolean }
input PodResumeInput { podId: String!, gpuCount: Int!, syncMachine: Boolean }
input PodTerminateInput { podId: String! }
"""
SCHEMA = graphql.build_schema(SCHEMA_SDL)

NO_CAPACITY = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)
"""What RunPod answers a create when no machine of the GPU type is free."""
GATEWAY_PAGE = (
    "<html>\r\n<head><title>{status} Bad Gateway</title></head>\r\n<body>\r\n<center>"
    "<h1>{status} Bad Gateway</h1></center>\r\n</body>\r\n</html>\r\n"
)
RATE_LIMIT_PAGE = "429 Too Many Requests"
PREEMPT_WARNING_S = 5.0
"""RunPod's notice to a spot pod before SIGKILL (docs: 'a 5-second warning')."""
VOLUME_PER_GB_MONTH = 0.20
"""$/GB/month a stopped pod's volume bills (docs: pricing)."""


def default_gpu_types() -> list[dict[str, Any]]:
    rows = [
        # id, display, GB, secure, community, on-demand $/GPU/h, min bid $/GPU/h
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 24, True, True, 0.69, 0.29),
        ("NVIDIA GeForce RTX 3090", "RTX 3090", 24, False, True, 0.22, 0.11),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe", 80, True, False, 1.64, 0.82),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 80, True, False, 2.99, 1.75),
    ]
    return [
        {"id": i, "displayName": d, "memoryInGb": gb, "maxGpuCount": 8, "manufacturer": "Nvidia",
         "cudaCores": 0, "secureCloud": sec, "communityCloud": com, "securePrice": price,
         "communityPrice": price, "secureSpotPrice": bid, "communitySpotPrice": bid,
         "oneMonthPrice": None, "threeMonthPrice": None, "oneWeekPrice": None,
         "_price": price, "_bid": bid, "_stock": 4}
        for i, d, gb, sec, com, price, bid in rows
    ]  # fmt: skip


@dataclass
class FakePod:
    id: str
    name: str
    gpu_type: dict[str, Any]
    gpu_count: int
    image: str
    docker_args: str
    env: dict[str, str]
    volume_gb: float
    container_gb: float
    volume_mount_path: str
    bid_per_gpu: float | None
    pod_key: str
    """The pod-scoped key in its ``RUNPOD_API_KEY``: it may manage this pod only."""
    machine: LocalMachine
    machine_id: str
    created: float = field(default_factory=time.time)
    desired: str = "RUNNING"
    running: bool = False
    last_change: str = ""
    billed_s: dict[str, float] = field(default_factory=lambda: {"running": 0.0, "stopped": 0.0})
    preempted: bool = False
    seed: dict[str, str] = field(default_factory=dict)
    """Files put on its volume before it boots (:attr:`FakeRunPod.disk_seeds`)."""
    _since: float = field(default_factory=time.monotonic)

    @property
    def gpu_price(self) -> float:
        return self.bid_per_gpu if self.bid_per_gpu is not None else float(self.gpu_type["_price"])

    @property
    def cost_per_hr(self) -> float:
        if self.desired == "RUNNING":
            return round(self.gpu_price * self.gpu_count, 4)
        return round(self.volume_gb * VOLUME_PER_GB_MONTH / 730.0, 4)

    def tick(self) -> None:
        now = time.monotonic()
        self.billed_s["running" if self.desired == "RUNNING" else "stopped"] += now - self._since
        self._since = now

    def row(self) -> dict[str, Any]:
        runtime = None
        if self.running and self.machine.port:
            runtime = {
                "uptimeInSeconds": int(time.time() - self.created),
                "ports": [
                    {"ip": "127.0.0.1", "isIpPublic": True, "privatePort": 22,
                     "publicPort": self.machine.port, "type": "tcp"},
                ],
            }  # fmt: skip
        return {
            "id": self.id, "name": self.name, "containerDiskInGb": int(self.container_gb),
            "costPerHr": self.cost_per_hr, "desiredStatus": self.desired,
            "dockerArgs": self.docker_args, "dockerId": None,
            "env": [f"{k}={v}" for k, v in self.env.items()], "gpuCount": self.gpu_count,
            "imageName": self.image, "lastStatusChange": self.last_change,
            "machineId": self.machine_id, "memoryInGb": 62.0,
            "podType": "INTERRUPTABLE" if self.bid_per_gpu is not None else "RESERVED",
            "port": None, "ports": "22/tcp", "uptimeSeconds": int(time.time() - self.created),
            "vcpuCount": 8.0, "volumeInGb": self.volume_gb,
            "volumeMountPath": self.volume_mount_path, "runtime": runtime,
            "machine": {"gpuDisplayName": self.gpu_type["displayName"],
                        "podHostId": f"{self.id}-{self.machine_id}", "location": "CA"},
        }  # fmt: skip


@dataclass
class Switches:
    """Fault injection; tests flip these between requests."""

    reject_auth: bool = False
    auth_in_errors: bool = False
    """A rejected key answered 200 with the API's words in ``errors`` instead of 401."""
    rate_limit_next: int = 0
    server_error_next: int = 0
    no_capacity: bool = False
    boot_s: float = 0.3


class QueryRefused(Exception):
    """A resolver's refusal: becomes the answer's ``errors``."""


class FakeRunPod:
    """The FAKE RunPod control plane plus real pods; use as a context manager."""

    def __init__(self, root: Path, workdir: Path, account_keys: list[Path]) -> None:
        self.root = root
        self.workdir = workdir
        """Where the tests' entries mount pods' volumes (their workdir is under it)."""
        self.account_keys = account_keys
        self.api_key = "fake-runpod-" + secrets.token_hex(8)
        self.gpu_types = default_gpu_types()
        self.switches = Switches()
        self.preempt_warning_s = PREEMPT_WARNING_S
        self.pods: dict[str, FakePod] = {}
        self.terminated: dict[str, FakePod] = {}
        self.disk_seeds: list[dict[str, str]] = []
        """Per created pod, in creation order: files put on its volume before boot (test
        fault switches, as :attr:`tests.fake_vast.FakeVast.disk_seeds`)."""
        self.queries: list[str] = []
        """The operation (first field) of every query answered, in order."""
        self.requests: list[dict[str, Any]] = []
        """Every request as the API reads it: path, the headers it uses, the JSON body."""
        self.lock = threading.RLock()
        self._machines = itertools.count(1)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeRunPod:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        for pod in list(self.pods.values()):
            pod.machine.kill()

    # -- what tests look at and do --------------------------------------------------------
    def live(self) -> list[FakePod]:
        with self.lock:
            return list(self.pods.values())

    def running(self) -> list[FakePod]:
        return [p for p in self.live() if p.desired == "RUNNING"]

    def wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.live():
                return True
            time.sleep(0.5)  # polling the fake's own state
        return False

    def preempt(self, pod_id: str) -> None:
        """What RunPod does to a spot pod whose machine is wanted: SIGTERM to the
        container's main process (PID 1, as ``docker stop``), ``preempt_warning_s``, then
        SIGKILL to all; the pod stays listed, EXITED, its volume kept (and billed); its
        container disk is gone."""
        pod = self.pods[pod_id]
        assert pod.bid_per_gpu is not None, "only an interruptible pod is preempted"
        pod.machine.signal_init(signal.SIGTERM)
        deadline = time.monotonic() + self.preempt_warning_s
        while time.monotonic() < deadline and pod.machine.pids():
            time.sleep(0.1)  # the pod's processes ending on their own within the warning
        self._stop(pod, "Stopped by RunPod: spot instance interrupted")
        pod.preempted = True

    # -- the API ----------------------------------------------------------------------------
    def who(self, key: str) -> FakePod | str | None:
        """The account (``"account"``), the pod a pod-scoped key belongs to, or None."""
        if self.switches.reject_auth:
            return None
        if key == self.api_key:
            return "account"
        return next((p for p in self.live() if p.pod_key == key), None)

    def execute(self, query: str, caller: FakePod | str) -> dict[str, Any]:
        document = graphql.parse(query)
        problems = graphql.validate(SCHEMA, document)
        if problems:
            return {"errors": [{"message": problems[0].message}]}
        ops = [
            sel.name.value
            for op in document.definitions
            if isinstance(op, graphql.OperationDefinitionNode)
            for sel in op.selection_set.selections
            if isinstance(sel, graphql.FieldNode)
        ]
        with self.lock:
            self.queries.extend(ops)
        result = graphql.execute_sync(
            SCHEMA, document, root_value=_Root(self, caller), context_value=caller
        )
        answer: dict[str, Any] = {"data": result.data}
        if result.errors:
            answer["errors"] = [{"message": e.message, "path": e.path} for e in result.errors]
        return answer

    def gpu_type(self, gpu_type_id: str | None) -> dict[str, Any] | None:
        return next((g for g in self.gpu_types if g["id"] == gpu_type_id), None)

    def deploy(self, spec: dict[str, Any], bid_per_gpu: float | None, boot: bool = True) -> FakePod:
        """A new pod, booted for real unless ``boot`` is False (a pod listed by the API and
        never started: tests of the API alone, which start no process)."""
        gpu = self.gpu_type(spec.get("gpuTypeId"))
        if gpu is None:
            raise QueryRefused(f"No GPU type found with id {spec.get('gpuTypeId')!r}.")
        count = int(spec.get("gpuCount") or 1)
        if self.switches.no_capacity or gpu["_stock"] < count:
            raise QueryRefused(NO_CAPACITY)
        if bid_per_gpu is not None and bid_per_gpu < gpu["_bid"]:
            raise QueryRefused(
                f"Your bid of ${bid_per_gpu}/gpu/hr is below the minimum bid price of "
                f"${gpu['_bid']}/gpu/hr."
            )
        pod_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(14))
        env = {e["key"]: e.get("value") or "" for e in spec.get("env") or []}
        # The pod's volume is mounted where the create asks (over a directory of this host).
        volume_at = str(spec.get("volumeMountPath") or "/runpod-volume")
        machine = LocalMachine(self.root / "pods" / pod_id, volume_at)
        # The account's keys arrive in PUBLIC_KEY; the image's start puts them where sshd
        # reads them: the container disk's home, which a stop wipes.
        machine.authorized_keys = machine.root / "container" / "home" / ".ssh" / "authorized_keys"
        pod = FakePod(
            id=pod_id, name=str(spec.get("name") or ""), gpu_type=gpu, gpu_count=count,
            image=str(spec.get("imageName") or ""), docker_args=str(spec.get("dockerArgs") or ""),
            env=env, volume_gb=float(spec.get("volumeInGb") or 0),
            container_gb=float(spec.get("containerDiskInGb") or 10),
            volume_mount_path=volume_at,
            bid_per_gpu=bid_per_gpu, pod_key="fake-pod-" + secrets.token_hex(8),
            machine=machine, machine_id=f"m{next(self._machines):04d}",
            last_change=f"Rented by User: {time.ctime()}",
        )  # fmt: skip
        with self.lock:
            pod.seed = self.disk_seeds.pop(0) if self.disk_seeds else {}
            self.pods[pod.id] = pod
        if boot:
            threading.Thread(target=self._boot, args=(pod,), daemon=True).start()
        return pod

    def stop(self, pod: FakePod) -> FakePod:
        self._stop(pod, f"Exited by user: {time.ctime()}")
        return pod

    def resume(self, pod: FakePod) -> FakePod:
        if pod.desired != "EXITED":
            raise QueryRefused("Pod is not stopped.")
        pod.tick()
        pod.desired, pod.preempted = "RUNNING", False
        pod.last_change = f"Resumed by user: {time.ctime()}"
        pod.machine.port = None  # a resumed pod gets a new public port
        threading.Thread(target=self._boot, args=(pod,), daemon=True).start()
        return pod

    def terminate(self, pod: FakePod) -> None:
        """Kill the pod's processes, then drop it from the listing: a test that sees the
        listing empty may assert that nothing of it still runs."""
        pod.tick()
        pod.machine.kill()
        pod.running = False
        with self.lock:
            self.pods.pop(pod.id, None)
            self.terminated[pod.id] = pod

    # -- real pods ----------------------------------------------------------------------------
    def _stop(self, pod: FakePod, why: str) -> None:
        pod.tick()
        pod.machine.kill()
        pod.running = False
        pod.desired, pod.last_change = "EXITED", why
        shutil.rmtree(pod.machine.root / "container", ignore_errors=True)

    def _boot(self, pod: FakePod) -> None:
        time.sleep(self.switches.boot_s)  # image pull and container start
        if pod.id not in self.pods or pod.desired != "RUNNING":
            return
        home = pod.machine.root / "container" / "home"
        home.mkdir(parents=True, exist_ok=True)
        keys = "".join(k.with_suffix(".pub").read_text() for k in self.account_keys)
        pod.machine.port = pod.machine.port or _free_port()
        env = {
            **pod.env, "RUNPOD_POD_ID": pod.id, "RUNPOD_API_KEY": pod.pod_key,
            "PUBLIC_KEY": keys, "HOME": str(home),
            "RUNPOD_PUBLIC_IP": "127.0.0.1", "RUNPOD_TCP_PORT_22": str(pod.machine.port),
            "RUNPOD_GPU_COUNT": str(pod.gpu_count), "RUNPOD_DC_ID": "CA-MTL-1",
            "DOCKER_ARGS": pod.docker_args, "START_LOG": str(pod.machine.root / "start.log"),
        }  # fmt: skip
        # The image starts its sshd (as RunPod's templates do), then runs the pod's command.
        # The pod's command becomes its PID 1, as a container's CMD does.
        start = '{sshd}; eval "exec $DOCKER_ARGS" > "$START_LOG" 2>&1 < /dev/null'
        pod.machine.boot(env, start, port=pod.machine.port, seed=pod.seed)
        pod.tick()
        pod.running = True


class _Root:
    """The resolvers: graphql-core calls the attribute named like each root field."""

    def __init__(self, fake: FakeRunPod, caller: FakePod | str) -> None:
        self.fake = fake
        self.caller = caller

    def _own(self, pod_id: str) -> FakePod:
        pod = self.fake.pods.get(pod_id)
        if self.caller != "account" and self.caller is not pod:
            raise QueryRefused("You do not have permission to perform this action.")
        if pod is None:
            raise QueryRefused(f"Pod {pod_id} not found.")
        return pod

    def myself(self, info: Any) -> dict[str, Any]:
        if self.caller != "account":
            raise QueryRefused("You do not have permission to perform this action.")
        return {"id": "user_fake", "pods": [p.row() for p in self.fake.live()]}

    def pod(self, info: Any, input: dict[str, Any]) -> dict[str, Any] | None:
        if self.caller != "account" and getattr(self.caller, "id", None) != input["podId"]:
            raise QueryRefused("You do not have permission to perform this action.")
        found = self.fake.pods.get(input["podId"])
        return found.row() if found else None

    def gpuTypes(self, info: Any, input: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        wanted = (input or {}).get("id")
        rows = [g for g in self.fake.gpu_types if wanted in (None, g["id"])]
        return [{**g, "lowestPrice": _lowest_price(g)} for g in rows]

    def podFindAndDeployOnDemand(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        self._account()
        return self.fake.deploy(input, None).row()

    def podRentInterruptable(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        self._account()
        return self.fake.deploy(input, float(input["bidPerGpu"])).row()

    def podStop(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        return self.fake.stop(self._own(input["podId"])).row()

    def podResume(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        self._account()
        return self.fake.resume(self._own(input["podId"])).row()

    def podTerminate(self, info: Any, input: dict[str, Any]) -> None:
        self.fake.terminate(self._own(input["podId"]))

    def _account(self) -> None:
        if self.caller != "account":
            raise QueryRefused("You do not have permission to perform this action.")


def _lowest_price(gpu: dict[str, Any]) -> Any:
    """``lowestPrice(input: {gpuCount})``: per-GPU prices, no stock past the count free."""

    def resolve(info: Any, input: dict[str, Any] | None = None) -> dict[str, Any] | None:
        count = int((input or {}).get("gpuCount") or 1)
        secure = (input or {}).get("secureCloud")
        if secure is True and not gpu["secureCloud"]:
            return None
        stock = "High" if gpu["_stock"] >= count else None
        return {"gpuName": gpu["displayName"], "minimumBidPrice": gpu["_bid"],
                "uninterruptablePrice": gpu["_price"], "stockStatus": stock}  # fmt: skip

    return resolve


def _handler(fake: FakeRunPod) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def _reply(self, status: int, body: Any, kind: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if self.path.split("?")[0] != "/graphql":
                return self._reply(404, {"errors": [{"message": f"no route {self.path}"}]})
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            seen = {h: self.headers.get(h) for h in ("Authorization", "Content-Type")}
            with fake.lock:
                fake.requests.append({"path": self.path, **seen, "body": body})
            with fake.lock:
                if fake.switches.rate_limit_next > 0:
                    fake.switches.rate_limit_next -= 1
                    return self._reply(429, RATE_LIMIT_PAGE, "text/plain")
                if fake.switches.server_error_next > 0:
                    fake.switches.server_error_next -= 1
                    return self._reply(502, GATEWAY_PAGE.format(status=502), "text/html")
            key = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            caller = fake.who(key)
            if caller is None:
                if fake.switches.auth_in_errors:
                    words = {"errors": [{"message": "Unauthorized: invalid API key"}]}
                    return self._reply(200, words)
                return self._reply(401, "Unauthorized", "text/plain")
            try:
                answer = fake.execute(str(body.get("query") or ""), caller)
            except graphql.GraphQLError as err:
                answer = {"errors": [{"message": err.message}]}
            self._reply(200, answer)

    return Handler


def _free_port() -> int:
    from tests.deploy_fixtures import free_port

    return free_port()


CLIENT_KEY = "client_ed25519"


@pytest.fixture
def fake_runpod(tmp_path: Path) -> Iterator[FakeRunPod]:
    """The FAKE RunPod API with its real pods; every pod is killed afterwards."""
    root = tmp_path / "fake-runpod"
    workdir = tmp_path / "workspace"
    for d in (root, workdir):
        d.mkdir(parents=True, exist_ok=True)
    _keygen(root / CLIENT_KEY)
    with FakeRunPod(root, workdir, [root / CLIENT_KEY]) as fake:
        yield fake


def runpod_entry(fake: FakeRunPod, **overrides: Any) -> dict[str, Any]:
    """A `kind: runpod` hosts entry pointed at the fake (SSH as this user, ups from .venv)."""
    entry: dict[str, Any] = {
        "kind": "runpod",
        "gpu": "RTX 4090",
        "gpus": 2,
        "max_price_per_hour": 2.0,
        "disk_gb": 20,
        "image": "ghcr.io/example/ups:0.1.0",
        "max_hours": 1,
        "on_exit": "destroy",
        "user": os.environ.get("USER", "root"),
        "key": str(fake.root / CLIENT_KEY),
        "volume_mount_path": str(fake.workdir),
        "workdir": str(fake.workdir / "ups"),
        "ups_bin": str(VENV_BIN / "ups"),
        "runpod_url": fake.url,
        "connect_timeout": 5,
        "keepalive_s": 2,
        "boot_timeout_s": 120,
        "watchdog_grace_s": 5,
    }
    if os.environ.get("PYTHONPATH"):
        entry["remote_env"] = f"export PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])}"
    entry.update(overrides)
    return entry


def write_runpod_hosts(fake: FakeRunPod, path: Path, **overrides: Any) -> Path:
    data = {
        "known_hosts": str(path.parent / "known_hosts"),
        "hosts": {"runpod": runpod_entry(fake, **overrides)},
    }
    path.write_text(yaml.safe_dump(data))
    return path


def runpod_env(fake: FakeRunPod, home: Path, **extra: str) -> dict[str, str]:
    """The environment `fab` runs in: the fake's account key, a HOME with no key files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "UPS_", "WANDB_"))}
    state = str(home / ".local" / "state")
    env.update({"RUNPOD_API_KEY": fake.api_key, "HOME": str(home), "XDG_CONFIG_HOME": str(home),
                "XDG_STATE_HOME": state})  # fmt: skip
    env.update(extra)
    return env
