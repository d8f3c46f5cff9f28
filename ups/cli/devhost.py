"""``ups dev-host up|down|status``: a loopback SSH host on this machine to try deploy on.

``up`` starts a real sshd on 127.0.0.1 in a temporary directory and writes a hosts file
with its entry (``local``); ``down`` ends the sshd and every run deployed to it and
removes the directory; it first refuses, naming them, while runs deployed there have not
been copied home by ``fab fetch`` (``--discard`` deletes them anyway). Exit codes: 0 done,
1 the host could not start, 2 nothing to stop, 3 unfetched runs (nothing was stopped).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from ups import devhost


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ups dev-host",
        description=__doc__.replace("``", "`"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "action",
        choices=["up", "down", "status"],
        help="up: start the host (or show the running one); down: stop it and every run "
        "deployed to it; status: show it",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=devhost.STATE_DIR,
        help=f"where the running dev host is recorded, with its hosts.yaml "
        f"(default: {devhost.STATE_DIR})",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="demo data directory to link into the host's workdir (default: data/demo; "
        "when missing, written with `ups data synth` if this folder holds configs/demo.yaml, "
        "which reads it, else none)",
    )
    p.add_argument(
        "--slurm-conf",
        type=Path,
        default=None,
        metavar="SLURM_CONF",
        help="up: add a `cluster` entry (kind: slurm, 2 nodes) for the Slurm cluster this "
        "slurm.conf describes, reached through the dev host (`scripts/slurm-setup.sh start "
        "DIR` runs one on this machine and prints it)",
    )
    p.add_argument(
        "--discard",
        action="store_true",
        help="down: delete runs that `fab fetch` has not copied home (refused without it)",
    )
    return p


def _workload_here() -> str:
    """What a deploy from this folder would run: the demo config in ups's checkout, your
    run file after `ups init`, else your script."""
    if Path("configs/demo.yaml").is_file():
        return "--config configs/demo.yaml"
    if Path("ups-run.yaml").is_file():
        return "--run-file ups-run.yaml"
    return "--script YOUR_SCRIPT.py -- ARGS"


EXIT_UNFETCHED = 3
"""``down`` refused: runs on the dev host were not fetched; nothing was stopped."""


def _describe(host: devhost.DevHost, started: bool) -> str:
    entry = yaml.safe_load(host.hosts_file.read_text())["hosts"]
    verb = "started" if started else "already running"
    slurm_too = devhost.SLURM_HOST_NAME in entry
    slurm = [f"  fab deploy --host {devhost.SLURM_HOST_NAME} --config configs/demo.yaml"]
    return "\n".join(
        [
            f"dev host {verb}: sshd on 127.0.0.1:{host.port} (pid {host.pid}), files in "
            f"{host.root}",
            f"hosts file {host.hosts_file} holds {'these entries' if slurm_too else 'this entry'}:",
            "",
            *("  " + line for line in yaml.safe_dump(entry, sort_keys=False).splitlines()),
            "",
            "Use it (in this shell):",
            f"  export UPS_HOSTS_FILE={host.hosts_file}",
            f"  fab deploy --host {devhost.HOST_NAME} {_workload_here()}",
            "(`ups deploy` takes the same options from any folder; `fab` needs a fabfile.py "
            "here or above: `ups init` writes one)",
            *(slurm if slurm_too else []),
            "Remove it, with every run deployed to it: ups dev-host down",
        ]
    )


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.action == "up":
        running = devhost.read_state(args.state_dir)
        started = running is None or not running.alive()
        try:
            host = devhost.up(args.state_dir, args.data, args.slurm_conf)
        except devhost.DevHostError as exc:
            print(f"ups dev-host up: {exc}", file=sys.stderr)
            return 1
        print(_describe(host, started))
        return 0
    if args.action == "status":
        recorded = devhost.read_state(args.state_dir)
        if recorded is None or not recorded.alive():
            print("no dev host running (start one with `ups dev-host up`)")
            return 2 if recorded is None else 1
        print(_describe(recorded, started=False))
        return 0
    recorded = devhost.read_state(args.state_dir)
    if recorded is not None and not args.discard and (runs := devhost.unfetched(recorded)):
        first = runs[0].split()[0]
        print(
            f"ups dev-host down: {len(runs)} run(s) on the dev host were not fetched since they "
            f"last changed, and would be deleted with it: {', '.join(runs)}. Copy one home "
            f"with `fab fetch --host {devhost.HOST_NAME} --run {first}` (its outputs too), "
            "or delete them with the host: `ups dev-host down --discard`. Nothing was stopped.",
            file=sys.stderr,
        )
        return EXIT_UNFETCHED
    stopped = devhost.down(args.state_dir)
    if stopped is None:
        print(
            f"ups dev-host down: no dev host recorded in {args.state_dir} (nothing to stop; "
            "run it from the directory where you ran `ups dev-host up`, or pass --state-dir)",
            file=sys.stderr,
        )
        return 2
    print(f"dev host stopped: sshd {stopped.pid} and its runs ended, {stopped.root} removed")
    return 0
