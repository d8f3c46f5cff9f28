"""Weights & Biases on rank 0 only; every way out records an exit code."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Literal

from ups.config import Config
from ups.log import get_logger

log = get_logger("tracking")


def decide_wandb_for_rank() -> None:
    """Called first thing in a worker: ranks other than 0 can never start a W&B run."""
    if os.environ.get("RANK", "0") != "0":
        os.environ["WANDB_MODE"] = "disabled"


def wandb_mode(cfg: Config) -> Literal["online", "offline", "disabled"]:
    if cfg.wandb.mode != "auto":
        return cfg.wandb.mode
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class Tracker:
    """A W&B run on rank 0; a no-op elsewhere or when disabled."""

    def __init__(self) -> None:
        self._run: Any = None

    def start(self, cfg: Config, *, run_id: str, run_dir: Path, rank: int) -> None:
        mode = wandb_mode(cfg)
        if rank != 0 or mode == "disabled":
            return
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._run = wandb.init(
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            name=run_id,
            id=run_id,
            dir=str(run_dir),
            mode=mode,
            resume="allow",
            config=cfg.model_dump(mode="json"),
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        log.info("wandb_started", mode=mode, wandb_dir=str(run_dir / "wandb"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._run is not None:
            try:
                self._run.log(metrics, step=step)
            except Exception as err:  # any failure of W&B's own machinery
                self._lost(err, "log")

    def summary(self, metrics: dict[str, float]) -> None:
        if self._run is not None:
            try:
                self._run.summary.update(metrics)
            except Exception as err:
                self._lost(err, "summary")

    def finish(self, exit_code: int) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            try:
                run.finish(exit_code=exit_code)
            except Exception as err:
                self._lost(err, "finish")

    def _lost(self, err: Exception, call: str) -> None:
        """W&B is a copy of what the run logs, not the run: when its own process is gone
        (on Slurm a job's SIGTERM reaches wandb-core too) or its socket breaks, the run
        goes on without it, says so once, and ends as it really ends."""
        self._run = None
        import wandb

        with contextlib.suppress(Exception):  # or W&B's exit hook prints its traceback
            wandb.teardown()
        log.warning(
            "wandb_lost",
            text=f"W&B stopped working ({call}: {type(err).__name__}: {err}); training goes "
            "on without it: every metric is still in the rank logs (logs/rank0.jsonl), and "
            "the W&B run keeps what it had",
            error=f"{type(err).__name__}: {err}",
        )
