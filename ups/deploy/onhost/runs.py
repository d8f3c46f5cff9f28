"""What a host knows about its deployed runs: which one, alive or not, how it ended."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass

from fabric import Connection

from ups.deploy.entries import SshHost
from ups.deploy.errors import DeployError, UsageError
from ups.deploy.frontend import command
from ups.deploy.onhost.plan import DeployPlan
from ups.deploy.transport import remote as rc
from ups.deploy.transport.session import Target, run
from ups.outcome import Outcome
from ups.runid import run_id_problem


@dataclass(frozen=True)
class RunState:
    """A run as the host sees it now."""

    run: rc.RemoteRun
    alive: bool
    """The launcher (or the docker watcher) is still running."""
    outcome: Outcome | None
    exit_code: int | None
    """The launcher's recorded exit code, once it ended."""
    pid: str = ""
    last_line: str = ""
    """The last line of launch.log (a JSON event, usually)."""
    notes: tuple[str, ...] = ()
    """What the host kind adds in words (a scheduler's job state)."""

    @property
    def finished(self) -> bool:
        return self.outcome is not None and self.outcome.outcome == "finished"


def _checked_id(spec: SshHost, run_id: str, where: str) -> str:
    # An id read back from the host is checked like one typed by the user: it goes into
    # paths and commands, and a tampered or corrupt `latest` link must not steer them.
    if problem := run_id_problem(run_id):
        raise DeployError(f"{where} on {spec.name!r} names a run id that is refused: {problem}")
    return run_id


def latest_run_id(target: Target, conn: Connection) -> str | None:
    spec = target.spec
    result = run(conn, rc.resolve_latest_command(spec.workdir), spec)
    run_id = result.stdout.strip()
    if result.exited != 0 or not run_id:
        return None
    return _checked_id(spec, run_id, rc.latest_link(spec.workdir))


def resolve_run(target: Target, conn: Connection, run_id: str | None) -> rc.RemoteRun:
    """The named run, or the one ``fab deploy`` started last on this host."""
    spec = target.spec
    if run_id is None:
        run_id = latest_run_id(target, conn)
        if run_id is None:
            raise DeployError(
                f"no run deployed on {spec.name!r} yet ({rc.latest_link(spec.workdir)} missing); "
                "pass --run ID."
            )
    elif problem := run_id_problem(run_id):
        raise UsageError(f"--run: {problem}.")
    probe = rc.RemoteRun(workdir=spec.workdir, run_id=run_id)
    output_dir = run(conn, rc.read_file_command(probe.state("output_dir")), spec).stdout.strip()
    deployed = run(conn, rc.exists_command(probe.state("run.sh")), spec).exited == 0
    found = rc.RemoteRun(
        workdir=spec.workdir, run_id=run_id, output_dir=output_dir or "runs", deployed=deployed
    )
    if not deployed and run(conn, rc.exists_command(found.run_dir), spec).exited:
        raise DeployError(f"run {run_id!r} not found on {spec.name!r} (looked in {found.run_dir})")
    return found


def read_outcome(conn: Connection, found: rc.RemoteRun, spec: SshHost) -> Outcome | None:
    text = run(conn, rc.read_file_command(found.outcome), spec).stdout
    return Outcome(**json.loads(text)) if text.strip() else None


def read_result(conn: Connection, found: rc.RemoteRun, spec: SshHost) -> tuple[int, Outcome | None]:
    """The run's exit code: outcome.json's, else the launcher's, else 1."""
    outcome = read_outcome(conn, found, spec)
    if outcome is not None:
        return outcome.exit_code, outcome
    code = run(conn, rc.read_file_command(found.exit_file), spec).stdout.strip()
    return (int(code) if code.lstrip("-").isdigit() else 1), None


def state_of(
    target: Target, conn: Connection, found: rc.RemoteRun, command: str | None = None
) -> RunState:
    """The run's state from ``command`` (default :func:`ups.deploy.transport.remote.status_command`:
    its launcher's pid), which prints ``key=value`` lines."""
    spec = target.spec
    lines = run(conn, command or rc.status_command(found), spec).stdout.splitlines()
    fields = dict(line.split("=", 1) for line in lines if "=" in line)
    code = fields.get("exit", "").strip()
    return RunState(
        run=found,
        alive=fields.get("alive") == "1",
        outcome=read_outcome(conn, found, spec),
        exit_code=int(code) if code.lstrip("-").isdigit() else None,
        pid=fields.get("pid", ""),
        last_line=fields.get("last", ""),
        notes=tuple(line.removeprefix("note=") for line in lines if line.startswith("note=")),
    )


def existing(target: Target, conn: Connection, run_id: str) -> RunState | None:
    """The state of deployed run ``run_id`` on this host, or None when there is none."""
    probe = rc.RemoteRun(workdir=target.spec.workdir, run_id=run_id)
    if run(conn, rc.exists_command(probe.state_dir), target.spec).exited != 0:
        return None
    return state_of(target, conn, resolve_run(target, conn, run_id))


def resumable(target: Target, conn: Connection, name: str) -> RunState | None:
    """The host's latest deployed run when it has this name and did not finish.

    Mirrors ``ups launch``: running the same command again continues a stopped or
    crashed run; ``--fresh`` (or a new name) starts a new one.
    """
    run_id = latest_run_id(target, conn)
    if run_id is None or not run_id.startswith(f"{name}-"):
        return None
    state = existing(target, conn, run_id)
    if state is None or state.finished or state.alive:
        return None
    return state


def log_size(target: Target, conn: Connection, found: rc.RemoteRun) -> int:
    """Bytes already in the run's launch.log (a resumed run's log continues after them)."""
    out = run(conn, rc.file_size_command(found.launch_log), target.spec).stdout.strip()
    return int(out) if out.isdigit() else 0


def choose_run(target: Target, plan: DeployPlan, replan: Callable[[str], DeployPlan]) -> DeployPlan:
    """The plan for the run this deploy will use, decided on the host before the plan is
    shown: the host's latest unfinished run of the config's name (as ``ups launch``
    continues one), else the new run the plan names. ``--dry-run`` contacts nothing and
    keeps both in its plan."""
    if not plan.resume_name:
        return plan
    conn = target.connect()
    try:
        state = resumable(target, conn, plan.resume_name)
    finally:
        conn.close()
    if state is None:
        return dataclasses.replace(plan, resume_name=None)
    return replan(state.run.run_id)


def settle(
    target: Target, conn: Connection, plan: DeployPlan, replan: Callable[[str], DeployPlan]
) -> tuple[DeployPlan, int]:
    """Decide between a new run and continuing one; return the plan and the log offset.

    Without ``--run`` the host's latest unfinished run of the config's name continues
    (as ``ups launch`` does); a given id continues when it exists and is not running.
    The offset is where the continued run's launch.log resumes, so only new lines show.
    """
    spec = target.spec
    if plan.resume_name:
        state = resumable(target, conn, plan.resume_name)
        if state is None:
            return plan, 0
        plan = replan(state.run.run_id)
    else:
        state = existing(target, conn, plan.run_id)
        if state is None:
            return plan, 0
        if state.alive:
            raise DeployError(
                f"run {plan.run_id} is still running on {spec.name!r}. Follow it with "
                f"{command('logs', '--host', spec.name, '--run', plan.run_id)}, or stop it "
                f"first with {command('stop', '--host', spec.name, '--run', plan.run_id)}."
            )
        if state.finished:
            raise UsageError(
                f"run {plan.run_id} already finished on {spec.name!r}. Start a new run with "
                f"--fresh (or another --run ID); {command('fetch')} copies the finished one."
            )
    last = state.outcome
    ended = (
        f"{last.outcome}{last.at_step}" if last else f"crashed (launcher exit {state.exit_code})"
    )
    target.say(
        f"continuing run {plan.run_id} on {spec.name} (it {ended}); "
        "add --fresh to start a new run instead"
    )
    return plan, log_size(target, conn, plan.remote)
