"""The whole ``fab deploy`` on a rented entry: a :class:`~ups.deploy.managed.controller.Keeper` run
under the stop signals, every instance it created ended per ``on_exit`` on every path
(exception, Ctrl-C, SIGTERM, SIGHUP), then the summary printed: instances used,
recoveries, cost, time lost. ``--detach`` rents and starts the run and leaves the
instance to its watchdog (and the run to the background supervisor). A supervisor that
lost its lease (:class:`~ups.deploy.managed.lease.LeaseLost`) ends nothing: the run and its
instance are the new holder's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ups.bucket import Bucket
from ups.deploy.errors import DeployError, PreflightFailed
from ups.deploy.frontend import command
from ups.deploy.managed.acquire import Where, rent
from ups.deploy.managed.controller import Keeper, host_or_user
from ups.deploy.managed.errors import Interrupted
from ups.deploy.managed.lease import LeaseLost
from ups.deploy.managed.lifecycle import Lifecycle, signals_interrupt
from ups.deploy.managed.record import Supervision
from ups.deploy.managed.store import newest_step
from ups.deploy.managed.watch import Leg
from ups.deploy.onhost import operate

__all__ = ["run"]


def run(
    lifecycle: Lifecycle,
    *,
    env: dict[str, str],
    skip_preflight: bool,
    watchdog_keys: Mapping[str, str | None],
    sup: Supervision,
    where: Where,
    bucket: Bucket | None = None,
    mirror: Path | None = None,
) -> int:
    """The whole deploy; ends every instance on every path and returns the run's exit code.

    ``skip_preflight`` is already in the plan; ``mirror`` (``--save``) is kept for a
    detached deploy only: a followed one keeps its log in the local run directory.
    """
    del skip_preflight
    plan = lifecycle.plan
    keeper = Keeper(lifecycle, env, watchdog_keys, sup, where, bucket)
    reason = "run ended"
    code = 1
    try:
        with signals_interrupt():
            if not plan.deploy.follow:
                return _detached(lifecycle, keeper, env, mirror)
            code = keeper.run()
            if bucket is not None and (step := newest_step(bucket, plan.run_id)) is not None:
                sup.bucket_has(step)
            sup.finished(f"exit {code}", code, keeper.outcome)
    except LeaseLost:
        keeper.log.close()
        raise
    except KeyboardInterrupt as exc:
        reason = f"interrupted ({str(exc) or 'Ctrl-C'})"
        problems = _end_all(lifecycle, keeper, reason)
        raise Interrupted(
            f"{reason}: ended the instance per on_exit ({plan.spec.on_exit}) before exiting."
            + (" " + " ".join(problems) if problems else "")
        ) from None
    except BaseException as exc:
        reason = f"deploy failed: {type(exc).__name__}"
        problems = _end_all(lifecycle, keeper, reason)
        if problems and isinstance(exc, DeployError):
            raise type(exc)(f"{exc} Also: {' '.join(problems)}") from None
        raise
    problems = _end_all(lifecycle, keeper, reason)
    if problems:
        raise DeployError(" ".join(problems))
    return code


def _end_all(lifecycle: Lifecycle, keeper: Keeper, reason: str) -> list[str]:
    keeper.log.close()
    problems = lifecycle.teardown(reason)
    if lifecycle.plan.spec.on_exit != "keep":
        for instance_id in lifecycle.created:
            keeper.sup.instance_ended(instance_id, reason)
    if keeper.legs:
        lifecycle.say(keeper.summary())
    return problems


def _detached(
    lifecycle: Lifecycle, keeper: Keeper, env: dict[str, str], mirror: Path | None
) -> int:
    """``--detach``: start the run and leave the instance to its watchdog."""

    def start(instance_id: str) -> tuple[Leg, int]:
        leg = keeper.leg(instance_id)
        target = keeper.boot(leg)
        try:
            code = operate.deploy(
                target,
                keeper.plan_on(target),
                env=env,
                replan=lambda run_id: lifecycle.plan.replan(target.spec, run_id),
                mirror=mirror,
                workload=lifecycle.plan.workload,
            )
        except PreflightFailed as err:
            raise host_or_user(err) from None
        return leg, code

    leg, code = rent(lifecycle, start, keeper.where)
    plan = lifecycle.plan
    lifecycle.created.clear()  # detached: the watchdog owns the instance now
    keeper.legs.clear()
    lifecycle.say(
        f"instance {leg.instance_id} keeps running detached; its watchdog ends it at "
        f"max_hours. {command('down', '--host', plan.spec.name, '--run', plan.run_id)} ends "
        "it now."
    )
    return code
