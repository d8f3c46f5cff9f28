"""Your own script as a workload: the run file's checks, the checkpoint helper, what a
deploy sends and caches. Pure logic and files; no processes but one ``git``."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from ups import ckpt
from ups.cli import launch as launch_cli
from ups.cli.deploy import run as ups_deploy
from ups.deploy.hosts import ContainerHost
from ups.deploy.onhost.plan import build_script_plan
from ups.deploy.onhost.workdir import files_to_send, setup_key
from ups.launch.plan import LaunchRequest, build_plan
from ups.launch.scriptrun import resumed_from, with_resume
from ups.workload import WorkloadError, load_run_file, script_workload


def _proj(tmp_path: Path, run_file: str) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('hi')\n")
    (proj / "ups-run.yaml").write_text(run_file)
    return proj / "ups-run.yaml"


def test_run_file_reports_every_problem_at_once(tmp_path: Path) -> None:
    """Unknown key, missing script, a path outside workdir, a bad and an unset secret name,
    a missing env file: all in one error, one line each (the files even beside a key the
    schema refuses)."""
    path = _proj(
        tmp_path,
        "script: nope.py\nchekpoint_dir: x\ndata: [/abs/data.h5]\n"
        "env: [NOT_SET_ANYWHERE_1, 9bad, UPS_RESUME]\nenv_file: missing.env\n",
    )
    with pytest.raises(WorkloadError) as err:
        load_run_file(path, environ={})
    first = str(err.value)
    # A key the schema refuses does not hide the files the well-formed keys name.
    assert first.startswith(f"invalid run {path}: 3 problem(s)"), first
    assert "chekpoint_dir: unknown key" in first
    assert "script: 'nope.py' is not a file in workdir" in first
    assert "env_file: " in first
    (path.parent / "ups-run.yaml").write_text(
        "script: nope.py\ncheckpoint_dir: ../out\ndata: [/abs/data.h5]\n"
        "env: [NOT_SET_ANYWHERE_1, 9bad, UPS_RESUME]\nenv_file: missing.env\n"
    )
    with pytest.raises(WorkloadError) as err:
        load_run_file(path, environ={})
    text = str(err.value)
    assert text.startswith(f"invalid run {path}: 7 problem(s)")
    for needle in (
        "script: 'nope.py' is not a file in workdir",
        "checkpoint_dir: '../out' must be a path inside workdir",
        "data: '/abs/data.h5' must be a path inside workdir",
        "env: NOT_SET_ANYWHERE_1 is not set here",
        "env: '9bad' is not a variable name",
        "env: UPS_RESUME is set by ups",
        "env_file: ",
    ):
        assert needle in text, needle


def test_run_file_secrets_come_from_env_file_and_never_reach_the_plan(tmp_path: Path) -> None:
    """A secret named in the run file is read from its env_file; the deploy plan names it,
    and neither its render nor the run file sent to the host holds the value."""
    path = _proj(
        tmp_path,
        "script: train.py\nenv: [TOKEN]\nenv_file: s.env\nargs: [--x, '1']\ndata: [d/x.h5]\n",
    )
    (path.parent / "s.env").write_text("export TOKEN='abc-secret-123'\n")
    workload = load_run_file(path, environ={})
    assert workload.secrets({}) == {"TOKEN": "abc-secret-123"}
    spec = ContainerHost(name="h", host="127.0.0.1", workdir="/w", ups_bin="ups")
    plan = build_script_plan(spec, workload, env={})
    assert plan.secrets == ["TOKEN"]
    assert plan.run_file is not None and plan.run_file["workdir"].startswith("/w/code/train-")
    assert "abc-secret-123" not in plan.render() + plan.to_json()
    assert plan.run_file == {
        "script": "train.py",
        "args": ["--x", "1"],
        "workdir": plan.run_file["workdir"],
        "checkpoint_dir": None,
        "data": ["d/x.h5"],
        "outputs": [],
        "stop_grace_s": None,
        "stall_timeout_s": None,
        "checkpoint_sync": None,
    }
    assert plan.bucket_access is None
    # The data is looked for on the host after sync and setup, before anything starts.
    names = [s.name for s in plan.steps]
    assert names.index("sync") < names.index("check-data") < names.index("start")
    assert "d/x.h5" in (plan.step("check-data").command or "")
    run_file = plan.remote.state("run-file.json")
    assert plan.launch_argv[:4] == ["ups", "launch", "--run-file", run_file]
    assert plan.resume_name == "train"


def test_run_file_checkpoint_sync_reaches_the_host_with_the_store_used_here(
    tmp_path: Path,
) -> None:
    """``checkpoint_sync`` in a run file: a malformed URL is one problem line; a good one
    goes to the host's run file with the endpoint this machine uses, and the deploy gives
    the host bucket credentials for the run's prefix as it does for the trainer."""
    path = _proj(tmp_path, "script: train.py\ncheckpoint_sync: {url: http://x/y, bucket: b}\n")
    with pytest.raises(WorkloadError) as err:
        load_run_file(path, environ={})
    assert "checkpoint_sync.url: Value error" in str(err.value) and "s3://" in str(err.value)
    assert "checkpoint_sync.bucket: unknown key" in str(err.value)
    path.write_text("script: train.py\ncheckpoint_sync: {url: s3://b/runs}\n")
    workload = load_run_file(path, environ={})
    spec = ContainerHost(name="h", host="127.0.0.1", workdir="/w", ups_bin="ups")
    plan = build_script_plan(spec, workload, run_id="r1", env={"AWS_ENDPOINT_URL": "http://s3"})
    assert plan.run_file is not None
    assert plan.run_file["checkpoint_sync"] == {"url": "s3://b/runs", "endpoint_url": "http://s3"}
    assert plan.bucket_access is not None and plan.bucket_access.prefix_url == "s3://b/runs/r1/"
    assert plan.bucket_access.mode == "account"


def test_launch_and_deploy_refuse_a_bad_run_file_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ups launch --run-file` and `ups deploy --run-file` answer a bad file with exit 2
    and the paragraph, before any host, run directory or process."""
    path = _proj(tmp_path, "script: train.py\ndata: [missing.h5]\nstop_grace_s: 0\n")
    assert launch_cli.main(["--run-file", str(path)]) == 2
    assert "stop_grace_s: Input should be greater than or equal to 1" in capsys.readouterr().err
    (path.parent / "ups-run.yaml").write_text("script: train.py\ndata: [missing.h5]\n")
    cwd = Path.cwd()
    try:
        assert launch_cli.main(["--run-file", str(path), "--output-dir", str(tmp_path)]) == 2
    finally:
        os.chdir(cwd)
    assert "data: 'missing.h5' does not exist in workdir" in capsys.readouterr().err
    assert not list(tmp_path.glob("train-*"))
    assert ups_deploy("deploy", ["--host", "h", "--script", str(tmp_path / "no.py")]) == 2
    assert "script: 'no.py' is not a file" in capsys.readouterr().err
    code = ups_deploy("deploy", ["--host", "h", "--run-file", str(path), "--set", "a.b=1"])
    assert code == 2 and "--set overrides a ups config" in capsys.readouterr().err


def test_launch_checkpoint_dir_overrides_the_run_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ups launch --run-file F --checkpoint-dir D`: the script's UPS_CHECKPOINT_DIR is D,
    taken relative to where ups launch started (not the run file's workdir), as a Slurm
    job's nodes need to share node 0's."""
    path = _proj(tmp_path, "script: train.py\ncheckpoint_dir: mine\n")
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        argv = ["--run-file", str(path), "--run-id", "c", "--dry-run"]
        assert launch_cli.main([*argv, "--checkpoint-dir", "runs/c/checkpoints"]) == 0
    finally:
        os.chdir(cwd)
    assert f'"UPS_CHECKPOINT_DIR": "{tmp_path}/runs/c/checkpoints"' in capsys.readouterr().out


def test_committed_checkpoints_by_rename_then_by_record(tmp_path: Path) -> None:
    """Temporary names never count; commit() renames a .tmp; naming a file through commit()
    switches the directory to the record, keeping what was committed before."""
    d = tmp_path / "ck"
    d.mkdir()
    (d / "step_1.pt.tmp").write_bytes(b"half")
    (d / ".partial").write_bytes(b"x")
    assert ckpt.latest(d) is None
    first = ckpt.commit(d / "step_1.pt.tmp")
    assert first == d / "step_1.pt" and ckpt.latest(d) == first
    (d / "step_2.pt").write_bytes(b"being written")  # not named: counts by the rename rule
    os.utime(d / "step_2.pt", ns=(1, 1))  # older than step_1 by mtime
    assert ckpt.latest(d) == first
    (d / "state_3").mkdir()  # a sharded checkpoint: a directory
    assert ckpt.commit(d / "state_3") == d / "state_3"
    assert [p.name for p in ckpt.committed(d)] == ["step_2.pt", "step_1.pt", "state_3"]
    (d / "state_4").mkdir()  # not recorded: no longer counts
    assert ckpt.latest(d) == d / "state_3"


def test_helper_reads_the_contract_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """checkpoint_dir/resume_path/is_rank0 follow the variables ups sets; should_stop turns
    true after a real SIGTERM to this process (its handler installed by the first call)."""
    monkeypatch.setenv("UPS_CHECKPOINT_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("UPS_RESUME", "")
    monkeypatch.setenv("RANK", "1")
    assert ckpt.checkpoint_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()
    assert ckpt.resume_path() is None and not ckpt.is_rank0()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert ckpt.should_stop() is False
        os.kill(os.getpid(), signal.SIGTERM)
        assert ckpt.should_stop() is True
    finally:
        signal.signal(signal.SIGTERM, previous)
        ckpt._stop.clear()
        ckpt._handler_installed = False


def test_sync_sends_git_view_plus_include_minus_exclude(tmp_path: Path) -> None:
    """In a git checkout: tracked and unignored files; include brings an ignored one back,
    exclude drops one; outside git the root .gitignore still applies."""
    proj = tmp_path / "p"
    (proj / "sub").mkdir(parents=True)
    for name in ("train.py", "sub/model.py", "big.bin", "keep.bin", "notes.log", "w.pt"):
        (proj / name).write_text(name)
    (proj / ".gitignore").write_text("*.bin\n*.log\n")
    plain = script_workload(str(proj / "train.py"))
    assert files_to_send(plain) == [".gitignore", "sub/model.py", "train.py", "w.pt"]
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    workload = load_run_file(
        _write(proj / "ups-run.yaml", "script: train.py\ninclude: [keep.bin]\nexclude: ['*.pt']\n")
    )
    assert files_to_send(workload) == [
        ".gitignore",
        "keep.bin",
        "sub/model.py",
        "train.py",
        "ups-run.yaml",
    ]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_setup_runs_again_only_when_the_files_it_names_change(tmp_path: Path) -> None:
    """The cache key covers the command and the content of the workdir files it names."""
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "train.py").write_text("")
    (proj / "requirements.txt").write_text("numpy\n")
    workload = script_workload(str(proj / "train.py"))
    cmd = "pip install -r requirements.txt"
    key = setup_key(workload, cmd)
    (proj / "train.py").write_text("changed")
    assert setup_key(workload, cmd) == key
    (proj / "requirements.txt").write_text("numpy\nscipy\n")
    assert setup_key(workload, cmd) != key
    assert setup_key(workload, cmd + " -q") != setup_key(workload, cmd)


def test_script_plan_sets_the_contract_and_the_outcome_says_where_it_started(
    tmp_path: Path,
) -> None:
    """A script's plan gives every rank UPS_CHECKPOINT_DIR (default: the run's checkpoints/)
    and its stop grace to torchrun; each attempt gets UPS_RESUME as of then; the outcome's
    resumed_from names the checkpoint, or says a continued run started from the beginning."""
    req = LaunchRequest(
        script="train.py", output_dir=str(tmp_path / "runs"), run_id="s1", stop_grace_s=7
    )
    plan = build_plan(req, None, gpu_count=0, pick_port=lambda p: p, environ={})
    directory = tmp_path / "runs" / "s1" / "checkpoints"
    assert plan.env["UPS_CHECKPOINT_DIR"] == str(directory)
    assert "--shutdown-timeout=7" in plan.torchrun_argv and plan.stop_grace_s == 7
    started, resume = with_resume(plan)
    assert resume is None and started.env["UPS_RESUME"] == ""
    assert resumed_from(started, resume, continued=False) is None
    restarted = resumed_from(started, resume, continued=True)
    assert restarted is not None and restarted["checkpoint"] is None
    assert restarted["why"].startswith("restarted from the start: no committed checkpoint")
    (directory / "step_000004.pt").write_bytes(b"done")
    started, resume = with_resume(plan)
    assert started.env["UPS_RESUME"] == str(directory / "step_000004.pt")
    said = resumed_from(started, resume, continued=True)
    assert said is not None and said["checkpoint"] == str(directory / "step_000004.pt")
    trainer = build_plan(
        LaunchRequest(config_path="c.yaml", output_dir=str(tmp_path)),
        None,
        gpu_count=0,
        pick_port=lambda p: p,
        environ={},
    )
    assert "UPS_CHECKPOINT_DIR" not in trainer.env
