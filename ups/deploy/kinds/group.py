"""One job on several ``container`` hosts: one torchrun node agent per host (composition of
the container kind; the plans come from :mod:`ups.deploy.group`)."""

from __future__ import annotations

import os
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from ups.deploy import group
from ups.deploy import remote as rc
from ups.deploy.deploy_plan import load_run_config
from ups.deploy.hosts import HostSpec
from ups.deploy.kinds.container import KIND as CONTAINER
from ups.deploy.request import DeployRequest
from ups.deploy.session import Target


class Group:
    name = "group"
    supported = frozenset({"run", "overrides", "dry_run", "follow", "skip_preflight"})
    instead = MappingProxyType(
        {
            "fresh": "a job on several hosts always starts a new run unless --run names one. "
            "Leave out --fresh.",
            "sync_wheel": "install the wheel on each host first with `fab deploy --host NAME "
            "--sync-wheel WHEEL --detach` (one host at a time), or rebuild the image they run.",
            "save": "`fab fetch --host HOSTS` brings every node's logs home after the run.",
        }
    )

    def deploy(
        self, request: DeployRequest, specs: list[HostSpec], known_hosts: Path, out: TextIO
    ) -> int:
        targets = [
            Target(spec=s, known_hosts=known_hosts, out=out, label=f"[node{i} {s.name}] ")
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
        for t, p in zip(targets, plans, strict=True):
            t.say(p.render())
        return 0 if request.dry_run else group.deploy(targets, plans, env=env)

    def attach(self, spec: HostSpec, run: str | None) -> HostSpec:
        return CONTAINER.attach(spec, run)

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        return CONTAINER.preflight_command(spec, config)

    def stop_command(self, spec: HostSpec, run: rc.RemoteRun, timeout_s: float) -> str:
        return CONTAINER.stop_command(spec, run, timeout_s)


KIND = Group()
