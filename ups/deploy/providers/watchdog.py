"""The instance guards itself, on every provider that can self-destruct: at ``max_hours``,
when no run started within ``start_timeout_s`` of its boot, or when a run ended and nobody
fetched it, it stops the run gracefully and ends the instance through its provider's
API, laptop or not.

Started at boot by the instance's onstart script (:func:`onstart_command`), so it runs
before ups ever reaches the instance over SSH. It acts through its provider's
:class:`~ups.deploy.providers.base.ComputeWithSelfDestruct` with the scoped key in
``<workdir>/.ups/watchdog/watchdog.key`` (0600, uploaded by deploy when hosts.yaml names
``watchdog_key_file``), else with the instance's own key from its environment; no key is
ever on a command line. A key that may not destroy makes it stop the instance instead,
which ends GPU billing but not storage. A ``lease`` file (an epoch) written by a
following laptop before it fetches holds the watchdog back until then, so it never ends
an instance mid-fetch.

The start bound ends an instance its supervisor lost before setting it up (one created by
a supervisor frozen between its lease check and its create): nothing ever starts a run
there, so it bills at most ``start_timeout_s`` past its boot.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import signal
import sys
import time
from pathlib import Path

from ups import jsonio
from ups.deploy.entries import RentedHost
from ups.deploy.providers import package
from ups.deploy.providers.base import ApiErrorKind, ProviderApiError
from ups.deploy.transport.remote import STATE_DIR, q, ups_python

WATCH_DIR = ".ups/watchdog"
KEY_FILE = "watchdog.key"
LEASE_FILE = "lease"
MODULE = "ups.deploy.providers.watchdog"
MAX_HOURS = "max_hours reached"
NOT_STARTED = "no run started within start_timeout_s"
UNFETCHED = "run ended and nobody fetched it"


def watch_path(workdir: str, name: str = "") -> str:
    """A file of the watchdog on the instance (its directory when ``name`` is empty)."""
    return posixpath.join(workdir, WATCH_DIR, name) if name else posixpath.join(workdir, WATCH_DIR)


def action_for(on_exit: str) -> str:
    return {"destroy": "destroy", "stop": "stop"}.get(on_exit, "none")


def onstart_command(spec: RentedHost, deadline_epoch: float) -> str:
    """The instance's onstart script: start the watchdog detached (well under 4 KB)."""
    args = [
        "--provider", spec.kind,
        "--deadline", f"{deadline_epoch:.0f}",
        "--start-timeout", f"{spec.start_timeout_s:g}",
        "--workdir", spec.workdir,
        "--action", action_for(spec.on_exit),
        "--grace", f"{spec.watchdog_grace_s:g}",
        "--poll", f"{spec.watchdog_poll_s:g}",
    ]  # fmt: skip
    if endpoint := package(spec.kind).watchdog_endpoint(spec):
        args += ["--endpoint", endpoint]
    log = watch_path(spec.workdir, "watchdog.log")
    lines = [
        "touch ~/.no_auto_tmux",
        f"mkdir -p {q(watch_path(spec.workdir))}",
        spec.remote_env or "",
        ups_python(spec.ups_bin),
        f'setsid nohup "$PY" -m {MODULE} {" ".join(q(a) for a in args)} '
        f">> {q(log)} 2>&1 < /dev/null &",
    ]
    return "\n".join(line for line in lines if line) + "\n"


def _log(event: str, **fields: object) -> None:
    line = jsonio.dumps({"event": event, "time": time.time(), **fields})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Watchdog:
    def __init__(self, args: argparse.Namespace) -> None:
        self.provider = str(args.provider)
        self.workdir = Path(args.workdir)
        self.watch_dir = self.workdir / args.watch_dir
        self.deadline = float(args.deadline)
        self.start_by = time.time() + float(args.start_timeout) if args.start_timeout else None
        self.action = str(args.action)
        self.grace_s = float(args.grace)
        self.endpoint: str | None = args.endpoint
        self.poll_s = float(args.poll)
        self.stop_grace_s = float(args.stop_grace)

    def runs(self) -> list[Path]:
        """State dirs of runs that were started (they have a pid file)."""
        root = self.workdir / STATE_DIR
        if not root.is_dir():
            return []
        return [p for p in root.iterdir() if not p.is_symlink() and (p / "pid").exists()]

    def lease(self) -> float:
        try:
            return float((self.watch_dir / LEASE_FILE).read_text().strip())
        except (OSError, ValueError):
            return 0.0

    def wait_for_trigger(self) -> str:
        while True:
            now = time.time()
            if now >= self.deadline:
                return MAX_HOURS
            runs = self.runs()
            late = self.start_by is not None and now >= max(self.start_by, self.lease())
            if not runs and late:
                return NOT_STARTED
            if runs:
                self.start_by = None  # a run started: the start bound is met for good
            ended = [(r / "exit").stat().st_mtime for r in runs if (r / "exit").exists()]
            idle = bool(runs) and len(ended) == len(runs) and now - max(ended) >= self.grace_s
            if idle and now >= self.lease():
                return UNFETCHED
            time.sleep(self.poll_s)  # a timer, not a busy wait: one stat per run per poll

    def stop_runs(self) -> None:
        """SIGTERM each live launcher (it checkpoints and exits) and wait for its exit file."""
        live = [r for r in self.runs() if not (r / "exit").exists()]
        for run in live:
            try:
                pid = int((run / "pid").read_text().strip())
                os.kill(pid, signal.SIGTERM)
                _log("watchdog stopping run", run=run.name, pid=pid)
            except (OSError, ValueError) as err:
                _log("watchdog could not signal run", run=run.name, error=str(err))
        deadline = time.monotonic() + self.stop_grace_s
        while time.monotonic() < deadline and any(not (r / "exit").exists() for r in live):
            time.sleep(self.poll_s)  # waiting for the preemption checkpoints, bounded

    def end_instance(self) -> bool:
        """End this instance per ``action``; False when the API should be tried again."""
        key_file = self.watch_dir / KEY_FILE
        key = key_file.read_text().strip() if key_file.exists() else None
        inside = package(self.provider).on_instance(self.endpoint, key or None)
        # Logged first: a destroy that works kills this process with the instance.
        _log("watchdog ending instance", instance=inside.instance_id(), action=self.action)
        try:
            try:
                inside.end_self(self.action)
            except ProviderApiError as err:
                if self.action != "destroy" or err.kind is not ApiErrorKind.KEY_REJECTED:
                    raise
                _log("watchdog key may not destroy; stopping instead")
                inside.end_self("stop")
        except ProviderApiError as err:
            if err.kind is ApiErrorKind.KEY_MISSING:
                _log("watchdog cannot act", action=self.action, error=str(err))
                return True
            _log("watchdog API call failed, retrying in a minute", error=str(err))
            return False
        return True

    def run(self) -> int:
        _log("watchdog armed", deadline=self.deadline, action=self.action, grace_s=self.grace_s,
             start_by=self.start_by, provider=self.provider)  # fmt: skip
        reason = self.wait_for_trigger()
        _log("watchdog triggered", reason=reason)
        hold = time.time()
        if reason == MAX_HOURS:
            self.stop_runs()
            hold = time.time() + self.grace_s  # a following laptop fetches in this window
        while time.time() < max(hold, self.lease()):
            time.sleep(self.poll_s)  # the fetch window: a laptop may lease it longer
        if self.action == "none":
            _log("watchdog leaves the instance running (on_exit: keep)")
            return 0
        while not self.end_instance():
            time.sleep(60.0)  # the API is down or rate-limiting: keep trying, never give up
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--provider", default="vast", help="the registry's name")
    parser.add_argument("--deadline", required=True, help="epoch seconds (max_hours)")
    parser.add_argument("--start-timeout", default=None, help="seconds from boot to a run")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--watch-dir", default=WATCH_DIR, help="its files, under workdir")
    parser.add_argument("--action", choices=["destroy", "stop", "none"], default="destroy")
    parser.add_argument("--grace", default="300", help="seconds left for a laptop to fetch")
    parser.add_argument("--endpoint", "--server-url", dest="endpoint", default=None)
    parser.add_argument("--poll", default="2", help="seconds between checks (watchdog_poll_s)")
    parser.add_argument("--stop-grace", default="120", help="seconds for the run to checkpoint")
    return Watchdog(parser.parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
