"""``kind: container``: the host runs the ups image itself; ups and torchrun run over SSH."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from ups.deploy import operate
from ups.deploy import remote as rc
from ups.deploy.deploy_plan import DeployPlan, build_plan, load_run_config
from ups.deploy.hosts import HostSpec
from ups.deploy.request import OPTIONS, DeployRequest
from ups.deploy.session import Target


class Container:
    name = "container"
    supported = frozenset(OPTIONS)
    instead: Mapping[str, str] = MappingProxyType({})

    def deploy(
        self, request: DeployRequest, specs: list[HostSpec], known_hosts: Path, out: TextIO
    ) -> int:
        target = Target(spec=specs[0], known_hosts=known_hosts, out=out)
        cfg = load_run_config(request.config, request.overrides)
        env = dict(os.environ)

        def replan(run_id: str | None) -> DeployPlan:
            return build_plan(
                target.spec,
                request.config,
                cfg=cfg,
                run_id=run_id,
                overrides=request.overrides,
                fresh=request.fresh,
                follow=request.follow,
                skip_preflight=request.skip_preflight,
                env=env,
            )

        plan = replan(request.run)
        target.say(plan.render())
        if request.dry_run:
            return 0
        return operate.deploy(
            target, plan, env=env, replan=replan, sync=request.sync_wheel, mirror=request.save
        )

    def attach(self, spec: HostSpec, run: str | None) -> HostSpec:
        return spec

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        return rc.argv(*rc.preflight_argv(spec.ups_bin, config, spec.gpus))

    def stop_command(self, spec: HostSpec, run: rc.RemoteRun, timeout_s: float) -> str:
        return rc.stop_command(run)


KIND = Container()
