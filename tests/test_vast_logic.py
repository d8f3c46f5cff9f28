"""The rented kind's pure logic on Vast: the instance state machine, offer choice, labels,
onstart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ups.deploy.errors import DeployError
from ups.deploy.hosts import load_hosts
from ups.deploy.managed.offers import choose, search
from ups.deploy.managed.reconcile import reconcile
from ups.deploy.managed.record import Rented
from ups.deploy.managed.record import State as Record
from ups.deploy.providers import (
    Instance,
    NoOffer,
    Offer,
    RunLabel,
    label_for,
    package,
    parse_label,
)
from ups.deploy.providers.base import ApiErrorKind, ProviderApiError
from ups.deploy.providers.vast.client import ACCOUNT
from ups.deploy.providers.vast.instance import State, instance_of, state_of
from ups.deploy.providers.vast.offers import offer_of
from ups.deploy.providers.vast.options import VastHost
from ups.deploy.providers.vast.provider import CAPABILITIES

ROWS = [
    {"id": 1, "dph_total": 0.9, "min_bid": 0.4, "gpu_name": "RTX 4090", "num_gpus": 2},
    {"id": 2, "dph_total": 0.6, "min_bid": 0.2, "gpu_name": "RTX 4090", "num_gpus": 2},
]
OFFERS = [offer_of(row, interruptible=True) for row in ROWS]


def _inst(**fields: Any) -> Instance:
    row = {"id": 5, "label": "ups:vast:r1", "actual_status": None, "intended_status": "running",
           "cur_state": "running", "status_msg": "", "dph_total": 0.5,
           "duration": 7200.0}  # fmt: skip
    return instance_of({**row, **fields})


@pytest.mark.parametrize(
    ("fields", "state"),
    [
        ({"actual_status": "loading"}, State.LOADING),
        ({"actual_status": "running"}, State.RUNNING),
        ({"actual_status": "exited", "cur_state": "stopped", "intended_status": "stopped"},
         State.STOPPED),
        ({"actual_status": "exited", "cur_state": "stopped", "intended_status": "running"},
         State.OUTBID),
        ({"actual_status": "loading", "status_msg": "Error response from daemon: pull access "
          "denied for x"}, State.FAILED),
        ({"actual_status": "offline"}, State.FAILED),
    ],
)  # fmt: skip
def test_instance_states(fields: dict[str, Any], state: State) -> None:
    """Each API row maps to the one state the lifecycle (and outbid recovery) acts on."""
    assert _inst(**fields).state is state


def test_gone_and_cost() -> None:
    """A missing instance is GONE; cost so far is $/h times hours since start."""
    assert state_of(None) is State.GONE
    assert _inst().cost_so_far == pytest.approx(1.0)


def test_labels_round_trip() -> None:
    """Labels name host and run; other people's instances are not ups's."""
    assert parse_label(label_for("vast", "demo-1")) == RunLabel("vast", "demo-1")
    assert parse_label(label_for("vast", "demo-1", 4)) == RunLabel("vast", "demo-1", 4)
    assert parse_label("ups:vast:demo-1@4").older_than(5)  # type: ignore[union-attr]
    assert not parse_label("ups:vast:demo-1@5").older_than(5)  # type: ignore[union-attr]
    assert parse_label("ups:vast:demo-1").older_than(1)  # type: ignore[union-attr]
    assert parse_label("my notebook") is None and parse_label(None) is None


def test_choose_first_under_cap_in_api_order() -> None:
    """The API's order wins among offers under the cap; interruptible compares the bid."""
    assert choose(OFFERS, 1.0, False, "Vast", "q").id == "1"
    assert choose(OFFERS, 0.7, False, "Vast", "q").id == "2"
    assert choose(OFFERS, 0.3, True, "Vast", "q").id == "2"  # min bid 0.2 <= 0.3; 1 needs 0.4
    assert choose(OFFERS, 0.45, 0.45, "Vast", "q").id == "1"  # an explicit bid


def test_choose_names_near_miss() -> None:
    """Nothing under the cap: the error names the cheapest offer and its price."""
    with pytest.raises(NoOffer, match=r"offer 2: 2x RTX 4090 .* at \$0\.600/h"):
        choose(OFFERS, 0.5, False, "Vast", "q")
    with pytest.raises(NoOffer, match="no Vast offer matches"):
        choose([], 0.5, False, "Vast", "q")


def test_vast_entry_validation(tmp_path: Path) -> None:
    """A vast entry needs an offer query and a price cap; other kinds still need an address."""
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  v: {kind: vast, offer: 'num_gpus=1'}\n  c: {kind: container}\n")
    with pytest.raises(DeployError) as err:
        load_hosts(path)
    assert "kind vast needs max_price_per_hour" in str(err.value)
    assert "kind container needs 'host'" in str(err.value)


def test_onstart_carries_no_secret_and_fits() -> None:
    """The onstart script starts the watchdog with no key in it and stays under Vast's 4 KB."""
    from ups.deploy.providers.watchdog import onstart_command

    spec = VastHost(offer="num_gpus=1", max_price_per_hour=1.0, vast_url="http://x")
    script = onstart_command(spec, 1.8e9)
    assert len(script.encode()) < 4000
    assert "ups.deploy.providers.watchdog --provider vast" in script
    assert "--deadline 1800000000" in script and "--start-timeout 3600" in script
    assert "--endpoint http://x" in script
    assert "KEY" not in script.upper().replace("NO_AUTO_TMUX", "")


def test_watchdog_poll_comes_from_hosts_yaml() -> None:
    """``watchdog_poll_s`` reaches the watchdog's command line (2 s when unset)."""
    from ups.deploy.providers.watchdog import onstart_command

    spec = VastHost(name="v", offer="num_gpus=1", max_price_per_hour=1.0)
    assert "--poll 2 " in onstart_command(spec, 1.8e9)
    quick = spec.model_copy(update={"watchdog_poll_s": 0.25})
    assert "--poll 0.25 " in onstart_command(quick, 1.8e9)


def test_a_rented_instance_is_a_container_host_of_the_shared_fields() -> None:
    """The instance a vast entry rents is a container host at the instance's address: the
    SSH and run fields carry over (user defaults to root), the rental's knobs stay behind."""
    from ups.deploy.hosts import ContainerHost

    spec = VastHost(
        name="v", offer="num_gpus=1", max_price_per_hour=1.0, gpus=2, workdir="/w", key="/k"
    )
    host = spec.as_container("ssh4.vast.ai", 4242)
    assert isinstance(host, ContainerHost) and host.kind == "container"
    assert (host.name, host.host, host.port, host.user) == ("v", "ssh4.vast.ai", 4242, "root")
    assert (host.gpus, host.workdir, host.key) == (2, "/w", "/k")
    assert not hasattr(host, "max_price_per_hour")


def _record(*rented: tuple[int, float | None]) -> Record:
    record = Record(run_id="r1", host="vast", config="/c.yaml", hosts_file=None, overrides=[])
    for instance_id, ended in rented:
        record.instances.append(
            Rented(str(instance_id), str(instance_id * 10), None, 0.5, 0.0, ended)
        )
    return record


def test_reconcile_follows_the_live_instance_and_blames_only_a_failed_host() -> None:
    """A supervisor starting on a run: it follows the youngest running instance; one still
    loading (rented by a supervisor killed right after the create) is adopted, not ended
    and not counted as a recovery; a second one is ended. Only an instance that failed on
    its host is a host fault; outbid, stopped or gone ones are not."""
    loading = _inst(id=7, actual_status="loading")
    verdict = reconcile(_record((5, 1.0), (7, None)), [loading])
    assert verdict.follow is loading and verdict.recovery is None and verdict.end == []
    running = _inst(id=8, actual_status="running", duration=60.0)
    verdict = reconcile(_record((7, None), (8, None)), [loading, running])
    assert verdict.follow is running
    assert verdict.end == [("7", "a second loading instance of run r1")]
    outbid = _inst(id=7, actual_status="exited", cur_state="stopped")
    failed = _inst(id=8, actual_status="offline")
    verdict = reconcile(_record((7, None), (8, None), (9, None)), [outbid, failed])
    assert verdict.follow is None and verdict.host_faults == ["8"]
    assert verdict.recovery is not None and "outbid" in verdict.recovery
    assert verdict.gone == [("9", verdict.gone[0][1])]
    assert "while no supervisor" in verdict.gone[0][1]
    assert reconcile(_record((7, 3.0)), []).continue_local


@pytest.mark.parametrize(
    ("phase", "recorded", "listed", "follow"),
    [
        # killed after it destroyed the outbid instance, before the create: nothing is
        # left and every recorded instance was ended by a supervisor; the run continues
        # from its checkpoint (the recovery was already counted)
        ("after the old one is destroyed", [(5, 1.0)], [], None),
        # killed right after the create (the record may not name it yet): adopted
        ("right after the create", [(5, 1.0)], [{"id": 7, "actual_status": "loading"}], 7),
        ("while it loads", [(5, 1.0), (7, None)], [{"id": 7, "actual_status": "loading"}], 7),
        # running, but setup, checkpoint upload or preflight not done: followed, and the
        # Keeper does the missing steps (attach)
        ("running, before setup", [(5, 1.0), (7, None)], [{"id": 7, "actual_status": "running"}],
         7),
    ],
)  # fmt: skip
def test_a_supervisor_killed_at_each_phase_of_a_recovery_is_picked_up(
    phase: str,
    recorded: list[tuple[int, float | None]],
    listed: list[dict[str, Any]],
    follow: int | None,
) -> None:
    """Wherever a recovering supervisor was killed, the next one neither ends a healthy
    replacement nor counts a second recovery for the one loss."""
    verdict = reconcile(_record(*recorded), [_inst(**row) for row in listed])
    assert verdict.end == [] and verdict.recovery is None, phase
    assert (verdict.follow.id if verdict.follow else None) == (str(follow) if follow else None), (
        phase
    )
    assert verdict.continue_local == (follow is None), phase


def test_all_matching_offers_excluded_is_not_no_offer(tmp_path: Path, monkeypatch: Any) -> None:
    """When offers matched but ups left every one out itself, the error says so, each with
    why; "no Vast offer matches" is kept for a query that matched nothing."""

    class FakeSearch:  # FAKE: stands for the Vast provider's offer search only
        name, account, capabilities = "vast", ACCOUNT, CAPABILITIES

        def search(self, *args: Any) -> list[Offer]:
            return [offer_of({**o, "machine_id": 100 + o["id"]}, False) for o in ROWS]

    monkeypatch.setenv("UPS_STATE_DIR", str(tmp_path))
    spec = VastHost(name="v", offer="num_gpus=2", max_price_per_hour=1.0)
    with pytest.raises(NoOffer) as err:
        search(FakeSearch(), spec, machines=["102"], offers=["1"])  # type: ignore[arg-type]
    text = str(err.value)
    assert "2 Vast offer(s) matched query 'num_gpus=2'; all were excluded" in text
    assert "offer 1 on machine 101: its instance was lost earlier in this run" in text
    assert "offer 2 on machine 102: its machine failed in this deploy" in text
    assert "no Vast offer matches" not in text


def test_a_detaching_deploy_is_named_as_such_not_as_the_supervisor_to_kill() -> None:
    """While a `--detach` deploy rents and starts the run it holds the lease; a second
    deploy is told it is that short-lived deploy (its supervisor comes later, another pid),
    not to `kill` it; a supervisor's holder is told how to end it."""
    from ups.deploy.managed.lease import DETACHING, Holder

    starting = Holder("h", 41, 1.0, "t", DETACHING, 0.0, 60.0)
    assert starting.describe().startswith("detached deploy pid 41 on h")
    assert "hands the run to a background supervisor" in starting.describe()
    assert "kill" not in starting.how_to_end() and "fab instances" in starting.how_to_end()
    supervising = Holder("h", 42, 1.0, "t", "detached", 0.0, 60.0)
    assert supervising.describe().startswith("detached supervisor pid 42 on h")
    assert "`kill 42` on h" in supervising.how_to_end()


def test_an_instance_without_its_id_or_key_says_so_in_the_instances_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog on an instance started some other way (no ``CONTAINER_ID`` or
    ``CONTAINER_API_KEY``) is told what is missing there, not the laptop's paragraph about
    saving an account key with `vastai set api-key`: nobody types that on the instance."""
    monkeypatch.delenv("CONTAINER_ID", raising=False)
    monkeypatch.setenv("CONTAINER_API_KEY", "instance-key")
    inside = package("vast").on_instance("http://127.0.0.1:9", None)
    with pytest.raises(ProviderApiError) as missing:
        inside.end_self("destroy")
    assert missing.value.kind is ApiErrorKind.KEY_MISSING
    said = str(missing.value)
    assert "cannot destroy this Vast instance: no CONTAINER_ID or no key" in said
    assert ACCOUNT.save_key not in said and "vastai" not in said
