"""`ups launch` with real torchrun workers (gloo on CPU): success, failures, exit codes, gate.

A run whose ranks report "preempted" exits 75: test_checkpoint_sync's preempted trainer run
asserts it (with launch's end line), so no launch here repeats it."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import made_once_per_run, parse_events, write_advection
from tests.launch_helpers import (
    ALLREDUCE,
    RAISE_ON_RANK1,
    SEGFAULT_ON_RANK1,
    events_named,
    outcome_of,
    run_launch,
    write_script,
)

pytestmark = pytest.mark.slow

FAST_GATE = ("--preflight-skip", "allreduce")
"""The all-reduce check takes ~8 s here and is tested in the preflight suite."""


CVD = """
sys.stdout.write("CVD=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset") + "\\n")
"""
"""Appended to :data:`ALLREDUCE`: the rank's CUDA_VISIBLE_DEVICES, in one write."""

PRINTED_LINES = 20_000
PRINTS = f"""
rank, pad = os.environ["RANK"], "x" * 60
for i in range({PRINTED_LINES}):
    print(f"r{{rank}} {{i:06d}} {{pad}}")
"""
"""Appended after :data:`CVD`: each rank print()s (two writes per line) this many lines."""


@dataclass(frozen=True)
class Launched:
    """A finished `ups launch` that several tests read."""

    out: Path
    returncode: int
    stdout: str
    stderr: str
    held_port: int | None


def _allreduce_run(factory: pytest.TempPathFactory) -> Launched:
    """One successful run of a script that all-reduces on 2 ranks and then print()s
    :data:`PRINTED_LINES` lines on each, read by the next three tests (made once per test
    run): with preflight (bar the all-reduce check), `--gpus 2,3`, and a `--master-port`
    that a real socket holds for as long as the launch runs."""

    def launch(root: Path) -> None:
        script = write_script(root, "ok.py", ALLREDUCE + CVD + PRINTS)
        with socket.socket() as held:
            held.bind(("0.0.0.0", 0))
            held.listen()
            port = held.getsockname()[1]
            proc = run_launch(
                "--script", str(script), "--output-dir", str(root / "runs"), *FAST_GATE,
                "--gpus", "2,3", "--nproc-per-node", "2", "--master-port", str(port),
            )  # fmt: skip
        _keep(root, proc, held_port=port)

    return _kept(made_once_per_run(factory, "launch-run-allreduce", launch))


def _keep(root: Path, proc: subprocess.CompletedProcess[str], held_port: int | None = None) -> None:
    """What the tests read of a launch made once per test run, beside its run directory."""
    kept = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
            "held_port": held_port}  # fmt: skip
    (root / "launched.json").write_text(json.dumps(kept))


def _kept(root: Path) -> Launched:
    return Launched(out=root / "runs", **json.loads((root / "launched.json").read_text()))


def test_script_success_tees_output_and_finishes(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A script that all-reduces on 2 ranks: exit 0, every worker line in launch.log and on
    stdout, outcome "finished", `latest` pointing at the run, and the outcome printed last.
    Launched with `--gpus 2,3`, which is the job's CUDA_VISIBLE_DEVICES in every worker (so
    preflight, the default --nproc-per-node and the workers agree on the subset); a typo in
    it is test_launch_ports' flag error. (Its master port is held and its ranks print a flood
    of lines: the next tests' run.)"""
    proc = _allreduce_run(tmp_path_factory)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("CVD=2,3") == 2, proc.stdout[-3000:]
    run_dir = (proc.out / "latest").resolve()
    reduced = events_named(proc.stdout, "allreduced")
    assert sorted(e["rank"] for e in reduced) == [0, 1]
    assert all(e["sum"] == 3.0 and e["run_id"] == run_dir.name for e in reduced)
    log_text = (run_dir / "logs" / "launch.log").read_text()
    assert len(events_named(log_text, "allreduced")) == 2
    assert "preflight OK" in log_text
    assert outcome_of(run_dir)["outcome"] == "finished"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (last["event"], last["outcome"], last["exit_code"]) == ("run_ended", "finished", 0)
    assert Path(last["run_dir"]).resolve() == run_dir


def test_taken_master_port_is_replaced_and_the_run_succeeds(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The configured master port is held by a real socket: launch logs the switch, the
    workers rendezvous on another port, and the run finishes (the previous test's run)."""
    proc = _allreduce_run(tmp_path_factory)
    port = proc.held_port
    assert port is not None
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    switched = events_named(proc.stdout, "master_port_switched")
    assert switched and switched[0]["port"] != port
    ports = {int(e["master_port"]) for e in events_named(proc.stdout, "allreduced")}
    assert ports == {switched[0]["port"]}


def test_two_ranks_printing_never_share_a_line(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two ranks print() 20,000 lines each: every line reaches stdout and launch.log whole
    (one rank's line, nothing glued to it), and none is lost (the success test's run)."""
    result = _allreduce_run(tmp_path_factory)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    pattern = re.compile(r"^r([01]) (\d{6}) x{60}$")
    for name, text in [
        ("stdout", result.stdout),
        ("launch.log", (result.out / "latest" / "logs" / "launch.log").read_text()),
    ]:
        rank_lines = [line for line in text.splitlines() if "xxxxxxxxxx" in line]
        whole = [m.groups() for line in rank_lines if (m := pattern.match(line))]
        assert len(whole) == len(rank_lines), f"{name}: {len(rank_lines) - len(whole)} corrupt"
        n = PRINTED_LINES
        assert len(set(whole)) == 2 * n, f"{name}: {2 * n - len(set(whole))} missing"


def test_failing_rank_is_named_with_its_exception(tmp_path: Path) -> None:
    """Rank 1 raises: launch exits 1 (torchrun's code), outcome.json is "failed" with
    failed_rank 1, the exception text, and the rank's error file as traceback location."""
    script = write_script(tmp_path, "fail.py", RAISE_ON_RANK1)
    out = tmp_path / "runs"
    proc = run_launch("--script", str(script), "--output-dir", str(out), "--skip-preflight")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    outcome = outcome_of((out / "latest").resolve())
    assert (outcome["outcome"], outcome["failed_rank"]) == ("failed", 1)
    assert "RuntimeError: boom on rank 1" in outcome["reason"]
    assert Path(outcome["traceback"]).name == "error.json"
    assert "boom on rank 1" in Path(outcome["traceback"]).read_text()
    assert "finished" not in proc.stdout.strip().splitlines()[-1]


def _segfault_run(factory: pytest.TempPathFactory) -> Launched:
    """One run of a script whose rank 1 dies of SIGSEGV, read by the next two tests (made
    once per test run)."""

    def launch(root: Path) -> None:
        script = write_script(root, "segv.py", SEGFAULT_ON_RANK1)
        _keep(root, run_launch("--script", str(script), "--output-dir", str(root / "runs"),
                               "--skip-preflight"))  # fmt: skip

    return _kept(made_once_per_run(factory, "launch-run-segfault", launch))


def test_segfault_is_named_with_its_signal(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rank 1 dies of SIGSEGV without writing anything: outcome.json names rank 1 and
    SIGSEGV, and the faulthandler stack is in launch.log."""
    proc = _segfault_run(tmp_path_factory)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = (proc.out / "latest").resolve()
    outcome = outcome_of(run_dir)
    assert (outcome["failed_rank"], outcome["signal"]) == (1, "SIGSEGV"), outcome
    assert "rank 1 died with SIGSEGV" in outcome["reason"]
    log_text = (run_dir / "logs" / "launch.log").read_text()
    assert "Fatal Python error: Segmentation fault" in log_text
    assert "segv.py" in log_text


def test_script_killed_rank_hint_promises_no_checkpoint(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A script's rank dies by a signal (cause rank_signal, retryable: SIGSEGV here, the
    previous test's run; SIGKILL, the OOM killer's, is the same cause): the hint says running
    the command again starts the script again; ups has no checkpoint of a script to
    continue from."""
    result = _segfault_run(tmp_path_factory)
    assert result.returncode != 0
    end = parse_events(result.stdout)[-1]
    assert (end["event"], end["outcome"]) == ("run_ended", "failed"), end
    assert end["resume"] == "run the same command again to start the script again"
    assert "checkpoint" not in json.dumps(end)
    assert outcome_of(result.out / "latest")["phase"] == "script"


def _torchrun_never_started(run_dir: Path) -> bool:
    log_text = (run_dir / "logs" / "launch.log").read_text()
    events = [e["event"] for e in parse_events(log_text)]
    return "torchrun_starting" not in events and not list(run_dir.glob("torchelastic/*"))


def test_held_rendezvous_port_fails_preflight_before_torchrun(tmp_path: Path) -> None:
    """Node 0 of a multi-node run cannot move the shared rendezvous port: when a socket
    holds it, preflight fails, outcome.json says so, and torchrun never starts."""
    script = write_script(tmp_path, "ok.py", ALLREDUCE)
    out = tmp_path / "runs"
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = run_launch(
            "--script", str(script), "--output-dir", str(out), "--run-id", "mn",
            "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{port}",
            *FAST_GATE,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    outcome = outcome_of(out / "mn")
    assert outcome["reason"] == "preflight failed: ports"
    assert f"port {port} is taken" in proc.stdout
    assert _torchrun_never_started(out / "mn")


def test_truncated_data_file_is_a_config_error_before_anything_starts(
    tmp_path: Path, make_config: Callable[..., Path]
) -> None:
    """A config whose HDF5 file is cut short is refused with the config's other problems
    (exit 2, the key and the file named), before preflight: no run directory exists."""
    data = write_advection(tmp_path / "adv.hdf5", n=24, t=11, x=64)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    config = make_config(tasks=[{"name": "advection", "layout": "single_1d", "path": str(data)}])
    proc = run_launch(str(config), "--run-id", "cut", *FAST_GATE)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"tasks.0.path (advection): data file {str(data)!r}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs" / "cut").exists()
