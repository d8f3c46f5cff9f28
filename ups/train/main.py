"""``ups-train CONFIG``: one training worker, under torchrun or as a plain process.

Only the flags are read here: ``--help`` and a usage mistake are answered before torch
and the trainer are imported (seconds of CPU per process); the worker itself is
:mod:`ups.train.worker`.
"""

from __future__ import annotations

import argparse
import sys

from ups.console import LOG_FORMATS


def _parser() -> argparse.ArgumentParser:
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from ups.train.worker import work  # torch and the trainer: only for a run

    code = work(args.config, args.set, args.log_format)
    assert code is not None  # torchrun's @record returns what work returned, or raises
    return code


if __name__ == "__main__":
    sys.exit(main())
