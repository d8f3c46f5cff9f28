"""The instance-side watchdog on its own: started by the onstart script at boot, it acts at its
deadline with the instance's own CONTAINER_API_KEY. The FAKE lets that key stop but not
destroy its instance (Vast does not document more), so the watchdog falls back to stop."""

from __future__ import annotations

import time

import pytest
from vastai import VastAI

from tests.deploy_fixtures import VENV_BIN
from tests.fake_vast import FakeVast, fake_vast
from ups.deploy.providers import Instance
from ups.deploy.providers.vast.instance import State, instance_of
from ups.deploy.providers.vast.options import VastHost
from ups.deploy.providers.watchdog import onstart_command

__all__ = ["fake_vast"]  # fixture used by name below

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def _spec(fake: FakeVast, **extra: object) -> VastHost:
    fields: dict[str, object] = {
        "kind": "vast", "offer": "num_gpus=2", "max_price_per_hour": 1.0,
        "workdir": str(fake.workdir), "ups_bin": str(VENV_BIN / "ups"), "vast_url": fake.url,
        "watchdog_grace_s": 0, "watchdog_poll_s": 0.2,
    }  # fmt: skip
    fields.update(extra)
    return VastHost.model_validate(fields)


def _wait_state(sdk: VastAI, instance_id: int, state: State, timeout: float) -> Instance | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = sdk.show_instance(id=instance_id)
        inst = instance_of(row) if row else None
        if (inst.state if inst else State.GONE) is state:
            return inst
        time.sleep(0.5)  # polling the FAKE API
    return None


def test_instance_key_may_only_stop_so_watchdog_stops(fake_vast: FakeVast) -> None:
    """With no scoped key, the watchdog's destroy is refused (401) and it stops the instance:
    GPU billing ends, the instance shows STOPPED, and its log says why."""
    sdk = VastAI(api_key=fake_vast.api_key, server_url=fake_vast.url, retry=1, raw=True)
    onstart = onstart_command(_spec(fake_vast), time.time() + 1)  # due as it boots
    created = sdk.create_instance(id=102, image="ups", disk=32, label="ups:vast:wd",
                                  onstart_cmd=onstart, ssh=True)  # fmt: skip
    instance_id = created["new_contract"]
    stopped = _wait_state(sdk, instance_id, State.STOPPED, timeout=120)
    assert stopped is not None, "the watchdog did not stop the instance"
    inst = fake_vast.instances[instance_id]
    log = (inst.root / "disk" / "workspace" / ".ups" / "watchdog" / "watchdog.log").read_text()
    assert "max_hours reached" in log
    assert "watchdog key may not destroy; stopping instead" in log
    assert fake_vast.namespace_pids(inst) == []
    assert inst.container_key not in onstart


def test_container_key_that_may_destroy_destroys(fake_vast: FakeVast) -> None:
    """Where the instance's own key may destroy, the watchdog destroys: the API lists nothing."""
    fake_vast.switches.container_key_can_destroy = True
    sdk = VastAI(api_key=fake_vast.api_key, server_url=fake_vast.url, retry=1, raw=True)
    onstart = onstart_command(_spec(fake_vast), time.time() + 1)  # due as it boots
    sdk.create_instance(id=102, image="ups", disk=32, label="ups:vast:wd2", onstart_cmd=onstart,
                        ssh=True)  # fmt: skip
    assert fake_vast.wait_empty(timeout=120), "the watchdog did not destroy the instance"
    assert sdk.show_instances() == []


def test_an_instance_no_run_started_on_ends_itself(fake_vast: FakeVast) -> None:
    """An instance nobody set up (created by a supervisor that lost the run before it got
    there) ends itself start_timeout_s after its boot, long before max_hours, with the
    instance's own key: nothing bills past that bound without any laptop."""
    fake_vast.switches.container_key_can_destroy = True
    sdk = VastAI(api_key=fake_vast.api_key, server_url=fake_vast.url, retry=1, raw=True)
    onstart = onstart_command(_spec(fake_vast, start_timeout_s=2), time.time() + 3600)
    created = sdk.create_instance(id=102, image="ups", disk=32, label="ups:vast:lost@1",
                                  onstart_cmd=onstart, ssh=True)  # fmt: skip
    inst = fake_vast.instances[created["new_contract"]]
    assert fake_vast.wait_empty(timeout=120), "the watchdog did not end the instance"
    log = (inst.root / "disk" / "workspace" / ".ups" / "watchdog" / "watchdog.log").read_text()
    assert "no run started within start_timeout_s" in log
    assert inst.billed_s["running"] < 60  # boot, 2 s, the destroy: not max_hours
