"""``ups hosts``: the host ledger: every rented machine a burn-in measured here (what it
delivered, what a sample cost), and the machines that failed a deploy here and why.

Machines with an entry younger than ``ledger_ttl_h`` (hosts.yaml, default 72) are left out
of every offer search; ``--ttl-h`` marks which those are for another setting.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from ups import jsonio
from ups.deploy.errors import DeployError


def main(argv: list[str]) -> int:
    from ups.deploy.managed.ledger import Ledger, render, render_measured

    p = argparse.ArgumentParser(
        prog="ups hosts",
        description="Show the host ledger: rented machines measured here (burn-in figures, $/h, "
        "$ per million samples) and those that failed here (a driver or pull error, never "
        "running, SSH silent, preflight or burn-in failing there), when and why.",
    )
    p.add_argument(
        "--ttl-h", type=float, default=72.0, help="mark entries younger than this (default 72)"
    )
    p.add_argument("--json", action="store_true", help="print the ledger as JSON")
    args = p.parse_args(argv)
    ledger = Ledger()
    try:
        failures = ledger.read()
        measured = ledger.measurements()
    except DeployError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    if args.json:
        body = {
            "path": str(ledger.path),
            "failures": [asdict(f) for f in failures],
            "measured": [
                {
                    **asdict(m),
                    "samples_per_s": m.samples_per_s,
                    "usd_per_msample": m.usd_per_msample(),
                }
                for m in measured
            ],
        }
        print(jsonio.dumps(body))
        return 0
    print(f"host ledger: {ledger.path}")
    print(render_measured(measured))
    print()
    print(render(failures, args.ttl_h))
    return 0
