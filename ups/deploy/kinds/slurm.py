"""``kind: slurm``: one batch job on a Slurm cluster, submitted from its login node over SSH.

The plan is the container plan of the login node (run id, config, secrets, the version
check) with the container's start replaced by a batch script: ``--dry-run`` prints that
script and ``fab deploy`` submits exactly it (docs/slurm.md). The trainer runs with a
config, a user's script (``--script``/``--run-file``) with the container kind's script
plan: its workdir synced to the shared filesystem and set up from the login node, then
``ups launch --run-file`` on every node.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from ups.deploy.frontend import command
from ups.deploy.hosts import AddressedHost, HostSpec, SlurmHost, get_host
from ups.deploy.onhost import slurm as on_slurm
from ups.deploy.onhost.plan import (
    DeployPlan,
    Step,
    build_plan,
    build_script_plan,
    load_run_config,
)
from ups.deploy.onhost.runs import choose_run, resolve_run
from ups.deploy.request import DeployRequest
from ups.deploy.transport import remote as rc
from ups.deploy.transport import slurm as sl
from ups.deploy.transport.session import Target, run
from ups.workload import ScriptWorkload


def own(spec: HostSpec) -> SlurmHost:
    """``spec`` as the slurm entry the registry chose this kind for."""
    assert isinstance(spec, SlurmHost), spec
    return spec


@dataclass
class SlurmDeploy:
    """The plan of one Slurm deploy; :meth:`run` submits the batch script it shows."""

    target: Target
    spec: SlurmHost
    plan: DeployPlan
    replan: Callable[[str | None], DeployPlan]
    skip_preflight: bool
    env: dict[str, str]
    workload: ScriptWorkload | None = None

    def choose_run(self) -> None:
        self.plan = choose_run(self.target, self.plan, self.replan)

    def job(self, plan: DeployPlan) -> sl.JobSpec:
        return job_spec(self.spec, plan, self.skip_preflight)

    def render(self) -> str:
        job = self.job(self.plan)
        scripts = [
            f"  batch script ({self.plan.remote.state(sl.BATCH_SCRIPT)}):",
            _indent(sl.batch_script(job)),
            f"  node script ({self.plan.remote.state(sl.NODE_SCRIPT)}), run by srun on each node:",
            _indent(sl.node_script(job)),
        ]
        # The container plan's launch line is not what runs: each node's is in node.sh.
        plan = dataclasses.replace(self.plan, launch_argv=[])
        return self.target.labelled("\n".join([plan.render(), *scripts]))

    def run(self) -> int:
        return on_slurm.deploy(
            self.target,
            self.spec,
            self.plan,
            job_for=self.job,
            replan=self.replan,
            env=self.env,
            workload=self.workload,
        )


def _indent(text: str) -> str:
    return "\n".join(f"    | {line}" for line in text.rstrip("\n").split("\n"))


def job_spec(spec: SlurmHost, plan: DeployPlan, skip_preflight: bool) -> sl.JobSpec:
    """The batch job of ``plan``: the ``ups launch`` arguments of its container plan, one
    node agent per node, and Slurm's options from the hosts.yaml entry. A script's nodes
    share one checkpoint directory (node 0's run directory's, unless the run file names
    one), so every node resumes from the same checkpoint."""
    script = plan.run_file is not None
    remote_config = None if script else plan.remote.state("config.yaml")
    launch = _without_output_dir(plan.launch_argv[1:])  # ups_bin and --output-dir: node.sh's
    sets = [w for i, w in enumerate(launch) if i and launch[i - 1] == "--set"]
    sets = [w for s in sets for w in ("--set", s)]
    ranks = spec.ranks_per_node or spec.gpus_per_node or None
    per_node = ["--nproc-per-node", str(ranks)] if ranks else []
    shared = []
    if plan.run_file is not None and plan.run_file.get("checkpoint_dir") is None:
        r = plan.remote
        shared = ["--checkpoint-dir", f"{r.output_dir}/{r.run_id}/checkpoints"]
    preflight = rc.preflight_argv(spec.ups_bin, remote_config, spec.gpus_per_node)[1:]
    return sl.JobSpec(
        run=plan.remote,
        sbatch=sl.sbatch_options(
            job_name=f"ups-{plan.run_id}",
            nodes=spec.nodes,
            cpus_per_task=spec.cpus_per_task,
            gpus_per_node=spec.gpus_per_node,
            partition=spec.partition,
            time=spec.time,
            account=spec.account,
            qos=spec.qos,
            signal_before_end_s=spec.signal_before_end_s,
            requeue=spec.requeue,
            output=plan.remote.state("slurm-%j.out"),
            extra=spec.sbatch_options,
        ),
        ups_bin=spec.ups_bin,
        launch_args=[*launch, *per_node, *shared],
        preflight_args=[*preflight, *sets, *per_node],
        remote_env=spec.remote_env,
        requeue=spec.requeue,
        skip_preflight=skip_preflight,
    )


def _without_output_dir(argv: list[str]) -> list[str]:
    """``argv`` less its ``--output-dir DIR``: each node's comes in the node script."""
    at = argv.index("--output-dir") if "--output-dir" in argv else len(argv)
    return argv[:at] + argv[at + 2 :]


_BEFORE_UPLOAD = ("connect", "check-code", "sync", "setup", "check-data")


def _slurm_steps(spec: SlurmHost, plan: DeployPlan) -> list[Step]:
    """The container plan's steps up to the upload (a script's sync and setup too, from
    the login node onto the shared filesystem), then submit, wait and follow."""
    r = plan.remote
    steps = [s for s in plan.steps if s.name in _BEFORE_UPLOAD]
    sent = "run file" if plan.run_file is not None else "config"
    steps.append(
        Step(
            "upload",
            f"{sent}, {sl.BATCH_SCRIPT} and {sl.NODE_SCRIPT} (below), secrets (0600)",
            rc.mkdir_command(r.state_dir),
        )
    )
    steps.append(Step("submit", "queue the batch script", sl.submit_command(r)))
    steps.append(
        Step(
            "wait",
            f"ask Slurm every {spec.poll_s:g} s until the job starts; cancel it if still "
            f"pending after {spec.max_pending_s:g} s (exit {on_slurm.EXIT_NOT_SCHEDULED})",
        )
    )
    if plan.follow:
        steps.append(Step("follow", f"stream {r.launch_log} until the job ends"))
    return steps


class Slurm:
    name = "slurm"
    supported = frozenset(
        {"run", "overrides", "fresh", "dry_run", "follow", "skip_preflight", "workload"}
    )
    instead = MappingProxyType(
        {
            "sync_wheel": "install the wheel into the cluster's ups environment (on the shared "
            "filesystem) from the login node, or point `remote_env` at an environment that "
            "has it.",
            "save": f"{command('fetch', '--host NAME')} copies the run directory (every "
            "node's logs) after the run.",
        }
    )

    def plan(
        self, request: DeployRequest, specs: Sequence[HostSpec], known_hosts: Path, out: TextIO
    ) -> SlurmDeploy:
        spec = own(specs[0])
        target = Target(spec=spec, known_hosts=known_hosts, out=out)
        if request.workload is not None:
            return self._plan_script(request, request.workload, spec, target)
        cfg = load_run_config(request.config, request.overrides)
        env = dict(os.environ)

        def replan(run_id: str | None) -> DeployPlan:
            plan = build_plan(
                spec,
                request.config,
                cfg=cfg,
                run_id=run_id,
                overrides=request.overrides,
                fresh=request.fresh,
                follow=request.follow,
                skip_preflight=request.skip_preflight,
                env=env,
            )
            return dataclasses.replace(plan, kind="slurm", steps=_slurm_steps(spec, plan))

        return SlurmDeploy(target, spec, replan(request.run), replan, request.skip_preflight, env)

    def _plan_script(
        self, request: DeployRequest, workload: ScriptWorkload, spec: SlurmHost, target: Target
    ) -> SlurmDeploy:
        # The run file's secrets (env_file values too) join the values the upload sends.
        env = {**os.environ, **workload.secrets(os.environ)}

        def replan(run_id: str | None) -> DeployPlan:
            plan = build_script_plan(
                spec,
                workload,
                run_id=run_id,
                fresh=request.fresh,
                follow=request.follow,
                skip_preflight=request.skip_preflight,
                env=env,
            )
            return dataclasses.replace(plan, kind="slurm", steps=_slurm_steps(spec, plan))

        plan = replan(request.run)
        return SlurmDeploy(target, spec, plan, replan, request.skip_preflight, env, workload)

    def attach(self, spec: HostSpec, run: str | None) -> AddressedHost:
        return own(spec)

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        slurm = own(spec)
        allocation = [f"--nodes={slurm.nodes}", "--ntasks-per-node=1", "--label"]
        allocation += [f"--partition={slurm.partition}"] if slurm.partition else []
        allocation += [f"--gpus-per-node={slurm.gpus_per_node}"] if slurm.gpus_per_node else []
        # No port check: a job's rendezvous port is chosen when it is submitted.
        check = rc.preflight_argv(slurm.ups_bin, config, slurm.gpus_per_node, check_port=False)
        return rc.argv("srun", *allocation, *check)

    def stop_command(self, spec: HostSpec, run: rc.RemoteRun, timeout_s: float) -> str:
        return sl.stop_command(run)

    def status_command(self, spec: HostSpec, run: rc.RemoteRun) -> str:
        return sl.status_command(run)

    def down(self, spec: HostSpec, run_id: str | None, hosts_file: str | None, out: TextIO) -> int:
        """Cancel the run's job (default: the last one deployed); its log stays."""
        _entry, known_hosts = get_host(spec.name, hosts_file)
        target = Target(spec=own(spec), known_hosts=known_hosts, out=out)
        conn = target.connect()
        try:
            found = resolve_run(target, conn, run_id)
            job_id = on_slurm.job_of(conn, own(spec), found)
            if job_id is None:
                out.write(f"run {found.run_id} was never submitted: nothing to cancel\n")
                return 0
            state = on_slurm.job_state(conn, own(spec), job_id)
            if not state.queued:
                out.write(f"slurm {state.words()} (run {found.run_id}): nothing to cancel\n")
                return 0
            result = run(conn, sl.cancel_command(job_id), own(spec))
        finally:
            conn.close()
        if result.exited != 0:
            out.write(f"scancel {job_id}: {result.stderr.strip()}\n")
            return 1
        out.write(f"cancelled slurm job {job_id} (run {found.run_id})\n")
        return 0


KIND = Slurm()
