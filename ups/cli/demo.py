"""``ups demo``: the main job on built-in data, on this machine.

Writes the demo files (PDEBench layout, `ups data synth`) when they are missing, runs
``ups launch configs/demo.yaml`` (preflight, then torchrun with 2 gloo ranks on CPU),
and ends with the held-out relative L2 error of the model next to the naive baseline.
"""

from __future__ import annotations

import argparse
import sys

from ups.cli.data import DemoDataError, write_demo_data
from ups.config import ConfigError, load_config
from ups.console import LOG_FORMATS, eval_table, render_text, wants_console
from ups.log import setup_logging
from ups.outcome import EXIT_CONFIG, read_outcome


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ups demo",
        description="Write the demo data (PDEBench layout, as `ups data synth` does) when it "
        "is missing, run `ups launch configs/demo.yaml` (preflight, then torchrun with 2 gloo "
        "ranks on CPU), and end with the held-out relative L2 error of the model next to the "
        "naive baseline.",
    )
    p.add_argument(
        "--config", default="configs/demo.yaml", help="run config (default: configs/demo.yaml)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, as for `ups launch` (repeatable)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the synthesized demo data")
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="auto",
        help="as for `ups launch`: console (progress line, tables), json, or auto",
    )
    return p


def render_comparison(metrics: dict[str, float]) -> str:
    """A table: task, model error, baseline error, how many times better the model is."""
    return render_text(eval_table(metrics))


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, check_files=False)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    missing = [task.path for task in cfg.tasks if not task.path.is_file()]
    if missing:
        live = wants_console(args.log_format, sys.stdout)
        setup_logging(console=live)
        try:
            write_demo_data(missing[0].parent, args.seed, live=live)
        except DemoDataError as exc:
            print(exc, file=sys.stderr)
            return exc.code
    from ups.cli import launch

    sets = [f"--set={item}" for item in args.overrides]
    code = launch.main([args.config, *sets, f"--log-format={args.log_format}"])
    outcome = read_outcome(cfg.run.output_dir / "latest")
    finished = code == 0 and outcome is not None and outcome.outcome == "finished"
    # On the console the run already ended with this table (the eval event's).
    if finished and outcome is not None and not wants_console(args.log_format, sys.stdout):
        print(render_comparison(outcome.metrics))
    return code
