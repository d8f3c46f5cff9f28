"""One job on several hosts: one ``ups launch`` node agent per host, torchrun does the rest.

Node order is the order of ``--host a,b`` (or of the group in hosts.yaml); node 0 hosts
the static rendezvous on ``distributed.master_port`` at its ``rdzv_address`` (default:
its ``host``), so global rank 0, outcome.json and checkpoints live on node 0. Every host
is prepared and preflighted before any is started; failures on several hosts are
reported together. Logs of all nodes are followed at once, each line prefixed with its
node; the job ends with node 0's outcome and the worst exit code of all nodes.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fabric import Connection

from ups.config import Config
from ups.deploy.errors import DeployError
from ups.deploy.frontend import command
from ups.deploy.onhost import operate
from ups.deploy.onhost.fetch import fetch as fetch_one
from ups.deploy.onhost.follow import follow
from ups.deploy.onhost.plan import DeployPlan, Node, build_plan
from ups.deploy.onhost.runs import read_result
from ups.deploy.transport.session import Target
from ups.outcome import EXIT_OK, EXIT_PREEMPTED
from ups.runid import new_run_id


@dataclass
class Member:
    target: Target
    plan: DeployPlan
    conn: Connection | None = None
    offset: int = 0


def _endpoint(first: Target, cfg: Config) -> str:
    address = first.spec.rdzv_address or first.spec.host
    return f"{address}:{cfg.distributed.master_port}"


def plan_group(
    targets: list[Target],
    config: Path,
    *,
    cfg: Config,
    run_id: str | None,
    overrides: list[str],
    follow_logs: bool,
    skip_preflight: bool,
    env: dict[str, str],
) -> list[DeployPlan]:
    """One plan per host, all with the same run id and node 0's rendezvous endpoint
    (every host is a container host: the registry, ``ups.deploy.kinds``, sees to that)."""
    shared = run_id or cfg.run.run_id or new_run_id(cfg.run.name)
    endpoint = _endpoint(targets[0], cfg)
    return [
        build_plan(
            t.spec,
            config,
            cfg=cfg,
            run_id=shared,
            overrides=overrides,
            follow=follow_logs,
            skip_preflight=skip_preflight,
            env=env,
            node=Node(rank=i, count=len(targets), rdzv_endpoint=endpoint),
        )
        for i, t in enumerate(targets)
    ]


def deploy(targets: list[Target], plans: list[DeployPlan], *, env: dict[str, str]) -> int:
    """Prepare every host, start node 0 first and then the others, follow all of them."""
    members = [Member(t, p) for t, p in zip(targets, plans, strict=True)]
    try:
        _prepare_all(members, env)
        for m in members:
            assert m.conn is not None
            operate.launch(m.target, m.conn, m.plan)
    finally:
        for m in members:
            if m.conn is not None:
                m.conn.close()
    head = members[0].plan
    hosts = [m.plan.host for m in members]
    job = dataclasses.replace(members[0].target, label="")  # the job's lines, no node prefix
    if not head.follow:
        job.say(
            f"follow it with: {command('logs', '--host', ','.join(hosts), '--run', head.run_id)}"
        )
        return 0
    codes = run_all(
        [m.target for m in members],
        lambda i: follow(members[i].target, members[i].plan.remote, offset=members[i].offset),
    )
    return summarize(job, head.run_id, hosts, codes, _rank0_outcome(members[0]))


def _rank0_outcome(head: Member) -> str:
    """Global rank 0's outcome (node 0's outcome.json), for the job's last line."""
    target = head.target
    try:
        conn = target.connect()
    except DeployError as err:
        return f"rank 0's outcome unknown ({err})"
    try:
        _code, outcome = read_result(conn, head.plan.remote, target.spec)
    finally:
        conn.close()
    if outcome is None:
        return "rank 0 wrote no outcome.json"
    return f"rank 0: {outcome.outcome}{outcome.at_step}: {outcome.reason}"


def _prepare_all(members: list[Member], env: dict[str, str]) -> None:
    errors: list[tuple[str, DeployError]] = []
    for m in members:
        try:
            m.conn = m.target.connect()
            m.plan, m.offset = operate.prepare(m.target, m.conn, m.plan, env=env, replan=_no_replan)
        except DeployError as err:
            errors.append((m.target.spec.name, err))
    if not errors:
        return
    for m in members:  # nothing starts unless every host is fit
        if m.conn is not None and m.offset == 0 and not any(n == m.plan.host for n, _ in errors):
            operate.discard(m.target, m.conn, m.plan)
    code = max(err.exit_code for _, err in errors)
    text = " ".join(f"[{name}] {err}" for name, err in errors)
    failed = DeployError(
        f"{len(errors)} of {len(members)} hosts are not ready; nothing was started. {text}"
    )
    failed.exit_code = code
    raise failed


def _no_replan(run_id: str) -> DeployPlan:
    raise AssertionError("a multi-host plan always carries its run id")  # resume_name is None


def run_all(targets: list[Target], fn: Callable[[int], int]) -> list[int]:
    """Run ``fn(i)`` for every host at once; a host whose task raises shows its error
    (prefixed with the node) and counts with that error's exit code."""
    codes = [0] * len(targets)

    def one(i: int) -> None:
        try:
            codes[i] = fn(i)
        except DeployError as err:
            targets[i].say(f"error: {err}")
            codes[i] = err.exit_code

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def worst(codes: list[int]) -> int:
    """The exit code that says most: a failure over a preemption over success."""
    failures = [c for c in codes if c not in (EXIT_OK, EXIT_PREEMPTED)]
    if failures:
        return failures[0]
    return EXIT_PREEMPTED if EXIT_PREEMPTED in codes else EXIT_OK


def summarize(out: Target, run_id: str, hosts: list[str], codes: list[int], rank0: str) -> int:
    """The job's last line: the worst exit code, each node's, and rank 0's outcome."""
    code = worst(codes)
    per_node = ", ".join(
        f"node {i} {h}: exit {c}" for i, (h, c) in enumerate(zip(hosts, codes, strict=True))
    )
    out.say(f"job {run_id} on {len(hosts)} hosts: exit {code} ({per_node}); {rank0}")
    return code


def fetch(targets: list[Target], run_id: str | None, dest: Path) -> int:
    """Fetch every node's run directory into ``dest/<host>/<run id>``."""
    codes = [fetch_one(t, run_id, dest / t.spec.name) for t in targets]
    return worst(codes)
