"""The test command's own rules, checked on sample test files run by a real pytest with
this conftest: a skip for any reason but the GPU fails the run (also under pytest-xdist,
where the workers' reports reach the controller), and a test that starts a process
without the `slow` marker (plus `ssh`/`docker` for those programs) fails, naming the
marker to add."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # each test runs pytest itself in a subprocess

SKIPS = """
import pytest

def test_runs() -> None:
    assert True

@pytest.mark.gpu
def test_needs_a_gpu() -> None:
    pytest.skip("needs CUDA")

def test_on_gpu_hosts_only() -> None:
    pytest.skip("asserts the behaviour of a host without a GPU")
"""


def _pytest(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), *args, str(tmp_path / "test_sample.py")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
    )  # fmt: skip


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_gpu_skips_pass_and_any_other_skip_fails_the_run(
    tmp_path: Path, workers: list[str]
) -> None:
    """Skips because of the GPU leave the exit code 0; one skip for another reason (an
    engine that is missing, an image not built) makes it 1 and names the test."""
    allowed = _pytest(tmp_path, SKIPS, *workers)
    assert allowed.returncode == 0, allowed.stdout

    other = _pytest(
        tmp_path, SKIPS + "\ndef test_x() -> None:\n    pytest.skip('no engine')\n", *workers
    )
    assert other.returncode == 1, other.stdout
    assert "skipped for a reason other than a missing GPU" in other.stdout
    assert "test_sample.py::test_x: Skipped: no engine" in other.stdout


SPAWNS = """
import multiprocessing
import subprocess
import pytest

def test_pure() -> None:
    assert sum(range(4)) == 6

def test_unmarked_subprocess() -> None:
    subprocess.run(["true"], check=True)

def test_unmarked_worker_process() -> None:
    p = multiprocessing.get_context("fork").Process(target=int)
    p.start()
    p.join()

@pytest.fixture(scope="module")
def server():
    return subprocess.Popen(["true"]).wait()

def test_unmarked_module_fixture_starts_a_server(server) -> None:
    assert server == 0

def test_unmarked_quick_tools_are_allowed(tmp_path) -> None:
    subprocess.run(["sh", "-n", "-c", "echo ok"], check=True)

@pytest.mark.slow
def test_marked_subprocess() -> None:
    subprocess.run(["true"], check=True)

@pytest.mark.slow
def test_docker_without_its_marker() -> None:
    subprocess.run(["docker", "version"], check=True)

@pytest.mark.slow
@pytest.mark.docker
def test_docker_marked() -> None:
    subprocess.run(["docker", "version"], check=True)

@pytest.mark.slow
def test_sshd_in_a_namespace_without_its_marker() -> None:
    subprocess.run(["env", "X=1", "sshd", "-t"], check=True)
"""


def test_a_test_that_starts_a_process_must_be_marked(tmp_path: Path) -> None:
    """Unmarked tests that start a subprocess, a multiprocessing worker or (through a
    fixture) a server fail naming `@pytest.mark.slow`; a `slow` test that runs docker or
    sshd fails naming `docker` / `ssh`; correctly marked tests and pure ones pass.
    ``docker`` and ``sshd`` here are stand-ins in tmp_path (PATH), so nothing real starts."""
    for name in ("docker", "sshd"):
        (tmp_path / name).write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / name).chmod(0o755)
    result = _pytest(tmp_path, SPAWNS, "-rA")
    assert result.returncode == 1, result.stdout
    summary = {
        line.split()[1].split("::")[1]: line.split()[0]
        for line in result.stdout.splitlines()
        if line.startswith(("PASSED", "FAILED")) and "::" in line
    }
    assert summary == {
        "test_pure": "PASSED",
        "test_unmarked_subprocess": "FAILED",
        "test_unmarked_worker_process": "FAILED",
        "test_unmarked_module_fixture_starts_a_server": "FAILED",
        "test_unmarked_quick_tools_are_allowed": "PASSED",
        "test_marked_subprocess": "PASSED",
        "test_docker_without_its_marker": "FAILED",
        "test_docker_marked": "PASSED",
        "test_sshd_in_a_namespace_without_its_marker": "FAILED",
    }, result.stdout
    assert "@pytest.mark.slow: it started `true`" in result.stdout
    assert "@pytest.mark.docker: it started `docker version`" in result.stdout
    assert "@pytest.mark.ssh: it started `env X=1 sshd -t`" in result.stdout
