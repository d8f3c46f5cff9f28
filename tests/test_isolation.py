"""No test depends on what another test left on the machine: each fixture makes what it
needs. Checked where it once went wrong: the FAKE Vast's instances start their sshd on a
machine where no other test (and no system sshd) ever made sshd's /run/sshd."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.ssh]

BOOT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.deploy_fixtures import _keygen
    from tests.fake_vast import CLIENT_KEY, FakeVast

    root = Path(sys.argv[1])
    (root / "fake").mkdir()
    (root / "workspace").mkdir()
    _keygen(root / "fake" / CLIENT_KEY)
    print("RUN_SSHD_BEFORE", Path("/run/sshd").exists(), flush=True)
    with FakeVast(root / "fake", root / "workspace", [root / "fake" / CLIENT_KEY]) as fake:
        fake.switches.boot_s = 0
        code, body = fake.create(fake.offers[0]["id"], {"disk": 16})
        assert code == 200, body
        inst = fake.instances[body["new_contract"]]
        deadline = time.monotonic() + 60
        while inst.actual_status != "running" and time.monotonic() < deadline:
            time.sleep(0.2)
        print("STATUS", inst.actual_status, flush=True)
        fake.destroy(inst.id)
    """
)


def test_a_fake_vast_instance_starts_where_no_sshd_ever_ran(tmp_path: Path) -> None:
    """In a mount namespace of its own whose /run is empty (a fresh machine: no system sshd,
    no test's sshd before), the FAKE Vast boots an instance and its sshd answers: the one
    function that starts every test sshd made /run/sshd itself."""
    script = tmp_path / "boot.py"
    script.write_text(BOOT)
    fresh_run = f"mount -t tmpfs tmpfs /run && exec {sys.executable} {script} {tmp_path}"
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", fresh_run],
        capture_output=True, text=True, timeout=180, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    logs = "".join(p.read_text() for p in tmp_path.glob("fake/instances/*/sshd.log"))
    assert "RUN_SSHD_BEFORE False" in proc.stdout, proc.stdout + proc.stderr
    assert "STATUS running" in proc.stdout, proc.stdout + proc.stderr[-3000:] + logs
