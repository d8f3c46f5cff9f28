"""Deploy never imports torch: `fab --list`, `fab status`, `fab deploy --dry-run` answer fast;
nor does `ups launch`'s own process, nor preflight's checks that do not use it.

Each check runs in a fresh interpreter (``python -c``): the test process itself has long
imported torch, so ``sys.modules`` there says nothing.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import ups.deploy
from tests.deploy_fixtures import REPO, demo_config, demo_data, free_port, link_data
from ups.pins import pinned_versions
from ups.preflight.checks import CHECKS

__all__ = ["demo_data"]  # a fixture, used by name below

DEPLOY_MODULES = sorted(
    m.name for m in pkgutil.walk_packages(ups.deploy.__path__, prefix="ups.deploy.")
)


def _torch_free(code: str, *, cwd: Path = REPO) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter, then report whether torch got imported."""
    probe = code + "\nimport json, sys\nprint(json.dumps({'torch': 'torch' in sys.modules}))\n"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_importing_the_fabfile_and_every_deploy_module_imports_no_torch() -> None:
    """The fabfile, the `ups` deploy commands and every module of ups.deploy load without torch."""
    imports = "\n".join(f"import {m}" for m in ["fabfile", "ups.cli", *DEPLOY_MODULES])
    assert _torch_free(imports) == {"torch": False}


@pytest.mark.slow
def test_dry_run_and_status_of_an_unreachable_host_import_no_torch(tmp_path: Path) -> None:
    """`fab deploy --dry-run` plans (config loaded, overrides applied) and `fab status` fails
    on a host that does not answer, both without importing torch."""
    hosts = tmp_path / "hosts.yaml"
    entry = {"host": "127.0.0.1", "port": free_port(), "user": "root", "workdir": "/w"}
    hosts.write_text(yaml.safe_dump({"known_hosts": str(tmp_path / "kh"), "hosts": {"h": entry}}))
    config = demo_config(tmp_path / "c.yaml")
    code = (
        "from ups.deploy import tasks\n"
        "from pathlib import Path\n"
        "from ups.deploy.request import DeployRequest\n"
        f"request = DeployRequest('h', Path({str(config)!r}), hosts_file={str(hosts)!r}, "
        "overrides=('training.max_steps=3',), dry_run=True)\n"
        "assert tasks.guarded(lambda: tasks.deploy(request)) == 0\n"
        f"assert tasks.guarded(lambda: tasks.status('h', hosts_file={str(hosts)!r})) == 3\n"
    )
    assert _torch_free(code) == {"torch": False}


@pytest.mark.slow
def test_launch_and_the_checks_without_torch_import_no_torch(
    demo_data: Path, tmp_path: Path
) -> None:
    """`ups launch` supervises torchrun, whose agent and workers import torch; its own process
    (planning included) does not, nor does `ups-preflight` running every check marked
    ``uses_torch=False``. Each import of torch costs about 1.5 s of CPU."""
    free = free_port()
    link_data(tmp_path, demo_data)
    config = demo_config(tmp_path / "c.yaml")
    light = ",".join(spec.name for spec in CHECKS if not spec.uses_torch)
    assert {"ports", "ulimits", "memory"} <= set(light.split(","))
    code = (
        "import ups.launch.execute, ups.launch.finalize, ups.launch.torchrun\n"
        "from ups.cli import launch\n"
        f"assert launch.main([{str(config)!r}, '--dry-run']) == 0\n"  # plans: counts GPUs
        "from ups.preflight.cli import main\n"
        f"assert main(['--only', {light!r}, '--master-port', '{free}', '--json']) == 0\n"
    )
    assert _torch_free(code, cwd=tmp_path) == {"torch": False}


def test_pins_are_read_through_ups_pins_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$UPS_PINS names the pins file for deploy's remote code check as it does for preflight."""
    pins = tmp_path / "other.toml"
    pins.write_text('[versions]\ntorch = "9.9.9"\n')
    monkeypatch.chdir(tmp_path)
    assert pinned_versions(env={"UPS_PINS": str(pins)}) == {"torch": "9.9.9"}
    assert pinned_versions(env={"UPS_PINS": str(tmp_path / "missing.toml")}) == {}
    monkeypatch.setenv("UPS_PINS", str(pins))
    from ups.deploy.onhost import operate

    assert operate._pinned_torch() == "9.9.9"
