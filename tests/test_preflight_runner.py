"""The runner and the CLI: deadlines, selection, table/JSON output and exit codes."""

from __future__ import annotations

import json
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.conftest import REPO
from ups.preflight import (
    CheckResult,
    PreflightOptions,
    Report,
    Status,
    run_preflight,
    select_checks,
)
from ups.preflight.checks.ports import pick_free_port
from ups.preflight.runner import run_with_deadline

CLI = [sys.executable, "-m", "ups.preflight.cli"]


def _cli(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=120, cwd=REPO, **kw
    )


def test_hung_check_fails_at_its_deadline() -> None:
    """A check that never returns is a failure after its own timeout, not a stuck host."""
    release = threading.Event()

    def hangs() -> CheckResult:
        release.wait()
        return CheckResult(name="hang", status=Status.PASS, message="never")

    start = time.perf_counter()
    result = run_with_deadline("hang", hangs, timeout_s=0.5)
    elapsed = time.perf_counter() - start
    release.set()
    assert result.status is Status.FAIL
    assert "did not finish within its 0.5 s timeout" in result.message
    assert 0.5 <= elapsed < 3
    assert result.hint is not None and "--timeout hang=SECONDS" in result.hint


def test_crashing_check_is_reported_not_raised() -> None:
    """A check that raises becomes a failed result naming the error; the run goes on."""

    def boom() -> CheckResult:
        raise RuntimeError("disk vanished")

    result = run_with_deadline("boom", boom, timeout_s=5)
    assert result.status is Status.FAIL
    assert "RuntimeError: disk vanished" in result.message


def test_select_checks_by_name_and_group() -> None:
    """--only/--skip take names and groups; unknown names are refused, listing the choices."""
    assert [s.name for s in select_checks(["system"], ["disk"])] == ["shm", "ulimits", "memory"]
    assert [s.name for s in select_checks(["ports,versions"], [])] == ["versions", "ports"]
    with pytest.raises(ValueError, match=r"unknown check.*nope.*choose from"):
        select_checks(["nope"], [])


def test_report_ok_strict_and_schema() -> None:
    """ok() fails on fail, and on warn only when strict; the JSON has the documented keys."""
    report = Report(results=[
        CheckResult(name="a", status=Status.PASS, message="fine", value=1.5, unit="GB/s"),
        CheckResult(name="b", status=Status.WARN, message="meh", hint="do x"),
    ])  # fmt: skip
    assert report.ok() and not report.ok(strict=True)
    data = json.loads(report.to_json())
    assert set(data) == {
        "schema_version", "ok", "strict", "host", "started_at", "duration_s", "counts", "checks"
    }  # fmt: skip
    assert data["schema_version"] == 1
    assert set(data["checks"][0]) == {
        "name", "status", "message", "value", "threshold", "unit", "hint", "duration_s", "details"
    }  # fmt: skip
    assert data["counts"] == {"pass": 1, "warn": 1, "fail": 0, "skip": 0}
    table = report.render_table()
    assert "How to fix:\n  b: do x" in table


def test_events_per_check_are_logged(make_config: Callable[..., Path]) -> None:
    """Each check emits one structlog event with its status, value and duration."""
    with capture_logs() as logs:
        run_preflight(
            PreflightOptions(
                config=make_config(), only=["ports", "data"], master_port=pick_free_port(0)
            )
        )
    checks = [e for e in logs if e["event"] == "preflight_check"]
    assert [e["check"] for e in checks] == ["config", "ports", "data"]
    assert all("duration_s" in e and e["status"] == "pass" for e in checks)
    assert any(e["event"] == "preflight_done" and e["ok"] for e in logs)


@pytest.mark.slow
def test_cli_json_is_machine_readable_and_exit_zero(make_config: Callable[..., Path]) -> None:
    """`ups-preflight --json` prints only the JSON document on stdout and exits 0 when fit."""
    # 29500 may be in use by a real training run on this machine: check a free port.
    port = str(pick_free_port(0))
    proc = _cli(
        "--config", str(make_config()), "--json", "--skip", "allreduce,gpu", "--master-port", port
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True
    names = [c["name"] for c in data["checks"]]
    assert names[0] == "config" and "allreduce" not in names and "data" in names
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    assert any(e.get("event") == "preflight_check" for e in events)


@pytest.mark.slow
def test_importing_torch_is_not_charged_to_a_checks_deadline() -> None:
    """A fresh ups-preflight imports torch before the first check that uses it starts its
    deadline: on a fresh host's cold disk the import alone can outlast a check's budget.
    Here the import takes about 1 s of CPU; the GPU check itself takes milliseconds."""
    proc = _cli("--only", "gpu", "--timeout", "gpu=0.5", "--json")
    (gpu,) = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "gpu"]
    assert "did not finish" not in gpu["message"], gpu
    assert gpu["status"] != "fail", gpu


@pytest.mark.slow
def test_cli_fails_with_exit_1_and_a_fix(make_config: Callable[..., Path]) -> None:
    """A held master port makes `ups preflight` exit 1 and print the fix in the table."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "ups", "preflight", "--only", "ports",
             "--master-port", str(port)],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
    assert proc.returncode == 1
    assert re.search(r"^ports\s+FAIL\s", proc.stdout, re.M)
    assert "How to fix:" in proc.stdout and "--master-port" in proc.stdout
    assert "preflight NOT OK" in proc.stdout


@pytest.mark.slow
def test_cli_strict_turns_warnings_into_failure() -> None:
    """A warning (low nofile) exits 0 normally and 1 with --strict."""

    def low_nofile() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))  # fmt: skip

    normal = _cli("--only", "ulimits", preexec_fn=low_nofile)
    strict = _cli("--only", "ulimits", "--strict", preexec_fn=low_nofile)
    assert normal.returncode == 0 and "WARN" in normal.stdout
    assert strict.returncode == 1 and "(strict)" in strict.stdout


@pytest.mark.slow
def test_cli_unknown_check_is_a_usage_error() -> None:
    """An unknown check name exits 2 listing the valid names."""
    proc = _cli("--only", "gpus")
    assert proc.returncode == 2
    assert "unknown check(s) gpus" in proc.stderr and "allreduce" in proc.stderr


@pytest.mark.slow
def test_cli_refuses_a_bad_config_before_importing_torch(tmp_path: Path) -> None:
    """A config with a value out of range and an unknown key exits 2 with every problem in
    one paragraph, as `ups launch` does, and no check runs: torch is never imported, so
    the refusal takes a fraction of a second (compose runs this before launch)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  batch_size: 0\n  epochz: 3\n")
    code = (
        "import sys\nfrom ups.preflight.cli import main\n"
        f"rc = main(['--config', {str(bad)!r}, '--events', 'off'])\n"
        "print('torch imported:', 'torch' in sys.modules)\nsys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "torch imported: False\n"  # no table, no check
    assert f"invalid config {bad}: 3 problem(s)" in proc.stderr
    assert "training.batch_size" in proc.stderr and "training.epochz" in proc.stderr
