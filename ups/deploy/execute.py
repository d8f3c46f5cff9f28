"""Carry out deploy plans and the follow-up operations (logs, status, stop, fetch).

Each operation takes a resolved host, writes what people should see to ``out`` and
returns the process exit code; problems the user must fix raise :class:`DeployError`.
"""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fabric import Connection

import ups
from ups.console import ConsoleView
from ups.deploy import remote as rc
from ups.deploy.connect import connect
from ups.deploy.errors import DeployError, PreflightFailed
from ups.deploy.hosts import HostSpec
from ups.deploy.plan import DeployPlan, script_for
from ups.deploy.progress import Progress
from ups.deploy.stream import LogFollower
from ups.grace import STOP_WAIT_S
from ups.log import render_line
from ups.outcome import Outcome


@dataclass
class Target:
    """A host from hosts.yaml, where its keys are checked, and where output goes."""

    spec: HostSpec
    known_hosts: Path
    out: TextIO

    def connect(self) -> Connection:
        return connect(self.spec, self.known_hosts)

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()


def _run(conn: Connection, command: str, spec: HostSpec) -> Any:
    return conn.run(rc.with_env(spec.remote_env, command), hide=True, warn=True, in_stream=False)


def check_code(target: Target, conn: Connection) -> dict[str, Any]:
    """Fail unless the remote ups and torch versions match this checkout and pins.toml."""
    spec = target.spec
    result = conn.run(
        rc.code_info_command(spec.ups_bin, spec.remote_env), hide=True, warn=True, in_stream=False
    )
    if result.exited != 0:
        raise DeployError(
            f"cannot run ups on {spec.name!r} ({spec.ups_bin}): {result.stderr.strip()}. Set "
            "'ups_bin' or 'remote_env' in hosts.yaml, or check that the instance runs the ups "
            "image."
        )
    info: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    want_torch = _pinned_torch()
    problems = []
    if info.get("ups") != ups.__version__:
        problems.append(f"ups {info.get('ups')} remotely, {ups.__version__} here")
    if want_torch and str(info.get("torch", "")).split("+")[0] != want_torch:
        problems.append(f"torch {info.get('torch')} remotely, pinned {want_torch}")
    if problems:
        raise DeployError(
            f"code on {spec.name!r} does not match: {'; '.join(problems)}. Recreate the instance "
            f"from the current image ({spec.image}), or for a code-only change build a wheel "
            "(`pip wheel --no-deps -w dist .`) and deploy with `--sync-wheel dist/ups-*.whl`."
        )
    target.say(f"remote code: ups {info['ups']}, torch {info['torch']} (cuda {info['cuda']})")
    return info


def _pinned_torch() -> str | None:
    pins = Path("pins.toml")
    if not pins.is_file():
        return None
    with pins.open("rb") as fh:
        version = tomllib.load(fh).get("versions", {}).get("torch")
    return str(version) if version else None


def sync_wheel(target: Target, conn: Connection, wheel: Path, state_dir: str) -> None:
    """Install a newer ups wheel into the remote ups environment (code-only change)."""
    remote_whl = posixpath.join(state_dir, wheel.name)
    progress = Progress(f"upload {wheel.name}", wheel.stat().st_size, target.out)
    conn.sftp().put(
        str(wheel), remote_whl, callback=lambda done, _: progress.update(done - progress.done)
    )
    progress.close()
    spec = target.spec
    cmd = (
        f'UPS=$(command -v {rc.q(spec.ups_bin)}); PY=$(head -n 1 "$UPS" | sed "s/^#!//"); '
        f"$PY -m pip install --quiet --no-deps --force-reinstall {rc.q(remote_whl)}"
    )
    result = _run(conn, cmd, spec)
    if result.exited != 0:
        raise DeployError(f"installing {wheel.name} on {spec.name!r} failed:\n{result.stderr}")


def write_private(conn: Connection, path: str, text: str) -> None:
    """Write ``text`` to a remote file that only its owner can read (mode 0600 before data)."""
    sftp = conn.sftp()
    with sftp.open(path, "w") as fh:
        fh.chmod(0o600)
        fh.write(text.encode())


def upload(target: Target, conn: Connection, plan: DeployPlan, env: dict[str, str]) -> None:
    r = plan.remote
    result = _run(conn, f"mkdir -p {rc.q(r.state_dir)}", target.spec)
    if result.exited != 0:
        raise DeployError(f"cannot create {r.state_dir} on {plan.host!r}: {result.stderr}")
    sftp = conn.sftp()
    sftp.put(plan.config, r.state("config.yaml"))
    with sftp.open(r.state("run.sh"), "w") as fh:
        fh.write(script_for(plan, target.spec.remote_env).encode())
    with sftp.open(r.state("output_dir"), "w") as fh:
        fh.write(r.output_dir.encode())
    if plan.secrets:
        body = "".join(f"{name}={rc.q(env[name])}\n" for name in plan.secrets)
        write_private(conn, r.state("secrets.env"), body)


def remote_preflight(target: Target, conn: Connection, command: str) -> None:
    """Run preflight on the host and show its report; raise with the report on failure."""
    spec = target.spec
    result = _run(conn, f"cd {rc.q(spec.workdir)} && {command}", spec)
    show_report(target, result.stdout + result.stderr)
    if result.exited != 0:
        raise PreflightFailed(
            f"preflight failed on {spec.name!r} (exit {result.exited}); nothing was started. "
            "Fix the failing checks above (each names its fix) and deploy again."
        )


def show_report(target: Target, text: str) -> None:
    """Show the remote preflight output; JSON log lines are rendered for people."""
    colors = target.out.isatty()
    lines = [render_line(line, colors=colors) for line in text.rstrip().splitlines()]
    target.say(f"remote preflight on {target.spec.name}:\n" + "\n".join(lines))


def deploy(
    target: Target,
    plan: DeployPlan,
    *,
    env: dict[str, str],
    skip_preflight: bool,
    sync: Path | None = None,
    mirror: Path | None = None,
) -> int:
    conn = target.connect()
    try:
        exists = _run(conn, f"test -e {rc.q(plan.remote.state_dir)}", target.spec)
        if exists.exited == 0:
            raise DeployError(
                f"run {plan.run_id} already exists on {plan.host!r}; pick another --run. "
                f"To resume it, `fab logs --host {plan.host} --run {plan.run_id}`."
            )
        if sync is not None:
            wheels = posixpath.join(target.spec.workdir, ".ups", "wheels")
            _run(conn, f"mkdir -p {rc.q(wheels)}", target.spec)
            sync_wheel(target, conn, sync, wheels)
        check_code(target, conn)
        upload(target, conn, plan, env)
        if not skip_preflight:
            pre = next(s for s in plan.steps if s.name == "preflight")
            assert pre.command is not None
            try:
                remote_preflight(target, conn, pre.command)
            except PreflightFailed:
                # Nothing started: leave no state behind, so the same --run can be retried.
                _run(conn, f"rm -rf {rc.q(plan.remote.state_dir)}", target.spec)
                raise
        started = _run(conn, rc.start_command(plan.remote), target.spec)
        if started.exited != 0:
            raise DeployError(f"starting the run on {plan.host!r} failed: {started.stderr}")
        target.say(f"started run {plan.run_id} on {plan.host} (detached; survives SSH drops)")
    finally:
        conn.close()
    if not plan.follow:
        target.say(f"follow it with: fab logs --host {plan.host} --run {plan.run_id}")
        return 0
    return follow(target, plan.remote, mirror)


def resolve_run(target: Target, conn: Connection, run_id: str | None) -> rc.RemoteRun:
    """The named run, or the one ``fab deploy`` started last on this host."""
    spec = target.spec
    if run_id is None:
        result = _run(conn, rc.resolve_latest_command(spec.workdir), spec)
        run_id = result.stdout.strip()
        if result.exited != 0 or not run_id:
            raise DeployError(
                f"no run deployed on {spec.name!r} yet ({rc.latest_link(spec.workdir)} missing); "
                "pass --run ID."
            )
    probe = rc.RemoteRun(workdir=spec.workdir, run_id=run_id)
    output_dir = _run(conn, rc.read_file_command(probe.state("output_dir")), spec).stdout.strip()
    deployed = _run(conn, f"test -e {rc.q(probe.state('pid'))}", spec).exited == 0
    run = rc.RemoteRun(
        workdir=spec.workdir, run_id=run_id, output_dir=output_dir or "runs", deployed=deployed
    )
    if not deployed and _run(conn, f"test -e {rc.q(run.run_dir)}", spec).exited:
        raise DeployError(f"run {run_id!r} not found on {spec.name!r} (looked in {run.run_dir})")
    return run


def read_result(conn: Connection, run: rc.RemoteRun, spec: HostSpec) -> tuple[int, Outcome | None]:
    """The run's exit code: outcome.json's, else the launcher's, else 1."""
    text = _run(conn, rc.read_file_command(run.outcome), spec).stdout
    outcome = Outcome(**json.loads(text)) if text.strip() else None
    if outcome is not None:
        return outcome.exit_code, outcome
    code = _run(conn, rc.read_file_command(run.exit_file), spec).stdout.strip()
    return (int(code) if code.lstrip("-").isdigit() else 1), None


def follow(target: Target, run: rc.RemoteRun, mirror: Path | None = None) -> int:
    """Stream the run's launch.log until it ends; return the run's exit code."""
    view = ConsoleView(target.out)  # live progress and tables on a terminal, lines otherwise
    sink = mirror.open("wb") if mirror is not None else None
    conns: list[Connection] = []

    def open_transport() -> Any:
        conn = target.connect()
        conns.append(conn)
        return conn.transport

    def on_line(line: bytes) -> None:
        if sink is not None:
            sink.write(line)
            sink.flush()
        view.feed(line.decode("utf-8", "replace").rstrip("\n"))

    follower = LogFollower(
        open_transport,
        run.launch_log,
        run.done_files,
        on_line,
        heartbeat_s=float(target.spec.keepalive_s),
    )
    try:
        stats = follower.follow()
        conn = conns[-1]
        code, outcome = read_result(conn, run, target.spec)
    finally:
        view.close()
        follower.close()
        for c in conns:
            c.close()
        if sink is not None:
            sink.close()
    summary = f"run {run.run_id}: {stats.lines} log lines, {stats.reconnects} reconnects; "
    if outcome is not None:
        summary += f"{outcome.outcome} (exit {code}): {outcome.reason}"
    else:
        summary += f"launcher exited {code} without writing outcome.json (see {run.state_dir})"
    target.say(summary)
    return code


def logs(target: Target, run_id: str | None, mirror: Path | None = None) -> int:
    conn = target.connect()
    try:
        run = resolve_run(target, conn, run_id)
    finally:
        conn.close()
    return follow(target, run, mirror)


def status(target: Target, run_id: str | None) -> int:
    conn = target.connect()
    try:
        run = resolve_run(target, conn, run_id)
        fields = dict(
            line.split("=", 1)
            for line in _run(conn, rc.status_command(run), target.spec).stdout.splitlines()
            if "=" in line
        )
        _code, outcome = read_result(conn, run, target.spec)
    finally:
        conn.close()
    state = "running" if fields.get("alive") == "1" else "not running"
    target.say(f"run {run.run_id} on {target.spec.name}: {state} (pid {fields.get('pid', '?')})")
    if outcome is not None:
        target.say(
            f"  outcome: {outcome.outcome} (exit {outcome.exit_code}) at step "
            f"{outcome.step}: {outcome.reason}"
        )
    if fields.get("last"):
        target.say(f"  last log line: {render_line(fields['last'])}")
    return 0


def stop(target: Target, run_id: str | None, timeout_s: float = STOP_WAIT_S) -> int:
    """SIGTERM the launcher and wait for the preemption checkpoint and outcome."""
    conn = target.connect()
    try:
        run = resolve_run(target, conn, run_id)
        if target.spec.kind == "docker":
            from ups.deploy.docker_kind import stop_command

            command = stop_command(target.spec, run, timeout_s)
        else:
            command = rc.stop_command(run)
        result = _run(conn, command, target.spec)
        target.say(f"stop {run.run_id}: {result.stdout.strip() or result.stderr.strip()}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = _run(
                conn, " || ".join(f"test -e {rc.q(p)}" for p in run.done_files), target.spec
            )
            if done.exited == 0:
                break
            time.sleep(1.0)  # polling the remote run; each check is one SSH round trip
        else:
            raise DeployError(
                f"run {run.run_id} did not stop within {timeout_s:.0f} s; check "
                f"`fab status --host {target.spec.name}`."
            )
        code, outcome = read_result(conn, run, target.spec)
    finally:
        conn.close()
    if outcome is not None:
        target.say(
            f"run {run.run_id}: {outcome.outcome} (exit {code}) at step {outcome.step}; "
            f"checkpoint {outcome.checkpoint}"
        )
    return 0 if outcome is not None and outcome.outcome in ("preempted", "finished") else 1


def fetch(target: Target, run_id: str | None, dest: Path) -> int:
    """Copy the run directory (checkpoints, outcome, logs) into ``dest/<run_id>``."""
    conn = target.connect()
    try:
        run = resolve_run(target, conn, run_id)
        dest.mkdir(parents=True, exist_ok=True)
        assert conn.transport is not None
        chan = conn.transport.open_session()
        chan.exec_command(rc.tar_run_command(run))
        # du's apparent size (close to the tar's) gives the transfer an ETA.
        size = _run(conn, f"du -sb {rc.q(run.run_dir)} | cut -f1", target.spec).stdout.strip()
        total = int(size) if size.isdigit() else None
        progress = Progress(f"fetch {run.run_id}", total, target.out)
        reader = _CountingReader(chan.makefile("rb"), progress)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            tar.extractall(dest, filter="data")
        progress.close()
        if chan.recv_exit_status() != 0:
            err = chan.makefile_stderr("rb").read().decode(errors="replace")
            raise DeployError(f"fetching {run.run_dir} from {target.spec.name!r} failed: {err}")
    finally:
        conn.close()
    target.say(f"fetched {run.run_dir} -> {dest / run.run_id}")
    return 0


class _CountingReader(io.RawIOBase):
    def __init__(self, inner: Any, progress: Progress) -> None:
        self.inner = inner
        self.progress = progress

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.inner.read(n)
        self.progress.update(len(data))
        return data
