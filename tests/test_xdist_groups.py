"""`xdist_group` keeps a module on one worker (its expensive module fixture built once; the
Slurm tests never side by side on the one cluster). pytest 9 broke that silently with
pytest-xdist 3.8 (the group went unnoticed and the tests spread over the workers), so the
grouping itself is checked: a tiny suite of its own under `--dist loadgroup`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a pytest run of its own

SUITE = """
import os, pathlib, time, pytest
pytestmark = pytest.mark.xdist_group("together")
OUT = pathlib.Path(__file__).with_name("workers")
def _record(request):
    time.sleep(0.5)
    with OUT.open("a") as fh:
        fh.write(os.environ["PYTEST_XDIST_WORKER"] + " " + request.node.nodeid + "\\n")
def test_one(request): _record(request)
def test_two(request): _record(request)
def test_three(request): _record(request)
"""


def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(SUITE)
    (tmp_path / "test_alone.py").write_text(
        "import time, pytest\n@pytest.mark.parametrize('i', range(4))\n"
        "def test_alone(i): time.sleep(0.3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = (tmp_path / "workers").read_text().split("\n")
    rows = [line.split() for line in lines if line]
    assert len(rows) == 3
    assert len({worker for worker, _ in rows}) == 1, rows
