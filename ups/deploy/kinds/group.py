"""One job on several ``container`` hosts: one torchrun node agent per host.

A composition of the container kind: each node is planned and attached as a container
host; :mod:`ups.deploy.onhost.group` adds the shared run id, the rendezvous and the start order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from ups.deploy.frontend import command
from ups.deploy.hosts import AddressedHost, HostSpec
from ups.deploy.kinds.container import KIND as CONTAINER
from ups.deploy.kinds.container import own
from ups.deploy.onhost import group
from ups.deploy.onhost.plan import DeployPlan, load_run_config
from ups.deploy.request import DeployRequest
from ups.deploy.transport import remote as rc
from ups.deploy.transport.session import Target


@dataclass
class GroupDeploy:
    """One plan per node; :meth:`run` sends the commands :meth:`render` shows."""

    targets: list[Target]
    plans: list[DeployPlan]
    env: dict[str, str]

    def choose_run(self) -> None:
        """Nothing to decide on a host: a multi-host job always names its run."""

    def render(self) -> str:
        return "\n".join(
            t.labelled(p.render()) for t, p in zip(self.targets, self.plans, strict=True)
        )

    def run(self) -> int:
        return group.deploy(self.targets, self.plans, env=self.env)


class Group:
    name = "group"
    supported = frozenset({"run", "overrides", "dry_run", "follow", "skip_preflight"})
    instead = MappingProxyType(
        {
            "workload": "a script runs on one container host so far; deploy it with --host NAME.",
            "fresh": "a job on several hosts always starts a new run unless --run names one. "
            "Leave out --fresh.",
            "sync_wheel": "install the wheel on each host first with "
            f"{command('deploy', '--host NAME --sync-wheel WHEEL --detach')} (one host at a "
            "time), or rebuild the image they run.",
            "save": f"{command('fetch', '--host HOSTS')} brings every node's logs home after "
            "the run.",
        }
    )

    def plan(
        self, request: DeployRequest, specs: Sequence[HostSpec], known_hosts: Path, out: TextIO
    ) -> GroupDeploy:
        targets = [
            Target(spec=own(s), known_hosts=known_hosts, out=out, label=f"[node{i} {s.name}] ")
            for i, s in enumerate(specs)
        ]
        env = dict(os.environ)
        plans = group.plan_group(
            targets,
            request.config,
            cfg=load_run_config(request.config, request.overrides),
            run_id=request.run,
            overrides=list(request.overrides),
            follow_logs=request.follow,
            skip_preflight=request.skip_preflight,
            env=env,
        )
        return GroupDeploy(targets, plans, env)

    def attach(self, spec: HostSpec, run: str | None) -> AddressedHost:
        return CONTAINER.attach(spec, run)

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        return CONTAINER.preflight_command(spec, config)

    def stop_command(self, spec: HostSpec, run: rc.RemoteRun, timeout_s: float) -> str:
        return CONTAINER.stop_command(spec, run, timeout_s)

    def status_command(self, spec: HostSpec, run: rc.RemoteRun) -> str:
        return CONTAINER.status_command(spec, run)

    def down(self, spec: HostSpec, run: str | None, hosts_file: str | None, out: TextIO) -> int:
        return CONTAINER.down(spec, run, hosts_file, out)


KIND = Group()
