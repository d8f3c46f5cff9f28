"""The installs scripts/test.sh runs in the background, awaited by name.

``scripts/test.sh`` starts each install as a named job (``background NAME CMD...``) and
exports ``UPS_BACKGROUND_DIR``, where a job leaves ``NAME.started`` (when it was asked
for), ``NAME.log``, and at its end ``NAME.s`` (its own seconds), ``NAME.ended`` and
``NAME.rc`` (its exit status). A test declares the jobs it needs with
``@pytest.mark.background("NAME")`` (the markers ``ssh`` and ``docker`` and the fixture
``ups_image`` imply theirs: :data:`IMPLIED`); conftest's autouse fixture waits for them
before the test starts, and :mod:`tests.scheduling` starts such tests once their jobs
should have ended. A fixture that starts a resource waits too (:func:`await_background`),
since a module-scoped fixture is set up before any function-scoped one.

Run without scripts/test.sh (``pytest tests/...``) no job exists: waiting returns at once
and the fixtures install what they need themselves, as they always did.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

IMPLIED = {"ssh": ("sshd",), "docker": ("docker",), "ups_image": ("ups-image",)}
"""Jobs a marker or a fixture implies: sshd is installed by the job ``sshd``
(scripts/sshd-setup.sh), the engine by ``docker`` (scripts/docker-engine.sh), and the
fixture ``ups_image`` (the project image) is built by ``ups-image``."""

WAIT_S = 3600.0
"""How long a test waits for a job before it fails: longer than any install takes."""


def job_dir() -> Path | None:
    """scripts/test.sh's directory of background jobs, or None when run without it."""
    root = os.environ.get("UPS_BACKGROUND_DIR")
    return Path(root) if root else None


def needs(item: pytest.Item) -> list[str]:
    """The background jobs ``item`` needs, from its markers and fixtures, sorted."""
    names: set[str] = set()
    for mark in item.iter_markers():
        names.update(mark.args if mark.name == "background" else IMPLIED.get(mark.name, ()))
    for fixture in getattr(item, "fixturenames", ()):
        names.update(IMPLIED.get(fixture, ()))
    return sorted(names)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def await_background(name: str, timeout: float = WAIT_S) -> bool:
    """Wait for the background job ``name`` to end. True when it ran in this test run and
    succeeded; False when scripts/test.sh started no such job (the caller installs what it
    needs itself). Fails the test, with the job's log tail, when the job failed, died or
    did not end within ``timeout``."""
    root = job_dir()
    if root is None or not (root / f"{name}.started").exists():
        return False
    rc_file, log = root / f"{name}.rc", root / f"{name}.log"
    deadline = time.monotonic() + timeout
    while not rc_file.exists():
        if not _alive(root / f"{name}.pid") and not rc_file.exists():
            _failed(name, "died without an exit status", log)
        if time.monotonic() > deadline:
            _failed(name, f"did not end within {timeout:.0f} s", log)
        time.sleep(0.5)  # polling the job's status file, bounded by the deadline
    rc = rc_file.read_text().strip()
    if rc != "0":
        _failed(name, f"failed with exit {rc}", log)
    return True


def _failed(name: str, what: str, log: Path) -> None:
    pytest.fail(
        f"the background job {name} (scripts/test.sh) {what}, so this test cannot run; fix "
        f"what its log says, then run the tests again. {log}:\n{_tail(log)}",
        pytrace=False,
    )


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _epoch(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def took_s() -> dict[str, float]:
    """For each job that succeeded and was still running when pytest started: seconds from
    asking for it to its end (waiting for the job it runs after included), what
    tests/durations.json keeps for the next run's order. A job that had ended by then (the
    machine had what it installs) says nothing about a fresh machine, so it is left out."""
    root = job_dir()
    pytest_started = _epoch(root / "pytest.started") if root else None
    if root is None or pytest_started is None:
        return {}
    took = {}
    for ended_file in root.glob("*.ended"):
        name = ended_file.name.removesuffix(".ended")
        asked, ended = _epoch(root / f"{name}.started"), _epoch(ended_file)
        rc = _epoch(root / f"{name}.rc")
        if rc == 0 and asked is not None and ended is not None and ended > pytest_started:
            took[name] = ended - asked
    return took


def expected_ready_s(name: str, last_seconds: dict[str, float]) -> float:
    """Seconds after pytest started that job ``name`` should end: 0 when it had ended by
    then, else when it was asked for plus what that took last time (``last_seconds``, from
    tests/durations.json; :data:`UNKNOWN_JOB_S` without a record), less when pytest
    started. The same in every xdist worker (a job that ended after pytest started counts
    as running, whether or not a worker saw it end), so every worker orders the tests
    alike. 0 when no such job runs."""
    root = job_dir()
    if root is None:
        return 0.0
    asked, pytest_started = _epoch(root / f"{name}.started"), _epoch(root / "pytest.started")
    if asked is None or pytest_started is None:
        return 0.0
    ended = _epoch(root / f"{name}.ended")
    if ended is not None and ended <= pytest_started:
        return 0.0
    took = last_seconds.get(name, UNKNOWN_JOB_S)
    return max(0.0, asked + took - pytest_started)


UNKNOWN_JOB_S = 180.0
"""Seconds assumed for a job tests/durations.json has no record of."""
