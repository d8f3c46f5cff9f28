"""``ups data``: write the demo data (``synth``) or check a config's data files (``check``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ups.config import ConfigError, load_config
from ups.console import wants_console
from ups.console.steps import steps_line
from ups.data.layouts import DataError, inspect_task  # h5py, not torch
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


def write_demo_data(out: Path, seed: int, *, live: bool) -> list[Path]:
    """Synthesize the demo files into ``out`` (tens of seconds on 2 cores), saying what is
    happening meanwhile: a live line naming the file being written on a terminal
    (``live``), else a ``data_file_writing`` event before each file. Either way it ends
    with ``data_file_written`` per file (off a terminal) and one ``demo_data_ready``.
    Logging is set up by the caller."""
    log = get_logger("ups.data")
    start = time.monotonic()
    if live:
        with steps_line(sys.stdout, "demo data", f"written to {out}") as step:
            paths = synthesize(out, seed, progress=step)
    else:

        def writing(done: int, total: int, path: Path) -> None:
            log.info(
                "data_file_writing", text="writing data file", path=str(path),
                file=f"{done + 1}/{total}",
            )  # fmt: skip

        paths = synthesize(out, seed, progress=writing)
        for path in paths:
            log.info(
                "data_file_written", text="data file written", path=str(path),
                bytes=path.stat().st_size,
            )  # fmt: skip
    seconds = round(time.monotonic() - start, 1)
    log.info("demo_data_ready", text="demo data ready", out=str(out), seed=seed, seconds=seconds)
    return paths


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
        write_demo_data(args.out, args.seed, live=wants_console("auto", sys.stdout))
        return 0
    return _check(args.config, args.overrides)
