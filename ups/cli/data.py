"""``ups data``: write the demo data (``synth``) or check a config's data files (``check``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ups.config import ConfigError, load_config
from ups.data.pdebench import DataError, inspect_task
from ups.data.synth import synthesize
from ups.log import get_logger, setup_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ups data",
        description="Write the demo data (synth) or check a config's data files (check).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    synth = sub.add_parser("synth", help="write the demo files in PDEBench layout")
    synth.add_argument("--out", type=Path, default=Path("data/demo"), help="output directory")
    synth.add_argument("--seed", type=int, default=0, help="the files are a function of it")
    check = sub.add_parser("check", help="check every task's file against its layout")
    check.add_argument("config", type=Path, help="run config whose tasks[].path to check")
    check.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, as for `ups launch` (repeatable)",
    )
    return parser


def _synth(out: Path, seed: int) -> int:
    log = get_logger("ups.data")
    start = time.monotonic()
    paths = synthesize(out, seed)
    for path in paths:
        log.info(
            "data_file_written", text="data file written", path=str(path), bytes=path.stat().st_size
        )
    seconds = round(time.monotonic() - start, 1)
    log.info("demo_data_ready", text="demo data ready", out=str(out), seed=seed, seconds=seconds)
    return 0


def _check(config: Path, overrides: list[str]) -> int:
    log = get_logger("ups.data")
    try:
        cfg = load_config(config, overrides, check_files=False)
    except ConfigError as exc:
        log.error("config_invalid", text="config invalid", error=str(exc))
        return 2
    failed = 0
    for task in cfg.tasks:
        try:
            info = inspect_task(task)
        except DataError as exc:
            failed += 1
            log.error("data_check_failed", text="data check failed", task=task.name, error=str(exc))
            continue
        log.info(
            "data_ok",
            text="data ok",
            task=task.name,
            layout=info.layout,
            path=str(info.path),
            samples=info.n_samples,
            train=info.n_train,
            test=info.n_test,
            frames=info.n_frames,
            sample_shape=list(info.sample_shape),
            steady=info.steady,
        )
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    setup_logging()
    if args.command == "synth":
        return _synth(args.out, args.seed)
    return _check(args.config, args.overrides)
