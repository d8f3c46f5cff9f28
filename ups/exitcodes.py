"""Every exit code a ups command ends with: the one table.

The modules that exit take their constants from here (``EXIT_PREEMPTED =
exitcodes.PREEMPTED.code``), and docs/reference/exit-codes.md is generated from
:data:`TABLE` (``scripts/docs-reference.py``), so the page and the code cannot disagree.
A code means one thing across commands; where two commands use it, ``meaning`` says what
each does. This module imports nothing of ups: anything may import it.

A run's *cause* (``outcome.json``'s ``cause``, whether the same command resumes it) is a
finer split of these codes: :data:`ups.retry.RETRY_TABLE`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ExitCode:
    code: int
    name: str
    """An identifier (for the docs' anchors and tools)."""
    meaning: str
    """What happened, for people: which commands exit with it and in which case."""
    fix: str
    """What to do next."""


OK = ExitCode(
    0,
    "ok",
    "The command did what it was asked. For a run (`ups launch`, `fab deploy`, compose's "
    "`train-ddp`): every rank finished; for `ups preflight`: no check failed.",
    "Nothing.",
)
FAILED = ExitCode(
    1,
    "failed",
    "The run failed: a rank raised or died, a collective timed out, too many steps were "
    "skipped, preflight failed before torchrun started. `outcome.json`'s `reason` and "
    "`cause` say which. `ups preflight`: a check failed (or warned, with `--strict`).",
    "Read the outcome's reason (`fab status`, `runs/<id>/outcome.json`); the runbook names "
    "the fix for each cause. A retryable cause resumes with the same command.",
)
USAGE = ExitCode(
    2,
    "usage",
    "A mistake in what was asked, found before anything started: the run config, the run "
    "file, hosts.yaml or a flag (every problem listed, each with its key path), or a resume "
    "that was refused (another world size, config, torch or data).",
    "Fix what the message names and run the same command again.",
)
DEPLOY = ExitCode(
    3,
    "deploy",
    "`fab`/`ups` deploy tasks: the host could not be reached, verified (a changed host key) "
    "or set up; nothing was started there. `ups dev-host down`: runs on the dev host were "
    "not fetched home (it names them); nothing was stopped.",
    "The message names the host and the step that failed; fix that (address, key, network, "
    "disk on the host) and deploy again. For `ups dev-host down`: `fab fetch` each run it "
    "names, or `ups dev-host down --discard`.",
)
REMOTE_PREFLIGHT = ExitCode(
    4,
    "remote_preflight",
    "`fab deploy`: preflight on the host found it unfit; nothing was started.",
    "Each failed check's hint in the report is the fix, as a command to run on the host.",
)
PROVIDER_API = ExitCode(
    5,
    "provider_api",
    "A provider's API (Vast, RunPod) refused or could not answer: no API key, a key it "
    "rejected, rate limiting that did not clear, a query it does not accept.",
    "Set the provider's API key (Vast: `vastai set api-key KEY` or `VAST_API_KEY`; RunPod: "
    "`RUNPOD_API_KEY`), check the offer query, try again later when it was rate limited.",
)
NOTHING_TO_RUN_ON = ExitCode(
    6,
    "nothing_to_run_on",
    "No machine to run on: no offer of the provider (or of any failover entry) matched the "
    "requirements under the price cap (or every one was taken first); a Slurm job stayed "
    "pending for `max_pending_s` and was cancelled. Nothing is billing.",
    "Widen the offer query or raise `max_price_per_hour`; for Slurm, ask for what the "
    "partition has (the message gives Slurm's reason).",
)
INSTANCE_UNUSABLE = ExitCode(
    7,
    "instance_unusable",
    "Rented machines never became usable (never running, an image pull or driver error, "
    "SSH silent, preflight failing there) for `max_offers` machines in a row, each named "
    "with its failure; each was destroyed.",
    "Read each machine's failure: a host fault is skipped next time (`ups hosts`); a fault "
    "every machine repeats (the image does not exist) needs fixing on your side.",
)
RECOVERIES_EXHAUSTED = ExitCode(
    8,
    "recoveries_exhausted",
    "A managed run lost its instance more than `max_recoveries` times, or `max_hours` ran "
    "out across instances; every instance was ended, the checkpoints are at home (and in "
    "the bucket).",
    "Deploy the same run again (`--run ID`) to continue from its newest checkpoint, with a "
    "higher `max_recoveries`/`max_hours` or another offer.",
)
SUPERVISED_ELSEWHERE = ExitCode(
    20,
    "supervised_elsewhere",
    "Another live supervisor holds the run's lease (the message names it); nothing was done.",
    "Nothing: the run is being followed. `fab logs --host H --run ID` shows it.",
)
LEASE_LOST = ExitCode(
    21,
    "lease_lost",
    "This supervisor lost the run's lease to another one (it could not renew it in time, "
    "e.g. the laptop slept): it stopped acting; the run goes on under the new holder.",
    "Nothing: the new holder follows the run.",
)
NONFINITE = ExitCode(
    65,
    "nonfinite",
    "A loss, gradient or evaluation metric became NaN/inf (`training.nonfinite: fail`). "
    "Deterministic: the same config fails the same way.",
    "Lower `training.lr`, set `training.grad_clip`; start a fresh run.",
)
SAVE_FAILED = ExitCode(
    74,
    "save_failed",
    "Rank 0 could not write a checkpoint (disk full, I/O error, permissions); every rank "
    "stopped, the earlier checkpoints are intact. `ups data synth`/`ups demo`: the demo data "
    "could not be written (the message names the file and why); no file is left half-written.",
    "Free space (or lower `checkpoint.keep_last`), then run the same command: it resumes. "
    "For the demo data: the fix the message names (a folder you can write, free space).",
)
PREEMPTED = ExitCode(
    75,
    "preempted",
    "Stopped while training (SIGTERM: `docker stop`, `fab stop`, a Vast preemption, "
    "Slurm's time limit; SIGINT: Ctrl-C on `ups launch`; SIGHUP); every rank stopped at the "
    "same step and the checkpoint was written.",
    "Run the same command again: it continues from that checkpoint.",
)
STALLED = ExitCode(
    124,
    "stalled",
    "`ups launch --script` (and a deploy of a script): the script made no progress for "
    "`--stall-timeout` seconds; ups recorded every rank's stack and ended it (the code GNU "
    "`timeout` exits with when it ends its command).",
    "Read the stacks the message names (`runs/<id>/stacks/`): the odd rank out is where it "
    "hung. Fix the hang, then run the same command: it resumes from the newest checkpoint.",
)
STOPPED_SIGHUP = ExitCode(
    129,
    "stopped_sighup",
    "`ups launch` got SIGHUP outside training (preflight, startup, wrap-up): no "
    "checkpoint of that moment.",
    "Run the same command again: it resumes from the newest checkpoint, if any.",
)
INTERRUPTED = ExitCode(
    130,
    "interrupted",
    "Ctrl-C (SIGINT). `ups launch`: outside training (inside it, the run is preempted, 75). "
    "`fab deploy`/`logs` of a run they follow: only following stopped, the run goes on; a "
    "managed run's instance was ended per `on_exit` first. `ups data synth`/`ups demo` "
    "while writing the demo data: the files already written are whole, the one being "
    "written was not kept.",
    "Run the same command again to continue (or to follow the run again).",
)
STOPPED_SIGTERM = ExitCode(
    143,
    "stopped_sigterm",
    "`ups launch` got SIGTERM outside training (preflight, startup, wrap-up): no "
    "checkpoint of that moment.",
    "Run the same command again: it resumes from the newest checkpoint, if any.",
)

TABLE: tuple[ExitCode, ...] = (
    OK,
    FAILED,
    USAGE,
    DEPLOY,
    REMOTE_PREFLIGHT,
    PROVIDER_API,
    NOTHING_TO_RUN_ON,
    INSTANCE_UNUSABLE,
    RECOVERIES_EXHAUSTED,
    SUPERVISED_ELSEWHERE,
    LEASE_LOST,
    NONFINITE,
    SAVE_FAILED,
    PREEMPTED,
    STALLED,
    STOPPED_SIGHUP,
    INTERRUPTED,
    STOPPED_SIGTERM,
)
BY_CODE = {entry.code: entry for entry in TABLE}
STOPPED_BY_SIGNAL = (STOPPED_SIGHUP.code, INTERRUPTED.code, STOPPED_SIGTERM.code)
"""128 + the signal's number: ``ups launch`` stopped outside training (cause ``stopped``)."""
