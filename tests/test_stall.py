"""A stalled ``--script`` run under real torchrun (gloo): found, every rank's stack written,
the odd rank named, ended with exit 124 and nothing left running; while a slow compile, a
long evaluation, a long checkpoint write, a wait with a heartbeat and a CPU loop longer
than the timeout are left alone. One launch covers them all, in that order
(tests/test_stall_rule.py has the rule's logic case by case)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import parse_events
from tests.launch_helpers import write_script
from tests.lifecycle_helpers import run
from ups.launch.plan import LaunchRequest, build_plan
from ups.launch.procs import RankProcesses, RssSampler
from ups.launch.ranklogs import RankLogs
from ups.launch.stall import StallWatch
from ups.stackdump import DUMP_SIGNAL, SHIM, hooked_pids, main_thread, parse_dump

pytestmark = pytest.mark.slow

TIMEOUT_S = 3
PHASE_S = 4.5
"""Each harmless phase outlasts the timeout: suspected at 1.5 s, cleared at 3 s (and 4.5 s)."""

PHASES = """
import os, subprocess, sys, time
import torch, torch.distributed as dist
from ups import ckpt

PHASE_S = float(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)


def done(phase):  # one line at the end of each phase: a line is progress, so none inside
    print(f"rank {rank} {phase}", flush=True)


def busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


# 1. A slow first-batch compile: rank 0 waits for a compiler process of its own (only the
#    child uses the CPU) while the others, done first, wait in the first all-reduce.
if rank == 0:
    spin = f"import time\\nend = time.monotonic() + {PHASE_S}\\nwhile time.monotonic() < end: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
dist.all_reduce(t)
done("compiled")
# 2. A long evaluation on rank 0 while the others wait at a barrier.
if rank == 0:
    busy(PHASE_S)
dist.barrier()
done("evaluated")
# 3. A long checkpoint write on rank 0: slow I/O, hardly any CPU.
if rank == 0:
    with open(os.path.join(os.environ["UPS_CHECKPOINT_DIR"], "big.tmp"), "wb") as f:
        end = time.monotonic() + PHASE_S
        while time.monotonic() < end:
            f.write(bytes(1 << 20))
            time.sleep(0.25)
dist.barrier()
done("saved")
# 4. Rank 0 waits outside any collective (say, for a remote evaluation), beating its heart.
if rank == 0:
    end = time.monotonic() + PHASE_S
    while time.monotonic() < end:
        time.sleep(0.2)
        ckpt.progress(7)
dist.barrier()
done("beat")
# 5. Every rank busy in a CPU loop longer than the timeout.
busy(PHASE_S)
dist.barrier()
done("looped")
# 6. The hang: rank 1 asleep outside any collective, rank 0 waiting in an all-reduce, and
#    rank 2 spin-waiting on its all-reduce as a rank does on a GPU (CUDA's spin-wait).
if rank == 1:
    time.sleep(600)  # line 58
elif rank == 2:
    work = dist.all_reduce(t, async_op=True)
    while not work.is_completed(): pass  # line 61
dist.all_reduce(t)  # line 62
done("never")
"""


def test_a_stalled_script_is_named_and_ended_and_long_work_is_not(tmp_path: Path) -> None:
    """3 ranks, --stall-timeout 3: every harmless phase runs to its end (each one was
    suspected and cleared: `stall_ruled_out`), then the hang is found: exit 124, outcome
    failed/stalled naming rank 1's sleep line first, rank 0 in all_reduce and rank 2
    spinning; each rank's stack file holds the dumps; no process outlives launch (``run``
    checks every process carrying the test's marker)."""
    script = write_script(tmp_path, "phases.py", PHASES)
    lines = PHASES.splitlines()
    assert lines[58 - 1].strip().startswith("time.sleep(600)")  # the line numbers named below
    result = run(
        str(tmp_path), "--script", str(script), "--output-dir", str(tmp_path / "runs"),
        "--skip-preflight", "--nproc-per-node", "3", "--stall-timeout", str(TIMEOUT_S),
        "--", str(PHASE_S), timeout=400,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 124, out[-4000:]
    for phase in ("compiled", "evaluated", "saved", "beat", "looped"):
        assert all(f"rank {r} {phase}" in out for r in range(3)), (phase, out[-4000:])
    events = parse_events(out)
    cleared = [e for e in events if e["event"] == "stall_ruled_out"]
    assert len(cleared) >= 3, out[-4000:]  # the compile, evaluation and write were suspected

    run_dir = (tmp_path / "runs" / "latest").resolve()
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert (outcome["outcome"], outcome["cause"], outcome["exit_code"]) == (
        "failed",
        "stalled",
        124,
    )
    assert outcome["failed_rank"] == 1 and outcome["stall"]["odd_ranks"] == [1]
    assert outcome["stall"]["last_step"] == {"0": 7}
    summary = outcome["stall"]["summary"]
    assert summary.startswith(
        f"rank 1 at {script}:58 (`time.sleep(600)`), outside any collective; "
    )
    assert f"rank 0 in all_reduce at {script}:62 (`dist.all_reduce(t)`)" in summary
    assert f"rank 2 spinning at {script}:61 (`while not work.is_completed(): pass`)" in summary
    assert outcome["reason"].startswith("stalled: no rank made progress for ")
    assert summary in outcome["reason"] and f"--run-id {run_dir.name}" in outcome["reason"]
    assert TIMEOUT_S <= outcome["stall"]["seconds"] < TIMEOUT_S + 10
    end = events[-1]
    assert (end["event"], end["exit_code"], end["cause"]) == ("run_ended", 124, "stalled")

    stacks = run_dir / "stacks"
    assert outcome["traceback"] == str(stacks / "rank1.txt")
    for rank, line in ((0, 62), (1, 58), (2, 61)):
        text = (stacks / f"rank{rank}.txt").read_text()
        assert len(hooked_pids(text)) == 1
        last = text.rsplit("--- ups launch: stacks of", 1)[1]
        frames = main_thread(parse_dump(last))
        assert (frames[-1].file, frames[-1].line) == (str(script), line), (rank, text[-2000:])


def test_the_hook_keeps_the_environments_own_sitecustomize(tmp_path: Path) -> None:
    """The ranks' sitecustomize hooks the rank, then runs the one the environment had
    (a user's or Debian's), so adding the hook changes nothing else in the script's start."""
    hooks, theirs = tmp_path / "hooks", tmp_path / "theirs"
    hooks.mkdir()
    theirs.mkdir()
    (hooks / "sitecustomize.py").write_text(SHIM)
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hooks), str(theirs), str(Path.cwd())]),
        "RANK": "0",
        "UPS_STACK_DIR": str(tmp_path / "stacks"),
    }
    env.pop("UPS_STACK_HOOK_PID", None)
    code = "import os; print(os.environ.get('THEIRS_RAN'), os.environ['UPS_STACK_HOOK_PID'])"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    ran, pid = done.stdout.split()
    assert ran == "1"
    assert hooked_pids((tmp_path / "stacks" / "rank0.txt").read_text()) == {
        int(pid): int(DUMP_SIGNAL)
    }


def test_the_rss_sampler_and_the_stall_watch_share_one_walk(tmp_path: Path) -> None:
    """launch's two samplers of the ranks' processes (RSS every 0.5 s, the stall watch every
    second) find them through one ``RankProcesses``: ten looks each, one walk of the process
    table; when a rank's process ends, the next look walks again and drops it."""
    procs = [subprocess.Popen(["sleep", "60"], env={**os.environ, "RANK": str(r)}) for r in (0, 1)]
    try:
        req = LaunchRequest(script=str(tmp_path / "s.py"), output_dir=str(tmp_path), run_id="w")
        plan = build_plan(req, None, gpu_count=0, pick_port=lambda port: port, environ={})
        ranks = RankProcesses(rescan_s=60.0)
        sampler = RssSampler(ranks)
        watch = StallWatch(plan, RankLogs(tmp_path / "none", 2, lambda _: None), ranks)
        rule = watch.rule()
        for _ in range(10):
            sampler.sample()
            watch.poll(rule, time.monotonic())
        assert ranks.walks == 1
        assert set(sampler.peak_rss) == {0, 1} and min(sampler.peak_rss.values()) > 0
        procs[1].kill()
        procs[1].wait()
        sampler.sample()  # rank 1's process is gone: said so
        watch.poll(rule, time.monotonic())  # the next look walks again
        assert ranks.walks == 2
        assert [rank for _, rank in ranks.current()] == [0]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
