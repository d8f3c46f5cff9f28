"""``kind: vast``: ups rents an instance for the run, trains, fetches and ends it."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from ups.deploy import remote as rc
from ups.deploy.errors import UsageError
from ups.deploy.hosts import HostSpec, get_host
from ups.deploy.request import DeployRequest


class Vast:
    name = "vast"
    supported = frozenset({"run", "overrides", "dry_run", "follow", "skip_preflight", "save"})
    instead = MappingProxyType(
        {
            "fresh": "a vast deploy always starts a new run on a new instance unless --run names "
            "one. Leave out --fresh.",
            "sync_wheel": "a vast instance starts from the image: publish a new image, point "
            "`image:` in hosts.yaml at it and deploy again.",
        }
    )

    def deploy(
        self, request: DeployRequest, specs: list[HostSpec], known_hosts: Path, out: TextIO
    ) -> int:
        from ups.deploy.vast import ops  # the Vast SDK only when a vast entry is used

        return ops.deploy(
            specs[0],
            known_hosts,
            request.config,
            out,
            run_id=request.run,
            overrides=request.overrides,
            dry_run=request.dry_run,
            detach=not request.follow,
            skip_preflight=request.skip_preflight,
            mirror=request.save,
            hosts_file=request.hosts_file,
        )

    def attach(self, spec: HostSpec, run: str | None) -> HostSpec:
        from ups.deploy.vast import ops

        # The instance ups rented for this entry (and run), found by its label.
        return ops.attach(spec, run)

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        return rc.argv(*rc.preflight_argv(spec.ups_bin, config, spec.gpus))

    def stop_command(self, spec: HostSpec, run: rc.RemoteRun, timeout_s: float) -> str:
        return rc.stop_command(run)


KIND = Vast()


def entry(host: str, hosts_file: str | None) -> HostSpec:
    """The ``kind: vast`` entry ``host`` (`fab instances` and `fab down` manage its instances)."""
    spec, _known = get_host(host, hosts_file)
    if spec.kind != KIND.name:
        raise UsageError(
            f"host {host!r} is kind {spec.kind}, not vast: `fab instances` and `fab down` "
            "manage Vast instances that ups created. Pass a `kind: vast` entry."
        )
    return spec


def instances(host: str, hosts_file: str | None, out: TextIO, ledger: bool = False) -> int:
    from ups.deploy.vast import ops

    return ops.instances(entry(host, hosts_file), out, ledger)


def down(host: str, run: str | None, hosts_file: str | None, out: TextIO) -> int:
    from ups.deploy.vast import ops

    return ops.down(entry(host, hosts_file), out, run)
