"""The provider-neutral core's pure logic: the recovery policies (where a run goes next),
the fence's choice of stray instances (an older lease epoch's), the typed requirements an
offer meets, and every provider's API errors worded the same."""

from __future__ import annotations

from typing import Any

import pytest

from ups.deploy.managed.fence import strays
from ups.deploy.managed.recovery import Failover, NextOffer, WaitAndRetry, policy_for
from ups.deploy.providers import (
    Account,
    ApiErrorKind,
    Instance,
    InstanceState,
    Move,
    Offer,
    OfferRequirements,
    Situation,
    Trigger,
    api_error,
    gpu_matches,
    label_for,
)
from ups.deploy.providers.vast.client import ACCOUNT, classify
from ups.deploy.providers.vast.options import VastHost

ENTRIES = ("vast-a", "vast-b", "other")


def _at(trigger: Trigger, entry: str = "vast-a", in_a_row: int = 1, **more: Any) -> Situation:
    return Situation(trigger, entry, "why", in_a_row, ENTRIES, **more)


def test_next_offer_never_leaves_the_provider() -> None:
    """The next offer after a loss, a bad host or a taken offer (up to max_offers in a row);
    no offer under the cap gives up (exit 6, as before failover existed)."""
    policy = NextOffer({"vast-a": 3})
    assert policy.decide(_at(Trigger.LOST)).move is Move.NEXT_OFFER
    assert policy.decide(_at(Trigger.BAD_HOST, in_a_row=2)).move is Move.NEXT_OFFER
    assert policy.decide(_at(Trigger.BAD_HOST, in_a_row=3)).move is Move.GIVE_UP
    assert policy.decide(_at(Trigger.OFFER_TAKEN, in_a_row=3)).move is Move.GIVE_UP
    assert policy.decide(_at(Trigger.NO_OFFER)).move is Move.GIVE_UP


def test_failover_moves_on_no_offer_or_bad_hosts_in_a_row() -> None:
    """No offer under the cap, or max_offers bad hosts in a row, moves the run to the next
    entry in order (skipping one known to have no offer, wrapping round); a loss or a
    single bad host stays; with nowhere left it gives up."""
    policy = Failover({"vast-a": 2, "vast-b": 2, "other": 2})
    moved = policy.decide(_at(Trigger.NO_OFFER))
    assert (moved.move, moved.entry) == (Move.NEXT_PROVIDER, "vast-b")
    assert "no offer under the cap on vast-a" in moved.reason
    skip = policy.decide(_at(Trigger.NO_OFFER, without_offer=frozenset({"vast-b"})))
    assert (skip.move, skip.entry) == (Move.NEXT_PROVIDER, "other")
    wrap = policy.decide(_at(Trigger.NO_OFFER, entry="other"))
    assert (wrap.move, wrap.entry) == (Move.NEXT_PROVIDER, "vast-a")
    assert policy.decide(_at(Trigger.BAD_HOST, in_a_row=1)).move is Move.NEXT_OFFER
    bad = policy.decide(_at(Trigger.BAD_HOST, in_a_row=2))
    assert (bad.move, bad.entry) == (Move.NEXT_PROVIDER, "vast-b")
    assert "2 bad host(s) in a row on vast-a" in bad.reason
    assert policy.decide(_at(Trigger.LOST)).move is Move.NEXT_OFFER
    nowhere = frozenset({"vast-b", "other"})
    assert policy.decide(_at(Trigger.NO_OFFER, without_offer=nowhere)).move is Move.GIVE_UP


def test_wait_and_retry_waits_where_the_inner_policy_would_give_up_for_offers() -> None:
    """Only wanting an offer waits; everything else is the inner policy's decision."""
    policy = WaitAndRetry(NextOffer({}), wait_s=30.0)
    waited = policy.decide(_at(Trigger.NO_OFFER, entry="vast-b"))
    assert (waited.move, waited.entry, waited.wait_s) == (Move.WAIT, "vast-a", 30.0)
    assert policy.decide(_at(Trigger.BAD_HOST, in_a_row=9)).move is Move.GIVE_UP


def test_the_entries_choose_the_policy() -> None:
    """One entry: next offer; with failover entries: failover; no_offer_wait_s wraps it."""
    one = VastHost(name="a", offer="num_gpus=1", max_price_per_hour=1.0)
    two = one.model_copy(update={"name": "b"})
    assert policy_for((one,)).name == "next_offer"
    assert policy_for((one, two)).name == "failover"
    waiting = one.model_copy(update={"no_offer_wait_s": 60.0})
    assert policy_for((waiting, two)).name == "wait_and_retry"


class _Provider:  # FAKE: only the name a listing's owner carries
    def __init__(self, name: str) -> None:
        self.name = name


def _inst(iid: str, epoch: int | None, state: InstanceState = InstanceState.RUNNING) -> Instance:
    return Instance(iid, "vast", label_for("vast", "r1", epoch), state)


def test_the_fence_ends_only_older_epochs_it_did_not_make_that_compute() -> None:
    """The holder of epoch 5 ends instances of its run created under an older epoch (or
    none: an older release) that it did not create or adopt and that load or run; its own
    epoch's, a newer one's, stopped ones and its adopted ones stay."""
    vast = _Provider("vast")
    found = [
        (vast, _inst("1", 4)),  # a frozen supervisor's create: ended
        (vast, _inst("2", None, InstanceState.LOADING)),  # an older release's: ended
        (vast, _inst("3", 5)),  # its own epoch
        (vast, _inst("4", 6)),  # a newer holder's: this one lost the lease, not its call
        (vast, _inst("5", 3, InstanceState.STOPPED)),  # kept per on_exit: bills disk only
        (vast, _inst("6", 2)),  # adopted at pick-up
    ]
    ended = strays(found, 5, {("vast", "6")})  # type: ignore[arg-type]
    assert [inst.id for _, inst, _ in ended] == ["1", "2"]
    assert "created under lease epoch 4, older than this supervisor's 5" in ended[0][2]


def test_requirements_are_stated_once_and_read_by_every_provider() -> None:
    """GPU names match across spellings; count, VRAM, region, reliability and the bid
    apply to a typed offer whatever its provider; the price cap is the caller's."""
    assert gpu_matches("RTX 4090", "NVIDIA GeForce RTX 4090")
    assert gpu_matches("A100", "A100-SXM4-80GB") and not gpu_matches("A100", "H100 SXM")
    spec = VastHost(name="v", gpu="RTX_4090", gpus=2, min_vram_gb=20, region=["CA", "NO"],
                    interruptible=True, max_price_per_hour=0.5)  # fmt: skip
    req = OfferRequirements.of(spec)
    offer = Offer("1", "x", "NVIDIA GeForce RTX 4090", 2, 24.0, 0.9, "Canada, CA",
                  interruptible=True, min_bid_per_hour=0.3)  # fmt: skip
    assert req.admits(offer) and offer.affordable(0.5, True) and not offer.affordable(0.2, True)
    assert not req.admits(Offer("2", "x", "RTX 4090", 2, 24.0, 0.9, "Texas, US", True))
    assert not req.admits(Offer("3", "x", "RTX 4090", 1, 24.0, 0.9, "Canada, CA", True))
    assert "2x RTX_4090, >= 20 GB per GPU, in CA or NO" in req.describe()


@pytest.mark.parametrize(
    ("status", "body"),
    [(401, {"error": "auth_error", "msg": "Invalid user key"}),
     (404, {"error": "auth_error", "msg": "Invalid user key"}),
     (403, "forbidden")],
)  # fmt: skip
def test_a_rejected_key_is_one_kind_whatever_the_status(status: int, body: object) -> None:
    """Vast's 404 with an auth_error body is a rejected key, read like its 401: the same
    paragraph naming where the key is read and how to replace it."""
    kind = classify(status, body)
    assert kind is ApiErrorKind.KEY_REJECTED
    text = str(api_error(ACCOUNT, kind, "search offers", status=status, detail="Invalid key"))
    assert f"the Vast API rejected the API key (HTTP {status}) when trying to search offers" in text
    assert "VAST_API_KEY, ~/.config/vastai/vast_api_key" in text
    assert "https://cloud.vast.ai/manage-keys/" in text and "vastai set api-key KEY" in text
    assert classify(404, {"error": "no_such_instance"}) is ApiErrorKind.NOT_FOUND


def test_every_provider_says_a_rejected_key_in_the_same_words() -> None:
    """Only the account's own facts differ between two providers' key errors."""
    other = Account("Other", "OTHER_KEY", "https://o/keys", "export OTHER_KEY=KEY", "https://o")

    def said(account: Account) -> str:
        text = str(api_error(account, ApiErrorKind.KEY_REJECTED, "list instances", status=401))
        facts = (account.title, account.key_locations, account.key_page, account.save_key)
        for fact in sorted(facts, key=len, reverse=True):
            text = text.replace(fact, "<>")
        return text

    assert said(ACCOUNT) == said(other)


def test_failover_entries_are_checked_where_they_are_read(tmp_path: Any) -> None:
    """``failover`` must name other rented entries (the loader lists every wrong one), and
    a run's entries keep one bucket (the next provider resumes from it)."""
    from ups.deploy.errors import DeployError, UsageError
    from ups.deploy.hosts import get_host, load_hosts
    from ups.deploy.managed.ops import entries_of

    path = tmp_path / "hosts.yaml"
    base = "kind: vast, offer: 'num_gpus=1', max_price_per_hour: 1"
    path.write_text(
        f"hosts:\n  a: {{{base}, failover: [box, a, nope]}}\n"
        f"  b: {{{base}, checkpoint_sync: 's3://one/runs'}}\n"
        f"  c: {{{base}, failover: [b]}}\n"
        "  box: {host: h}\n"
    )
    with pytest.raises(DeployError) as err:
        load_hosts(path)
    for name in ("'box'", "'a'", "'nope'"):
        assert f"hosts.a.failover: {name} is not another rented entry" in str(err.value)
    path.write_text(path.read_text().replace("failover: [box, a, nope]", "failover: [c]"))
    spec, _ = get_host("c", path)
    with pytest.raises(UsageError, match="keeps one bucket"):
        entries_of(spec, str(path))  # type: ignore[arg-type]
    spec, _ = get_host("a", path)
    assert [e.name for e in entries_of(spec, str(path))] == ["a", "c"]  # type: ignore[arg-type]


def test_a_lost_instance_leaves_its_offer_out_only_where_the_offer_is_a_machine() -> None:
    """Vast's offer is one machine: after its instance was lost (outbid) the next search
    leaves it out. RunPod's offer is a GPU type at a count (RunPod picks the machine at each
    create): it stays, or a preempted spot pod could never be replaced on RunPod (the run
    ended with exit 6, 'all were excluded', before the fix)."""
    from types import SimpleNamespace

    from ups.deploy.managed.acquire import Where
    from ups.deploy.providers import Capabilities

    def provider(machine_identity: bool) -> Any:
        caps = Capabilities(interruptible=True, stop_resume=True, labels=True,
                            self_destruct=True, machine_identity=machine_identity)  # fmt: skip
        return SimpleNamespace(capabilities=caps)

    market: Any = None  # not searched here
    where = Where(market=market, policy=NextOffer({}), on_move=lambda *_: None)
    machine = Offer(id="101", provider="vast", gpu_name="RTX 4090", num_gpus=1, gpu_ram_gb=24.0,
                    price_per_hour=0.4, region="NO", machine_id="1010")  # fmt: skip
    gpu_type = Offer(id="NVIDIA GeForce RTX 4090|1", provider="runpod", gpu_name="RTX 4090",
                     num_gpus=1, gpu_ram_gb=24.0, price_per_hour=0.7, region="ALL")  # fmt: skip
    where.lost(machine, provider(machine_identity=True))
    where.lost(gpu_type, provider(machine_identity=False))
    assert where.offers_of("vast") == {"101"}
    assert where.offers_of("runpod") == set()
