"""The shell text of a Slurm job: the batch script, each node's script, the Slurm commands.

Pure functions, like :mod:`ups.deploy.transport.remote`: ``--dry-run`` prints exactly
what these return, and ``fab deploy`` submits exactly that. How the job runs (one batch
script, ``srun`` of one ``ups launch`` node agent per node, preflight on every node
first, signals, requeue) is described in docs/slurm.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ups.deploy.transport.remote import RemoteRun, argv, q, secrets_line

BATCH_SCRIPT = "run.sh"
"""The batch script, under the name every deployed run's script has (its state dir is a
deployed run's: ``fab logs`` ends at its exit file)."""
NODE_SCRIPT = "node.sh"
JOB_ID_FILE = "jobid"
ATTEMPTS_FILE = "attempts"
"""One line per start of the batch script: ``<restart count> <job id> <epoch s> <nodes>``."""
PREFLIGHT_DIR = "preflight"
"""Each node's preflight report (``<node>.txt``) and, when it failed, ``<node>.failed``."""
PORT_BASE = 20000
PORT_SPAN = 10000
"""The rendezvous port is chosen per job (and per requeue) in this range: jobs sharing a
node do not collide, and a requeued job does not wait for its old port."""
STOP_SIGNAL = "USR2"
"""`fab stop` sends this to the batch shell: stop at a step with a checkpoint, no requeue."""
WARN_SIGNAL = "USR1"
"""Slurm sends this ahead of the time limit (``--signal=B:USR1@N``): checkpoint, requeue."""
_PREFLIGHT_OUTCOME = (
    '{"run_id": "%s", "outcome": "failed", "exit_code": 4, "phase": "preflight", '
    '"cause": "preflight", "reason": "preflight failed on %s before training (reports in %s)"}\\n'
)
"""outcome.json when a node's preflight failed (printf: run id, nodes, report dir; the run
id and paths are checked words, Slurm's node names letters and digits: strict JSON)."""
PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED"})
ACTIVE_STATES = frozenset({"RUNNING", "COMPLETING", "RESIZING", "STAGE_OUT", "SIGNALING"})


@dataclass(frozen=True)
class JobSpec:
    """What the batch script asks Slurm for, and what each node runs."""

    run: RemoteRun
    sbatch: list[str]
    """``#SBATCH`` options, one per line, in order."""
    ups_bin: str
    launch_args: list[str]
    """``ups launch`` arguments every node shares (config, run id, ``--set``s, ranks)."""
    preflight_args: list[str]
    """``ups preflight`` arguments every node shares; node 0 also checks the port."""
    remote_env: str | None
    requeue: bool
    skip_preflight: bool = False


def node_output_dir(run: RemoteRun) -> str:
    """``--output-dir`` of node ``$SLURM_NODEID``: node 0 writes the run directory itself
    (rank 0, outcome.json, checkpoints); node N its own launch.log and outcome under
    ``<run dir>/nodes/N``, since the nodes share one filesystem."""
    return f"{q(run.output_dir)}/{q(run.run_id)}/nodes/$SLURM_NODEID"


def node_script(job: JobSpec) -> str:
    """What ``srun`` runs on every node: ``preflight`` (report to the state dir) or
    ``train`` (one ``ups launch`` node agent; SIGTERM stops it at a step)."""
    run = job.run
    state = run.state
    report = f"{q(state(PREFLIGHT_DIR))}/$SLURMD_NODENAME"
    preflight = argv(job.ups_bin, *job.preflight_args)
    launch = argv(job.ups_bin, *job.launch_args)
    lines = [
        "#!/bin/sh",
        "# written by `fab deploy`: srun runs it once on every node of the job",
        f"cd {q(run.workdir)} || exit 1",
        job.remote_env or "",
        secrets_line(run),
        f"export UPS_RUN_ID={q(run.run_id)}",
        f'if [ "$SLURM_NODEID" = 0 ]; then out={q(run.output_dir)}; '
        f"else out={node_output_dir(run)}; fi",
        'if [ "$1" = preflight ]; then',
        f'  if ! mkdir -p "$out" 2>{report}.txt || [ ! -w "$out" ]; then',
        f'    echo "run directory: $PWD/$out is not a writable directory on'
        f' $SLURMD_NODENAME" >> {report}.txt',
        f"    echo run-dir > {report}.failed; exit 4",
        "  fi",
        '  if [ "$SLURM_NODEID" = 0 ]; then port="--master-port ${UPS_RDZV_ENDPOINT##*:}"; '
        'else port="--skip ports"; fi',
        f"  {preflight} $port >> {report}.txt 2>&1 || {{ echo $? > {report}.failed; exit 4; }}",
        "  exit 0",
        "fi",
        # exec: Slurm sends SIGTERM to every process of the step (requeue, cancel, and the
        # batch shell's `scancel --signal=TERM` on the time-limit warning or `fab stop`), so
        # the launcher gets it once, from Slurm, and stops the ranks at a step with a
        # checkpoint; a shell in between forwarding it too would signal it twice.
        f'exec {launch} --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" '
        '--rdzv-endpoint "$UPS_RDZV_ENDPOINT" --output-dir "$out"',
    ]
    return "\n".join(line for line in lines if line) + "\n"


def batch_script(job: JobSpec) -> str:
    """The script ``sbatch`` queues: pick the rendezvous, preflight every node, train,
    and record the job's end (``exit``) unless the job goes back to the queue."""
    run = job.run
    state = run.state
    exit_file, tmp = q(run.exit_file), q(state("exit.tmp"))
    node = argv("sh", state(NODE_SCRIPT))
    srun = "srun --ntasks-per-node=1"
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {option}" for option in job.sbatch),
        "# written by `fab deploy` (ups): preflight on every node, then one `ups launch`",
        "# node agent per node; see docs/slurm.md",
        f"cd {q(run.workdir)} || exit 1",
        "restart=${SLURM_RESTART_COUNT:-0}",
        f'echo "$restart $SLURM_JOB_ID $(date +%s) $SLURM_JOB_NODELIST" '
        f">> {q(state(ATTEMPTS_FILE))}",
        f"rm -f {exit_file}",
        # Node 0 hosts the rendezvous, at the address Slurm reaches it by.
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "addr=$(scontrol show node \"$head\" -o | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')",
        f"port=$(( {PORT_BASE} + (SLURM_JOB_ID * 8 + restart) % {PORT_SPAN} ))",
        'export UPS_RDZV_ENDPOINT="${addr:-$head}:$port"',
        "end() {",
        f"  echo $1 > {tmp} && mv {tmp} {exit_file}",
        "  exit $1",
        "}",
    ]
    if not job.skip_preflight:
        report = q(state(PREFLIGHT_DIR))
        lines += [
            f"rm -rf {report} && mkdir -p {report}",
            f"{srun} --kill-on-bad-exit=0 {node} preflight",
            f"failed=$(cd {report} && ls -- *.failed 2>/dev/null | sed 's/[.]failed$//' "
            "| paste -sd ' ')",
            'if [ -n "$failed" ]; then',
            # The job's outcome, as a run's: `fab status` and the follow's last line say it.
            f"  mkdir -p {q(run.run_dir)} && printf {q(_PREFLIGHT_OUTCOME)} {q(run.run_id)} "
            f'"$failed" {report} > {q(run.outcome + ".tmp")} '
            f"&& mv {q(run.outcome + '.tmp')} {q(run.outcome)}",
            "  end 4",
            "fi",
        ]
    lines += [
        "stop=0; warned=0",
        # SIGTERM to the job's steps only (not to this shell, nor to srun, which would
        # cancel the step): every process of the training step gets it. A TERM to this
        # shell (Slurm requeues or cancels the job) reaches the step from Slurm itself, so
        # this shell only waits for the step.
        f"trap 'warned=1; scancel --signal=TERM \"$SLURM_JOB_ID\"' {WARN_SIGNAL}",
        f"trap 'stop=1; scancel --signal=TERM \"$SLURM_JOB_ID\"' {STOP_SIGNAL}",
        "trap 'true' TERM",
        f"{srun} --kill-on-bad-exit=1 {node} train &",
        "step=$!",
        'while :; do wait "$step"; rc=$?; kill -0 "$step" 2>/dev/null || break; done',
        # The run's exit code is rank 0's (node 0's outcome.json, when this attempt wrote
        # one): another node's launcher may end 143 on the same SIGTERM.
        f"if [ {q(run.outcome)} -nt {q(state(ATTEMPTS_FILE))} ]; then",
        f"  code=$(sed -n 's/^  \"exit_code\": \\([0-9]*\\),\\{{0,1\\}}$/\\1/p' {q(run.outcome)})",
        '  if [ -n "$code" ]; then rc=$code; fi',
        "fi",
    ]
    if job.requeue:
        lines += [
            # The time limit is near: the ranks saved; back into the queue to continue.
            'if [ "$rc" = 75 ] && [ "$warned" = 1 ] && [ "$stop" = 0 ]; then',
            '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
            "fi",
            # Slurm is requeueing the job itself (preemption, `scontrol requeue`): it comes
            # back, so this is not the job's end.
            'now=$(scontrol show job "$SLURM_JOB_ID" -o | tr " " "\\n" | sed -n "s/^Restarts=//p")',
            'if [ "${now:-0}" -gt "$restart" ]; then exit "$rc"; fi',
        ]
    lines.append('end "$rc"')
    return "\n".join(lines) + "\n"


def submit_command(run: RemoteRun) -> str:
    """Queue the batch script from the state dir; prints the job id."""
    return f"cd {q(run.state_dir)} && sbatch --parsable {BATCH_SCRIPT}"


JOB_FIELDS = ("JobState", "Reason", "NodeList", "Restarts")


def job_state_command(job_id: str) -> str:
    """Print the job's :data:`JOB_FIELDS` as ``Key=value`` lines (nothing once Slurm has
    forgotten the job: ``MinJobAge`` after its end)."""
    return _job_fields(q(job_id))


def _job_fields(job_word: str) -> str:
    keys = "|".join(JOB_FIELDS)
    return (
        f"scontrol show job {job_word} -o 2>/dev/null | tr ' ' '\\n' "
        f"| grep -E {q(f'^({keys})=')}; {_position(job_word)} || true"
    )


def _position(job_word: str) -> str:
    """``Position=N``: the job's place among the cluster's pending jobs, highest priority
    first (nothing when it is not pending)."""
    return (
        f"squeue -h -t PENDING -o %i --sort=-p,i 2>/dev/null | grep -nx {job_word} "
        "| cut -d: -f1 | sed 's/^/Position=/'"
    )


def status_command(run: RemoteRun) -> str:
    """``fab status`` on a Slurm run: ``alive=``, ``exit=`` and ``last=`` lines as
    :func:`ups.deploy.transport.remote.status_command` prints them for a process, and
    ``note=`` lines with the job's state in words (pending and why, running where,
    requeued how often)."""
    s = run.state
    field = "$(echo \"$info\" | sed -n 's/^{}=//p')"
    live = "|".join(sorted(PENDING_STATES | ACTIVE_STATES))
    return (
        f"job=$(cat {q(s(JOB_ID_FILE))} 2>/dev/null); "
        f'info=$([ -n "$job" ] && {_job_fields(chr(34) + "$job" + chr(34))}); '
        f"st={field.format('JobState')}; reason={field.format('Reason')}; "
        f"nodes={field.format('NodeList')}; restarts={field.format('Restarts')}; "
        f"pos={field.format('Position')}; "
        f'case "$st" in {live}) echo alive=1;; *) echo alive=0;; esac; '
        'case "$st" in '
        'PENDING) echo "note=slurm job $job: pending ($reason), position ${pos:-?} in the queue";; '
        'RUNNING) echo "note=slurm job $job: running on $nodes";; '
        '"") echo "note=slurm job ${job:-?}: not known to Slurm (any more)";; '
        '*) echo "note=slurm job $job: $st";; esac; '
        '[ "${restarts:-0}" -gt 0 ] && echo "note=requeued $restarts time(s)"; '
        f"[ -f {q(s('exit'))} ] && echo exit=$(cat {q(s('exit'))}); "
        f"[ -f {q(run.launch_log)} ] && printf 'last=%s\\n' \"$(tail -n 1 {q(run.launch_log)})\"; "
        "true"
    )


def stop_command(run: RemoteRun) -> str:
    """``fab stop``: the batch shell gets :data:`STOP_SIGNAL`, stops the ranks at a step
    with a checkpoint and records the job's end (no requeue)."""
    return (
        f"job=$(cat {q(run.state(JOB_ID_FILE))} 2>/dev/null) || {{ echo 'no job id'; exit 3; }}; "
        f'scancel --signal={STOP_SIGNAL} --batch "$job" && echo "signalled job $job"'
    )


def cancel_command(job_id: str, signal: str | None = None) -> str:
    """``scancel`` the job; with ``signal``, only signal its batch shell."""
    words = ["scancel", *([f"--signal={signal}", "--batch"] if signal else []), job_id]
    return argv(*words)


SACCT_FIELDS = ("JobID", "State", "Elapsed", "ExitCode", "NodeList")


def sacct_command(job_id: str) -> str:
    """The job's :data:`SACCT_FIELDS` from Slurm's accounting, one ``|``-separated line
    (nothing where accounting is not configured)."""
    fields = ",".join(SACCT_FIELDS)
    return f"sacct -j {q(job_id)} -X -n -P -o {fields} 2>/dev/null || true"


def read_job_id_command(run: RemoteRun) -> str:
    return f"cat {q(run.state(JOB_ID_FILE))} 2>/dev/null || true"


def preflight_reports_command(run: RemoteRun) -> str:
    """Print every node's preflight report; failed nodes marked ``FAILED <node>``."""
    d = q(run.state(PREFLIGHT_DIR))
    return (
        f'for f in {d}/*.txt; do [ -e "$f" ] || continue; n=$(basename "$f" .txt); '
        f'if [ -e {d}/"$n".failed ]; then echo "FAILED $n"; else echo "PASSED $n"; fi; '
        'cat "$f"; done'
    )


def sbatch_options(
    *,
    job_name: str,
    nodes: int,
    cpus_per_task: int | None,
    gpus_per_node: int,
    partition: str | None,
    time: str | None,
    account: str | None,
    qos: str | None,
    signal_before_end_s: int,
    requeue: bool,
    output: str,
    extra: Sequence[str],
) -> list[str]:
    """The ``#SBATCH`` lines, from a hosts.yaml entry (values checked there)."""
    options = [
        f"--job-name={job_name}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--output={output}",
        "--open-mode=append",
        f"--signal=B:{WARN_SIGNAL}@{signal_before_end_s}",
        "--requeue" if requeue else "--no-requeue",
    ]
    optional = {
        "cpus-per-task": cpus_per_task,
        "gpus-per-node": gpus_per_node or None,
        "partition": partition,
        "time": time,
        "account": account,
        "qos": qos,
    }
    options += [f"--{name}={value}" for name, value in optional.items() if value is not None]
    return [*options, *extra]
