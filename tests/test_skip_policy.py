"""The test command fails when a test skips for any reason but the GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

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


def _pytest(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip


def test_gpu_skips_pass_and_any_other_skip_fails_the_run(tmp_path: Path) -> None:
    """Skips because of the GPU leave the exit code 0; one skip for another reason (an
    engine that is missing, an image not built) makes it 1 and names the test."""
    allowed = _pytest(tmp_path, SKIPS)
    assert allowed.returncode == 0, allowed.stdout

    other = _pytest(tmp_path, SKIPS + "\ndef test_x() -> None:\n    pytest.skip('no engine')\n")
    assert other.returncode == 1, other.stdout
    assert "skipped for a reason other than a missing GPU" in other.stdout
    assert "test_sample.py::test_x: Skipped: no engine" in other.stdout
