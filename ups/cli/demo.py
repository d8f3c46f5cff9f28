"""``ups demo``: the main job on built-in data, on this machine.

Writes the demo files (PDEBench layout, `ups data synth`) when they are missing, runs
``ups launch configs/demo.yaml`` (preflight, then torchrun with 2 gloo ranks on CPU),
and ends with the held-out relative L2 error of the model next to the naive baseline.
"""

from __future__ import annotations

import argparse
import sys

from ups.config import ConfigError, load_config
from ups.data.synth import synthesize
from ups.outcome import EXIT_CONFIG, read_outcome


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ups demo", description=__doc__)
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthesized demo data")
    return p


def render_comparison(metrics: dict[str, float]) -> str:
    """A table: task, model error, baseline error, and how many times better the model is."""
    tasks = sorted({key.split("/")[1] for key in metrics if key.startswith("eval/")})
    lines = [f"{'task':<12} {'model rel L2':>13} {'baseline rel L2':>16} {'baseline/model':>15}"]
    for task in tasks:
        model = metrics[f"eval/{task}/rel_l2"]
        base = metrics[f"eval/{task}/baseline_rel_l2"]
        lines.append(f"{task:<12} {model:>13.4f} {base:>16.4f} {base / model:>14.1f}x")
    lines.append(
        "baseline: persistence (previous frame) for time tasks, mean training field for steady"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, check_files=False)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    missing = [task.path for task in cfg.tasks if not task.path.is_file()]
    if missing:
        synthesize(missing[0].parent, args.seed)
    from ups.cli import launch

    sets = [f"--set={item}" for item in args.overrides]
    code = launch.main([args.config, *sets])
    outcome = read_outcome(cfg.run.output_dir / "latest")
    if code == 0 and outcome is not None and outcome.outcome == "finished":
        print(render_comparison(outcome.metrics))
    return code
