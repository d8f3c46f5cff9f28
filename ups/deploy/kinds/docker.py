"""``kind: docker``: a machine with a Docker daemon; the image is shipped, compose runs it."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from ups.deploy import remote as rc
from ups.deploy.deploy_plan import load_run_config
from ups.deploy.hosts import HostSpec
from ups.deploy.request import DeployRequest
from ups.deploy.session import Target


class Docker:
    name = "docker"
    supported = frozenset({"run", "fresh", "dry_run", "follow", "skip_preflight"})
    instead = MappingProxyType(
        {
            "overrides": "the compose services read the uploaded config as it is. Put the change "
            "in the config file and deploy again.",
            "sync_wheel": "a docker host runs the image: rebuild it (scripts/build-images.sh) and "
            "deploy again; only the layers that changed are sent.",
            "save": "follow the run with `fab logs --host NAME --save FILE`, which writes the raw "
            "log while it streams.",
        }
    )

    def deploy(
        self, request: DeployRequest, specs: list[HostSpec], known_hosts: Path, out: TextIO
    ) -> int:
        from ups.deploy import docker_kind  # the Docker SDK only when a docker host is used

        return docker_kind.deploy(
            Target(spec=specs[0], known_hosts=known_hosts, out=out),
            request.config,
            cfg=load_run_config(request.config, request.overrides),
            run_id=request.run,
            fresh=request.fresh,
            dry_run=request.dry_run,
            detach=not request.follow,
            skip_preflight=request.skip_preflight,
        )

    def attach(self, spec: HostSpec, run: str | None) -> HostSpec:
        return spec

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        # The checks must see what the container sees: run them in the image.
        return rc.docker_preflight_command(spec.image, spec.docker_host, spec.gpus, config)

    def stop_command(self, spec: HostSpec, run: rc.RemoteRun, timeout_s: float) -> str:
        return rc.docker_stop_command(run, spec.docker_host, timeout_s)


KIND = Docker()
