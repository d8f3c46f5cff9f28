"""Where a run lives on disk, and which run a command continues.

"Run the same command again" continues the latest run of that name whenever it did not
finish, its way of ending is retryable (``ups.retry``: preempted, a killed or crashed
rank, a hang, no outcome at all) and it has a checkpoint to resume from. A script's run
continues with or without one, as ``fab deploy`` continues it: the script then gets an
empty ``UPS_RESUME`` and starts from its beginning, under the same run id. A run whose
``ups launch`` is still alive is never joined.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from ups import ckpt
from ups.fsio import atomic_symlink, atomic_write_text
from ups.outcome import read_outcome
from ups.retry import retry_verdict
from ups.runid import new_run_id

LATEST = "latest"
LAUNCH_PID = "launch.pid"
_CHECKPOINT_GLOB = "checkpoints/step_*"
_CHECKPOINT_SUFFIXES = {".pt", ".dcp"}
"""A ``.pt`` file (training.strategy ddp) or a sharded ``.dcp`` directory (fsdp)."""


@dataclass(frozen=True, slots=True)
class Resume:
    run_id: str
    step: int | None
    """None for a script: ups sees no step inside it."""
    checkpoint: str | None
    """None: a script's run that committed no checkpoint (it starts from its beginning)."""
    why: str
    """How the run ended, in words (the outcome's reason, or the retry table's)."""


@dataclass(frozen=True, slots=True)
class RunChoice:
    run_id: str
    resume: Resume | None = None
    note: str | None = None
    """Why the latest run was not continued, when there was one of this name."""


def newest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """The step and path of ``run_dir``'s newest checkpoint (a config run's), if any."""
    found = sorted(
        (int(p.stem.removeprefix("step_")), p)
        for p in run_dir.glob(_CHECKPOINT_GLOB)
        if p.suffix in _CHECKPOINT_SUFFIXES and p.stem.removeprefix("step_").isdigit()
    )
    return found[-1] if found else None


def launch_alive(run_dir: Path) -> bool:
    """True when the ``ups launch`` that wrote ``launch.pid`` is still running."""
    try:
        data = json.loads((run_dir / LAUNCH_PID).read_text())
        proc = psutil.Process(int(data["pid"]))
        return abs(proc.create_time() - float(data["create_time"])) < 1.0
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return False


def record_launch(run_dir: Path) -> None:
    """Say that this process runs ``run_dir`` now (pid and start time, so a reused pid
    is not mistaken for it)."""
    me = psutil.Process()
    atomic_write_text(
        run_dir / LAUNCH_PID, json.dumps({"pid": me.pid, "create_time": me.create_time()}) + "\n"
    )


def _latest_of(output_dir: Path, name: str) -> Path | None:
    try:
        target = (output_dir / LATEST).resolve(strict=True)
    except (FileNotFoundError, RuntimeError):
        return None
    return target if target.name.startswith(name) else None


@dataclass(frozen=True, slots=True)
class ScriptRuns:
    """How a script's runs keep checkpoints: ``directory`` (a run file's ``checkpoint_dir``,
    shared by its runs) or None (each run's own ``checkpoints/``), by ``ups.ckpt``'s rules."""

    directory: Path | None = None


def resumable(
    output_dir: Path, name: str, script: ScriptRuns | None = None
) -> tuple[Resume | None, str | None]:
    """The latest run of ``name`` when it can be continued; else None and why not."""
    target = _latest_of(output_dir, name)
    if target is None:
        return None, None
    outcome = read_outcome(target)
    retryable, why = retry_verdict(outcome)
    if not retryable:
        return None, f"latest run {target.name} is not resumed: {why}"
    if launch_alive(target):
        return None, f"latest run {target.name} is still running (its ups launch is alive)"
    if script is not None:
        found = ckpt.latest(script.directory or target / "checkpoints")
        said = outcome.reason if outcome is not None else why
        return Resume(target.name, None, str(found) if found else None, said), None
    newest = newest_checkpoint(target)
    if newest is None:
        return None, f"latest run {target.name} did not finish ({why}) but has no checkpoint"
    step, path = newest
    return Resume(run_id=target.name, step=step, checkpoint=str(path), why=why), None


def choose_run(
    output_dir: Path,
    name: str,
    explicit: str | None = None,
    *,
    fresh: bool = False,
    script: ScriptRuns | None = None,
) -> RunChoice:
    """An explicit id as given; else the resumable latest run (unless ``fresh``); else new."""
    if explicit:
        return RunChoice(explicit)
    if fresh:
        return RunChoice(new_run_id(name), note="--fresh: a new run")
    resume, note = resumable(output_dir, name, script)
    if resume is not None:
        return RunChoice(resume.run_id, resume=resume)
    return RunChoice(new_run_id(name), note=note)


def resolve_run_id(output_dir: Path, name: str, explicit: str | None = None) -> str:
    """Explicit id (config or ``--run-id``) > ``$UPS_RUN_ID`` > resumable latest > a new id."""
    return choose_run(output_dir, name, explicit or os.environ.get("UPS_RUN_ID")).run_id


def mark_latest(output_dir: Path, run_dir: Path) -> None:
    """Point ``<output_dir>/latest`` at ``run_dir`` (atomically replacing the old link)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_symlink(output_dir / LATEST, run_dir.resolve().relative_to(output_dir.resolve()))
