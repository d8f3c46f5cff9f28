"""Which ways a run can end are worth retrying: the one table every resumer reads.

``ups launch`` reads it twice: to decide whether the same command continues the latest
run of that name (``ups.rundir``), and whether ``--max-restarts`` relaunches torchrun in
place. A later recovery loop (e.g. recreating a Vast instance) imports the same table,
so "retryable" means one thing everywhere.

A cause is retryable when running the same code on the same data again can succeed:
the host went away, a process was killed, a peer hung or dropped its connection. A
cause is deterministic when the same command would fail the same way (a bad config, a
non-finite loss, a Python exception, too many out-of-memory skips): retrying it in a
loop only burns money, so the user has to change something first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ups import exitcodes
from ups.bucket.store import BucketError, BucketUnreachable
from ups.outcome import (
    EXIT_CONFIG,
    EXIT_NONFINITE,
    EXIT_PREEMPTED,
    EXIT_SAVE_FAILED,
    EXIT_STALLED,
    Outcome,
)


@dataclass(frozen=True, slots=True)
class RetryRule:
    cause: str
    """The ``cause`` field of ``outcome.json``."""
    retryable: bool
    exit_codes: tuple[int, ...]
    """Exit codes of ``ups launch`` that mean this cause on their own (for tools that see
    only a container's exit code); an empty tuple when only ``outcome.json`` tells."""
    meaning: str


RETRY_TABLE: tuple[RetryRule, ...] = (
    RetryRule(
        "preempted",
        True,
        (EXIT_PREEMPTED,),
        "stopped while training: SIGTERM (docker stop, Vast), or Ctrl-C/SIGHUP to ups "
        "launch; every rank stopped, checkpoint written",
    ),
    RetryRule(
        "stopped",
        True,
        exitcodes.STOPPED_BY_SIGNAL,
        "ups launch got SIGHUP/SIGINT/SIGTERM outside training (preflight, startup, "
        "wrap-up), or a script's rank did not exit 0 after it: no checkpoint of that moment",
    ),
    RetryRule("killed", True, (), "no outcome.json: ups launch was killed or the host died"),
    RetryRule("rank_signal", True, (), "a rank died by a signal (SIGKILL, SIGSEGV, SIGBUS...)"),
    RetryRule(
        "loader_died",
        True,
        (),
        "a rank's DataLoader worker died (SIGKILL: often the OOM killer; SIGBUS: /dev/shm full)",
    ),
    RetryRule("hang", True, (), "a collective timed out: a rank hung"),
    RetryRule("peer_died", True, (), "a collective failed: a peer's connection dropped"),
    RetryRule(
        "stalled",
        False,
        (EXIT_STALLED,),
        "a --script run made no progress for --stall-timeout: ups named the rank and line "
        "and ended it; it would hang again (resume with --run-id once fixed)",
    ),
    RetryRule("exception", False, (), "a Python exception in a rank: it would raise again"),
    RetryRule("too_many_oom_skips", False, (), "training.max_consecutive_skips reached"),
    RetryRule("oom_in_step", False, (), "out of memory inside the optimizer step on every rank"),
    RetryRule("nonfinite", False, (EXIT_NONFINITE,), "non-finite loss, gradients or eval metrics"),
    RetryRule(
        "save_failed",
        True,
        (EXIT_SAVE_FAILED,),
        "a checkpoint could not be written (disk full): free space, the same command resumes",
    ),
    RetryRule("config", False, (EXIT_CONFIG,), "invalid config or data, or a refused resume"),
    RetryRule("preflight", False, (), "a preflight check failed: fix the host first"),
    RetryRule("launch_error", False, (), "ups launch could not start torchrun"),
)
RULES = {rule.cause: rule for rule in RETRY_TABLE}


def retry_verdict(outcome: Outcome | None, exit_code: int | None = None) -> tuple[bool, str]:
    """Whether a run that ended with ``outcome`` (None: no outcome.json) may be resumed,
    and why, in words. Finished runs and unknown causes are never retried. Without an
    outcome, ``exit_code`` (the launcher's, when known) is looked up in the table first:
    ``ups launch`` refusing a config exits 2 before any outcome.json is written."""
    if outcome is None:
        by_code = [r for r in RETRY_TABLE if exit_code is not None and exit_code in r.exit_codes]
        if by_code:
            return by_code[0].retryable, by_code[0].meaning
        return True, RULES["killed"].meaning
    if outcome.outcome == "finished":
        return False, "it finished"
    cause = outcome.cause or ("preempted" if outcome.outcome == "preempted" else None)
    rule = RULES.get(cause or "")
    if rule is None:
        for candidate in RETRY_TABLE:
            if outcome.exit_code in candidate.exit_codes:
                rule = candidate
                break
    if rule is None:
        return False, f"it failed for an unclassified reason ({outcome.reason})"
    return rule.retryable, rule.meaning


SLURM_JOB_ENV = "SLURM_JOB_ID"
"""Set in a Slurm job's processes (``ups launch``'s and, through torchrun, the ranks'): a
preempted or requeued job comes back by itself."""


def resume_hint(
    *, checkpoint: str | None, script: bool = False, environ: Mapping[str, str] | None = None
) -> str:
    """How a run that stopped retryably goes on, in the words of every report of it (the
    trainer's preempted reason, launch's end line): in a Slurm job, the requeue brings it
    back by itself; elsewhere, the same command again, which continues from ``checkpoint``
    (the run's newest committed one; a ``--script`` run gets it as ``UPS_RESUME``) or,
    where there is none, starts over (``ups.rundir.resumable``: a new run for a config)."""
    job = (os.environ if environ is None else environ).get(SLURM_JOB_ENV)
    if job is not None:
        return (
            f"a requeued Slurm job (slurm job {job}) starts again by itself from here; after "
            "`fab stop`, the same `fab deploy` continues it"
        )
    if script:
        if checkpoint:
            return f"run the same command again: the script gets UPS_RESUME={checkpoint}"
        return "run the same command again to start the script again"  # it committed none
    if checkpoint:
        return "run the same command again to continue from the last checkpoint"
    return "no checkpoint was written, so the same command starts a new run from step 0"


def table_markdown() -> str:
    """The table as it appears in docs/runbook.md and docs/launch.md (a test keeps them equal)."""
    lines = ["| cause | resumed | exit code | meaning |", "|---|---|---|---|"]
    for r in RETRY_TABLE:
        codes = ", ".join(map(str, r.exit_codes)) or "see outcome.json"
        lines.append(f"| `{r.cause}` | {'yes' if r.retryable else 'no'} | {codes} | {r.meaning} |")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class ApiRetry:
    """Which failed calls to a cloud API (Vast) are tried again, by kind of call."""

    call: str
    statuses: frozenset[int]
    """HTTP statuses worth another try; connection errors and timeouts always are."""
    meaning: str


API_RETRY: dict[str, ApiRetry] = {
    r.call: r
    for r in (
        ApiRetry(
            "default",
            frozenset({429, 502, 503, 504}),
            "rate limited, or a gateway between us and the API failed: the call may not "
            "have reached the API, so it is sent again (a create is reconciled by label)",
        ),
        ApiRetry(
            "destroy",
            frozenset({429, 500, 502, 503, 504}),
            "destroying an instance twice is harmless, and leaving it billing is not: a 500 "
            "is tried again too, and the instance is shown afterwards to verify it is gone",
        ),
    )
}


def api_retryable(call: str, status: int | None) -> bool:
    """Whether an API call of kind ``call`` that failed with HTTP ``status`` (None: no
    answer, a connection error or timeout) is tried again."""
    rule = API_RETRY.get(call, API_RETRY["default"])
    return status is None or status in rule.statuses


def bucket_retryable(exc: BucketError) -> bool:
    """Whether a failed bucket operation is worth another try (``ups.backoff.BUCKET_SYNC``):
    the endpoint did not answer, timed out, throttled or answered 5xx. Missing credentials,
    a refused key, a missing bucket would fail the same way again: the uploader stops and
    says so (training goes on)."""
    return isinstance(exc, BucketUnreachable)
