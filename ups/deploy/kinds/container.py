"""``kind: container``: the host runs the ups image itself; ups and torchrun run over SSH."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from ups.deploy import kinds
from ups.deploy.hosts import AddressedHost, ContainerHost, HostSpec
from ups.deploy.onhost import operate
from ups.deploy.onhost.plan import DeployPlan, build_plan, build_script_plan, load_run_config
from ups.deploy.onhost.runs import choose_run
from ups.deploy.request import OPTIONS, DeployRequest
from ups.deploy.transport import remote as rc
from ups.deploy.transport.session import Target
from ups.workload import ScriptWorkload


@dataclass
class ContainerDeploy:
    """The plan of one container deploy; :meth:`run` sends the commands it shows."""

    target: Target
    plan: DeployPlan
    replan: Callable[[str | None], DeployPlan]
    """The same plan for the run found on the host (a continued run keeps its id)."""
    env: dict[str, str]
    sync: Path | None = None
    mirror: Path | None = None
    workload: ScriptWorkload | None = None

    def choose_run(self) -> None:
        self.plan = choose_run(self.target, self.plan, self.replan)

    def render(self) -> str:
        return self.target.labelled(self.plan.render())

    def run(self) -> int:
        return operate.deploy(
            self.target,
            self.plan,
            env=self.env,
            replan=self.replan,
            sync=self.sync,
            mirror=self.mirror,
            workload=self.workload,
        )


def own(spec: HostSpec) -> ContainerHost:
    """``spec`` as the container entry the registry chose this kind for."""
    assert isinstance(spec, ContainerHost), spec
    return spec


class Container:
    name = "container"
    supported = frozenset(OPTIONS)
    instead: Mapping[str, str] = MappingProxyType({})

    def plan(
        self, request: DeployRequest, specs: Sequence[HostSpec], known_hosts: Path, out: TextIO
    ) -> ContainerDeploy:
        target = Target(spec=own(specs[0]), known_hosts=known_hosts, out=out)
        if request.workload is not None:
            return self._plan_script(request, request.workload, target)
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

        return ContainerDeploy(
            target, replan(request.run), replan, env, request.sync_wheel, request.save
        )

    def _plan_script(
        self, request: DeployRequest, workload: ScriptWorkload, target: Target
    ) -> ContainerDeploy:
        # The run file's secrets (env_file values too) join the values upload() sends.
        env = {**os.environ, **workload.secrets(os.environ)}

        def replan(run_id: str | None) -> DeployPlan:
            return build_script_plan(
                target.spec,
                workload,
                run_id=run_id,
                fresh=request.fresh,
                follow=request.follow,
                skip_preflight=request.skip_preflight,
                env=env,
            )

        return ContainerDeploy(
            target, replan(request.run), replan, env, request.sync_wheel, request.save, workload
        )

    def attach(self, spec: HostSpec, run: str | None) -> AddressedHost:
        return own(spec)

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        return rc.argv(*rc.preflight_argv(spec.ups_bin, config, spec.gpus))

    def stop_command(self, spec: HostSpec, run: rc.RemoteRun, timeout_s: float) -> str:
        return rc.stop_command(run)

    def status_command(self, spec: HostSpec, run: rc.RemoteRun) -> str:
        return rc.status_command(run)

    def down(self, spec: HostSpec, run: str | None, hosts_file: str | None, out: TextIO) -> int:
        raise kinds.no_down(spec)


KIND = Container()
