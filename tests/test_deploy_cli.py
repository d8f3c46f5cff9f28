"""`ups deploy|logs|status|...` and `fab ...` are one set of commands: same options, codes, text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy_fixtures import REPO, demo_config, free_port
from ups.cli import COMMANDS
from ups.cli import main as ups_main
from ups.cli.deploy import SUMMARY

FAB = str(Path(sys.executable).with_name("fab"))


def _hosts(tmp_path: Path) -> Path:
    entry = {"host": "127.0.0.1", "port": free_port(), "user": "root", "workdir": "/w"}
    path = tmp_path / "hosts.yaml"
    path.write_text(
        yaml.safe_dump(
            {"known_hosts": str(tmp_path / "kh"), "hosts": {"dock": {**entry, "kind": "docker"}}}
        )
    )
    return path


def test_every_fab_task_is_an_ups_command() -> None:
    """Each fab task but `preflight` (ups has its own) is an `ups` subcommand."""
    assert set(SUMMARY) - {"preflight"} <= set(COMMANDS)


def test_ups_deploy_refuses_an_unsupported_option_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ups deploy` builds the same request as `fab deploy`: a docker host refuses --save."""
    code = ups_main(
        [
            "deploy",
            "--host",
            "dock",
            "--hosts-file",
            str(_hosts(tmp_path)),
            "--config",
            str(demo_config(tmp_path / "c.yaml")),
            "--save",
            str(tmp_path / "log"),
        ]
    )
    assert code == 2
    assert "--save is not supported by a docker host (dock)" in capsys.readouterr().err


@pytest.mark.slow
def test_fab_and_ups_answer_alike(tmp_path: Path) -> None:
    """`fab status` and `ups status` on a host that refuses the connection exit 3 with the
    same message."""
    hosts = _hosts(tmp_path)
    args = ["status", "--host", "dock", "--hosts-file", str(hosts)]
    fab = subprocess.run([FAB, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    ups = subprocess.run(
        [sys.executable, "-m", "ups", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert fab.returncode == ups.returncode == 3
    error = [line for line in fab.stderr.splitlines() if line.startswith("error:")]
    assert error and error == [
        line for line in ups.stderr.splitlines() if line.startswith("error:")
    ]


@pytest.mark.slow
def test_fab_in_your_own_folder_after_ups_init(tmp_path: Path) -> None:
    """Outside the checkout, `ups init` writes the fabfile `fab` finds: `fab --list` shows
    each description uncut; `fab deploy ... -- ARGS` gives the words to the script as typed
    (the plan shows them), as `ups deploy ... -- ARGS` does; after another task they are
    refused in one paragraph with exit 2, no traceback."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    ups = [sys.executable, "-m", "ups"]
    subprocess.run([*ups, "init"], cwd=project, capture_output=True, timeout=120, check=True)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=120)

    listing = run(FAB, "--list")
    assert listing.returncode == 0, listing.stderr
    flat = " ".join(listing.stdout.split())
    for name, line in SUMMARY.items():
        assert f"{name} {line}" in flat
    entry = {"kind": "container", "host": "127.0.0.1", "port": free_port(), "workdir": "/w"}
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"known_hosts": str(tmp_path / "kh"), "hosts": {"box": entry}}))
    deploy = ["deploy", "--host", "box", "--hosts-file", str(hosts), "--script", "train.py"]
    for front in ([FAB], ups):
        plan = run(*front, *deploy, "--dry-run", "--", "4", "two words")
        assert plan.returncode == 0, plan.stdout + plan.stderr
        assert "script:   --script (train.py 4 'two words')" in plan.stdout
    refused = run(FAB, "status", "--host", "box", "--hosts-file", str(hosts), "--", "4", "2")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.count("\n") == 1 and "--script-args" in refused.stderr
