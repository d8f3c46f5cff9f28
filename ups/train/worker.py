"""One training worker, after ``ups-train``'s flags were read (:mod:`ups.train.main`).

Order matters: W&B is decided from RANK before anything imports it; the config and
data are checked (``ups.train.startcheck``, as ``ups launch`` did before it started
anything) before any process group exists; the process group comes before the data
loaders.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from ups.config import ConfigError, load_config
from ups.config.faults import with_env_faults
from ups.console import wants_console
from ups.distributed.env import read_dist_env
from ups.log import get_logger, setup_logging
from ups.outcome import EXIT_CONFIG
from ups.train.run import train
from ups.train.signals import StopFlag
from ups.train.startcheck import start_problems
from ups.train.tracking import decide_wandb_for_rank


@record
def work(config: str, overrides: list[str], log_format: str) -> int:
    """Check ``config`` (with ``overrides``) on this host, then train; the exit code."""
    decide_wandb_for_rank()
    stop = StopFlag().install()
    setup_logging(
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        console=wants_console(log_format, sys.stdout),
        live=True if log_format == "console" else None,
    )
    log = get_logger()
    try:
        cfg = with_env_faults(load_config(config, overrides), os.environ)
        env = read_dist_env()
        log.info("phase", phase="data_check")  # ups launch names it if a signal lands here
        infos, problems = start_problems(cfg, cuda=torch.cuda.is_available())
        if problems:
            raise ConfigError(config, problems)
    except (ConfigError, ValueError) as exc:
        log.error("config_invalid", error=str(exc))
        return EXIT_CONFIG
    return train(cfg, env, infos, stop=stop)
