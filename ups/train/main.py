"""``ups-train CONFIG``: one training worker, under torchrun or as a plain process.

Order matters: W&B is decided from RANK before anything imports it; the
config and data are checked before any process group exists; the process group comes
before the data loaders.
"""

from __future__ import annotations

import argparse
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from ups.config import Config, ConfigError, load_config
from ups.console import LOG_FORMATS, wants_console
from ups.data.pdebench import DataError, TaskInfo, inspect_task
from ups.distributed.env import read_dist_env
from ups.log import get_logger, setup_logging
from ups.model import model_problems, task_shapes
from ups.outcome import EXIT_CONFIG
from ups.train.amp import precision_problems
from ups.train.cache import cache_problems
from ups.train.faults import ENV_VAR, fault_problems, parse_faults
from ups.train.run import train
from ups.train.signals import StopFlag
from ups.train.strategies import strategy_problems
from ups.train.tracking import decide_wandb_for_rank


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ups-train",
        description="One training worker, under torchrun or as a plain process "
        "(`ups launch` starts these).",
    )
    parser.add_argument("config", help="run config (YAML), e.g. configs/demo.yaml")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set training.lr=1e-4 (repeatable)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="auto",
        help="stdout for people (console: progress line, tables) or JSON lines; auto: "
        "console on a terminal. logs/rank<N>.jsonl is always JSON",
    )
    return parser.parse_args(argv)


def _inspect_tasks(cfg: Config) -> tuple[dict[str, TaskInfo], list[str]]:
    """Check every task's data file; problems are named by the task's key path."""
    infos, problems = {}, []
    for i, task in enumerate(cfg.tasks):
        try:
            infos[task.name] = inspect_task(task)
        except DataError as exc:
            problems.append(f"tasks.{i} ({task.name}): {exc}")
    return infos, problems


@record
def main(argv: list[str] | None = None) -> int:
    decide_wandb_for_rank()
    stop = StopFlag().install()
    args = _parse(argv)
    setup_logging(
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        console=wants_console(args.log_format, sys.stdout),
        live=True if args.log_format == "console" else None,
    )
    log = get_logger()
    try:
        cfg = load_config(args.config, args.set)
        faults = parse_faults(os.environ.get(ENV_VAR, ""))
        if faults:
            cfg = cfg.model_copy(update={"faults": [*cfg.faults, *faults]})
        env = read_dist_env()
        log.info("phase", phase="data_check")  # ups launch names it if a signal lands here
        infos, problems = _inspect_tasks(cfg)
        if not problems:
            problems = model_problems(task_shapes(infos), cfg.model)
        if cfg.cache.enabled:
            problems += cache_problems(cfg, infos)
        problems += precision_problems(cfg)
        problems += strategy_problems(cfg.training)
        problems += fault_problems(cfg.faults)
        if problems:
            raise ConfigError(args.config, problems)
    except (ConfigError, DataError, ValueError) as exc:
        log.error("config_invalid", error=str(exc))
        return EXIT_CONFIG
    return train(cfg, env, infos, stop=stop)


if __name__ == "__main__":
    sys.exit(main())
