"""How a run ended, written to ``<run_dir>/outcome.json`` for people and tools.

The file is the single source of truth that ``ups launch``, compose tooling and
``fab logs`` read. Written atomically (temp file, fsync, rename), so a reader never
sees half a file. Schema (stable, ``schema_version`` 1)::

    {
      "schema_version": 1,
      "run_id": "demo-20261122-001500",
      "outcome": "finished" | "failed" | "preempted",
      "exit_code": 0 | 1 | 75 | ...,
      "reason": "one sentence for people",
      "step": 412,                     # last completed optimizer step, or null
      "world_size": 2,
      "failed_rank": 1,                # or null
      "signal": "SIGSEGV",             # or null
      "traceback": "runs/<id>/logs/rank1.jsonl",   # where to look, or null
      "checkpoint": "runs/<id>/checkpoints/step_000400.pt",  # newest good one, or null
      "metrics": {"eval/advection/rel_l2": 0.05, ...},
      "time": "2026-11-22T00:15:00Z",
      "cause": "rank_signal",          # key into ups.retry.RETRY_TABLE, or null
      "phase": "training",             # preflight, torchrun_start, data_check, init,
                                       # compile, training, evaluation, final_save; or null
      "restarts": 1,                   # in-place restarts (--max-restarts) used
      "attempts": [{...}, ...],        # one entry per torchrun attempt of this launch
      "resumed_from": {"step": 8, "checkpoint": "...", "why": "..."},  # or null
      "memory": {"oom_killer": false, "limit_bytes": ..., "peak_rss_bytes": {"0": ...}},
      "training": {"strategy": "ddp", "precision": "bf16", "compiled": true,
                   "accum_steps": 4, "oom_policy": "skip"},
      "warnings": ["2 ranks ran, none joined a process group: ..."]
    }

Fields after ``time`` were added later; readers must accept their absence (older files).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from ups import jsonio
from ups.fsio import atomic_write_text

OUTCOME_FILE = "outcome.json"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
"""Bad config or data, reported before any process group started."""
EXIT_NONFINITE = 65
"""A loss, gradient or eval metric became NaN/inf (training.nonfinite=fail). Deterministic:
rerunning the same config fails the same way. EX_DATAERR."""
EXIT_SAVE_FAILED = 74
"""Rank 0 could not write a checkpoint (disk full, I/O error, permissions); every rank
stopped. Fix the disk, then resume. EX_IOERR."""
EXIT_PREEMPTED = 75
"""SIGTERM received (docker stop, Vast preemption); a checkpoint was written. EX_TEMPFAIL."""

Kind = Literal["finished", "failed", "preempted"]


@dataclass(kw_only=True)
class Outcome:
    run_id: str
    outcome: Kind
    exit_code: int
    reason: str
    step: int | None = None
    world_size: int = 1
    failed_rank: int | None = None
    signal: str | None = None
    traceback: str | None = None
    checkpoint: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    time: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    schema_version: int = 1
    cause: str | None = None
    """Why it ended, as a key of :data:`ups.retry.RETRY_TABLE` (decides whether to resume)."""
    phase: str | None = None
    """What the run was doing when it ended: preflight, torchrun_start, data_check, init,
    compile, training, evaluation, final_save."""
    restarts: int = 0
    attempts: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    """When a rank died by SIGKILL: the OOM killer's verdict, the memory limit, peak RSS."""
    training: dict[str, Any] | None = None
    """How the run trained: ``precision``, ``compiled`` (torch.compile ran), ``accum_steps``,
    ``oom_policy``; null when it ended before training was set up."""
    warnings: list[str] = field(default_factory=list)
    """What a run that ended as it did should not have done (several ranks that never
    joined a process group), one sentence each."""
    checkpoint_sync: dict[str, Any] | None = None
    """With ``checkpoint_sync.url``: the bucket, the checkpoints uploaded, those still
    ``pending`` (on this host only) and whether the final upload completed."""

    @property
    def at_step(self) -> str:
        """`` at step N`` for a message, or nothing when no step is known (a script run:
        ups sees no step inside it)."""
        return "" if self.step is None else f" at step {self.step}"

    def to_json(self) -> str:
        return jsonio.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def write_outcome(run_dir: Path, outcome: Outcome) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / OUTCOME_FILE
    atomic_write_text(path, outcome.to_json())
    return path


def read_outcome(run_dir: Path) -> Outcome | None:
    """Return the run's outcome, or None when it has not ended (or never wrote a whole one)."""
    path = run_dir / OUTCOME_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        # Never written, or cut short (the disk filled up): either way the run did not end
        # cleanly, which is how callers must treat it.
        return None
    known = {f.name for f in fields(Outcome)}
    # A newer ups may have added fields: keep what this version knows.
    return Outcome(**{k: v for k, v in data.items() if k in known})
