"""One job on two hosts: `fab deploy --host a,b` over real SSH into two network namespaces.

Each host is its own network namespace with an address that exists only there
(tests/netns_hosts.py); torchrun's static rendezvous and gloo run over real TCP between
them, one `ups launch` node agent (one worker) per host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_fixtures import demo_config, demo_data, fab, link_data
from tests.netns_hosts import NetnsHost, netns_hosts

__all__ = ["demo_data"]

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _hosts_file(tmp_path: Path, hosts: list[NetnsHost]) -> Path:
    data: dict[str, Any] = {
        "known_hosts": str(tmp_path / "known_hosts"),
        "hosts": {f"n{i}": h.entry() for i, h in enumerate(hosts)},
        "groups": {"pair": ["n0", "n1"]},
    }
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _config(tmp_path: Path) -> Path:
    path = demo_config(tmp_path / "demo.yaml", max_steps=12)
    cfg = yaml.safe_load(path.read_text())
    cfg["distributed"]["nproc_per_node"] = 1  # one worker per host: world size 2
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_two_host_job_runs_across_namespaces(demo_data: Path, tmp_path: Path) -> None:
    """`fab deploy --host n0,n1` preflights both hosts, starts one node agent on each with
    node 0's address as rendezvous, streams both logs with a node prefix and ends with
    rank 0's outcome (world size 2) and exit 0; `fab status`/`fab fetch --host pair` act
    on both hosts."""
    with netns_hosts(tmp_path / "net", 2) as hosts:
        for h in hosts:
            link_data(h.ssh.root / "remote", demo_data)
        hosts_file = _hosts_file(tmp_path, hosts)
        result = fab(
            "deploy", "--host", "n0,n1", "--hosts-file", str(hosts_file),
            "--config", str(_config(tmp_path)), "--run", "pair1",
            timeout=480,
        )  # fmt: skip
        out = result.stdout
        assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]
        assert out.count("remote preflight on n") == 2
        assert "[node0 n0] started run pair1" in out and "[node1 n1] started run pair1" in out
        assert f"--rdzv-endpoint {hosts[0].address}:" in out  # node 0's own address
        assert "[node0 n0] run pair1:" in out and "[node1 n1] run pair1:" in out
        last = out.strip().splitlines()[-1]
        assert last.startswith("job pair1 on 2 hosts: exit 0 (node 0 n0: exit 0, node 1 n1: exit")
        assert "rank 0: finished at step" in last

        run0 = hosts[0].ssh.root / "remote" / "runs" / "pair1"
        outcome = json.loads((run0 / "outcome.json").read_text())
        assert outcome["outcome"] == "finished"
        assert outcome["world_size"] == 2
        run1 = hosts[1].ssh.root / "remote" / "runs" / "pair1"
        assert (run1 / "logs" / "launch.log").exists()
        assert not (run1 / "checkpoints").exists() or not list((run1 / "checkpoints").iterdir())

        status = fab("status", "--host", "pair", "--hosts-file", str(hosts_file), timeout=120)
        assert status.returncode == 0, status.stderr
        assert "[node0 n0] run pair1 on n0: not running" in status.stdout
        assert "[node1 n1] run pair1 on n1: not running" in status.stdout

        dest = tmp_path / "fetched"
        fetched = fab(
            "fetch", "--host", "pair", "--hosts-file", str(hosts_file), "--dest", str(dest),
            timeout=120,
        )  # fmt: skip
        assert fetched.returncode == 0, fetched.stderr
        assert json.loads((dest / "n0" / "pair1" / "outcome.json").read_text())["world_size"] == 2
        assert (dest / "n1" / "pair1" / "logs" / "launch.log").exists()


def test_group_preflight_failure_starts_no_host(demo_data: Path, tmp_path: Path) -> None:
    """When one host of the group fails preflight (no data there), the deploy exits 4,
    names that host, and nothing starts on either host."""
    with netns_hosts(tmp_path / "net", 2) as hosts:
        link_data(hosts[0].ssh.root / "remote", demo_data)  # host n1 has no data
        hosts_file = _hosts_file(tmp_path, hosts)
        result = fab(
            "deploy", "--host", "pair", "--hosts-file", str(hosts_file),
            "--config", str(_config(tmp_path)), "--run", "pair2",
            timeout=480,
        )  # fmt: skip
        assert result.returncode == 4, result.stdout[-3000:] + result.stderr[-3000:]
        assert "1 of 2 hosts are not ready; nothing was started" in result.stderr
        assert "[n1] preflight failed on 'n1'" in result.stderr
        assert "started run" not in result.stdout
        for h in hosts:
            assert not (h.ssh.root / "remote" / "runs" / "pair2").exists()
            assert not (h.ssh.root / "remote" / ".ups" / "deploy" / "pair2").exists()
