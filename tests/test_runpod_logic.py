"""RunPod's pure parts: how its SDK's failures become the one paragraph with the fix (a
rejected key reads the same however RunPod words it), pod states, offers from the neutral
requirements, the pod's start command and spot mutation (checked against the FAKE's
schema of RunPod's API), the hosts entry. No pod; only importing the SDK starts a process
(its ``rp_debugger`` asks py-cpuinfo, which runs a subprocess)."""

from __future__ import annotations

import ast
import base64
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import graphql
import pytest
import requests
from pydantic import ValidationError

from tests.fake_runpod import (
    GATEWAY_PAGE,
    RATE_LIMIT_PAGE,
    SCHEMA,
    FakeRunPod,
    default_gpu_types,
)
from ups.deploy.providers import package
from ups.deploy.providers.base import (
    ApiErrorKind,
    InstanceState,
    OfferRequirements,
    OfferTaken,
    ProviderApiError,
    api_error,
)
from ups.deploy.providers.runpod import offers
from ups.deploy.providers.runpod.client import ACCOUNT, Answer, classify, data_of
from ups.deploy.providers.runpod.entry import RunPodHost
from ups.deploy.providers.runpod.pods import (
    PASS_ON_TERM,
    instance_of,
    start_command,
    state_of,
)
from ups.deploy.providers.runpod.provider import spot_mutation
from ups.deploy.providers.runpod.sdk import answer_of, import_sdk

REPO = Path(__file__).resolve().parents[1]


def _paragraph(err: BaseException, what: str = "list pods") -> tuple[ApiErrorKind, str]:
    answer = answer_of(err)
    assert answer is not None
    status, body = answer
    kind = classify(status, body)
    return kind, str(api_error(ACCOUNT, kind, what, status=status, retried_s=120))


def _page(text: str) -> requests.JSONDecodeError:
    try:
        requests.Response.json(_response(text))
    except requests.JSONDecodeError as err:
        return err
    raise AssertionError("a page that is not JSON parsed")


def _response(text: str) -> requests.Response:
    resp = requests.Response()
    resp._content = text.encode()
    resp.status_code = 200  # the SDK never looks; only the page survives in the error
    return resp


@pytest.mark.slow  # importing the runpod SDK runs py-cpuinfo's subprocess (rp_debugger)
def test_a_rejected_key_reads_the_same_however_runpod_words_it() -> None:
    """RunPod's 401 (the SDK's AuthenticationError) and its words in a 200 answer (a
    QueryError) are one kind, with one fix: where the key is read and how to replace it."""
    error = import_sdk().error
    as_401 = _paragraph(error.AuthenticationError("Unauthorized request, please check your key"))
    in_words = _paragraph(error.QueryError("Unauthorized: invalid API key", "query"))
    for kind, text in (as_401, in_words):
        assert kind is ApiErrorKind.KEY_REJECTED
        assert "RUNPOD_API_KEY, then ~/.runpod/config.toml" in text
        assert "https://console.runpod.io/user/settings" in text and "`runpod config`" in text
    # The same sentences as every provider's: only the account's words differ.
    fix = "is wrong, revoked or lacks the permission; make a new one at"
    assert fix in as_401[1] and fix in in_words[1]


@pytest.mark.slow  # importing the runpod SDK runs py-cpuinfo's subprocess (rp_debugger)
def test_rate_limits_gateway_pages_and_capacity_are_classified_by_their_words() -> None:
    """A 429 page and a 502 gateway page (not JSON: the SDK keeps only the page) are
    retried kinds; RunPod's 'no longer any instances available' is the offer taken."""
    error = import_sdk().error
    kind, text = _paragraph(_page("429 Too Many Requests"))
    assert kind is ApiErrorKind.RATE_LIMITED and "(HTTP 429) for 120 s" in text
    assert "UPS_RUNPOD_RETRY_S" in text
    kind, text = _paragraph(_page("<html><title>502 Bad Gateway</title></html>"))
    assert kind is ApiErrorKind.SERVER_ERROR and "HTTP 502, a server error" in text
    assert "https://uptime.runpod.io" in text and "`fab instances`" in text
    taken = error.QueryError(
        "There are no longer any instances available with the requested specifications."
    )
    kind, _ = _paragraph(taken)
    assert kind is ApiErrorKind.OFFER_TAKEN
    assert isinstance(api_error(ACCOUNT, kind, "create a pod"), OfferTaken)
    assert classify(None, {"errors": [{"message": "Pod abc not found."}]}) is (
        ApiErrorKind.NOT_FOUND
    )
    assert answer_of(ValueError("a bug")) is None  # not the API's: raised as it is


@pytest.mark.parametrize(
    ("desired", "pod_type", "runtime", "state"),
    [
        ("RUNNING", "RESERVED", True, InstanceState.RUNNING),
        ("RUNNING", "RESERVED", False, InstanceState.LOADING),
        ("CREATED", "RESERVED", False, InstanceState.LOADING),
        ("EXITED", "RESERVED", False, InstanceState.STOPPED),
        ("EXITED", "INTERRUPTABLE", False, InstanceState.OUTBID),
        ("DEAD", "RESERVED", False, InstanceState.FAILED),
        ("TERMINATED", "RESERVED", False, InstanceState.GONE),
    ],
)
def test_pod_states(desired: str, pod_type: str, runtime: bool, state: InstanceState) -> None:
    """desiredStatus, podType and the runtime's public port 22 give the neutral state."""
    ports = [{"ip": "1.2.3.4", "isIpPublic": True, "privatePort": 22, "publicPort": 40022,
              "type": "tcp"}]  # fmt: skip
    pod = {"id": "p1", "name": "ups:rp:r1@4", "desiredStatus": desired, "podType": pod_type,
           "runtime": {"ports": ports} if runtime else None, "costPerHr": 1.38,
           "uptimeSeconds": 3600, "machineId": "m1", "gpuCount": 2}  # fmt: skip
    assert state_of(pod, runtime) is state
    inst = instance_of(pod)
    assert inst.state is state and inst.run is not None and inst.run.epoch == 4
    assert (inst.ssh_host, inst.ssh_port) == (("1.2.3.4", 40022) if runtime else (None, None))
    assert inst.cost_so_far == pytest.approx(1.38)


def _rows(count: int) -> list[dict[str, object]]:
    rows = []
    for g in default_gpu_types():
        stock = "High" if g["_stock"] >= count else None
        price = {"minimumBidPrice": g["_bid"], "uninterruptablePrice": g["_price"],
                 "stockStatus": stock}  # fmt: skip
        rows.append({"id": g["id"], "memoryInGb": g["memoryInGb"], "lowestPrice": price})
    return rows


def test_offers_translate_the_neutral_requirements() -> None:
    """GPU models as people write them match RunPod's type ids; prices are per pod (per
    GPU x count, plus the volume); a type out of stock at the count is no offer; the
    escape hatch lists exact ids; the memory floor applies."""
    req = OfferRequirements(gpu_names=("RTX 4090", "A100"), num_gpus=2, disk_gb=73)
    found = offers.offers_of(_rows(2), req, 2, "ALL", None)
    assert [o.gpu_name for o in found] == ["NVIDIA GeForce RTX 4090", "NVIDIA A100 80GB PCIe"]
    rtx = found[0]
    assert rtx.price_per_hour == pytest.approx(0.69 * 2 + 73 * 0.10 / 730)
    assert rtx.min_bid_per_hour == pytest.approx(0.58) and rtx.interruptible
    assert rtx.price(True) == pytest.approx(0.58) and rtx.machine_id is None
    assert offers.offers_of(_rows(5), req, 5, "ALL", None) == []  # 4 in stock
    only = OfferRequirements(query="NVIDIA A100 80GB PCIe", num_gpus=1)
    assert [o.gpu_name for o in offers.offers_of(_rows(1), only, 1, "ALL", None)] == [
        "NVIDIA A100 80GB PCIe"
    ]
    big = OfferRequirements(min_gpu_ram_gb=48, num_gpus=1)
    assert {o.gpu_ram_gb for o in offers.offers_of(_rows(1), big, 1, "ALL", None)} == {80.0}
    query = offers.gpu_types_query(2, "SECURE", "CA")
    assert not graphql.validate(SCHEMA, graphql.parse(query))
    assert "secureCloud: true" in query and 'countryCode: "CA"' in query


def test_the_start_command_and_the_spot_mutation_survive_the_sdk_quoting() -> None:
    """The pod's command carries ups's boot script base64-coded (the SDK puts it between
    double quotes as it is); the spot mutation with awkward env values is valid GraphQL
    for RunPod's schema."""
    onstart = 'echo "watchdog $HOME" > /tmp/x\n'
    command = start_command(onstart)
    assert '"' not in command and "\\" not in command
    coded = re.search(r"echo (\S+) \| base64 -d", command)
    assert coded is not None
    script = base64.b64decode(coded.group(1)).decode()
    assert onstart.strip() in script and '"${PUBLIC_KEY:-}"' in script
    assert script.rstrip().endswith("sleep infinity & wait")
    # PID 1 passes SIGTERM on from its first line: a namespace's init drops a signal it
    # has no handler for, so a stop during the pod's start would otherwise reach nothing.
    assert script.splitlines()[0] == f"trap '{PASS_ON_TERM}' TERM"
    from ups.deploy.providers.runpod.client import graphql_string

    fields = {
        "name": "ups:rp:run-1@3", "image_name": "ghcr.io/x/ups:1", "cloud_type": "ALL",
        "gpu_type_id": "NVIDIA GeForce RTX 4090", "gpu_count": 2, "volume_in_gb": 20,
        "container_disk_in_gb": 20, "volume_mount_path": "/workspace", "ports": "22/tcp",
        "docker_args": command, "env": {"A": graphql_string('say "hi" \\ there')},
        "country_code": None,
    }  # fmt: skip
    text = spot_mutation(fields, 0.35)
    document = graphql.parse(text)
    assert not graphql.validate(SCHEMA, document)
    assert "bidPerGpu: 0.3500" in text


def test_the_entry_keeps_the_workdir_on_the_volume_and_refuses_reliability() -> None:
    """A workdir on the container disk would lose the run at a stop; RunPod reports no
    reliability figure to filter on: both refused with the reason."""
    base = {"name": "rp", "gpu": "RTX 4090", "max_price_per_hour": 1.0}
    ok = RunPodHost(**base, workdir="/workspace/ups")
    assert ok.cloud_type == "ALL" and ok.volume_mount_path == "/workspace"
    with pytest.raises(ValidationError, match="not under volume_mount_path"):
        RunPodHost(**base, workdir="/root/ups")
    with pytest.raises(ValidationError, match="RunPod reports no reliability"):
        RunPodHost(**base, workdir="/workspace/ups", min_reliability=0.99)


def test_the_pod_ends_itself_without_the_sdk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog's path on a pod (the registry's ``on_instance``, then ``end_self``)
    works where ``import runpod`` fails, as in the ups image (docker/lock.sh leaves the SDK
    out): it terminates its own pod through the FAKE with the pod's scoped key, and a key
    for another pod is refused in the one paragraph, not with an ImportError."""
    monkeypatch.setitem(sys.modules, "runpod", None)  # `import runpod` raises ImportError
    with FakeRunPod(tmp_path / "fake", tmp_path / "workspace", []) as fake:
        spec = {"gpuTypeId": "NVIDIA GeForce RTX 4090", "gpuCount": 1, "name": "ups:rp:r@1"}
        mine, other = (fake.deploy(spec, None, boot=False) for _ in range(2))
        monkeypatch.setenv("RUNPOD_POD_ID", other.id)
        monkeypatch.setenv("RUNPOD_API_KEY", mine.pod_key)  # what RunPod sets in a pod
        on_pod = package("runpod").on_instance(fake.url, None)
        with pytest.raises(ProviderApiError) as refused:
            on_pod.end_self("stop")
        assert refused.value.kind is ApiErrorKind.KEY_REJECTED
        assert f"when trying to stop pod {other.id}" in str(refused.value)
        monkeypatch.setenv("RUNPOD_POD_ID", mine.id)
        on_pod.end_self("destroy")
        assert fake.queries == ["podStop", "podTerminate"]
        assert mine.id in fake.terminated and [p.id for p in fake.live()] == [other.id]
        assert {r["Authorization"] for r in fake.requests} == {f"Bearer {mine.pod_key}"}


def test_only_the_sdk_module_imports_runpod_and_only_when_called() -> None:
    """No module of ups imports the RunPod SDK when it is imported (`ups --help`, `fab
    --list`, the image's trainer, preflight and launch never load it), and only
    ``ups.deploy.providers.runpod.sdk`` imports it at all: the laptop's provider. The
    image has no SDK; anything else importing it would fail there."""
    importers: dict[str, set[str]] = {}
    for path in sorted((REPO / "ups").rglob("*.py")):
        text = path.read_text()
        if "runpod" not in text:  # no import of it either: not worth parsing
            continue
        tree = ast.parse(text, str(path))
        at_import = {id(node) for node in _module_level(tree)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(name.split(".")[0] == "runpod" for name in names):
                when = "at import" if id(node) in at_import else "when called"
                importers.setdefault(when, set()).add(str(path.relative_to(REPO)))
    assert importers == {"when called": {"ups/deploy/providers/runpod/sdk.py"}}


def _module_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """The statements Python runs when it imports the module: outside every function (class
    bodies and ``if``/``try`` blocks included)."""
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        yield node
        for name in ("body", "orelse", "finalbody", "handlers"):
            todo.extend(getattr(node, name, []))


@pytest.mark.parametrize(
    ("status", "page", "kind"),
    [
        (401, "Unauthorized", ApiErrorKind.KEY_REJECTED),
        (
            200,
            '{"errors": [{"message": "Unauthorized: invalid API key"}]}',
            ApiErrorKind.KEY_REJECTED,
        ),
        (429, RATE_LIMIT_PAGE, ApiErrorKind.RATE_LIMITED),
        (502, GATEWAY_PAGE.format(status=502), ApiErrorKind.SERVER_ERROR),
        (200, "<html>maintenance</html>", ApiErrorKind.SERVER_ERROR),
        (200, '{"data": null}', ApiErrorKind.SERVER_ERROR),
        (200, '{"errors": [{"message": "Pod abc not found."}]}', ApiErrorKind.NOT_FOUND),
    ],
)
def test_the_pods_plain_answers_are_read_as_the_sdks(
    status: int, page: str, kind: ApiErrorKind
) -> None:
    """What the pod's standard-library client makes of each answer RunPod (or a gateway in
    front of it) gives, as the SDK's failure for it is read on the laptop."""
    with pytest.raises(Answer) as failed:
        data_of(status, page)
    assert classify(failed.value.status, failed.value.body) is kind
    assert data_of(200, '{"data": {"podTerminate": null}}') == {"podTerminate": None}
