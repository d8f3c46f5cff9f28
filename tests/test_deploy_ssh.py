"""`fab deploy` and friends against a real sshd on loopback (the `container` host kind).

The "remote" host is this machine: sshd logs in as the current user and the run uses
the ups installed in this checkout's venv, exactly as on a Vast instance running the image.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.deploy_fixtures import (
    FAB,
    REPO,
    SshServer,
    demo_config,
    demo_data,
    fab,
    link_data,
    paused_at,
    sshd,
    start_sshd,
    stop_sshd,
)
from tests.repo_scripts import captures

__all__ = ["demo_data", "sshd"]  # fixtures used by name below

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

SECRET = "wandb-test-key-0123456789abcdef"
NO_WANDB = {"mode": "disabled"}
"""For the runs whose checks are exit codes, outcomes and checkpoints: W&B's start (rank 0,
~1.4 CPU-s a launch by py-spy) buys them nothing. W&B offline, as users run it, and fetching its
files are the first test's."""


def _argv_containing(text: str) -> list[str]:
    """Command lines of running processes that contain ``text`` (what `ps` would show)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in argv:
                found.append(argv)
    return found


def _setup(server: SshServer, data: Path, tmp_path: Path) -> tuple[Path, Path]:
    hosts = server.write_hosts(tmp_path / "hosts.yaml")
    link_data(server.root / "remote", data)
    return hosts, server.root / "remote"


def test_deploy_streams_to_completion_across_drops(
    sshd: SshServer, demo_data: Path, tmp_path: Path
) -> None:
    """`fab deploy --host test` preflights remotely, runs detached and streams the log to the
    end; killing the SSH connection 3 times mid-run loses and repeats no byte; exit code 0."""
    hosts, workdir = _setup(sshd, demo_data, tmp_path)
    config = demo_config(tmp_path / "demo.yaml", max_steps=40)
    saved = tmp_path / "local-launch.log"
    proc = subprocess.Popen(
        [
            str(FAB),
            "deploy",
            "--host",
            "test",
            "--hosts-file",
            str(hosts),
            "--config",
            str(config),
            "--run",
            "e2e",
            "--save",
            str(saved),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "WANDB_API_KEY": SECRET},
    )
    out: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if line.startswith("started run e2e"):
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    drops = 0
    leaked_argv: list[str] = []
    if started.wait(timeout=120):
        leaked_argv = _argv_containing(SECRET)
        for _ in range(3):
            time.sleep(2.0)  # spread the drops over the ~20 s run
            drops += sshd.drop_sessions()
    proc.wait(timeout=240)
    reader.join(timeout=10)
    stdout = "".join(out)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert drops >= 3
    assert stdout.count("remote preflight on test") == 1
    assert stdout.count("preflight OK") == 1  # the table once, not again as log lines
    assert "preflight skipped" not in stdout  # launch knows deploy's preflight passed
    assert '"check"' not in stdout
    assert "run e2e:" in stdout and "finished (exit 0)" in stdout
    assert "reconnects" in stdout and "0 reconnects" not in stdout
    remote_log = workdir / "runs" / "e2e" / "logs" / "launch.log"
    assert saved.read_bytes() == remote_log.read_bytes()
    # The W&B key travelled in a 0600 file: never on a command line, in the plan or logs.
    state = workdir / ".ups" / "deploy" / "e2e"
    assert leaked_argv == []
    assert (state / "secrets.env").stat().st_mode & 0o777 == 0o600
    assert SECRET not in stdout + stderr + (state / "run.sh").read_text()
    assert SECRET.encode() not in remote_log.read_bytes()
    outcome = json.loads((workdir / "runs" / "e2e" / "outcome.json").read_text())
    assert outcome["outcome"] == "finished"

    status = fab("status", "--host", "test", "--hosts-file", str(hosts), timeout=60)
    assert status.returncode == 0, status.stderr
    assert "run e2e on test: not running" in status.stdout
    assert "outcome: finished (exit 0)" in status.stdout
    last = status.stdout.split("last event: ", 1)[1]
    assert not last.startswith("{") and "run finished" in last  # rendered, not raw JSON

    dest = tmp_path / "fetched"
    fetched = fab(
        "fetch", "--host", "test", "--hosts-file", str(hosts), "--dest", str(dest), timeout=60
    )
    assert fetched.returncode == 0, fetched.stderr
    assert "Traceback" not in fetched.stderr
    assert "fetched e2e from test: " in fetched.stdout
    assert json.loads((dest / "e2e" / "outcome.json").read_text())["outcome"] == "finished"
    assert (dest / "e2e" / "config.yaml").is_file()
    # W&B offline writes debug-core.log as a link to an absolute path under ~/.cache/wandb:
    # its content is copied in place of the link, with a one-line note.
    offline = next((dest / "e2e" / "wandb").glob("offline-run-*"))
    assert (offline / "run-e2e.wandb").stat().st_size > 0
    core = offline / "logs" / "debug-core.log"
    assert core.is_file() and not core.is_symlink()
    assert "copied the file behind link wandb/offline-run-" in fetched.stdout
    assert "logs/debug-core.log -> /" in fetched.stdout
    assert list((dest / "e2e" / "checkpoints").glob("step_*.pt"))
    assert (dest / "e2e" / "logs" / "launch.log").read_bytes() == remote_log.read_bytes()


def test_failed_run_exit_code_reaches_local_shell(
    sshd: SshServer, demo_data: Path, tmp_path: Path
) -> None:
    """A run that fails remotely (injected exception on rank 1) makes `fab deploy` exit with
    the run's own non-zero exit code and says which outcome it was."""
    hosts, workdir = _setup(sshd, demo_data, tmp_path)
    config = demo_config(
        tmp_path / "demo.yaml",
        max_steps=40,
        extra={"faults": [{"kind": "exception", "rank": 1, "step": 3}], "wandb": NO_WANDB},
    )
    result = fab(
        "deploy",
        "--host",
        "test",
        "--hosts-file",
        str(hosts),
        "--config",
        str(config),
        "--run",
        "boom",
        "--skip-preflight",
    )
    outcome = json.loads((workdir / "runs" / "boom" / "outcome.json").read_text())
    assert outcome["exit_code"] != 0
    assert result.returncode == outcome["exit_code"], result.stdout[-2000:] + result.stderr
    assert f"failed (exit {outcome['exit_code']})" in result.stdout


def _wait_for_step(log: Path, step: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and f'"step":{step}' not in (
        log.read_text() if log.exists() else ""
    ):
        time.sleep(0.5)  # waiting for training to be under way, bounded by the deadline


def test_stop_then_same_deploy_command_continues_the_run(
    sshd: SshServer, demo_data: Path, tmp_path: Path
) -> None:
    """`fab stop` SIGTERMs a detached run and reports its preemption checkpoint; `fab logs`
    replays the log, exits 75 and starts nothing; running the same `fab deploy` command
    again (no --run) continues that run from its checkpoint to the end, showing only the
    new log lines; `--fresh` would start a new id."""
    hosts, workdir = _setup(sshd, demo_data, tmp_path)
    # Held asleep at step 6 until stopped, so `fab stop` (an SSH round trip or two after
    # step 5) lands in training however loaded the machine is; the resumed run starts after
    # step 6, so the pause does not hold it again.
    config = demo_config(
        tmp_path / "demo.yaml",
        max_steps=12,
        nproc=1,
        extra={"faults": paused_at(6, ranks=1), "wandb": NO_WANDB},
    )
    deploy = ["deploy", "--host", "test", "--hosts-file", str(hosts), "--config", str(config)]
    started = fab(*deploy, "--skip-preflight", "--detach")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split("started run ", 1)[1].split()[0]
    log = workdir / "runs" / run_id / "logs" / "launch.log"
    _wait_for_step(log, 5)
    stopped = fab("stop", "--host", "test", "--hosts-file", str(hosts), "--timeout", "120")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "preempted (exit 75)" in stopped.stdout
    preempted = json.loads((workdir / "runs" / run_id / "outcome.json").read_text())
    assert preempted["outcome"] == "preempted" and preempted["checkpoint"]

    followed = fab("logs", "--host", "test", "--hosts-file", str(hosts), timeout=60)
    assert followed.returncode == 75
    assert "preempted (exit 75)" in followed.stdout
    assert "started run" not in followed.stdout  # logs only replays; it never resumes
    assert "run the same `fab deploy` (or `ups deploy`) again" in followed.stdout
    assert f"--run {run_id} in place of --fresh" in followed.stdout  # --fresh would not continue
    size_before = log.stat().st_size

    again = fab(*deploy, "--skip-preflight", timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert f"continuing run {run_id} on test (it preempted at step" in again.stdout
    assert f"started run {run_id}" in again.stdout
    # The plan shown names only the run it continues: no other run id, none of its paths.
    assert f"deploy plan: run {run_id} on test" in again.stdout
    assert "else new run" not in again.stdout
    # The console shortens long values with "…" (the torchrun command line), which can cut
    # inside the id; a shortened one must still be a prefix of this run's id.
    shown_ids = re.findall(r"(demo-[0-9a-z-]+)(…?)", again.stdout)
    assert {i for i, cut in shown_ids if not cut} == {run_id}
    assert all(run_id.startswith(i) for i, cut in shown_ids if cut), shown_ids
    outcome = json.loads((workdir / "runs" / run_id / "outcome.json").read_text())
    assert outcome["outcome"] == "finished"
    assert outcome["reason"].startswith("all 1 rank(s) finished 12 steps")
    new_events = [
        json.loads(line)
        for line in log.read_bytes()[size_before:].decode().splitlines()
        if line.startswith("{")
    ]
    assert any(e.get("event") == "resumed" for e in new_events)
    shown = again.stdout.split(f"started run {run_id}", 1)[1]
    assert "preempted (exit 75)" not in shown  # the old attempt's lines are not replayed

    refused = fab(*deploy, "--run", run_id, "--skip-preflight")
    assert refused.returncode == 2
    assert f"run {run_id} already finished" in refused.stderr and "--fresh" in refused.stderr
    fresh = fab(*deploy, "--fresh", "--dry-run")
    assert fresh.returncode == 0 and "latest unfinished" not in fresh.stdout


def test_fab_preflight_shows_remote_report(sshd: SshServer, tmp_path: Path) -> None:
    """`fab preflight --host test` runs the checks on the host and shows their table."""
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml")
    result = fab("preflight", "--host", "test", "--hosts-file", str(hosts), timeout=120)
    assert "remote preflight on test" in result.stdout
    assert "allreduce" in result.stdout
    assert result.returncode in (0, 4)  # this machine may legitimately fail a check
    assert ("preflight OK" in result.stdout) == (result.returncode == 0)


def test_unreachable_host_fails_clearly(tmp_path: Path) -> None:
    """A host whose port refuses connections fails after retries with the address and a fix."""
    from tests.deploy_fixtures import free_port

    hosts = tmp_path / "hosts.yaml"
    port = free_port()
    hosts.write_text(
        f"hosts:\n  gone:\n    host: 127.0.0.1\n    port: {port}\n    workdir: /tmp\n"
        f"    connect_timeout: 2\nknown_hosts: {tmp_path / 'kh'}\n"
    )
    result = fab("status", "--host", "gone", "--hosts-file", str(hosts), timeout=60)
    assert result.returncode == 3
    assert f"host 'gone' is unreachable at 127.0.0.1:{port}" in result.stderr


def test_changed_host_key_is_refused(tmp_path: Path) -> None:
    """First contact records the host key and prints its fingerprint; after the host's key
    changes, every task refuses with both fingerprints and the command that fixes it."""
    server = start_sshd(tmp_path / "a")
    hosts = server.write_hosts(tmp_path / "hosts.yaml")
    try:
        first = fab("status", "--host", "test", "--hosts-file", str(hosts), timeout=60)
        assert "recorded new host key" in first.stderr
        assert "no run deployed" in first.stderr  # connected fine; nothing deployed yet
        assert (tmp_path / "known_hosts").exists()
    finally:
        stop_sshd(server)
    other = start_sshd(tmp_path / "b", port=server.port)  # same address, new host key
    try:
        second = fab("status", "--host", "test", "--hosts-file", str(hosts), timeout=60)
    finally:
        stop_sshd(other)
    assert second.returncode == 3
    assert f"host key for [127.0.0.1]:{server.port} CHANGED" in second.stderr
    # docs/deploy.md shows this message from this run (UPS_CAPTURES=rewrite writes it there).
    assert captures().check("host-key-changed", second.stderr) == []
    assert second.stderr.count("SHA256:") == 2
    assert "ssh-keygen -R" in second.stderr


def test_ssh_config_alias_and_jump_host(sshd: SshServer, tmp_path: Path) -> None:
    """A host given only as an alias from an OpenSSH config (HostName, Port, User,
    IdentityFile) connects, and so does one reached through a jump host."""
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n"
        f"  IdentityFile {sshd.client_key}\n"
    )
    jump = f"root@127.0.0.1:{sshd.port}"
    hosts = sshd.write_hosts(
        tmp_path / "hosts.yaml",
        {
            "aliased": {
                "host": "gpu-alias",
                "ssh_config": str(ssh_config),
                "workdir": str(sshd.root / "remote"),
            },
            "jumped": sshd.host_entry(jump=jump),
        },
    )
    for name in ("aliased", "jumped"):
        result = fab("status", "--host", name, "--hosts-file", str(hosts), timeout=60)
        # Connected and verified: the only complaint is that nothing was deployed there yet.
        assert result.returncode == 3
        assert f"no run deployed on {name!r} yet" in result.stderr, result.stderr


def test_sync_wheel_installs_code_only_change_then_a_failed_preflight_starts_nothing(
    sshd: SshServer, tmp_path: Path
) -> None:
    """`fab deploy --sync-wheel W` installs a newer ups wheel into the remote ups
    environment before anything else; the deploy then stops at the remote preflight, which
    fails (the data file is missing on the host): it shows the report, exits 4 and starts
    nothing (no process, no run directory). One deploy for both: a remote preflight costs
    a few CPU-seconds, its failure is the same with or without a synced wheel."""
    import shutil
    import sys

    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md", "pins.toml"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, src / name if src.exists() else _mkdir(src) / name)
    for pkg in ("ups",):  # preflight lives in ups/preflight now
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    marker = "# code-only change shipped by --sync-wheel"
    with (src / "ups" / "deploy" / "__init__.py").open("a") as fh:
        fh.write(marker + "\n")
    # uv (a dev dependency) builds, makes the venv and installs here: what pip and
    # `python -m venv` (ensurepip alone about 5 CPU-s) did, at a fraction of the CPU.
    uv = str(Path(sys.executable).with_name("uv"))
    subprocess.run(
        [uv, "build", "-q", "--wheel", "--no-build-isolation", "--python", sys.executable,
         "-o", str(tmp_path / "dist"), str(src)],
        check=True, timeout=180,
    )  # fmt: skip
    wheel = next((tmp_path / "dist").glob("ups-*.whl"))
    # A separate "remote" environment with its own interpreter and pip (--seed; so the sync
    # can never touch this checkout's venv); the heavy deps come from this venv via a .pth.
    venv = tmp_path / "remote-venv"
    subprocess.run([uv, "venv", "-q", "--seed", "--python", sys.executable, str(venv)],
                   check=True, timeout=120)  # fmt: skip
    site = next(venv.glob("lib/python*/site-packages"))
    assert (site / "pip").is_dir()  # what --sync-wheel's `python -m pip install` runs
    deps = next(Path(sys.prefix).glob("lib/python*/site-packages"))
    (site / "zz_deps.pth").write_text(deps.as_posix() + "\n")
    subprocess.run(
        [uv, "pip", "install", "-q", "--no-deps", "--python", str(venv / "bin" / "python"),
         str(wheel)],
        check=True, timeout=180,
    )  # fmt: skip
    assert (venv / "bin" / "ups").read_text().splitlines()[0] == f"#!{venv}/bin/python"
    installed = site / "ups" / "deploy" / "__init__.py"
    installed.write_text(installed.read_text().replace(marker, ""))  # the "old" code
    hosts = sshd.write_hosts(
        tmp_path / "hosts.yaml", {"venv": sshd.host_entry(ups_bin=str(venv / "bin" / "ups"))}
    )
    result = fab(
        "deploy",
        "--host",
        "venv",
        "--hosts-file",
        str(hosts),
        "--config",
        str(demo_config(tmp_path / "demo.yaml")),
        "--run",
        "sync",
        "--sync-wheel",
        str(wheel),
    )
    assert f"upload {wheel.name}" in result.stdout, result.stdout + result.stderr
    assert marker in installed.read_text()
    assert "remote code: ups 0.1.0" in result.stdout
    # No data on this host: the remote preflight fails and stops the deploy.
    assert result.returncode == 4, result.stdout + result.stderr
    assert "remote preflight on venv" in result.stdout
    assert "FAIL" in result.stdout
    assert "preflight failed on 'venv'" in result.stderr
    assert "nothing was started" in result.stderr
    workdir = sshd.root / "remote"
    assert not (workdir / "runs").exists()
    assert not (workdir / ".ups" / "deploy" / "sync").exists()  # retry with the same id


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
