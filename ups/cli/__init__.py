"""``ups`` command: each subcommand is its own small module with ``main(argv) -> int``."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "demo": ("ups.cli.demo", "synthesize the demo data if needed and train on it with 2 ranks"),
    "train": ("ups.train.main", "run one training worker (what torchrun starts; ups-train)"),
    "launch": ("ups.cli.launch", "preflight, then torchrun: the one way to start training"),
    "preflight": ("ups.preflight.cli", "check that this host is fit to train (ups-preflight)"),
    "data": ("ups.cli.data", "demo data: `ups data synth`, `ups data check CONFIG`"),
    "cache": ("ups.cli.cache", "latent cache: `ups cache build CONFIG`"),
    "checkpoint": ("ups.cli.checkpoint", "`ups checkpoint export RUN`: one weights file"),
    "init": ("ups.cli.init", "make this folder a ups project: fabfile.py, ups-run.yaml"),
    "dev-host": ("ups.cli.devhost", "`ups dev-host up|down`: a local SSH host to try deploy on"),
    # The fabfile's tasks (fab deploy, ...): module:function, one module for all of them.
    "deploy": ("ups.cli.deploy:deploy", "start a run on a host from hosts.yaml (fab deploy)"),
    "logs": ("ups.cli.deploy:logs", "follow a deployed run's log to its end (fab logs)"),
    "status": ("ups.cli.deploy:status", "is a deployed run alive, its outcome (fab status)"),
    "stop": ("ups.cli.deploy:stop", "stop a deployed run gracefully (fab stop)"),
    "fetch": ("ups.cli.deploy:fetch", "copy a deployed run's outputs home (fab fetch)"),
    "instances": ("ups.cli.deploy:instances", "list ups's rented instances (fab instances)"),
    "down": (
        "ups.cli.deploy:down",
        "destroy ups's rented instances, cancel its Slurm job (fab down)",
    ),
    "hosts": ("ups.cli.hosts", "rented machines that failed here and are skipped (host ledger)"),
    "supervise": ("ups.cli.supervise", "follow and recover a managed run (--detach starts it)"),
}


def _usage() -> str:
    # Plain aligned text, not a rich table: it is usage text that must read the same in
    # `ups --help | less`, and two columns need no library.
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return (
        "usage: ups COMMAND [ARGS...]\n       ups --version\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\nRun `ups COMMAND --help` for a command's options."
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if args else 2
    if args[0] == "--version":
        from ups import __version__

        print(__version__)
        return 0
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"ups: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _, function = entry[0].partition(":")
    module = importlib.import_module(module_name)
    return int(getattr(module, function or "main")(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
