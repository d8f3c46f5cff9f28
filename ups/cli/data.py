"""``ups data``: write the demo data (``synth``) or check a config's data files (``check``)."""

from __future__ import annotations

import argparse
import errno
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ups import exitcodes
from ups.config import ConfigError, load_config
from ups.console import wants_console
from ups.console.steps import steps_line
from ups.data.layouts import DataError, inspect_task  # h5py, not torch
from ups.data.synth import DEMO_FILES, synthesize
from ups.log import get_logger, setup_logging

DEMO_MB = 95
"""About how much the demo files take on disk (the fix when the disk is full)."""


class DemoDataError(Exception):
    """The demo data could not be written; ``str()`` is the paragraph to print, ``code``
    the exit code (``ups data synth`` and ``ups demo`` end with it)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _fix_for(exc: OSError) -> str:
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        return (
            "a file or a broken link stands where a folder must be: remove it, or write the "
            "data elsewhere (`ups data synth --out DIR`, and the config's tasks[].path)"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = (
            "that file system is read-only"
            if exc.errno == errno.EROFS
            else "this user cannot write there"
        )
        return (
            f"{why}: write the data to a folder you can write "
            "(`ups data synth --out DIR`, and the config's tasks[].path)"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"the disk is full: the demo files take about {DEMO_MB} MB; free that much there, "
            "or write them to another disk (`ups data synth --out DIR`)"
        )
    if exc.errno == errno.EFBIG:
        return (
            "a file-size limit (`ulimit -f`) is below the demo files' size (up to 27 MB each): "
            "raise it in this shell, or run where there is none"
        )
    return "check that folder, then run the same command again"


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
    Logging is set up by the caller.

    Raises :class:`DemoDataError` when the files cannot be written (exit 74) or on Ctrl-C
    (130): each file appears whole or not at all (ups.data.synth), so the paragraph can say
    which are complete.
    """
    log = get_logger("ups.data")
    start = time.monotonic()
    written, current = 0, out  # the progress callback names each file before writing it

    def counted(step: Callable[[int, int, Path], object]) -> Callable[[int, int, Path], None]:
        def progress(done: int, total: int, path: Path) -> None:
            nonlocal written, current
            written, current = done, path
            step(done, total, path)

        return progress

    def writing(done: int, total: int, path: Path) -> None:
        log.info(
            "data_file_writing", text="writing data file", path=str(path),
            file=f"{done + 1}/{total}",
        )  # fmt: skip

    try:
        out.mkdir(parents=True, exist_ok=True)  # a bad --out is said before the live line
        if live:
            with steps_line(sys.stdout, "demo data", f"written to {out}") as step:
                paths = synthesize(out, seed, progress=counted(step))
        else:
            paths = synthesize(out, seed, progress=counted(writing))
    except OSError as exc:
        where = exc.filename or current
        raise DemoDataError(
            f"ups: cannot write the demo data to {out}: {exc.strerror or exc} ({where}). "
            f"Fix: {_fix_for(exc)}. No file there is half-written.",
            exitcodes.SAVE_FAILED.code,
        ) from None
    except KeyboardInterrupt:
        raise DemoDataError(
            f"ups: interrupted (Ctrl-C) while writing the demo data to {out}: "
            f"{written} of {len(DEMO_FILES)} files are complete, and the one being written "
            "was not kept. Run the same command again to write them all.",
            exitcodes.INTERRUPTED.code,
        ) from None
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
        try:
            write_demo_data(args.out, args.seed, live=wants_console("auto", sys.stdout))
        except DemoDataError as exc:
            print(exc, file=sys.stderr)
            return exc.code
        return 0
    return _check(args.config, args.overrides)
