"""``ups checkpoint export RUN``: the run's newest good weights as one file for inference."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ups.outcome import EXIT_CONFIG, EXIT_FAILED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ups checkpoint",
        description="`ups checkpoint export RUN`: the run's newest good weights as one file "
        "for inference.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser(
        "export",
        help="write the newest good checkpoint's model weights (either strategy's format) "
        "as one torch.load(weights_only=True) file",
    )
    export.add_argument("run", help="run directory (runs/latest, runs/<id>) or run id")
    export.add_argument(
        "--output-dir", type=Path, default=Path("runs"), help="where a bare run id is looked up"
    )
    export.add_argument(
        "--out", type=Path, help="file to write; default RUN/export/model_step_<N>.pt"
    )
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    run_dir = Path(args.run)
    if not run_dir.is_dir():
        run_dir = args.output_dir / args.run
    if not (run_dir / "checkpoints").is_dir():
        print(
            f"ups checkpoint export: {args.run} is not a run directory (no checkpoints/ in "
            f"{run_dir}); pass runs/<id>, runs/latest, or a run id with --output-dir",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    # torch only once the flags and the directory are good: a mistyped path is answered
    # without its import (~2 s).
    from ups.log import get_logger, setup_logging
    from ups.train.export import NothingToExport, export_weights

    setup_logging()
    log = get_logger("ups.checkpoint")
    try:
        written, source, step = export_weights(run_dir.resolve(), args.out)
    except NothingToExport as exc:
        print(f"ups checkpoint export: {exc}", file=sys.stderr)
        return EXIT_FAILED
    log.info("exported", path=str(written), checkpoint=str(source), step=step)
    return 0
