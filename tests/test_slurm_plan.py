"""`kind: slurm` without a cluster: the hosts.yaml entry, the batch script `--dry-run`
prints, and the options refused before anything is contacted."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_fixtures import demo_config
from ups.deploy import tasks
from ups.deploy.errors import UsageError
from ups.deploy.hosts import load_hosts
from ups.deploy.onhost.slurm import Accounting, _failed_nodes, parse_sacct
from ups.deploy.request import DeployRequest
from ups.workload import load_run_file


def _hosts(tmp_path: Path, **fields: Any) -> Path:
    entry = {
        "kind": "slurm",
        "host": "login.cluster.example",
        "workdir": "/shared/ups",
        "nodes": 2,
        "gpus_per_node": 4,
        "cpus_per_task": 32,
        "partition": "gpu",
        "time": "1:00:00",
        "account": "proj42",
        "qos": "normal",
        "sbatch_options": ["--constraint=a100", "--exclude=node7"],
        "signal_before_end_s": 300,
        **fields,
    }
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"cluster": entry}}))
    return path


def _dry_run(tmp_path: Path, **fields: Any) -> str:
    out = io.StringIO()
    request = DeployRequest(
        host="cluster",
        hosts_file=str(_hosts(tmp_path, **fields)),
        config=demo_config(tmp_path / "demo.yaml", max_steps=4),
        run="r1",
        dry_run=True,
    )
    assert tasks.deploy(request, out) == 0
    return out.getvalue()


def _script(text: str, which: str) -> str:
    block = text.split(f"  {which} script (", 1)[1]
    lines = block.splitlines()[1:]
    return "".join(line[6:] + "\n" for line in lines if line.startswith("    | "))


def test_dry_run_prints_the_batch_script_from_the_entry(tmp_path: Path) -> None:
    """Every Slurm option of the entry becomes an #SBATCH line; each node runs preflight,
    then one `ups launch` with the job's node count, its node id and node 0's endpoint;
    both scripts are valid shell."""
    text = _dry_run(tmp_path)
    batch, node = _script(text, "batch"), _script(text, "node")
    for option in (
        "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=32", "--gpus-per-node=4",
        "--partition=gpu", "--time=1:00:00", "--account=proj42", "--qos=normal",
        "--signal=B:USR1@300", "--requeue", "--open-mode=append", "--constraint=a100",
        "--exclude=node7",
    ):  # fmt: skip
        assert f"#SBATCH {option}\n" in batch, option
    assert "node.sh preflight" in batch and "end 4" in batch
    assert 'scontrol requeue "$SLURM_JOB_ID"' in batch
    assert "--nproc-per-node 4" in node and '--nnodes "$SLURM_NNODES"' in node
    assert '--node-rank "$SLURM_NODEID" --rdzv-endpoint "$UPS_RDZV_ENDPOINT"' in node
    assert "--gpus 4" in node  # preflight checks the GPUs each node must show
    assert "sbatch --parsable run.sh" in text
    assert "launch:" not in text  # each node's command is in node.sh, not a container's
    for script in (batch, node):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_dry_run_of_a_script(tmp_path: Path) -> None:
    """`--run-file` on a slurm host: the workdir is synced and set up from the login node,
    each node runs `ups launch --run-file` with its rank and the job's rendezvous, and every
    node shares node 0's checkpoint directory (so a requeue resumes all of them from it)."""
    run_file = Path(__file__).resolve().parents[1] / "examples" / "ddp" / "ups-run.yaml"
    out = io.StringIO()
    request = DeployRequest(
        host="cluster",
        hosts_file=str(_hosts(tmp_path, gpus_per_node=0, ranks_per_node=1)),
        workload=load_run_file(run_file),
        run="s1",
        dry_run=True,
    )
    assert tasks.deploy(request, out) == 0
    text = out.getvalue()
    batch, node = _script(text, "batch"), _script(text, "node")
    steps = [w[1] for w in map(str.split, text.splitlines()) if w and w[0].rstrip(".").isdigit()]
    assert steps[:4] == ["connect:", "check-code:", "sync:", "upload:"], steps
    assert "/shared/ups/code/train-" in text
    assert (
        "ups launch --run-file /shared/ups/.ups/deploy/s1/run-file.json --run-id s1 "
        "--preflight-passed-by 'fab deploy' --nproc-per-node 1 --checkpoint-dir "
        "runs/s1/checkpoints --nnodes"
    ) in node
    assert node.count("--output-dir") == 1 and "--config" not in node
    assert "node.sh preflight" in batch
    for script in (batch, node):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_no_requeue_and_cpu_ranks(tmp_path: Path) -> None:
    """`requeue: false` asks Slurm for none and never requeues itself; ranks_per_node
    sets the ranks of a CPU node."""
    text = _dry_run(tmp_path, requeue=False, gpus_per_node=0, ranks_per_node=2)
    batch, node = _script(text, "batch"), _script(text, "node")
    assert "#SBATCH --no-requeue\n" in batch and "scontrol requeue" not in batch
    assert "--gpus-per-node" not in batch and "--nproc-per-node 2" in node


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"gpus": 2}, "set gpus_per_node (GPUs of each node), not gpus"),
        ({"time": "an hour"}, "is not a Slurm time"),
        ({"sbatch_options": ["-N 3"]}, "is not one long option"),
        ({"offer": "x"}, "not a field of a slurm host (it belongs to rented (vast"),
        ({"nodes": 0}, "nodes: Input should be greater than or equal to 1"),
    ],
)
def test_entry_mistakes_are_named(tmp_path: Path, fields: dict[str, Any], problem: str) -> None:
    """A wrong slurm entry is refused with its key path before anything is contacted."""
    with pytest.raises(UsageError) as err:
        load_hosts(_hosts(tmp_path, **fields))
    assert problem in str(err.value)


@pytest.mark.parametrize(("flag", "value"), [("sync_wheel", Path("x.whl")), ("save", Path("l"))])
def test_options_it_cannot_honour_are_refused(tmp_path: Path, flag: str, value: Path) -> None:
    """--sync-wheel and --save are refused (exit 2) with what to do instead."""
    request = DeployRequest(host="cluster", hosts_file=str(_hosts(tmp_path)), **{flag: value})
    with pytest.raises(UsageError, match="is not supported by a slurm host"):
        tasks.deploy(request, io.StringIO())


def test_down_on_a_host_of_your_own_is_refused(tmp_path: Path) -> None:
    """`fab down` ends what ups holds (instances, queued jobs); on a container host it
    says so and how to stop a run instead (exit 2)."""
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"box": {"host": "box.example"}}}))
    err = io.StringIO()
    code = tasks.guarded(lambda: tasks.down("box", hosts_file=str(path)), err)
    assert code == 2
    assert "`fab stop --host box`" in err.getvalue()


def test_failed_node_reports_are_split_by_node() -> None:
    """The per-node preflight reports come back as one stream: each failed node keeps its
    own lines, passed nodes are left out."""
    reports = "PASSED n1\nall good\nFAILED n2\nrun directory: x is not writable\nmore\n"
    assert _failed_nodes(reports) == {"n2": "run directory: x is not writable\nmore"}


def test_sacct_lines_are_read_for_the_job_only() -> None:
    """`sacct -X -n -P` output: the job's last allocation line (a requeued job has one per
    start) is its accounting; other jobs, blank or malformed lines, and no output at all
    (accounting not configured) give nothing."""
    text = (
        "41|COMPLETED|00:00:05|0:0|n1\n"
        "42|REQUEUED|00:00:31|0:15|n[1-2]\n"
        "garbage line\n\n"
        "42|COMPLETED|00:01:02|0:0|n[1-2]\n"
    )
    found = parse_sacct(text, "42")
    assert found == Accounting("COMPLETED", "00:01:02", "0:0", "n[1-2]")
    assert found.words() == "completed, elapsed 00:01:02, exit code 0:0, on n[1-2]"
    assert parse_sacct("", "42") is None and parse_sacct(text, "43") is None


def test_a_pending_job_without_a_reason_yet_says_none_of_slurms_none() -> None:
    """Just submitted, Slurm's reason is the word "None": the line leaves it out."""
    from ups.deploy.onhost.slurm import JobState

    fresh = JobState(job_id="1", state="PENDING", reason="None", position="1")
    assert fresh.words() == "job 1 pending, position 1 in the queue"
    limited = JobState(job_id="2", state="PENDING", reason="PartitionNodeLimit")
    assert limited.words() == "job 2 pending (PartitionNodeLimit), position ? in the queue"


def test_a_dev_host_names_the_local_slurm_cluster(tmp_path: Path) -> None:
    """`ups dev-host up --slurm-conf F` writes a `cluster` entry beside `local`: kind slurm,
    two nodes, reached through the dev host's sshd, SLURM_CONF set for its login shell; the
    hosts file loads as a valid `kind: slurm` entry."""
    from ups import devhost

    host = devhost.DevHost(tmp_path, 2222, 1, tmp_path / "hosts.yaml")
    devhost.write_hosts(host, tmp_path / "slurm.conf")
    specs = load_hosts(host.hosts_file).hosts
    cluster = specs["cluster"]
    assert (
        cluster.kind == "slurm"
        and cluster.port == 2222
        and cluster.workdir == str(tmp_path / "remote")
    )
    assert cluster.remote_env == f"export SLURM_CONF={tmp_path / 'slurm.conf'}"
    assert specs["local"].kind == "container"
