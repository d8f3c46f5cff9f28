"""What the fabfile calls for vast hosts: ``deploy``, ``instances`` and ``down``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

from ups.deploy.errors import DeployError
from ups.deploy.hosts import HostSpec
from ups.deploy.operate import bucket_credentials
from ups.deploy.vast.client import VastApi
from ups.deploy.vast.errors import VastApiError
from ups.deploy.vast.instance import Instance, State, label_for
from ups.deploy.vast.keeper import run
from ups.deploy.vast.rental import Lifecycle, describe_timings
from ups.deploy.vast.rental_plan import build_vast_plan, container_spec


def _watchdog_key(spec: HostSpec) -> str | None:
    if not spec.watchdog_key_file:
        return None
    path = Path(spec.watchdog_key_file).expanduser()
    try:
        return path.read_text().strip() or None
    except OSError as err:
        raise VastApiError(
            f"watchdog_key_file {path} of host {spec.name!r} cannot be read ({err.strerror}). "
            "Save the scoped key there (docs/vast.md) or remove the setting to let the "
            "watchdog use the instance's own key."
        ) from None


def deploy(
    spec: HostSpec,
    known_hosts: Path,
    config: Path,
    out: TextIO,
    *,
    run_id: str | None,
    overrides: tuple[str, ...] = (),
    dry_run: bool,
    detach: bool,
    skip_preflight: bool,
    mirror: Path | None,
) -> int:
    env = dict(os.environ)
    api = VastApi(spec.vast_url)
    watchdog_key = _watchdog_key(spec)  # read before renting: a bad path costs nothing
    plan = build_vast_plan(
        spec,
        config,
        api,
        run_id=run_id,
        overrides=overrides,
        follow=not detach,
        skip_preflight=skip_preflight,
        env=env,
    )
    out.write(plan.render() + "\n")
    out.flush()
    if dry_run:
        return 0
    if plan.deploy.bucket:
        bucket_credentials(plan.deploy.bucket)  # before renting: none found costs nothing
    lifecycle = Lifecycle(api, plan, known_hosts, out)
    code = run(
        lifecycle, env=env, skip_preflight=skip_preflight, watchdog_key=watchdog_key, mirror=mirror
    )
    lifecycle.say(f"vast timings since start: {describe_timings(lifecycle.timings)}")
    return code


def ups_instances(api: VastApi, host: str | None = None) -> list[Instance]:
    """Every instance with a ups label (for ``host`` only when given), reconciled live."""
    found = [Instance.from_api(row) for row in api.list()]
    return [i for i in found if i.run and (host is None or i.run[0] == host)]


def instances(spec: HostSpec, out: TextIO) -> int:
    api = VastApi(spec.vast_url)
    rows = ups_instances(api)
    if not rows:
        out.write("no ups instances on this Vast account\n")
        return 0
    header = f"{'id':>10}  {'state':<8} {'host':<10} {'run':<32} {'$/h':>7} {'cost':>8}  ssh"
    lines = [header]
    total = 0.0
    for inst in rows:
        host, run_id = inst.run or ("?", "?")
        ssh = f"{inst.ssh_host}:{inst.ssh_port}" if inst.ssh_host else "-"
        total += inst.cost_so_far
        lines.append(
            f"{inst.id:>10}  {inst.state.value:<8} {host:<10} {run_id:<32} "
            f"{inst.dph_total:>7.3f} {inst.cost_so_far:>8.2f}  {ssh}"
        )
    lines.append(f"{len(rows)} instance(s), about ${total:.2f} so far ($/h x time since start)")
    out.write("\n".join(lines) + "\n")
    return 0


def down(spec: HostSpec, out: TextIO, run_id: str | None) -> int:
    """Destroy the instances of ``run_id`` (or every one this host entry created)."""
    api = VastApi(spec.vast_url)
    wanted = label_for(spec.name, run_id) if run_id else None
    targets = [i for i in ups_instances(api, spec.name) if wanted is None or i.label == wanted]
    if not targets:
        what = f"run {run_id}" if run_id else f"host {spec.name}"
        out.write(f"no instances for {what}: nothing to destroy\n")
        return 0
    for inst in targets:
        api.destroy(inst.id)
        out.write(
            f"destroyed instance {inst.id} ({inst.label}), about ${inst.cost_so_far:.2f} so far\n"
        )
    return 0


def attach(spec: HostSpec, run_id: str | None) -> HostSpec:
    """The container host a running instance of this entry is (for logs, status, stop, fetch).

    The newest running instance labelled for ``run_id`` (any run when None); its host key
    was recorded when deploy first reached it.
    """
    api = VastApi(spec.vast_url)
    wanted = label_for(spec.name, run_id) if run_id else None
    running = [
        i
        for i in ups_instances(api, spec.name)
        if i.state is State.RUNNING and (wanted is None or i.label == wanted)
    ]
    if not running:
        what = f"run {run_id}" if run_id else f"host {spec.name!r}"
        raise DeployError(
            f"no running Vast instance for {what}: `fab instances` lists what exists; "
            f"`fab deploy --host {spec.name}` rents one."
        )
    inst = min(running, key=lambda i: i.duration_s)
    assert inst.ssh_host and inst.ssh_port
    return container_spec(spec, inst.ssh_host, inst.ssh_port)
