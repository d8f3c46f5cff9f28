"""What a checkpoint records about the run that wrote it, and what a resume must agree on.

A checkpoint is only a faithful continuation when the resuming run does the same math on
the same data: the same world size and batch (which fix the data order and the global
batch), the same config fields that change the math, the same torch and the same data
files. Each group of facts can be allowed to change explicitly
(``checkpoint.allow_resume_change`` / ``ups launch --allow-resume-change``); anything
else that differs is refused with one paragraph listing every difference.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from ups.config import Config

FACTS_KEY = "run_facts"
HEAD_BYTES = 1 << 20
"""How much of each data file is hashed: its header and first chunks, in milliseconds."""

_NOT_MATH = {
    "training": {"epochs", "max_steps", "num_workers", "log_every", "eval_batch_size",
                 "record_sample_ids", "batch_size", "max_consecutive_skips", "strategy",
                 "prefetch_factor", "pin_memory", "persistent_workers", "accum_steps",
                 "compile", "oom_policy"},
}  # fmt: skip
"""Fields that do not change an update: run length (extending a run is the usual reason to
resume), logging, loader processes, compiling, what an OOM does. ``batch_size`` and
``accum_steps`` (samples per optimizer step) are the ``batch`` group; ``strategy`` is a
fact of its own that no resume may change (the checkpoint formats differ)."""


_ADDED = {"training.precision": "fp32"}
"""Math fields added after checkpoints first recorded their config: what a checkpoint
without the field was trained with."""


class ResumeRefused(ValueError):
    """The checkpoint was written by a run that differs from this one (a user decision)."""


def fingerprint(path: Path) -> dict[str, Any]:
    """Size and SHA-256 of the first MiB: cheap, and catches a re-generated or swapped file."""
    with path.open("rb") as f:
        head = f.read(HEAD_BYTES)
    return {"size": path.stat().st_size, "head_sha256": hashlib.sha256(head).hexdigest()}


def math_config(cfg: Config) -> dict[str, Any]:
    """The config fields that change what an optimizer step computes."""
    training = cfg.training.model_dump(mode="json", exclude=_NOT_MATH["training"])
    tasks = [t.model_dump(mode="json", exclude={"path"}) for t in cfg.tasks]
    return {
        "seed": cfg.run.seed,
        "tasks": tasks,
        "model": cfg.model.model_dump(mode="json"),
        "training": training,
        "cache": cfg.cache.enabled,
    }


def run_facts(cfg: Config, world_size: int) -> dict[str, Any]:
    """What this run's checkpoints record about it."""
    math = math_config(cfg)
    return {
        "strategy": cfg.training.strategy,
        "world_size": world_size,
        "batch_size": cfg.training.batch_size,
        "accum_steps": cfg.training.accum_steps,
        "global_batch": cfg.training.batch_size * cfg.training.accum_steps * world_size,
        "config": math,
        "config_digest": hashlib.sha256(json.dumps(math, sort_keys=True).encode()).hexdigest(),
        "torch": str(torch.__version__),  # TorchVersion would not load with weights_only
        "data": {t.name: fingerprint(Path(t.path)) for t in cfg.tasks},
    }


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(f"{prefix}.{k}" if prefix else str(k), v))
        return out
    if isinstance(value, list):
        return _flat(prefix, {str(i): v for i, v in enumerate(value)})
    return {prefix: value}


def differences(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, list[str]]:
    """Every difference, grouped by what ``allow_resume_change`` calls it."""
    found: dict[str, list[str]] = {}

    def note(group: str, what: str, old: Any, new: Any) -> None:
        if old != new:
            found.setdefault(group, []).append(f"{what} {old} -> {new}")

    # Checkpoints from before training.strategy existed are DDP's.
    note("strategy", "training.strategy", saved.get("strategy", "ddp"), now.get("strategy", "ddp"))
    note("world_size", "world size", saved["world_size"], now["world_size"])
    note("batch", "per-rank batch", saved["batch_size"], now["batch_size"])
    note("batch", "accumulation steps", saved.get("accum_steps", 1), now.get("accum_steps", 1))
    old_cfg, new_cfg = _flat("", saved["config"]), _flat("", now["config"])
    for key in sorted(old_cfg.keys() | new_cfg.keys()):
        old = old_cfg.get(key, _ADDED.get(key, "(unset)"))
        note("config", key, old, new_cfg.get(key, "(unset)"))
    note("torch", "torch", saved["torch"], now["torch"])
    for task in sorted(saved["data"].keys() | now["data"].keys()):
        old, new = saved["data"].get(task), now["data"].get(task)
        if old != new:
            old_s = "(none)" if old is None else f"{old['size']} B, head {old['head_sha256'][:12]}"
            new_s = "(none)" if new is None else f"{new['size']} B, head {new['head_sha256'][:12]}"
            found.setdefault("data", []).append(f"data file of task {task}: {old_s} -> {new_s}")
    return found


def check_resume(
    saved: dict[str, Any] | None, now: dict[str, Any], allowed: list[str], checkpoint: str
) -> list[str]:
    """Raise :class:`ResumeRefused` listing every difference not in ``allowed``; return the
    allowed ones (to log). A checkpoint without facts (older ups) is accepted as it is."""
    if saved is None:
        return ["checkpoint predates resume checks: world size, config and data not verified"]
    diffs = differences(saved, now)
    # A sharded checkpoint is read back shard by shard: the world size must match.
    fixed = {"strategy", "world_size"} if now.get("strategy") == "fsdp" else {"strategy"}
    refused = {g: d for g, d in diffs.items() if g not in allowed or g in fixed}
    if refused:
        listing = "; ".join(d for group in refused.values() for d in group)
        allowable = sorted(set(refused) - fixed)
        accept = (
            f", or accept the change with --allow-resume-change {','.join(allowable)} "
            f"(world_size/batch remap the data position to the same number of samples seen)"
            if allowable
            else ""
        )
        never = (
            " Under training.strategy=fsdp the world size cannot change: the checkpoint "
            "is sharded for the world size that wrote it."
            if "world_size" in refused and "world_size" in fixed
            else ""
        )
        raise ResumeRefused(
            f"cannot resume from {checkpoint}: this run differs from the one that wrote it: "
            f"{listing}. Resuming would silently change the run's math.{never} Start a new run "
            f"with `ups launch CONFIG --fresh` or restore the old setup{accept}"
        )
    return [d for group in diffs.values() for d in group]


def strategy_refusal(found: Path, strategy: str) -> str:
    """Why a run cannot resume from a checkpoint written under the other strategy."""
    other = "ddp" if strategy == "fsdp" else "fsdp"
    return (
        f"cannot resume from {found}: it was written with training.strategy={other} and this "
        f"run uses training.strategy={strategy}; the checkpoint formats differ (one file vs "
        f"a sharded directory). Set training.strategy={other} to resume it, or start a new "
        f"run with `ups launch CONFIG --fresh` (export its weights with `ups checkpoint "
        f"export RUN`)"
    )


def remapped_step(step: int, saved: dict[str, Any] | None, now: dict[str, Any]) -> int:
    """The step with the same number of samples seen under the new global batch."""
    if saved is None or saved["global_batch"] == now["global_batch"]:
        return step
    return step * int(saved["global_batch"]) // int(now["global_batch"])


def rng_state() -> dict[str, Any]:
    """The CUDA generators of every local device (the CPU one is saved with the model)."""
    if not torch.cuda.is_available():
        return {}
    return {"rng_cuda": torch.cuda.get_rng_state_all()}


def restore_rng(state: dict[str, Any]) -> str | None:
    """Restore the CUDA generators; a warning text when the checkpoint cannot supply them."""
    if not torch.cuda.is_available():
        return None
    saved = state.get("rng_cuda")
    if saved is None or len(saved) != torch.cuda.device_count():
        return "checkpoint holds no CUDA RNG state for these devices; CUDA RNG starts fresh"
    torch.cuda.set_rng_state_all(saved)
    return None
