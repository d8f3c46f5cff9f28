"""Carry out deploy plans on ``container`` hosts, and the follow-up tasks for every kind.

Each operation takes a resolved host, writes what people should see to ``out`` and
returns the process exit code; problems the user must fix raise :class:`DeployError`.
Remote commands come from :mod:`ups.deploy.transport.remote` (directly or through the plan).
"""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabric import Connection

import ups
from ups import jsonio
from ups.bucket.credentials import FILE_NAME as CREDENTIALS_FILE
from ups.bucket.credentials import Keys, NoCredentials
from ups.bucket.scoped import Access, MintRefused, keys_for
from ups.deploy.errors import DeployError, PreflightFailed, UsageError
from ups.deploy.frontend import command
from ups.deploy.onhost import workdir
from ups.deploy.onhost.follow import follow
from ups.deploy.onhost.plan import DeployPlan, script_for
from ups.deploy.onhost.runs import read_result, resolve_run, settle, state_of
from ups.deploy.transport import remote as rc
from ups.deploy.transport.progress import Progress
from ups.deploy.transport.session import (
    Target,
    remote_preflight,
    replace_private,
    run,
    write_private,
    write_text,
)
from ups.grace import STOP_WAIT_S
from ups.log import render_line
from ups.pins import pinned_versions
from ups.workload import ScriptWorkload


def check_code(target: Target, conn: Connection, plan: DeployPlan) -> dict[str, Any]:
    """Fail unless the remote ups and torch versions match this checkout and pins.toml."""
    spec = target.spec
    result = run(conn, plan.step("check-code").command or "", spec)
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
    version = pinned_versions().get("torch")
    return str(version) if version else None


def sync_wheel(target: Target, conn: Connection, wheel: Path) -> None:
    """Install a newer ups wheel into the remote ups environment (code-only change)."""
    spec = target.spec
    wheels = posixpath.join(spec.workdir, ".ups", "wheels")
    run(conn, rc.mkdir_command(wheels), spec)
    remote_whl = posixpath.join(wheels, wheel.name)
    progress = Progress(f"upload {wheel.name}", wheel.stat().st_size, target.out)
    conn.sftp().put(
        str(wheel), remote_whl, callback=lambda done, _: progress.update(done - progress.done)
    )
    progress.close()
    result = run(conn, rc.pip_install_command(spec.ups_bin, remote_whl), spec)
    if result.exited != 0:
        raise DeployError(f"installing {wheel.name} on {spec.name!r} failed:\n{result.stderr}")


def upload(target: Target, conn: Connection, plan: DeployPlan, env: dict[str, str]) -> None:
    r = plan.remote
    result = run(conn, plan.step("upload").command or "", target.spec)
    if result.exited != 0:
        raise DeployError(f"cannot create {r.state_dir} on {plan.host!r}: {result.stderr}")
    if plan.run_file is None:
        conn.sftp().put(plan.config, r.state("config.yaml"))
    else:
        write_text(conn, r.state(rc.RUN_FILE), jsonio.dumps(plan.run_file, indent=2))
    write_text(conn, r.state("run.sh"), script_for(plan, target.spec.remote_env))
    write_text(conn, r.state("output_dir"), r.output_dir)
    write_private_files(conn, plan, env)


def write_private_files(conn: Connection, plan: DeployPlan, env: dict[str, str]) -> None:
    """The run's secrets (``secrets.env``) and bucket credentials, each a 0600 file in its
    state directory, never on a command line: the one place any kind writes them."""
    r = plan.remote
    if plan.secrets:
        body = "".join(f"{name}={rc.q(env[name])}\n" for name in plan.secrets)
        write_private(conn, r.state("secrets.env"), body)
    if plan.bucket_access is not None:
        keys = bucket_keys(plan.bucket_access)
        replace_private(conn, r.state(CREDENTIALS_FILE), keys.file_text())


def bucket_keys(access: Access) -> Keys:
    """The S3 credentials the host gets (this machine's, or minted from them); none here,
    or a store that will not mint them, is a usage error (exit 2)."""
    try:
        return keys_for(access)
    except (NoCredentials, MintRefused) as err:
        raise UsageError(str(err)) from None


def prepare(
    target: Target,
    conn: Connection,
    plan: DeployPlan,
    *,
    env: dict[str, str],
    replan: Callable[[str], DeployPlan],
    sync: Path | None = None,
    workload: ScriptWorkload | None = None,
    on_preflight: Callable[[str], object] | None = None,
) -> tuple[DeployPlan, int]:
    """Everything before starting: pick the run, check code, upload, preflight.

    Returns the plan to start and the launch.log offset a continued run resumes at.
    ``on_preflight`` gets the report of a preflight that passed (a failed one's is in the
    :class:`PreflightFailed` raised).
    """
    plan, offset = settle(target, conn, plan, replan)
    if sync is not None:
        sync_wheel(target, conn, sync)
    check_code(target, conn, plan)
    if workload is not None:
        prepare_code(target, conn, plan, workload)
    upload(target, conn, plan, env)
    if plan.has_step("preflight"):
        try:
            report = remote_preflight(target, conn, plan.step("preflight").command or "")
        except PreflightFailed:
            if offset == 0:
                discard(target, conn, plan)
            raise
        if on_preflight is not None:
            on_preflight(report)
    return plan, offset


def prepare_code(
    target: Target, conn: Connection, plan: DeployPlan, workload: ScriptWorkload
) -> None:
    """A script plan's ``sync``, ``setup`` and ``check-data`` steps, as the plan shows them:
    the code is on the host, set up, its data there (every kind that runs scripts)."""
    assert plan.run_file is not None, "a script plan carries the host's run file"
    workdir.sync(target, conn, workload, plan.run_file["workdir"])
    setup = [s for s in plan.steps if s.name == "setup"]
    workdir.run_setup(target, conn, [(s.detail, s.command or "") for s in setup])
    if plan.has_step("check-data"):
        workdir.check_data(target, conn, plan.step("check-data").command or "")


def discard(target: Target, conn: Connection, plan: DeployPlan) -> None:
    """Remove a new run's state that never started, so the same --run can be retried."""
    run(conn, rc.remove_tree_command(plan.remote.state_dir), target.spec)


def launch(target: Target, conn: Connection, plan: DeployPlan) -> None:
    """Start the run detached (the plan's ``start`` command, exactly as shown)."""
    started = run(conn, plan.step("start").command or "", target.spec)
    if started.exited != 0:
        raise DeployError(f"starting the run on {plan.host!r} failed: {started.stderr}")
    target.say(f"started run {plan.run_id} on {plan.host} (detached; survives SSH drops)")


def deploy(
    target: Target,
    plan: DeployPlan,
    *,
    env: dict[str, str],
    replan: Callable[[str], DeployPlan],
    sync: Path | None = None,
    mirror: Path | None = None,
    workload: ScriptWorkload | None = None,
) -> int:
    conn = target.connect()
    try:
        plan, offset = prepare(
            target, conn, plan, env=env, replan=replan, sync=sync, workload=workload
        )
        launch(target, conn, plan)
    finally:
        conn.close()
    if not plan.follow:
        target.say(f"follow it with: {command('logs', '--host', plan.host, '--run', plan.run_id)}")
        return 0
    return follow(target, plan.remote, mirror, offset=offset)


def logs(target: Target, run_id: str | None, mirror: Path | None = None) -> int:
    """Replay and follow a run's log to its end; it never starts or resumes anything."""
    conn = target.connect()
    try:
        found = resolve_run(target, conn, run_id)
    finally:
        conn.close()
    return follow(target, found, mirror)


def status(
    target: Target,
    run_id: str | None,
    status_command: Callable[[rc.RemoteRun], str] = rc.status_command,
) -> int:
    """Say whether the run is alive, how it ended, and its last event, rendered for people
    (``status_command``: its kind's way to ask, printing ``key=value`` lines)."""
    conn = target.connect()
    try:
        found = resolve_run(target, conn, run_id)
        state = state_of(target, conn, found, status_command(found))
    finally:
        conn.close()
    alive = "running" if state.alive else "not running"
    name = target.spec.name
    pid = f" (pid {state.pid})" if state.pid else ""
    target.say(f"run {state.run.run_id} on {name}: {alive}{pid}")
    for note in state.notes:
        target.say(f"  {note}")
    if state.outcome is not None:
        o = state.outcome
        target.say(f"  outcome: {o.outcome} (exit {o.exit_code}){o.at_step}: {o.reason}")
    if state.last_line:
        target.say(f"  last event: {render_line(state.last_line, colors=target.out.isatty())}")
    return 0


def stop(
    target: Target,
    run_id: str | None,
    stop_command: Callable[[rc.RemoteRun], str] = rc.stop_command,
    timeout_s: float = STOP_WAIT_S,
) -> int:
    """SIGTERM the run (``stop_command``: its kind's way) and wait for the preemption
    checkpoint and outcome."""
    spec = target.spec
    conn = target.connect()
    try:
        found = resolve_run(target, conn, run_id)
        result = run(conn, stop_command(found), spec)
        target.say(f"stop {found.run_id}: {result.stdout.strip() or result.stderr.strip()}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if run(conn, rc.exists_command(*found.done_files), spec).exited == 0:
                break
            time.sleep(1.0)  # polling the remote run; each check is one SSH round trip
        else:
            raise DeployError(
                f"run {found.run_id} did not stop within {timeout_s:.0f} s; check "
                f"{command('status', '--host', spec.name)}."
            )
        code, outcome = read_result(conn, found, spec)
    finally:
        conn.close()
    if outcome is not None:
        saved = f"checkpoint {outcome.checkpoint}" if outcome.checkpoint else "no checkpoint"
        target.say(f"run {found.run_id}: {outcome.outcome} (exit {code}){outcome.at_step}; {saved}")
        target.say(f"  {outcome.reason}")
    return 0 if outcome is not None and outcome.outcome in ("preempted", "finished") else 1
