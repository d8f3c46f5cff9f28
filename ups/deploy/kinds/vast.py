"""``kind: vast``: ups rents an instance for the run, trains, fetches and ends it.

The adapter the registry (``ups.deploy.kinds``) finds; the Vast SDK is imported only
when a vast entry is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, TextIO

from ups.deploy import kinds
from ups.deploy.errors import UsageError
from ups.deploy.frontend import command
from ups.deploy.hosts import AddressedHost, HostSpec, VastHost, get_host
from ups.deploy.request import DeployRequest
from ups.deploy.transport import remote as rc

if TYPE_CHECKING:
    from ups.deploy.managed.ops import VastDeploy


def own(spec: HostSpec) -> VastHost:
    """``spec`` as the vast entry the registry chose this kind for."""
    assert isinstance(spec, VastHost), spec
    return spec


class Vast:
    name = "vast"
    supported = frozenset(
        {"run", "overrides", "dry_run", "follow", "skip_preflight", "save", "workload"}
    )
    instead = MappingProxyType(
        {
            "fresh": "a vast deploy always starts a new run on a new instance unless --run names "
            "one. Leave out --fresh.",
            "sync_wheel": "a vast instance starts from the image: publish a new image, point "
            "`image:` in hosts.yaml at it and deploy again.",
        }
    )

    def plan(
        self, request: DeployRequest, specs: Sequence[HostSpec], known_hosts: Path, out: TextIO
    ) -> VastDeploy:
        from ups.deploy.managed import ops

        if request.workload is not None and not request.follow:
            raise UsageError(
                "--detach with --script/--run-file on a vast host: a script's managed run is "
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


KIND = Vast()


def entry(host: str, hosts_file: str | None) -> VastHost:
    """The ``kind: vast`` entry ``host`` (`fab instances` and `fab down` manage its instances)."""
    spec, _known = get_host(host, hosts_file)
    if not isinstance(spec, VastHost):
        raise UsageError(
            f"host {host!r} is kind {kinds.of(spec).name}, not vast: {command('instances')} "
            f"and {command('down')} manage Vast instances that ups created. Pass a `kind: vast` "
            "entry."
        )
    return spec


def instances(host: str, hosts_file: str | None, out: TextIO, ledger: bool = False) -> int:
    from ups.deploy.managed import ops

    return ops.instances(entry(host, hosts_file), out, ledger)


def down(host: str, run: str | None, hosts_file: str | None, out: TextIO) -> int:
    from ups.deploy.managed import ops

    return ops.down(entry(host, hosts_file), out, run)
