"""The RunPod provider through the real ``runpod`` SDK against the FAKE RunPod API
(tests/fake_runpod.py) with real pods: offers, an on-demand pod reached over SSH with the
account's key, a spot pod at its minimum bid preempted (SIGTERM first, volume kept,
OUTBID), the pod ending itself with its own scoped key and no other, terminate; and the
API's 429s, gateway errors and a rejected key (both wordings) answered with one
paragraph. One FAKE and two pods for all of it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.deploy_fixtures import FAB, REPO
from tests.fake_runpod import CLIENT_KEY, FakeRunPod, Switches, fake_runpod, runpod_entry
from ups.deploy.providers.base import (
    ApiErrorKind,
    CreateRequest,
    InstanceState,
    OfferRequirements,
    OfferTaken,
    ProviderApiError,
)
from ups.deploy.providers.runpod import on_instance, open_provider
from ups.deploy.providers.runpod.client import PlainApi
from ups.deploy.providers.runpod.entry import RunPodHost
from ups.deploy.providers.runpod.on_pod import stop_mutation, terminate_mutation
from ups.deploy.providers.runpod.provider import RunPodProvider

__all__ = ["fake_runpod"]  # fixture used by name below

TRAP = (
    "mkdir -p {workdir} && (trap 'sleep 0.5; echo term > {workdir}/got-sigterm; exit 0' TERM; "
    ": > {workdir}/trap-set; while :; do sleep 0.1; done) &\n"
)
"""The pod's boot script in these tests: a process, not the pod's PID 1's child, that takes
0.5 s to stop on SIGTERM (as `ups launch` checkpointing), records that it did, and says
when its trap is set (the pod's PID 1 set its own before it ran this)."""


def _provider(fake: FakeRunPod, monkeypatch: pytest.MonkeyPatch) -> RunPodProvider:
    monkeypatch.setenv("RUNPOD_API_KEY", fake.api_key)
    monkeypatch.setenv("UPS_RUNPOD_RETRY_S", "20")
    entry = runpod_entry(fake, name="rp")
    entry.pop("kind")
    provider = open_provider(RunPodHost(**entry))
    assert isinstance(provider, RunPodProvider)
    return provider


def _wait(provider: RunPodProvider, pod_id: str, state: InstanceState) -> None:
    deadline = time.monotonic() + 60
    while (inst := provider.get(pod_id)) is None or inst.state is not state:
        assert time.monotonic() < deadline, f"pod {pod_id} never {state}: {inst}"
        time.sleep(0.2)  # the FAKE booting the pod


def _ssh(fake: FakeRunPod, port: int, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(fake.root / CLIENT_KEY), "-p", str(port), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         f"{os.environ.get('USER', 'root')}@127.0.0.1", command],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.ssh
def test_pods_through_the_sdk_on_demand_and_spot_preempted(
    fake_runpod: FakeRunPod, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Search, create (on demand and spot), SSH, list by run, preemption, self-destruct
    with the pod's own key, terminate: every call through the real SDK."""
    fake = fake_runpod
    provider = _provider(fake, monkeypatch)
    req = OfferRequirements(gpu_names=("RTX 4090",), num_gpus=2, interruptible=True)
    (offer,) = provider.search(req)
    assert offer.gpu_name == "NVIDIA GeForce RTX 4090" and offer.min_bid_per_hour == 0.58
    onstart = TRAP.format(workdir=fake.workdir)
    ask = CreateRequest(run_id="r1", host="rp", epoch=3, image="img", disk_gb=20,
                        onstart=onstart, env={"NOTE": 'a "quoted" value'})  # fmt: skip
    on_demand = provider.create(offer, ask)
    spot = provider.create(offer, CreateRequest(**{**ask.__dict__, "bid_per_hour": 0.58}))
    assert fake.queries.count("podRentInterruptable") == 1
    for pod in (on_demand, spot):
        _wait(provider, pod, InstanceState.RUNNING)
    inst = provider.get(on_demand)
    assert inst is not None and inst.label == "ups:rp:r1@3" and inst.run is not None
    assert inst.run.epoch == 3 and inst.price_per_hour == pytest.approx(1.38)
    assert inst.ssh_host == "127.0.0.1" and inst.ssh_port is not None
    # The account's key (RunPod's PUBLIC_KEY) lets SSH in; the env arrived intact.
    deadline = time.monotonic() + 30
    while (done := _ssh(fake, inst.ssh_port, "echo ok")).returncode != 0:
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.5)  # the pod's start command installing the key
    assert fake.pods[on_demand].env["NOTE"] == 'a "quoted" value'
    assert {i.id for i in provider.list("r1")} == {on_demand, spot}
    assert provider.list("other-run") == []

    # Preempted: SIGTERM reaches the pod's processes first; the volume stays; OUTBID.
    # Once the pod's boot script has set its trap: a signal before it would find nothing
    # to warn (the spot pod is RUNNING as soon as its sshd listens, before its script ran).
    pod = fake.pods[spot]
    deadline = time.monotonic() + 60
    while not (pod.machine.disk / "workspace" / "trap-set").exists():
        assert time.monotonic() < deadline, "the spot pod's boot script never ran"
        time.sleep(0.1)  # the pod's start command running
    fake.preempt(spot)
    assert (pod.machine.disk / "workspace" / "got-sigterm").read_text().strip() == "term"
    assert provider.get(spot).state is InstanceState.OUTBID  # type: ignore[union-attr]
    assert pod.machine.pids() == [] and (pod.machine.disk / "workspace").is_dir()

    # The pod ends itself with its own scoped key, which reaches no other pod.
    monkeypatch.setenv("RUNPOD_POD_ID", spot)
    on_pod = on_instance(fake.url, fake.pods[spot].pod_key)
    assert on_pod.instance_id() == spot
    monkeypatch.setenv("RUNPOD_POD_ID", on_demand)
    with pytest.raises(ProviderApiError) as refused:
        on_pod.end_self("destroy")
    assert refused.value.kind is ApiErrorKind.KEY_REJECTED
    monkeypatch.setenv("RUNPOD_POD_ID", spot)
    on_pod.end_self("destroy")
    assert spot in fake.terminated and provider.get(spot) is None

    provider.destroy(on_demand)
    provider.destroy(on_demand)  # already gone: not an error
    assert fake.live() == [] and fake.terminated[on_demand].machine.pids() == []

    fake.switches.no_capacity = True
    with pytest.raises(OfferTaken):
        provider.create(offer, ask)


@pytest.mark.slow
def test_api_errors_are_retried_or_explained_in_one_paragraph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """429 pages and a 502 gateway page are retried until the API answers; a key RunPod
    rejects, with a 401 or in words, is one paragraph naming where the key is read and
    how to replace it (exit 5), with no retry; rate limited past UPS_RUNPOD_RETRY_S says
    so."""
    with FakeRunPod(tmp_path / "fake", tmp_path / "workspace", []) as fake:
        provider = _provider(fake, monkeypatch)
        fake.switches.rate_limit_next, fake.switches.server_error_next = 2, 1
        assert provider.list() == []
        assert (fake.switches.rate_limit_next, fake.switches.server_error_next) == (0, 0)
        fake.switches.reject_auth = True
        texts = []
        for in_words in (False, True):
            fake.switches.auth_in_errors = in_words
            asked = len(fake.queries)
            with pytest.raises(ProviderApiError) as err:
                provider.list()
            assert err.value.kind is ApiErrorKind.KEY_REJECTED and err.value.exit_code == 5
            assert len(fake.queries) == asked  # never retried
            texts.append(str(err.value))
        for text in texts:
            assert "RUNPOD_API_KEY, then ~/.runpod/config.toml" in text
            assert "make a new one at https://console.runpod.io/user/settings" in text
        fake.switches.reject_auth = False
        monkeypatch.setenv("UPS_RUNPOD_RETRY_S", "2")
        provider = _provider(fake, monkeypatch)
        monkeypatch.setenv("UPS_RUNPOD_RETRY_S", "2")
        provider.api.retry_s = 2.0
        fake.switches.rate_limit_next = 10_000
        with pytest.raises(ProviderApiError) as err:
            provider.list()
        assert err.value.kind is ApiErrorKind.RATE_LIMITED
        assert "kept rate-limiting us (HTTP 429) for 2 s while trying to list pods" in str(
            err.value
        )


@pytest.mark.slow
def test_the_pods_plain_requests_are_the_sdks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod's watchdog, with no SDK in its image, asks RunPod exactly what the SDK asks
    (same mutation texts, endpoint, Authorization, body) and the FAKE answers both alike:
    the same data; after a 429 page or a 502 gateway page, the same retry and data; a
    rejected key (a 401 or words), a pod not found, the same kind of paragraph."""
    from runpod.api.mutations import pods as sdk_mutations

    assert terminate_mutation("abc123") == sdk_mutations.generate_pod_terminate_mutation("abc123")
    assert stop_mutation("abc123") == sdk_mutations.generate_pod_stop_mutation("abc123")
    with FakeRunPod(tmp_path / "fake", tmp_path / "workspace", []) as fake:
        sdk = _provider(fake, monkeypatch).api
        plain = PlainApi(fake.url, fake.api_key)
        cases: list[tuple[str, str, dict[str, object]]] = [
            ("myself", "query { myself { id } }", {}),
            ("429 page", "query { myself { id } }", {"rate_limit_next": 1}),
            ("502 page", "query { myself { id } }", {"server_error_next": 1}),
            ("no such pod", terminate_mutation("nope"), {}),
            ("no such pod", stop_mutation("nope"), {}),
            ("401", stop_mutation("nope"), {"reject_auth": True}),
            ("words", stop_mutation("nope"), {"reject_auth": True, "auth_in_errors": True}),
        ]
        for case, text, switches in cases:
            outcomes, asked = [], []
            for api in (sdk, plain):
                fake.switches = Switches(**switches)  # type: ignore[arg-type]
                before = len(fake.requests)
                try:
                    outcomes.append(api.query(case, text))
                except ProviderApiError as err:
                    outcomes.append((err.kind, err.status, err.exit_code))
                asked.append(fake.requests[before:])
            assert outcomes[0] == outcomes[1], case
            assert asked[0] == asked[1], case
            assert len(asked[0]) == (2 if "page" in case else 1), case
        assert outcomes[0] == (ApiErrorKind.KEY_REJECTED, 401, 5)


@pytest.mark.slow
@pytest.mark.ssh
def test_fab_instances_and_down_cover_a_runpod_entry(
    fake_runpod: FakeRunPod, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`fab instances --host rp` lists the pod ups rented for the entry, with its run;
    `fab down --host rp` terminates it: the same provider-neutral tasks as for Vast, on
    an entry of kind runpod."""
    fake = fake_runpod
    provider = _provider(fake, monkeypatch)
    (offer,) = provider.search(OfferRequirements(gpu_names=("RTX 4090",), num_gpus=2))
    ask = CreateRequest(run_id="r1", host="rp", epoch=1, image="img", disk_gb=20,
                        onstart="true", env={})  # fmt: skip
    pod = provider.create(offer, ask)
    _wait(provider, pod, InstanceState.RUNNING)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"rp": runpod_entry(fake)}}))
    env = {**os.environ, "RUNPOD_API_KEY": fake.api_key, "UPS_RUNPOD_RETRY_S": "20"}

    def fab(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(FAB), "-r", str(REPO), *args, "--hosts-file", str(hosts)],
                              capture_output=True, text=True, env=env, timeout=120)  # fmt: skip

    listed = fab("instances", "--host", "rp")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert pod in listed.stdout and "r1" in listed.stdout, listed.stdout
    down = fab("down", "--host", "rp")
    assert down.returncode == 0, down.stdout + down.stderr
    assert pod in down.stdout, down.stdout
    assert fake.live() == [] and pod in fake.terminated
