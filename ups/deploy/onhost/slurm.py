"""Carry out a Slurm deploy from the login node: upload, ``sbatch``, wait to start, follow.

The batch script (:mod:`ups.deploy.transport.slurm`) does the work inside the
allocation; from here deploy only talks to Slurm and reads the shared run directory:
the job's state while it waits in the queue, then node 0's launch.log by byte offset
(a requeued job appends to it), then the outcome, the requeues and, when preflight
failed on a node, that node's report. See docs/slurm.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from fabric import Connection

from ups import jsonio
from ups.deploy.entries import SlurmHost
from ups.deploy.errors import DeployError, PreflightFailed
from ups.deploy.frontend import command
from ups.deploy.onhost import operate
from ups.deploy.onhost.follow import follow
from ups.deploy.onhost.plan import DeployPlan
from ups.deploy.onhost.runs import settle
from ups.deploy.transport import remote as rc
from ups.deploy.transport import slurm as sl
from ups.deploy.transport.session import Target, run, write_text
from ups.workload import ScriptWorkload

EXIT_NOT_SCHEDULED = 6
"""The job stayed pending for ``max_pending_s`` and was cancelled (as a provider's "no
offer": the resources asked for were not to be had)."""


@dataclass(frozen=True)
class JobState:
    """What Slurm says about a job now; ``state`` is empty once Slurm has forgotten it."""

    job_id: str
    state: str
    reason: str = ""
    nodes: str = ""
    restarts: int = 0
    position: str = ""
    """Its place among the cluster's pending jobs, highest priority first."""

    @property
    def pending(self) -> bool:
        return self.state in sl.PENDING_STATES

    @property
    def queued(self) -> bool:
        """Pending or running: the job is not over."""
        return self.pending or self.state in sl.ACTIVE_STATES

    def words(self) -> str:
        if self.pending:
            where = f"position {self.position or '?'} in the queue"
            # Slurm says "None" for a job it has not looked at yet (just submitted).
            why = f" ({self.reason})" if self.reason not in ("", "None", "(null)") else ""
            return f"job {self.job_id} pending{why}, {where}"
        if self.state == "RUNNING":
            return f"job {self.job_id} running on {self.nodes}"
        return f"job {self.job_id} {self.state.lower() or 'no longer known to Slurm'}"


@dataclass(frozen=True)
class Accounting:
    """What ``sacct`` recorded of a job (where the cluster keeps accounting)."""

    state: str
    elapsed: str
    exit_code: str
    """``code:signal``, as Slurm writes it."""
    nodes: str

    def words(self) -> str:
        return (
            f"{self.state.lower()}, elapsed {self.elapsed}, exit code {self.exit_code}, "
            f"on {self.nodes}"
        )


def parse_sacct(text: str, job_id: str) -> Accounting | None:
    """The job's last allocation line of :func:`ups.deploy.transport.slurm.sacct_command`'s
    output; None when there is none (accounting off, or the job unknown to it)."""
    found = None
    for line in text.splitlines():
        words = line.strip().split("|")
        if len(words) == len(sl.SACCT_FIELDS) and words[0] == job_id:
            found = Accounting(*words[1:])
    return found


def job_state(conn: Connection, spec: SlurmHost, job_id: str) -> JobState:
    lines = run(conn, sl.job_state_command(job_id), spec).stdout.splitlines()
    fields = dict(line.split("=", 1) for line in lines if "=" in line)
    restarts = fields.get("Restarts", "0")
    return JobState(
        job_id=job_id,
        state=fields.get("JobState", ""),
        reason=fields.get("Reason", ""),
        nodes=fields.get("NodeList", ""),
        restarts=int(restarts) if restarts.isdigit() else 0,
        position=fields.get("Position", ""),
    )


def job_of(conn: Connection, spec: SlurmHost, found: rc.RemoteRun) -> str | None:
    """The Slurm job id a run was last submitted as (None: never submitted)."""
    job_id = run(conn, sl.read_job_id_command(found), spec).stdout.strip()
    return job_id if job_id.isdigit() else None


def deploy(
    target: Target,
    spec: SlurmHost,
    plan: DeployPlan,
    *,
    job_for: Callable[[DeployPlan], sl.JobSpec],
    replan: Callable[[str], DeployPlan],
    env: dict[str, str],
    workload: ScriptWorkload | None = None,
) -> int:
    """Submit the run's batch job, wait for it to start, follow it to its end. A script's
    workdir is synced and set up from the login node first, onto the shared filesystem
    every node reads it from."""
    conn = target.connect()
    try:
        _refuse_queued(conn, spec, plan)
        plan, offset = settle(target, conn, plan, replan)
        job = job_for(plan)
        operate.check_code(target, conn, plan)
        if workload is not None:
            operate.prepare_code(target, conn, plan, workload)
        _upload(target, conn, plan, job, env)
        submitted = run(conn, plan.step("submit").command or "", spec)
        job_id = submitted.stdout.strip().split(";")[0]
        if submitted.exited != 0 or not job_id.isdigit():
            raise DeployError(
                f"sbatch on {spec.name!r} refused the job: {submitted.stderr.strip()}. Fix the "
                "slurm options of this entry in hosts.yaml (the batch script is shown above)."
            )
        run(conn, rc.write_word_command(plan.remote.state(sl.JOB_ID_FILE), job_id), spec)
        run(conn, f"ln -sfn {rc.q(plan.run_id)} {rc.q(rc.latest_link(spec.workdir))}", spec)
        target.say(f"submitted run {plan.run_id} as slurm job {job_id} on {spec.name}")
        wait_to_start(target, conn, spec, job_id)
    finally:
        conn.close()
    if not plan.follow:
        target.say(f"follow it with: {command('logs', '--host', spec.name, '--run', plan.run_id)}")
        return 0
    code = follow(target, plan.remote, offset=offset)
    return report_end(target, spec, plan.remote, code)


def _refuse_queued(conn: Connection, spec: SlurmHost, plan: DeployPlan) -> None:
    job_id = job_of(conn, spec, plan.remote)
    if job_id is None:
        return
    state = job_state(conn, spec, job_id)
    if state.queued:
        raise DeployError(
            f"run {plan.run_id} is still in the queue on {spec.name!r} ({state.words()}). "
            f"Follow it with {command('logs', '--host', spec.name, '--run', plan.run_id)}, or "
            f"stop it first with {command('stop', '--host', spec.name, '--run', plan.run_id)}."
        )


def _upload(
    target: Target, conn: Connection, plan: DeployPlan, job: sl.JobSpec, env: dict[str, str]
) -> None:
    r = plan.remote
    result = run(conn, plan.step("upload").command or "", target.spec)
    if result.exited != 0:
        raise DeployError(f"cannot create {r.state_dir} on {plan.host!r}: {result.stderr}")
    if plan.run_file is None:
        conn.sftp().put(plan.config, r.state("config.yaml"))
    else:
        write_text(conn, r.state(rc.RUN_FILE), jsonio.dumps(plan.run_file, indent=2))
    write_text(conn, r.state("output_dir"), r.output_dir)
    write_text(conn, r.state(sl.NODE_SCRIPT), sl.node_script(job))
    write_text(conn, r.state(sl.BATCH_SCRIPT), sl.batch_script(job))
    operate.write_private_files(conn, plan, env)


def wait_to_start(target: Target, conn: Connection, spec: SlurmHost, job_id: str) -> JobState:
    """Poll Slurm until the job runs or ends; say each new pending reason. A job still
    pending after ``max_pending_s`` is cancelled (exit :data:`EXIT_NOT_SCHEDULED`)."""
    deadline = time.monotonic() + spec.max_pending_s
    said = ""
    while True:
        state = job_state(conn, spec, job_id)
        if not state.pending:
            target.say(f"slurm {state.words()}")
            return state
        if state.words() != said:
            said = state.words()
            target.say(f"slurm {said}")
        if time.monotonic() >= deadline:
            run(conn, sl.cancel_command(job_id), spec)
            failed = DeployError(
                f"slurm job {job_id} was still pending after {spec.max_pending_s:.0f} s "
                f"({state.reason}), so it was cancelled. Ask for what the partition can give "
                f"(nodes, gpus_per_node, time in hosts.yaml; `sinfo` shows it) or raise "
                "max_pending_s to wait longer."
            )
            failed.exit_code = EXIT_NOT_SCHEDULED
            raise failed
        time.sleep(spec.poll_s)  # asking slurmctld; each ask is one SSH round trip


def report_end(target: Target, spec: SlurmHost, found: rc.RemoteRun, code: int) -> int:
    """After the log ended: how often the job was requeued, and every node whose preflight
    failed, with its report (exit 4)."""
    conn = target.connect()
    try:
        attempts = run(conn, rc.read_file_command(found.state(sl.ATTEMPTS_FILE)), spec).stdout
        reports = run(conn, sl.preflight_reports_command(found), spec).stdout
        starts = [line.split() for line in attempts.splitlines() if len(line.split()) > 1]
        job_id = starts[-1][1] if starts else ""
        # The run's earlier jobs (a stopped run deployed again) are not this job's starts.
        starts = [words for words in starts if words[1] == job_id]
        sacct = run(conn, sl.sacct_command(job_id), spec).stdout if job_id.isdigit() else ""
    finally:
        conn.close()
    if len(starts) > 1:
        restarts = max(int(words[0]) for words in starts if words[0].isdigit())
        target.say(f"slurm job {job_id}: requeued {restarts} time(s), started {len(starts)}")
    if (accounting := parse_sacct(sacct, job_id)) is not None:
        target.say(f"slurm job {job_id} (sacct): {accounting.words()}")
    failed = _failed_nodes(reports)
    if not failed:
        return code
    for node, report in failed.items():
        target.say(f"preflight on {node} failed:\n{report}")
    raise PreflightFailed(
        f"preflight failed on {', '.join(failed)} (report above); no training started. Fix "
        "that node, or leave it out with `sbatch_options: [--exclude=NODE]` in hosts.yaml, "
        "and deploy again.",
        reports,
    )


def _failed_nodes(reports: str) -> dict[str, str]:
    """``FAILED node`` / ``PASSED node`` headers, each followed by its report."""
    failed: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in reports.splitlines():
        head, _, node = line.partition(" ")
        if head in ("FAILED", "PASSED") and node and " " not in node:
            current = failed.setdefault(node, []) if head == "FAILED" else None
        elif current is not None:
            current.append(line)
    return {node: "\n".join(lines) for node, lines in failed.items()}
