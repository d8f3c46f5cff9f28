"""scripts/test.sh's background installs as the tests see them (tests/background.py): a test
waits for the jobs it needs by name, fails with the log's tail when one failed, and a
run without scripts/test.sh waits for nothing. Job directories written here by hand, as
the script writes them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.background import (
    UNKNOWN_JOB_S,
    await_background,
    expected_ready_s,
    needs,
    took_s,
)


def _job(root: Path, name: str, *, started: float, ended: float | None, rc: int | None) -> None:
    (root / f"{name}.started").write_text(f"{started:.0f}\n")
    (root / f"{name}.pid").write_text(f"{os.getpid()}\n")  # a live pid: this test's
    (root / f"{name}.log").write_text("step 1\nE: Unable to locate package slurmd\n")
    if ended is not None and rc is not None:
        (root / f"{name}.ended").write_text(f"{ended:.0f}\n")
        (root / f"{name}.rc").write_text(f"{rc}\n")


def test_waiting_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that succeeded: True at once; one that failed: the test fails naming the job,
    its exit status and the log's last lines; a name no job has: False (the caller installs
    what it needs itself); the same without scripts/test.sh at all."""
    monkeypatch.setenv("UPS_BACKGROUND_DIR", str(tmp_path))
    _job(tmp_path, "sshd", started=100, ended=130, rc=0)
    _job(tmp_path, "slurm", started=100, ended=190, rc=100)
    assert await_background("sshd") is True
    with pytest.raises(pytest.fail.Exception) as failed:
        await_background("slurm")
    text = str(failed.value)
    assert "background job slurm (scripts/test.sh) failed with exit 100" in text
    assert "Unable to locate package slurmd" in text
    assert await_background("torch-oldest") is False
    monkeypatch.delenv("UPS_BACKGROUND_DIR")
    assert await_background("sshd") is False


def test_a_job_still_running_is_waited_for_up_to_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job without an exit status yet, whose process lives: waited for, and past the
    timeout the test fails naming the job and its log."""
    monkeypatch.setenv("UPS_BACKGROUND_DIR", str(tmp_path))
    _job(tmp_path, "docker", started=100, ended=None, rc=None)
    with pytest.raises(pytest.fail.Exception, match=r"docker .* did not end within 1 s"):
        await_background("docker", timeout=1)


def test_seconds_kept_and_expected_readiness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept for next time: from asking for a job to its end, for jobs that succeeded while
    pytest ran (one done before pytest started installed nothing worth timing). Expected:
    0 for a job done before pytest started, else when it was asked for plus its record
    (or the default), from pytest's start."""
    monkeypatch.setenv("UPS_BACKGROUND_DIR", str(tmp_path))
    (tmp_path / "pytest.started").write_text("160\n")
    _job(tmp_path, "sshd", started=100, ended=130, rc=0)  # done before pytest started
    _job(tmp_path, "docker", started=100, ended=250, rc=0)
    _job(tmp_path, "slurm", started=100, ended=190, rc=1)
    _job(tmp_path, "ups-image", started=100, ended=None, rc=None)
    assert took_s() == {"docker": 150.0}
    assert expected_ready_s("sshd", {"sshd": 300.0}) == 0.0
    assert expected_ready_s("docker", {"docker": 150.0}) == 90.0  # ended since: still "running"
    assert expected_ready_s("ups-image", {}) == 100 + UNKNOWN_JOB_S - 160
    assert expected_ready_s("no-such-job", {}) == 0.0


@dataclass
class _Mark:
    name: str
    args: tuple[Any, ...] = ()


@dataclass
class _Item:
    marks: list[_Mark] = field(default_factory=list)
    fixturenames: list[str] = field(default_factory=list)

    def iter_markers(self) -> list[_Mark]:
        return self.marks


def test_needs_come_from_the_background_marker_and_ssh_docker() -> None:
    """A test's jobs: its ``background`` marker's, plus sshd for ``ssh``, the engine for
    ``docker`` and the image for the ``ups_image`` fixture; none for a test with neither."""
    item = _Item([_Mark("slow"), _Mark("ssh"), _Mark("docker"), _Mark("background", ("cxx",))])
    assert needs(item) == ["cxx", "docker", "sshd"]  # type: ignore[arg-type]
    image = _Item([_Mark("docker")], ["tmp_path", "ups_image"])
    assert needs(image) == ["docker", "ups-image"]  # type: ignore[arg-type]
    assert needs(_Item([_Mark("slow")])) == []  # type: ignore[arg-type]
