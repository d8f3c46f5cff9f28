"""How long a stopping run gets, derived from one setting: ``distributed.stop_grace_s``.

A stop travels down a chain, and each link must wait longer than the one below it, or
the outer one kills the inner one mid-checkpoint:

- torchrun's ``--shutdown-timeout`` = ``stop_grace_s``: after forwarding SIGTERM, the
  agent waits this long for the workers (stop at a step, rank 0 saves) before SIGKILL.
  torch's own default is 30 s, too short for a real model's checkpoint.
- the container's ``stop_grace_period`` (docker-compose.yml) = ``stop_grace_s`` +
  :data:`LAUNCH_MARGIN_S`: ``ups launch`` then writes the outcome and exits.
- ``fab stop``'s wait (``docker stop -t``, then waiting for outcome.json) = the
  container's grace + :data:`STOP_MARGIN_S`.

``tests/test_lifecycle_units.py`` reads docker-compose.yml and the deploy code and
checks that they agree with these numbers.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_STOP_GRACE_S = 120
"""``distributed.stop_grace_s``'s default (the schema imports it)."""
LAUNCH_MARGIN_S = 20
"""After torchrun returns: finalize the outcome, sweep leftovers, flush logs."""
STOP_MARGIN_S = 40
"""``fab stop`` waits this much beyond the container's grace (ssh, docker's own latency)."""


def shutdown_timeout_s(stop_grace_s: float) -> int:
    """torchrun's ``--shutdown-timeout`` (whole seconds, at least 1)."""
    return max(1, round(stop_grace_s))


def container_grace_s(stop_grace_s: float = DEFAULT_STOP_GRACE_S) -> int:
    """What ``stop_grace_period`` must be for a container running ``ups launch``."""
    return shutdown_timeout_s(stop_grace_s) + LAUNCH_MARGIN_S


def stop_wait_s(stop_grace_s: float = DEFAULT_STOP_GRACE_S) -> int:
    """How long ``fab stop`` waits for the container to save and exit."""
    return container_grace_s(stop_grace_s) + STOP_MARGIN_S


STOP_WAIT_S = float(stop_wait_s())
"""``fab stop``'s default wait, for the default grace."""


STOP_REQUEST_FILE = "stop_request"
"""In the run directory while a stop is under way: the signal a person or an agent sent
``ups launch`` (``SIGINT`` for Ctrl-C). Launch writes it before it forwards its one
SIGTERM, so the workers name the stop as it was sent, not as it was forwarded."""


def requested_stop(run_dir: str | None) -> str | None:
    """The signal named in ``run_dir``'s stop request, or None (no request, no run dir)."""
    if not run_dir:
        return None
    try:
        name = (Path(run_dir) / STOP_REQUEST_FILE).read_text().strip()
    except OSError:
        return None
    return name if name.startswith("SIG") and name[3:].isalpha() else None
