"""Bad inputs and Vast API trouble: one clear paragraph, a documented exit code, nothing billing.

`fab deploy --host vast` runs for real against the FAKE Vast API (tests/fake_vast.py),
driven through the real `vastai` SDK.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy_fixtures import fab
from tests.fake_vast import FakeVast, fab_env, fake_vast, write_vast_hosts

__all__ = ["fake_vast"]  # fixture used by name below

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def _deploy(fake: FakeVast, tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
            **entry: object) -> tuple[int, str, str]:  # fmt: skip
    hosts = write_vast_hosts(fake, tmp_path / "hosts.yaml", **entry)
    result = fab(
        "deploy", "--host", "vast", "--hosts-file", str(hosts), "--config", "configs/demo.yaml",
        *extra, env=env or fab_env(fake, tmp_path), timeout=180,
    )  # fmt: skip
    return result.returncode, result.stdout, result.stderr


def _one_paragraph(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return errors[0]


def test_no_api_key(fake_vast: FakeVast, tmp_path: Path) -> None:
    """Without any Vast API key, deploy says where the key is looked for; exit 5."""
    env = fab_env(fake_vast, tmp_path)
    del env["VAST_API_KEY"]
    code, _out, err = _deploy(fake_vast, tmp_path, env=env)
    assert code == 5
    assert "no Vast API key found" in _one_paragraph(err)
    assert "VAST_API_KEY" in err and "vast_api_key" in err
    assert fake_vast.requests == []


@pytest.mark.parametrize("status", [401, 404])
def test_key_rejected(fake_vast: FakeVast, tmp_path: Path, status: int) -> None:
    """A wrong key gets 'rejected the API key' and the fix (where the key is read, how to
    replace it), whether Vast answers 401 or 404 with an auth_error body; the key is not
    echoed."""
    fake_vast.switches.auth_error_status = status
    wrong = "not-the-right-key-123"
    code, out, err = _deploy(fake_vast, tmp_path, env=fab_env(fake_vast, tmp_path,
                                                              VAST_API_KEY=wrong))  # fmt: skip
    assert code == 5
    line = _one_paragraph(err)
    assert f"rejected the API key (HTTP {status})" in line
    assert "~/.config/vastai/vast_api_key" in line and "vastai set api-key KEY" in line
    assert wrong not in out + err
    assert fake_vast.live() == []


def test_rate_limited_backs_off_then_succeeds(fake_vast: FakeVast, tmp_path: Path) -> None:
    """Three 429s without Retry-After are waited out: the dry run still prints its offer."""
    fake_vast.switches.rate_limit_next = 3
    code, out, err = _deploy(fake_vast, tmp_path, "--dry-run")
    assert code == 0, err
    assert "offer 102: 2x RTX 4090 in Canada, CA at $0.627/h" in out
    assert fake_vast.switches.rate_limit_next == 0


def test_rate_limited_for_too_long(fake_vast: FakeVast, tmp_path: Path) -> None:
    """An API that keeps answering 429 ends in one message naming the rate limit; exit 5."""
    fake_vast.switches.rate_limit_next = 10_000
    code, _out, err = _deploy(
        fake_vast, tmp_path, env=fab_env(fake_vast, tmp_path, UPS_VAST_RETRY_S="3")
    )
    assert code == 5
    assert "kept rate-limiting us (HTTP 429)" in _one_paragraph(err)


def test_query_rejected_by_api(fake_vast: FakeVast, tmp_path: Path) -> None:
    """An offer query with a field the API does not know shows the API's reason; exit 5."""
    code, _out, err = _deploy(fake_vast, tmp_path, offer="gpu_nam=RTX_4090")
    assert code == 5
    line = _one_paragraph(err)
    assert "rejected the request to search offers (HTTP 400)" in line
    assert "gpu_nam" in line


def test_no_offer_under_cap_names_near_miss(fake_vast: FakeVast, tmp_path: Path) -> None:
    """Under a too-low cap nothing is created and the cheapest near miss is named; exit 6."""
    code, _out, err = _deploy(fake_vast, tmp_path, offer="num_gpus>=1", max_price_per_hour=0.1)
    assert code == 6
    line = _one_paragraph(err)
    assert "offer 103: 1x RTX 3090 in Texas, US at $0.217/h" in line
    assert "$0.100/h" in line
    assert not [r for r in fake_vast.requests if r[1].startswith("/api/v0/asks/")]
    assert fake_vast.live() == []


def test_image_pull_failure_shows_status_and_destroys(fake_vast: FakeVast, tmp_path: Path) -> None:
    """An image Vast cannot pull: the instance's own status message is shown, it is destroyed;
    exit 7."""
    fake_vast.switches.image_pull_fails = True
    code, out, err = _deploy(fake_vast, tmp_path)
    assert code == 7
    assert "pull access denied for ghcr.io/example/ups:0.1.0" in _one_paragraph(err)
    assert "destroyed instance" in out
    assert fake_vast.live() == [] and len(fake_vast.destroyed) == 1
