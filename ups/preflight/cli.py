"""``ups-preflight`` / ``ups preflight``: run the checks, print a table or JSON, exit 0 if fit.

Exit codes: 0 nothing failed (with ``--strict``: nothing warned either), 1 a check failed,
2 bad usage (unknown check name, malformed flag, invalid run config).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

from rich.console import Console

from ups.config import ConfigError, load_config
from ups.log import setup_logging
from ups.outcome import EXIT_CONFIG
from ups.preflight.checks import CHECKS, GROUPS
from ups.preflight.options import PreflightOptions
from ups.preflight.runner import run_preflight, select_checks


def _check_list() -> str:
    # Plain aligned text: argparse prints it as the --help epilog, which rich cannot draw.
    width = max(len(s.name) for s in CHECKS)
    lines = [f"  {s.name:<{width}}  {s.summary} (timeout {s.timeout_s:g} s)" for s in CHECKS]
    lines += [f"  {g:<{width}}  group: {', '.join(names)}" for g, names in GROUPS.items()]
    return "checks:\n" + "\n".join(lines)


def _timeout(item: str) -> tuple[str, float]:
    name, sep, seconds = item.partition("=")
    try:
        value = float(seconds)
    except ValueError:
        value = -1.0
    if not sep or value <= 0:
        raise argparse.ArgumentTypeError(f"expected NAME=SECONDS, got {item!r}")
    return name, value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ups-preflight",
        description="Check that this host is fit to train: GPUs, NCCL/gloo all-reduce, ports, "
        "cache tensors on CPU, /dev/shm, ulimits, disk, RAM, versions vs pins, data, env.",
        epilog=_check_list(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", "-c", type=Path, help="run config YAML")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override (repeatable)",
    )
    p.add_argument("--gpus", type=int, dest="expected_gpus", help="GPUs this host must show")
    p.add_argument("--nproc-per-node", type=int, help="workers per node (default: config)")
    p.add_argument("--master-port", type=int, help="default: distributed.master_port or 29500")
    p.add_argument("--rdzv-port", type=int, help="rendezvous port to check as well")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAMES",
        help="run only these checks/groups (comma-separated, repeatable)",
    )
    p.add_argument(
        "--skip", action="append", default=[], metavar="NAMES", help="skip these checks/groups"
    )
    p.add_argument("--shm-path", type=Path, default=Path("/dev/shm"), help="shared memory to check")
    p.add_argument(
        "--pins",
        type=Path,
        dest="pins_path",
        help="pins.toml (default: $UPS_PINS, ./pins.toml, else the one ups ships)",
    )
    p.add_argument(
        "--min-busbw",
        type=float,
        dest="min_busbw_gbps",
        metavar="GBPS",
        help="all-reduce bus bandwidth floor, overriding the GPU table",
    )
    p.add_argument("--cpu-procs", type=int, default=2, help="gloo processes without GPUs")
    p.add_argument(
        "--cache-path",
        type=Path,
        action="append",
        default=[],
        dest="cache_paths",
        help="extra .pt file or directory to scan (repeatable)",
    )
    p.add_argument(
        "--timeout",
        type=_timeout,
        action="append",
        default=[],
        metavar="NAME=S",
        help="per-check timeout override in seconds (repeatable)",
    )
    p.add_argument(
        "--burn-in",
        choices=["off", "warn", "enforce"],
        help="measure this host (docs/burn-in.md); default: preflight.burn_in of the config",
    )
    p.add_argument("--strict", action="store_true", help="warnings fail too")
    p.add_argument("--json", action="store_true", help="print the JSON report (stable schema)")
    p.add_argument(
        "--events",
        choices=["auto", "on", "off"],
        default="auto",
        help="structlog events on stderr (auto: on unless stderr is a terminal)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        select_checks(args.only, args.skip)
    except ValueError as exc:
        parser.error(str(exc))
    if args.config is not None:
        # Before anything imports torch, as in `ups launch`: wrong keys or values end
        # here in a fraction of a second (compose runs this before launch), not after a
        # full preflight. Missing or malformed data files are the data check's to report.
        try:
            load_config(args.config, args.overrides, check_files=False)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return EXIT_CONFIG
    # Events go to stderr so stdout carries only the table or the JSON document; on a
    # terminal they would repeat the table line by line, so auto leaves them out there.
    events = args.events == "on" or (args.events == "auto" and not sys.stderr.isatty())
    setup_logging(stdout=sys.stderr if events else io.StringIO(), console=False)
    opts = PreflightOptions(
        config=args.config,
        overrides=args.overrides,
        expected_gpus=args.expected_gpus,
        nproc_per_node=args.nproc_per_node,
        master_port=args.master_port,
        rdzv_port=args.rdzv_port,
        only=args.only,
        skip=args.skip,
        shm_path=args.shm_path,
        pins_path=args.pins_path,
        strict=args.strict,
        min_busbw_gbps=args.min_busbw_gbps,
        cpu_procs=args.cpu_procs,
        timeouts=dict(args.timeout),
        cache_paths=args.cache_paths,
        burn_in=args.burn_in,
    )
    report = run_preflight(opts)
    if args.json:
        print(report.to_json(args.strict))
    elif sys.stdout.isatty():
        # A person reads it: colours, and long messages wrapped to the terminal's width.
        Console(highlight=False, markup=False, emoji=False).print(report.renderable(args.strict))
    else:
        print(report.render_table(args.strict))
    return 0 if report.ok(args.strict) else 1


if __name__ == "__main__":
    sys.exit(main())
