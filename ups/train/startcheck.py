"""The refusals a training run meets before any process starts, in one place.

``ups launch`` asks here before preflight and torchrun, so a config this host cannot run
is refused at once (exit 2, one paragraph, no run directory); every worker asks again as
the last guard before its process group (``ups-train`` run by hand, a node whose
launcher ran elsewhere). Both say the same words: they come from here.

No torch at import: whether a CUDA device is visible is passed in (``ups launch`` knows
it without torch on a machine with no GPU driver), and the one capability only torch can
tell, FSDP2's per-step reset, is asked of ``ups.torchcompat`` only when the config asks
for FSDP.
"""

from __future__ import annotations

import json
from typing import Any

from ups.config import Config, TrainingConfig
from ups.data.layouts import DataError, TaskInfo, inspect_task
from ups.model.fit import model_problems
from ups.torchcompat import FSDP_RESET_SINCE, fsdp_missing

CACHE_MANIFEST = "manifest.json"
"""The latent cache's index of what it holds (written by ``ups.train.cache``)."""


def start_problems(cfg: Config, *, cuda: bool) -> tuple[dict[str, TaskInfo], list[str]]:
    """Each task's data (read from its file) and every problem that stops ``cfg`` here,
    by key path; ``cuda``: a CUDA device is visible to this process."""
    infos, problems = _inspect_tasks(cfg)
    if not problems:
        problems = model_problems(infos.values(), cfg.model)
    if cfg.cache.enabled:
        problems += _cache_problems(cfg, infos)
    problems += device_problems(cfg, cuda=cuda)
    problems += strategy_problems(cfg.training)
    return infos, problems


def _inspect_tasks(cfg: Config) -> tuple[dict[str, TaskInfo], list[str]]:
    infos, problems = {}, []
    for i, task in enumerate(cfg.tasks):
        try:
            infos[task.name] = inspect_task(task)
        except DataError as exc:
            problems.append(f"tasks.{i} ({task.name}): {exc}")
    return infos, problems


def _cache_problems(cfg: Config, infos: dict[str, TaskInfo]) -> list[str]:
    """The cache's manifest against the config (no tensors read)."""
    try:
        manifest: dict[str, Any] = json.loads((cfg.cache.dir / CACHE_MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        return [
            f"cache.dir: no readable {CACHE_MANIFEST} in {cfg.cache.dir} ({exc}); build the "
            "cache with `ups cache build CONFIG` or set cache.enabled=false"
        ]
    problems = []
    for t in cfg.tasks:
        items = infos[t.name].n_train * infos[t.name].pairs_per_sample
        cached = manifest.get("tasks", {}).get(t.name, {}).get("items")
        if cached != items:
            problems.append(
                f"cache.dir: task {t.name!r} has {cached} cached items but the data has {items}; "
                "rebuild with `ups cache build CONFIG`"
            )
    if manifest.get("latent_dim") != cfg.model.latent_dim:
        problems.append(
            f"cache.dir: cached latent width {manifest.get('latent_dim')} != model.latent_dim "
            f"{cfg.model.latent_dim}; rebuild with `ups cache build CONFIG`"
        )
    return problems


def device_problems(cfg: Config, *, cuda: bool) -> list[str]:
    """What needs CUDA where the run has none."""
    problems = []
    if cfg.distributed.backend == "nccl" and not cuda:
        problems.append(
            "distributed.backend: nccl needs CUDA, and this host has no CUDA device; set "
            "distributed.backend=auto (gloo on CPU)"
        )
    if cfg.training.precision == "fp16" and not cfg.distributed.on_cuda(cuda):
        where = "this host" if not cuda else "distributed.backend: gloo"
        problems.append(
            "training.precision: fp16 needs CUDA (its loss scaler and fast kernels are GPU "
            f"features), and this run trains on the CPU ({where}); use bf16 or fp32"
        )
    if any(f.kind == "alloc" for f in cfg.faults) and not cuda:
        problems.append(
            "faults: kind alloc needs CUDA (it makes the CUDA allocator itself run out of "
            "memory); use kind oom on this host"
        )
    return problems


def strategy_problems(training: TrainingConfig) -> list[str]:
    """What this torch cannot do of ``training.strategy``: one line naming the release
    that can."""
    if training.strategy != "fsdp" or (missing := fsdp_missing()) is None:
        return []
    import torch  # already imported by fsdp_missing: only its version is read here

    return [
        f"training.strategy: fsdp needs {missing}, which torch {torch.__version__} lacks "
        f"(torch {FSDP_RESET_SINCE} has it): use strategy ddp here, or torch>={FSDP_RESET_SINCE}"
    ]
