"""Every deploy option is honoured by the chosen host kind or refused before any contact.

Pure logic: the hosts below point at a loopback port nobody listens on (and a Vast API
URL there), so a deploy that got past the refusal would fail with exit 3, not 2.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_fixtures import demo_config, free_port
from ups.deploy import kinds, tasks
from ups.deploy.errors import EXIT_USAGE, UsageError
from ups.deploy.kinds import refuse_unsupported
from ups.deploy.request import OPTIONS, DeployRequest
from ups.workload import ScriptWorkload

# A value other than the default for every option.
SET: dict[str, Any] = {
    "run": "r1",
    "overrides": ("training.max_steps=3",),
    "fresh": True,
    "dry_run": True,
    "follow": False,
    "skip_preflight": True,
    "sync_wheel": Path("dist/ups-0.1.0-py3-none-any.whl"),
    "save": Path("remote.log"),
    "workload": ScriptWorkload(script="train.py", workdir=Path("examples/ddp")),
}


def test_every_request_field_is_an_option_or_says_where() -> None:
    """No field of the request escapes the option table (and so the per-kind check)."""
    names = {f.name for f in fields(DeployRequest)}
    assert names == set(OPTIONS) | {"host", "config", "hosts_file"}
    assert set(SET) == set(OPTIONS)
    for name in kinds.NAMES:
        kind = kinds.get(name)
        assert kind.name == name and kind.supported <= set(OPTIONS)
        assert set(kind.instead) <= set(OPTIONS) - kind.supported


@pytest.mark.parametrize("name", kinds.NAMES)
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_each_option_is_honoured_or_refused_by_each_kind(name: str, option: str) -> None:
    """A supported option passes; any other is refused naming the flag, the kind and the fix."""
    kind = kinds.get(name)
    base = DeployRequest(host="h")
    request = replace(base, **{option: SET[option]})
    if option in kind.supported:
        refuse_unsupported(request, kind, "h")
        return
    with pytest.raises(UsageError) as err:
        refuse_unsupported(request, kind, "h")
    text = str(err.value)
    assert err.value.exit_code == EXIT_USAGE
    assert text.startswith(f"{OPTIONS[option]} is not supported by a {name} host (h): ")
    assert len(text.split(": ", 1)[1]) > 20  # what to do instead


def test_contradictory_flags_are_refused_by_the_request() -> None:
    with pytest.raises(UsageError, match="--fresh starts a new run and --run names one"):
        DeployRequest(host="h", run="r1", fresh=True)
    with pytest.raises(UsageError, match="--run: "):
        DeployRequest(host="h", run="../x")


def _hosts(tmp_path: Path) -> Path:
    down = {"host": "127.0.0.1", "port": free_port(), "user": "root", "workdir": "/w"}
    vast = {
        "kind": "vast",
        "offer": "num_gpus=1",
        "max_price_per_hour": 1.0,
        "vast_url": f"http://127.0.0.1:{free_port()}",
    }
    hosts = {
        "known_hosts": str(tmp_path / "kh"),
        "hosts": {"box": down, "box2": down, "dock": {**down, "kind": "docker"}, "vast": vast},
        "groups": {"pair": ["box", "box2"]},
    }
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(hosts))
    return path


@pytest.mark.parametrize(
    ("host", "kind", "option"),
    [("dock", "docker", "sync_wheel"), ("vast", "rented", "fresh"), ("pair", "group", "save")],
)
def test_deploy_refuses_before_contacting_anything(
    tmp_path: Path, host: str, kind: str, option: str
) -> None:
    """The refusal comes from tasks.deploy before any connection or API call (exit 2)."""
    request = DeployRequest(
        host=host,
        config=demo_config(tmp_path / "c.yaml"),
        hosts_file=str(_hosts(tmp_path)),
        **{option: SET[option]},
    )
    with pytest.raises(UsageError, match=rf"^{OPTIONS[option]} is not supported by a {kind}"):
        tasks.deploy(request)
