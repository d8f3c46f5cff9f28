"""``ups cache build CONFIG``: precompute the latent cache on the CPU (see ups.train.cache)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ups.outcome import EXIT_CONFIG


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ups cache",
        description="Encode a config's training inputs once into cache.dir (ups cache build).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="encode the training inputs into cache.dir")
    build.add_argument("config", help="run config (its cache section says where and what)")
    build.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, as for `ups launch` (repeatable)",
    )
    build.add_argument(
        "--checkpoint",
        type=Path,
        help="encoders to use; default: newest good checkpoint of <output_dir>/latest, "
        "else a fresh model from run.seed",
    )
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    # torch and the trainer only once the flags are good: `--help` answers without them.
    import torch

    from ups.config import ConfigError, load_config
    from ups.data.layouts import DataError, inspect_task
    from ups.log import get_logger, setup_logging
    from ups.train.cache import build_cache
    from ups.train.checkpoint import CheckpointCorrupt, load_checkpoint
    from ups.train.export import NothingToExport, newest_weights
    from ups.train.run import make_model

    setup_logging()
    log = get_logger("cache")
    try:
        cfg = load_config(args.config, args.overrides)
        infos = {t.name: inspect_task(t) for t in cfg.tasks}
        torch.manual_seed(cfg.run.seed)
        model = make_model(cfg, infos)
        source = f"fresh model, seed {cfg.run.seed}"
        if args.checkpoint is not None:
            state = load_checkpoint(args.checkpoint)
            source = str(args.checkpoint)
        elif (latest := cfg.run.output_dir / "latest" / "checkpoints").is_dir():
            try:  # either strategy's format (a sharded fsdp checkpoint is gathered here)
                path, _, _, weights = newest_weights(latest)
                source, state = str(path), {"model": weights}
            except NothingToExport:
                state = None
                log.warning("cache_fresh_encoders", reason="no good checkpoint", source=source)
        else:
            state = None
            log.warning("cache_fresh_encoders", reason="no checkpoint found", source=source)
        if state is not None:
            model.load_state_dict(state["model"])
    except (ConfigError, DataError, CheckpointCorrupt, ValueError) as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    for path in build_cache(cfg, infos, model, source):
        log.info("cache_file", path=str(path))
    return 0
