"""W&B for a run on a rented host: offline there (no key on a stranger's machine), synced
from this machine once the run directory has come home.

``wandb sync`` runs here with this machine's credentials (``WANDB_API_KEY``, or what
``wandb login`` saved) on every offline run of the directory; it marks what it synced,
so a second sync sends nothing twice. It reports some failures (a refused key) only in
its output, with exit status 0: its ``ERROR`` and ``Error:`` lines count as a failure here.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

SYNC_TIMEOUT_S = 600.0


def sync_home(run_dir: Path, env: dict[str, str], say: Callable[[str], None]) -> bool:
    """Sync the offline W&B runs under ``run_dir/wandb`` from this machine; whether every
    one was synced. Says what happened, and the command to retry when it did not."""
    runs = sorted(p for p in (run_dir / "wandb").glob("offline-run-*") if p.is_dir())
    if not runs:
        return True
    command = ["wandb", "sync", *(str(p) for p in runs)]
    retry = f"`{' '.join(command)}` syncs it"
    try:
        result = subprocess.run(
            [sys.executable, "-m", *command],
            env=env,
            capture_output=True,
            text=True,
            timeout=SYNC_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        say(f"warning: W&B sync did not finish within {SYNC_TIMEOUT_S:.0f} s; {retry}")
        return False
    output = result.stdout + result.stderr
    errors = [ln for ln in output.splitlines() if "ERROR" in ln or ln.startswith("Error:")]
    if result.returncode != 0 or errors:
        why = errors[-1] if errors else (output.strip().splitlines() or ["no output"])[-1]
        say(f"warning: W&B sync from this machine failed ({why.strip()}); {retry}")
        return False
    say(f"synced the run's W&B directory from this machine ({len(runs)} offline run(s))")
    return True
