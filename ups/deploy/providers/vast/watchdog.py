"""The instance guards itself: at ``max_hours`` (or when a run ended and nobody fetched it)
stop the run gracefully and end the instance through the Vast API, laptop or not.

Started at boot by the instance's onstart script (:func:`onstart_command`), so it runs
before ups ever reaches the instance over SSH. It acts with the scoped key in
``<workdir>/.ups/vast/watchdog.key`` (0600, uploaded by deploy when hosts.yaml names
``watchdog_key_file``), else with the instance's own ``CONTAINER_API_KEY`` from its
environment; no key is ever on a command line. A key that may not destroy (HTTP
401/403) makes it stop the instance instead, which ends GPU billing but not storage.
A ``lease`` file (an epoch) written by a following laptop before it fetches holds the
watchdog back until then, so it never ends an instance mid-fetch.
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
from ups.deploy.hosts import VastHost
from ups.deploy.transport.remote import STATE_DIR, q, ups_python

WATCH_DIR = ".ups/vast"
KEY_FILE = "watchdog.key"
LEASE_FILE = "lease"


def watch_path(workdir: str, name: str) -> str:
    return posixpath.join(workdir, WATCH_DIR, name)


def action_for(on_exit: str) -> str:
    return {"destroy": "destroy", "stop": "stop"}.get(on_exit, "none")


def onstart_command(spec: VastHost, deadline_epoch: float) -> str:
    """The instance's onstart script: start the watchdog detached (well under 4 KB)."""
    args = [
        "--deadline", f"{deadline_epoch:.0f}",
        "--workdir", spec.workdir,
        "--action", action_for(spec.on_exit),
        "--grace", f"{spec.watchdog_grace_s:g}",
        "--poll", f"{spec.watchdog_poll_s:g}",
    ]  # fmt: skip
    if spec.vast_url:
        args += ["--server-url", spec.vast_url]
    return _onstart_script(spec.workdir, WATCH_DIR, spec.ups_bin, spec.remote_env, args)


def _log(event: str, **fields: object) -> None:
    line = jsonio.dumps({"event": event, "time": time.time(), **fields})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Watchdog:
    def __init__(self, args: argparse.Namespace) -> None:
        self.workdir = Path(args.workdir)
        self.deadline = float(args.deadline)
        self.action = str(args.action)
        self.grace_s = float(args.grace)
        self.server_url: str | None = args.server_url
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
            return float((self.workdir / WATCH_DIR / LEASE_FILE).read_text().strip())
        except (OSError, ValueError):
            return 0.0

    def wait_for_trigger(self) -> str:
        while True:
            now = time.time()
            if now >= self.deadline:
                return "max_hours reached"
            runs = self.runs()
            ended = [(r / "exit").stat().st_mtime for r in runs if (r / "exit").exists()]
            idle = bool(runs) and len(ended) == len(runs) and now - max(ended) >= self.grace_s
            if idle and now >= self.lease():
                return "run ended and nobody fetched it"
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
        from ups.deploy.providers.vast.client import VastApi
        from ups.deploy.providers.vast.errors import VastApiError

        instance = os.environ.get("CONTAINER_ID", "")
        key_file = self.workdir / WATCH_DIR / KEY_FILE
        key = key_file.read_text().strip() if key_file.exists() else None
        key = key or os.environ.get("CONTAINER_API_KEY")
        if not instance.isdigit() or not key:
            _log("watchdog cannot act: no CONTAINER_ID or no key", action=self.action)
            return True
        api = VastApi(self.server_url, api_key=key)
        # Logged first: a destroy that works kills this process with the instance.
        _log("watchdog ending instance", instance=instance, action=self.action)
        try:
            if self.action == "destroy":
                try:
                    api.destroy(int(instance))
                except VastApiError as err:
                    if err.status not in (401, 403):
                        raise
                    _log("watchdog key may not destroy; stopping instead", instance=instance)
                    api.stop(int(instance))
            elif self.action == "stop":
                api.stop(int(instance))
        except VastApiError as err:
            _log("watchdog API call failed, retrying in a minute", error=str(err))
            return False
        return True

    def run(self) -> int:
        _log("watchdog armed", deadline=self.deadline, action=self.action, grace_s=self.grace_s)
        reason = self.wait_for_trigger()
        _log("watchdog triggered", reason=reason)
        hold = time.time()
        if reason == "max_hours reached":
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
    parser.add_argument("--deadline", required=True, help="epoch seconds (max_hours)")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--action", choices=["destroy", "stop", "none"], default="destroy")
    parser.add_argument("--grace", default="300", help="seconds left for a laptop to fetch")
    parser.add_argument("--server-url", default=None)
    parser.add_argument("--poll", default="2", help="seconds between checks (watchdog_poll_s)")
    parser.add_argument("--stop-grace", default="120", help="seconds for the run to checkpoint")
    return Watchdog(parser.parse_args(argv)).run()


def _onstart_script(
    workdir: str, watch_dir: str, ups_bin: str, remote_env: str | None, watchdog_args: list[str]
) -> str:
    """A Vast instance's onstart script: start the watchdog detached (well under 4 KB)."""
    log = posixpath.join(workdir, watch_dir, "watchdog.log")
    lines = [
        "touch ~/.no_auto_tmux",
        f"mkdir -p {q(posixpath.join(workdir, watch_dir))}",
        remote_env or "",
        ups_python(ups_bin),
        f'setsid nohup "$PY" -m ups.deploy.providers.vast.watchdog '
        f"{' '.join(q(a) for a in watchdog_args)} "
        f">> {q(log)} 2>&1 < /dev/null &",
    ]
    return "\n".join(line for line in lines if line) + "\n"


if __name__ == "__main__":
    sys.exit(main())
