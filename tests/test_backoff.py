"""Every wait between tries comes from one named policy (ups/backoff.py)."""

from __future__ import annotations

import itertools

import pytest
import tenacity

from ups.backoff import LAUNCH_RESTART, LOG_STREAM, POLICIES, Policy
from ups.deploy.providers.vast.client import BACKOFF as VAST

VAST_RUNNING, VAST_SSH = VAST.running, VAST.ssh
EVERY = {**POLICIES, **{p.name: p for p in vars(VAST).values()}}


def _first(policy: Policy, n: int) -> list[float]:
    return list(itertools.islice(policy.delays(), n))


def test_policies_keep_the_waits_each_loop_had() -> None:
    """The numbers the hand-written loops used, now named in one place."""
    assert _first(LOG_STREAM, 7) == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert _first(VAST_SSH, 5) == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert _first(VAST_RUNNING, 8)[:3] == [1.0, 1.5, 2.25] and _first(VAST_RUNNING, 8)[-1] == 10.0
    restart = LAUNCH_RESTART.with_(first=10.0)
    assert [restart.delay(n) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]


@pytest.mark.parametrize("name", sorted(EVERY))
def test_tenacity_waits_equal_the_policy(name: str) -> None:
    """Retrying under tenacity waits what the policy says, try by try (a provider's too)."""
    policy = EVERY[name]
    wait = policy.wait()
    state = tenacity.RetryCallState(tenacity.Retrying(), fn=None, args=(), kwargs={})
    for attempt in range(1, 9):
        state.attempt_number = attempt
        assert wait(state) == pytest.approx(policy.delay(attempt - 1))
