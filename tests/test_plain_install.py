"""`pip install ups` with no extras, into a fresh virtualenv, runs everything.

The dev extras bring along packages that ups imports without declaring (pathspec was one:
`ups deploy --help` and `fab --list` failed on a plain install), and CI always has them.
So this test builds ups's wheel, installs it alone (torch first, from this machine's local
CPU wheel, so no CUDA build is ever pulled; then the wheel, whose declared dependencies
are resolved from the index) and, from folders outside the checkout, runs each console
entry point, imports every module of ups, makes a project with `ups init` (`fab --list`
there), and launches a 2-rank script of its own to the end with `ups launch --script`,
whose preflight reads the pins file the wheel carries.

uv installs (it is a dev dependency): it resolves the same packages as pip (checked: the
same names and versions) in about 15 s where pip took over 4 minutes on this machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.deploy_fixtures import REPO, free_port

pytestmark = pytest.mark.slow

UV = str(Path(sys.executable).with_name("uv"))
SCRIPT = '''\
"""Two gloo ranks sum a value per step; rank 0 prints the total."""
import sys

import torch
import torch.distributed as dist

steps, scale = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
total = 0.0
for _ in range(steps):
    value = torch.tensor([float(dist.get_rank() + 1) * scale])
    dist.all_reduce(value)
    total += value.item()
if dist.get_rank() == 0:
    print(f"plain install: {steps} steps, total {total:.0f}")
dist.destroy_process_group()
'''
IMPORT_ALL = """\
import importlib, pkgutil, ups
names = [m.name for m in pkgutil.walk_packages(ups.__path__, "ups.")
         if not m.name.endswith(".__main__")]
for name in names:
    importlib.import_module(name)
print(len(names), ups.__file__)
"""


def _run(*args: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _local_torch_links() -> list[str]:
    """Where this machine keeps the CPU torch wheel: pip's ``find-links`` (its config or
    ``$PIP_FIND_LINKS``), which `make venv` relies on too; uv does not read pip's config."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    links = {
        link
        for key, _, value in (line.partition("=") for line in listed.splitlines())
        if key.endswith(".find-links")
        for link in value.strip("'\"").split()
    }
    assert links, f"pip has no find-links here, so no local CPU torch wheel:\n{listed}"
    return sorted(links)


def _wheel(tmp_path: Path) -> Path:
    """Build ups's wheel from a copy of what it is made of (the build writes build/ and
    an egg-info beside its sources; the checkout stays clean). Symlinks stay links, as
    in the checkout: ups/pins.toml is one."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "pins.toml"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(
        REPO / "ups", src / "ups", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = tmp_path / "dist"
    _run(UV, "build", "-q", "--wheel", "--no-build-isolation", "--python", sys.executable,
         "-o", str(dist), str(src), cwd=tmp_path, env=dict(os.environ))  # fmt: skip
    (wheel,) = dist.glob("ups-*.whl")
    return wheel


def test_a_plain_install_runs_every_entry_point_module_and_a_two_rank_script(
    tmp_path: Path,
) -> None:
    """Installed with no extras into a fresh venv and run from folders outside the checkout:
    `ups`, `ups-train`, `ups-preflight` and `ups deploy` answer --help, every module of
    ups imports, `ups init` then `fab --list` show the tasks, and `ups launch --script`
    runs two ranks to `finished` with preflight's versions check passing on the pins file
    inside the installed package."""
    started = time.monotonic()
    wheel = _wheel(tmp_path)
    venv = tmp_path / "venv"
    # Without PYTHONDONTWRITEBYTECODE (set here and in CI): the first process to import a
    # module writes its bytecode into the venv, as in a user's install, and every later one
    # (the ranks, the agent, preflight) reads it instead of compiling torch again (~3 CPU-s
    # a process).
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
    base_env = {k: v for k, v in os.environ.items() if k not in dropped}
    _run(UV, "venv", "-q", "--python", sys.executable, str(venv), cwd=tmp_path, env=base_env)
    python = str(venv / "bin" / "python")
    links = [arg for link in _local_torch_links() for arg in ("--find-links", link)]
    # torch alone and only from the local wheel (no index: a CUDA build can never come),
    # then the wheel: its declared dependencies, torch's own included, from the index.
    _run(UV, "pip", "install", "-q", "--python", python, "--no-deps", "--no-index", *links,
         "torch==2.13.0", cwd=tmp_path, env=base_env)  # fmt: skip
    _run(UV, "pip", "install", "-q", "--python", python, str(wheel), cwd=tmp_path, env=base_env)
    installed = time.monotonic()

    env = {**base_env, "PATH": f"{venv / 'bin'}{os.pathsep}{base_env.get('PATH', '')}"}
    env["UPS_STATE_DIR"] = str(tmp_path / "state")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for command in (["ups", "--help"], ["ups-train", "--help"], ["ups-preflight", "--help"],
                    ["ups", "deploy", "--help"]):  # fmt: skip
        assert "usage:" in _run(*command, cwd=outside, env=env)
    count, where = _run(python, "-c", IMPORT_ALL, cwd=outside, env=env).split()
    assert int(count) > 150 and Path(where).is_relative_to(venv)  # the wheel's, not the tree's
    pins = Path(where).parent / "pins.toml"
    assert not pins.is_symlink() and pins.read_text() == (REPO / "pins.toml").read_text()

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT)
    _run("ups", "init", cwd=project, env=env)
    listing = _run("fab", "--list", cwd=project, env=env)
    assert all(f"  {task} " in listing for task in ("deploy", "logs", "status", "stop"))
    port = str(free_port())
    launched = _run("ups", "launch", "--script", "train.py", "--master-port", port,
                    "--preflight-skip", "allreduce", "--log-format", "json", "--", "4", "2",
                    cwd=project, env=env, timeout=600)  # fmt: skip
    assert "plain install: 4 steps, total 24" in launched
    events = [json.loads(line) for line in launched.splitlines() if line.startswith("{")]
    (versions,) = [e for e in events if e.get("check") == "versions"]
    assert versions["status"] == "pass", versions
    (ended,) = [e for e in events if e.get("event") == "run_ended"]
    assert ended["outcome"] == "finished" and ended["exit_code"] == 0
    print(
        f"plain install: wheel + venv + install {installed - started:.1f} s, "
        f"checks and the 2-rank run {time.monotonic() - installed:.1f} s"
    )
