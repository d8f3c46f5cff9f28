"""Several `ups launch` on one host: each reserves its own master port until it exits."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, worker_env
from tests.launch_helpers import ALLREDUCE, events_named, launch_cmd, outcome_of, write_script
from ups.launch.ports import release, reserve_port


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


HOLD = """
import sys, time
from ups.launch.ports import reserve_port
print(reserve_port(int(sys.argv[1])), flush=True)
time.sleep(60)  # holds the reservation while the test plans another launch, then is killed
"""


@pytest.mark.slow
def test_a_port_another_launch_reserved_is_not_planned_again(tmp_path: Path) -> None:
    """While one process holds the reservation of port P (bindable, not yet bound), a
    second one gets another port; once the first exits, P can be reserved again."""
    preferred = _free_port()
    env = worker_env({"UPS_PORT_LOCK_DIR": str(tmp_path / "locks")})
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(preferred)],
        stdout=subprocess.PIPE, text=True, env=env, cwd=REPO,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert int(holder.stdout.readline()) == preferred
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("UPS_PORT_LOCK_DIR", str(tmp_path / "locks"))
            other = reserve_port(preferred)
            assert other != preferred
            release(other)
            holder.kill()
            holder.wait(timeout=30)
            assert reserve_port(preferred) == preferred  # the kernel dropped the dead lock
            release(preferred)
    finally:
        holder.kill()
        holder.wait(timeout=30)


@pytest.mark.slow
def test_three_launches_started_at_once_all_finish(tmp_path: Path) -> None:
    """Three `ups launch` of the same script and master port, started in the same instant,
    all run preflight and end "finished" on three different master ports, each one's ranks
    meeting on its own (before, the second and third died with EADDRINUSE after preflight).
    The script is the smallest that rendezvouses (an all-reduce): the ports are the point,
    not training."""
    port = _free_port()
    script = write_script(tmp_path, "allreduce.py", ALLREDUCE)
    env = worker_env({"UPS_PORT_LOCK_DIR": str(tmp_path / "locks")})
    args = ("--script", str(script), "--output-dir", str(tmp_path / "runs"), "--master-port",
            str(port), "--nproc-per-node", "2", "--preflight-skip", "allreduce")  # fmt: skip
    procs = [
        subprocess.Popen(
            launch_cmd(*args, "--run-id", f"par{i}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO,
        )
        for i in range(3)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
        assert "EADDRINUSE" not in out
        assert "preflight OK" in out, out[-3000:]
    endpoints = [events_named(out, "launch_plan")[0]["rdzv_endpoint"] for out in outputs]
    assert len(set(endpoints)) == 3, endpoints
    assert f"127.0.0.1:{port}" in endpoints
    for i, (endpoint, out) in enumerate(zip(endpoints, outputs, strict=True)):
        met = {e["master_port"] for e in events_named(out, "allreduced")}
        assert met == {endpoint.rsplit(":", 1)[1]}, (f"par{i}", endpoint, met)
        assert outcome_of(tmp_path / "runs" / f"par{i}")["outcome"] == "finished"


@pytest.mark.slow
def test_gpus_flag_rejects_typos(tmp_path: Path) -> None:
    """`--gpus 0,x` is a flag error (exit 2) before anything starts. That `--gpus 2,3` is
    every worker's CUDA_VISIBLE_DEVICES is test_launch_run's script success test."""
    script = tmp_path / "cvd.py"
    script.write_text("print('never run')\n")
    bad_out = tmp_path / "bad"
    bad = subprocess.run(
        launch_cmd("--script", str(script), "--output-dir", str(bad_out), "--gpus", "0,x"),
        capture_output=True, text=True, timeout=120, env=worker_env(), cwd=REPO,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "--gpus '0,x' must list distinct GPU indices" in bad.stderr
    assert not bad_out.exists()
