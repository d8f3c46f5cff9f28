"""``ups init``: make the current folder a project ups deploys from.

Writes ``fabfile.py`` (two lines: ``fab`` finds ups's tasks in this folder, as in ups's
own checkout) and ``ups-run.yaml`` (how your script runs: a starter with its keys
explained), then says where deploy looks for hosts and what to run next. It never
overwrites a file: when either exists it writes nothing and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path, PurePosixPath

from ups.deploy.hosts import DEFAULT_HOSTS_FILE, HOSTS_FILE_LOOKUP
from ups.fsio import atomic_write_text

EXIT_USAGE = 2

FABFILE = """\
# ups's deploy tasks (`fab --list`); `ups deploy|logs|...` are the same commands without Fabric.
from ups.fabtasks import *  # noqa: F403
"""
"""The fabfile of every ups project, ups's own checkout included."""

RUN_FILE = """\
# How ups runs your script: `ups launch --run-file ups-run.yaml` on this machine,
# `fab deploy --host NAME --run-file ups-run.yaml` (or `ups deploy ...`) on a host.
# Arguments after `--` on either command line replace `args`. Every key: docs/script.md.
script: {script}
args: []
# setup: ["pip install -r requirements.txt"]  # on the host, once per content of the files named
# env: [WANDB_API_KEY]          # secrets by name; values from this machine's environment
# checkpoint_dir: checkpoints   # where your script saves (UPS_CHECKPOINT_DIR); it resumes
#                               # from UPS_RESUME (default: the run directory's checkpoints/)
# data: [data/train.h5]         # must exist on the host before the run starts
# exclude: ["*.pt"]             # never sent to the host (nor is what .gitignore ignores)
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ups init",
        description="Write fabfile.py (so `fab deploy` works in this folder) and a starter "
        "ups-run.yaml for your script, then say where hosts are read from and what to run "
        "next. Existing files are never overwritten (exit 2).",
        epilog="Then: `ups launch --run-file ups-run.yaml` here; `ups dev-host up` for a host "
        "on this machine; `fab deploy --host NAME --script train.py -- ARGS` (or `ups deploy`).",
    )
    p.add_argument(
        "--script",
        default="train.py",
        help="your training script, relative to this folder (default: train.py)",
    )
    return p


def _script_problem(script: str) -> str | None:
    path = PurePosixPath(script)
    if path.is_absolute() or ".." in path.parts:
        return (
            f"--script {script!r} must be a path inside this folder (relative, no '..'): the "
            "folder is what deploy sends to the host. Run ups init in the folder that holds it."
        )
    if not Path(script).is_file():
        return (
            f"there is no {script} in this folder ({Path.cwd()}). Name your training script "
            "with --script PATH (relative to this folder), or run ups init where it is."
        )
    if path.suffix != ".py":
        return f"--script {script!r} must be a Python file (torchrun runs it)."
    return None


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    files = {Path("fabfile.py"): FABFILE, Path("ups-run.yaml"): RUN_FILE.format(script=args.script)}
    present = [str(p) for p in files if p.exists()]
    if present:
        print(
            f"ups init: {' and '.join(present)} already exist{'s' if len(present) == 1 else ''} "
            f"in {Path.cwd()}; ups init writes nothing over a file, so it wrote nothing. To use "
            "ups's tasks from a fabfile.py of your own, add the line "
            "`from ups.fabtasks import *` to it; for a fresh start, move the file(s) away and "
            "run ups init again.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    problem = _script_problem(args.script)
    if problem:
        print(f"ups init: {problem}", file=sys.stderr)
        return EXIT_USAGE
    for path, text in files.items():
        atomic_write_text(path, text)
    hosts_here = DEFAULT_HOSTS_FILE.is_file()
    print(
        "\n".join(
            [
                "wrote fabfile.py: `fab --list` here shows ups's deploy tasks "
                "(`ups deploy|logs|...` are the same commands)",
                f"wrote ups-run.yaml: how {args.script} runs (args, setup, secrets, "
                "checkpoints; docs/script.md)",
                "",
                f"Hosts are read from {HOSTS_FILE_LOOKUP} "
                f"({'present' if hosts_here else 'not here yet'}).",
                "Next:",
                "  ups launch --run-file ups-run.yaml     # run it here first",
                "  ups dev-host up                        # an SSH host on this machine to "
                "deploy to; prints its hosts file",
                f"  fab deploy --host NAME --script {args.script} -- ARGS   "
                "# or --run-file ups-run.yaml; `ups deploy` alike",
            ]
        )
    )
    return 0
