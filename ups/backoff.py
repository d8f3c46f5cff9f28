"""How long to wait between tries: every backoff in ups is one of the named policies here.

*Whether* a failure is worth another try is decided elsewhere: ``ups/retry.py`` for a
run's outcome, the caller's exception types for a connection or an API call. This module
only says how the waits grow: ``first * factor**n`` seconds before try ``n + 2``, capped
at ``max_s``. A provider declares its own API's policies
(:class:`ups.deploy.providers.base.Backoff`). Tenacity runs the retries where a function
is simply called again (:meth:`Policy.wait`); loops that poll a state or stream keep
their own loop and take their sleeps from :meth:`Policy.delays`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import tenacity


@dataclass(frozen=True)
class Policy:
    """Exponential backoff: ``first`` seconds, times ``factor`` each try, at most ``max_s``."""

    name: str
    first: float
    factor: float
    max_s: float

    def delay(self, n: int) -> float:
        """The wait after the ``n``-th failed try (0-based)."""
        return float(min(self.first * self.factor**n, self.max_s))

    def delays(self) -> Iterator[float]:
        """The waits in order, without end (the caller's deadline or budget stops it)."""
        n = 0
        while True:
            yield self.delay(n)
            n += 1

    def wait(self) -> tenacity.wait.wait_base:
        """The same waits for a ``tenacity.Retrying``."""
        return tenacity.wait_exponential(
            multiplier=self.first, exp_base=self.factor, max=self.max_s
        )

    def with_(self, *, first: float | None = None, max_s: float | None = None) -> Policy:
        """This policy with a setting from config or a caller (e.g. ``first`` from a flag)."""
        return dataclasses.replace(
            self,
            first=self.first if first is None else first,
            max_s=self.max_s if max_s is None else max_s,
        )


SSH_CONNECT = Policy("ssh_connect", first=1.0, factor=2.0, max_s=30.0)
"""A connect that failed for network reasons (an sshd still starting)."""
LOG_STREAM = Policy("log_stream", first=0.25, factor=2.0, max_s=8.0)
"""Reconnecting a dropped log stream: the first retry fast, a dead link not hammered."""
LAUNCH_RESTART = Policy("launch_restart", first=10.0, factor=2.0, max_s=300.0)
"""Relaunching torchrun in place after a retryable failure (``first`` comes from the plan)."""
BUCKET_SYNC = Policy("bucket_sync", first=2.0, factor=2.0, max_s=60.0)
"""Uploading to a bucket that did not answer: training goes on, the uploads catch up."""

POLICIES = {
    p.name: p
    for p in (
        SSH_CONNECT,
        LOG_STREAM,
        LAUNCH_RESTART,
        BUCKET_SYNC,
    )
}
