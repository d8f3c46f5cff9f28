"""``kind: docker``: a machine with a Docker daemon; the image is shipped, compose runs it.

Modules: :mod:`compose` (the plan and its execution), :mod:`commands` (the shell
commands), :mod:`dial` (a Docker SDK client over the verified SSH transport),
:mod:`layers` (shipping only the image layers the remote daemon lacks). The Docker SDK
is imported only when an image is shipped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from ups.deploy import kinds
from ups.deploy.frontend import command
from ups.deploy.hosts import AddressedHost, DockerHost, HostSpec
from ups.deploy.kinds.docker import commands
from ups.deploy.kinds.docker.compose import DockerDeploy, build_docker_plan
from ups.deploy.onhost.plan import DeployPlan, load_run_config
from ups.deploy.request import DeployRequest
from ups.deploy.transport.remote import RemoteRun, status_command
from ups.deploy.transport.session import Target


def own(spec: HostSpec) -> DockerHost:
    """``spec`` as the docker entry the registry chose this kind for."""
    assert isinstance(spec, DockerHost), spec
    return spec


class Docker:
    name = "docker"
    supported = frozenset({"run", "fresh", "dry_run", "follow", "skip_preflight"})
    instead = MappingProxyType(
        {
            "workload": "the image has ups's dependencies only, not your script's. Deploy the "
            "script to an entry of kind: container for the same machine (SSH into the "
            "container), or to kind: vast.",
            "overrides": "the compose services read the uploaded config as it is. Put the change "
            "in the config file and deploy again.",
            "sync_wheel": "a docker host runs the image: rebuild it (scripts/build-images.sh) and "
            "deploy again; only the layers that changed are sent.",
            "save": f"follow the run with {command('logs', '--host NAME --save FILE')}, which "
            "writes the raw log while it streams.",
        }
    )

    def plan(
        self, request: DeployRequest, specs: Sequence[HostSpec], known_hosts: Path, out: TextIO
    ) -> DockerDeploy:
        spec = own(specs[0])
        cfg = load_run_config(request.config, request.overrides)
        env = dict(os.environ)

        def replan(run_id: str | None) -> DeployPlan:
            return build_docker_plan(
                spec,
                request.config,
                cfg=cfg,
                run_id=run_id,
                fresh=request.fresh,
                follow=request.follow,
                skip_preflight=request.skip_preflight,
                env=env,
            )

        target = Target(spec=spec, known_hosts=known_hosts, out=out)
        return DockerDeploy(target, spec, replan(request.run), replan, env)

    def attach(self, spec: HostSpec, run: str | None) -> AddressedHost:
        return own(spec)

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        # The checks must see what the container sees: run them in the image.
        docker = own(spec)
        return commands.docker_preflight_command(
            docker.image, docker.docker_host, docker.gpus, config
        )

    def stop_command(self, spec: HostSpec, run: RemoteRun, timeout_s: float) -> str:
        return commands.docker_stop_command(run, own(spec).docker_host, timeout_s)

    def status_command(self, spec: HostSpec, run: RemoteRun) -> str:
        return status_command(run)

    def down(self, spec: HostSpec, run: str | None, hosts_file: str | None, out: TextIO) -> int:
        raise kinds.no_down(spec)


KIND = Docker()
