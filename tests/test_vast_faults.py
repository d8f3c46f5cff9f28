"""Whose fault a failed Vast instance is, the host ledger, and which API failures are
retried: pure logic, no process started."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ups.deploy.errors import DeployError
from ups.deploy.managed.faults import failed_checks, preflight_side
from ups.deploy.managed.ledger import Failure, Ledger, ledger_path, render
from ups.deploy.providers import Side
from ups.deploy.providers.vast.faults import STATUS_RULES, classify_status
from ups.deploy.providers.vast.instance import State, instance_of
from ups.deploy.providers.vast.offers import offer_of
from ups.retry import API_RETRY, api_retryable


@pytest.mark.parametrize(
    ("status_msg", "side"),
    [
        ("nvidia-container-cli: initialization error: nvml error: driver not loaded", Side.HOST),
        ("failed to register layer: unexpected EOF", Side.HOST),
        ("Error pulling image: unexpected EOF", Side.HOST),
        ("write /var/lib/docker/tmp/x: no space left on device", Side.HOST),
        ("OCI runtime create failed: runc create failed", Side.HOST),
        (
            "Error response from daemon: manifest for ghcr.io/x/ups:9 not found: manifest "
            "unknown: manifest unknown",
            Side.USER,
        ),
        ("Error response from daemon: Head https://ghcr.io/v2/x/ups: unauthorized", Side.USER),
        (
            "Error response from daemon: pull access denied for x/ups, repository does not "
            "exist or may require 'docker login'",
            Side.USER,
        ),
        ("invalid reference format: repository name must be lowercase", Side.USER),
    ],
)
def test_status_messages_are_told_apart(status_msg: str, side: Side) -> None:
    """Driver and pull errors are the machine's; a missing or refused image is the user's,
    even where the daemon's generic prefix is the same."""
    rule = classify_status(status_msg)
    assert rule is not None and rule.side is side


def test_unknown_and_benign_messages_are_not_fatal() -> None:
    """A status the table does not know is not classified: the instance keeps its boot time."""
    assert classify_status("") is None
    assert classify_status("Pulling layer 3/9 (1.2 GB)") is None
    assert all(rule.meaning for rule in STATUS_RULES)


def test_known_fatal_status_fails_fast() -> None:
    """An instance still 'created' but showing the NVML error is FAILED at once (no wait)."""
    row = {"id": 5, "actual_status": "created", "intended_status": "running",
           "cur_state": "running", "status_msg": "nvml error: driver not loaded"}  # fmt: skip
    assert instance_of(row).state is State.FAILED
    row["status_msg"] = "unexpected EOF"
    assert instance_of(row).state is State.FAILED
    row["status_msg"] = "Pulling image"
    assert instance_of(row).state is State.LOADING


PREFLIGHT_REPORT = """CHECK    STATUS  VALUE         MESSAGE
config   PASS    demo.yaml     valid (2 task(s))
shm      {shm}    64.0 MiB      /dev/shm is 64.0 MiB, below the 1.0 GiB needed
ulimits  PASS    20000 files   nofile=20000
data     {data}    2 files       ok
"""


def test_preflight_failures_of_the_machine_are_host_faults() -> None:
    """Only the machine's own checks failing makes it a host fault; a data or config check
    failing (with or without a machine check) is the user's."""
    host = PREFLIGHT_REPORT.format(shm="FAIL", data="PASS")
    assert failed_checks(host) == ["shm"]
    assert preflight_side(host) is Side.HOST
    both = PREFLIGHT_REPORT.format(shm="FAIL", data="FAIL")
    assert preflight_side(both) is Side.USER
    assert preflight_side(PREFLIGHT_REPORT.format(shm="PASS", data="FAIL")) is Side.USER
    assert preflight_side("preflight could not start") is Side.USER


def _failure(machine: int, at: float, why: str = "nvml error") -> Failure:
    return Failure(machine_id=str(machine), host_id=str(machine * 10),
                   offer_id=str(machine + 1), instance_id="7", failure=why, at=at, run_id="r1",
                   host="vast")  # fmt: skip


def test_ledger_records_strict_json_and_excludes_within_ttl(tmp_path: Path) -> None:
    """Entries survive in strict JSON; only those younger than the TTL are excluded."""
    ledger = Ledger(tmp_path / "state" / "hosts-ledger.json")
    assert ledger.read() == [] and ledger.excluded(72, "vast") == set()
    now = time.time()
    ledger.record(_failure(11, now - 100 * 3600))
    ledger.record(_failure(22, now - 60))
    data = json.loads(ledger.path.read_text())  # strict: json.loads accepts nothing else
    assert [f["machine_id"] for f in data["failures"]] == ["11", "22"]
    assert ledger.excluded(72, "vast", now) == {"22"}
    assert ledger.excluded(200, "vast", now) == {"11", "22"}
    assert ledger.excluded(200, "runpod", now) == set()  # machine ids are per provider
    assert ledger.excluded(0, "vast", now) == set()
    table = render(ledger.read(), 72, now)
    assert "22" in table and "nvml error (run r1)" in table
    assert "2 failure(s)" in table


def test_ledger_drops_month_old_entries_and_reports_a_broken_file(tmp_path: Path) -> None:
    """A write keeps the file small; a corrupt ledger is one paragraph naming the file."""
    ledger = Ledger(tmp_path / "hosts-ledger.json")
    ledger.record(_failure(1, time.time() - 40 * 86400))
    ledger.record(_failure(2, time.time()))
    assert [f.machine_id for f in ledger.read()] == ["2"]
    ledger.path.write_text("{not json")
    with pytest.raises(DeployError, match=r"host ledger .* cannot be read"):
        ledger.read()


def test_ledger_path_follows_the_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """UPS_STATE_DIR wins; else XDG_STATE_HOME/ups."""
    monkeypatch.setenv("UPS_STATE_DIR", str(tmp_path / "a"))
    assert ledger_path() == tmp_path / "a" / "hosts-ledger.json"
    monkeypatch.delenv("UPS_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "x"))
    assert ledger_path() == tmp_path / "x" / "ups" / "hosts-ledger.json"


def test_offers_carry_machines() -> None:
    """The search rows' machine_id/host_id reach the typed offer (as strings), the row
    itself rides along opaque."""
    row = {"id": 1, "machine_id": 10, "host_id": 100, "gpu_ram": 24564, "reliability": 0.99}
    offer = offer_of(row, False)
    assert (offer.id, offer.machine_id, offer.host_id) == ("1", "10", "100")
    assert offer.gpu_ram_gb == pytest.approx(24.564) and offer.data is row
    assert offer_of({"id": 3}, False).machine_id is None


def test_api_retry_table() -> None:
    """A destroy is retried on a 500, other calls are not; nothing retries a 400 or 401;
    connection errors (no status) always are."""
    assert api_retryable("destroy", 500) and not api_retryable("default", 500)
    assert api_retryable("create", 504) and api_retryable("search", 429)
    assert not api_retryable("destroy", 400) and not api_retryable("default", 401)
    assert api_retryable("destroy", None) and api_retryable("default", None)
    assert all(rule.meaning for rule in API_RETRY.values())
