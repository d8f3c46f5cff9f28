"""`ups init` makes a folder a ups project (fabfile.py, ups-run.yaml) and never overwrites.

In-process and pure: files in a temporary folder, no processes. `fab` itself in such a
folder: tests/test_deploy_cli.py (`fab --list`, `-- ARGS`) and tests/test_script_deploy.py
(a real deploy from it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ups.cli import main as ups_main
from ups.cli.init import FABFILE
from ups.deploy.frontend import command
from ups.workload import load_run_file

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def test_init_writes_the_fabfile_and_a_run_file_that_loads(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fabfile is the checkout's own (two lines); the starter run file names the
    script and loads as a run file; the output says where hosts are read from."""
    assert ups_main(["init"]) == 0
    assert (project / "fabfile.py").read_text() == FABFILE == (REPO / "fabfile.py").read_text()
    workload = load_run_file(project / "ups-run.yaml")
    assert workload.script == "train.py" and workload.args == ()
    out = capsys.readouterr().out
    assert "--hosts-file, else $UPS_HOSTS_FILE, else configs/hosts.yaml" in out
    assert "ups dev-host up" in out and "fab deploy --host NAME --script train.py -- ARGS" in out


def test_init_refuses_to_overwrite_and_writes_nothing(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An existing fabfile.py: exit 2, one paragraph naming it and the line to add, the
    file untouched and no run file written."""
    (project / "fabfile.py").write_text("# mine\n")
    assert ups_main(["init"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fabfile.py already exists" in err
    assert "from ups.fabtasks import *" in err
    assert (project / "fabfile.py").read_text() == "# mine\n"
    assert not (project / "ups-run.yaml").exists()


def test_init_without_the_script_names_the_flag(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No train.py: exit 2 naming --script; with --script of another file it works."""
    (project / "train.py").unlink()
    (project / "fit.py").write_text("print('hi')\n")
    assert ups_main(["init"]) == 2
    assert "no train.py in this folder" in capsys.readouterr().err
    assert not (project / "fabfile.py").exists()
    assert ups_main(["init", "--script", "fit.py"]) == 0
    assert load_run_file(project / "ups-run.yaml").script == "fit.py"


def test_a_hint_names_the_fab_task_and_its_ups_twin() -> None:
    """Every deploy hint is built by one function: the fab command, then `ups` alike."""
    assert command("logs", "--host", "a", "--run", "r") == (
        "`fab logs --host a --run r` (or `ups logs` with the same options)"
    )
