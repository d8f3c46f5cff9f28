"""A rented entry (``kind: <provider>``, any provider of the registry
:mod:`ups.deploy.providers`): ups rents an instance for the run, trains, fetches and ends
it, recovering the run across instances and providers (:mod:`ups.deploy.managed`).

The adapter the kinds registry (``ups.deploy.kinds``) finds for every provider's entry; a
provider's SDK is imported only when one of its entries is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, TextIO

from ups.deploy import providers
from ups.deploy.entries import RentedHost
from ups.deploy.errors import UsageError
from ups.deploy.frontend import command
from ups.deploy.hosts import AddressedHost, HostSpec, get_host
from ups.deploy.request import DeployRequest
from ups.deploy.transport import remote as rc

if TYPE_CHECKING:
    from ups.deploy.managed.ops import ManagedDeploy


def own(spec: HostSpec) -> RentedHost:
    """``spec`` as the rented entry the registry chose this kind for."""
    assert isinstance(spec, RentedHost), spec
    return spec


class Rented:
    name = "rented"
    supported = frozenset(
        {"run", "overrides", "dry_run", "follow", "skip_preflight", "save", "workload"}
    )
    instead = MappingProxyType(
        {
            "fresh": "a rented deploy always starts a new run on a new instance unless --run "
            "names one. Leave out --fresh.",
            "sync_wheel": "a rented instance starts from the image: publish a new image, point "
            "`image:` in hosts.yaml at it and deploy again.",
        }
    )

    def plan(
        self, request: DeployRequest, specs: Sequence[HostSpec], known_hosts: Path, out: TextIO
    ) -> ManagedDeploy:
        from ups.deploy.managed import ops

        if request.workload is not None and not request.follow:
            raise UsageError(
                "--detach with --script/--run-file on a rented host: a script's managed run is "
                "supervised by the deploy that follows it (a background supervisor rebuilds "
                "the run from a ups config). Leave out --detach."
            )
        return ops.plan(
            own(specs[0]),
            known_hosts,
            request.config,
            out,
            run_id=request.run,
            overrides=request.overrides,
            follow=request.follow,
            skip_preflight=request.skip_preflight,
            mirror=request.save,
            hosts_file=request.hosts_file,
            workload=request.workload,
        )

    def attach(self, spec: HostSpec, run: str | None) -> AddressedHost:
        from ups.deploy.managed import ops

        # The instance ups rented for this entry (and run), found by its label.
        return ops.attach(own(spec), run)

    def preflight_command(self, spec: HostSpec, config: str | None) -> str:
        return rc.argv(*rc.preflight_argv(spec.ups_bin, config, spec.gpus))

    def stop_command(self, spec: HostSpec, run: rc.RemoteRun, timeout_s: float) -> str:
        return rc.stop_command(run)

    def status_command(self, spec: HostSpec, run: rc.RemoteRun) -> str:
        return rc.status_command(run)

    def down(self, spec: HostSpec, run: str | None, hosts_file: str | None, out: TextIO) -> int:
        from ups.deploy.managed import ops

        return ops.down(own(spec), out, run)


KIND = Rented()


def entry(host: str, hosts_file: str | None) -> RentedHost:
    """The rented entry ``host`` (`fab instances` and `fab down` manage its instances)."""
    spec, _known = get_host(host, hosts_file)
    if not isinstance(spec, RentedHost):
        raise UsageError(
            f"host {host!r} is kind {spec.kind}, not a rented one: {command('instances')} and "
            f"{command('down')} manage the instances ups rented. Pass an entry of kind "
            f"{' or '.join(providers.NAMES)}."
        )
    return spec


def instances(host: str, hosts_file: str | None, out: TextIO, ledger: bool = False) -> int:
    from ups.deploy.managed import ops

    return ops.instances(entry(host, hosts_file), out, ledger)


def down(host: str, run: str | None, hosts_file: str | None, out: TextIO) -> int:
    from ups.deploy.managed import ops

    return ops.down(entry(host, hosts_file), out, run)
