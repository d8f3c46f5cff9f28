"""The deploy plan: a plain, printable description of what ``fab deploy`` will do.

Built without touching the network; ``--dry-run`` prints it, tests inspect
it, and :mod:`ups.deploy.onhost.operate` carries it out step by step. Every remote command in
it comes from :mod:`ups.deploy.transport.remote`, and the executor runs exactly those commands.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ups import jsonio
from ups.bucket.credentials import FILE_NAME as CREDENTIALS_FILE
from ups.bucket.credentials import endpoint_from_env
from ups.bucket.scoped import Access
from ups.config import Config, ConfigError, ConfigFileError, load_config
from ups.deploy.entries import AddressedHost
from ups.deploy.errors import UsageError
from ups.deploy.transport import remote as rc
from ups.runid import new_run_id, run_id_problem
from ups.workload import ScriptWorkload

SECRET_NAMES = ("WANDB_API_KEY",)
"""Local environment variables forwarded to the run (values go in a 0600 file, never argv)."""
SECRET_SCOPES = {"WANDB_API_KEY": "your W&B account (every project of it), until you revoke it"}
"""What each forwarded secret opens, for the plan (docs/security.md)."""


@dataclass(frozen=True)
class Step:
    name: str
    detail: str
    command: str | None = None
    """Remote shell command, when the step is one (shown by --dry-run, run as shown)."""


@dataclass(frozen=True)
class Node:
    """This host's place in a job that spans several hosts (one ``ups launch`` per host)."""

    rank: int
    count: int
    rdzv_endpoint: str
    """Node 0's ``address:port``, reachable from every node."""


@dataclass
class DeployPlan:
    host: str
    kind: str
    address: str
    image: str
    run_id: str
    config: str
    """Local config file uploaded as the run's config."""
    remote: rc.RemoteRun
    launch_argv: list[str]
    secrets: list[str] = field(default_factory=list)
    """Names (never values) of secrets sent in a 0600 file."""
    bucket: str | None = None
    """``checkpoint_sync.url``: S3 credentials go to the host as a 0600 file."""
    bucket_access: Access | None = None
    """Which S3 credentials: minted for the run (scoped) or this machine's own."""
    follow: bool = True
    steps: list[Step] = field(default_factory=list)
    resume_name: str | None = None
    """Continue the host's latest unfinished run of this name instead of ``run_id``
    (decided on the host; None with ``--run``, ``run.run_id`` or ``--fresh``)."""
    node: Node | None = None
    run_file: dict[str, Any] | None = None
    """A script run: the run file ``ups launch --run-file`` reads on the host (no secrets;
    the code is synced to its ``workdir`` first). None: the trainer with ``config``."""

    def to_json(self) -> str:
        data = asdict(self)
        data["remote"]["run_dir"] = self.remote.run_dir
        return jsonio.dumps(data, indent=2)

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def has_step(self, name: str) -> bool:
        return any(s.name == name for s in self.steps)

    def render(self) -> str:
        run = f"run {self.run_id}"
        if self.resume_name:
            # Which run is decided on the host, after this plan is shown: say so first, so
            # a continued run is not announced under an id it will not have.
            run = (
                f"the host's latest unfinished {self.resume_name!r} run (found when the host "
                f"is contacted), else new run {self.run_id}"
            )
        node = f", node {self.node.rank} of {self.node.count}" if self.node else ""
        lines = [
            f"deploy plan: {run} on {self.host} ({self.kind}, {self.address}{node})",
            f"  image:    {self.image}",
            f"  config:   {self.config} -> {self.remote.state('config.yaml')}"
            if self.run_file is None
            else f"  script:   {self.config} -> {self.run_file['workdir']}",
            f"  run dir:  {self.remote.run_dir}",
            f"  secrets:  {', '.join(self.secrets) or '(none)'} (0600 file, never on argv)",
        ]
        for name in self.secrets:
            lines.append(f"    {name}: {SECRET_SCOPES.get(name, 'as set here')}")
        if self.bucket:
            lines.append(
                f"  bucket:   {self.bucket} (checkpoints uploaded from the host; S3 credentials "
                "in a 0600 file, never on argv)"
            )
        if self.bucket_access is not None:
            lines.append(f"    {CREDENTIALS_FILE}: {self.bucket_access.describe(time.time())}")
        if self.launch_argv:
            lines.append(f"  launch:   {rc.argv(*self.launch_argv)} (in run.sh)")
        lines.append("  steps:")
        for i, step in enumerate(self.steps, 1):
            lines.append(f"    {i}. {step.name}: {step.detail}")
            if step.command:
                lines.append(f"         $ {step.command}")
        return "\n".join(lines)


def address(spec: AddressedHost) -> str:
    user = f"{spec.user}@" if spec.user else ""
    port = f":{spec.port}" if spec.port else ""
    jump = f" via {spec.jump}" if spec.jump else ""
    return f"{user}{spec.host}{port}{jump}"


def load_run_config(config: Path, overrides: Sequence[str]) -> Config:
    """The run config with ``--set`` overrides; a mistake is a UsageError (exit 2)."""
    try:
        return load_config(config, overrides, check_files=False)
    except ConfigFileError as err:  # the file itself: no key to override yet
        raise UsageError(str(err)) from None
    except ConfigError as err:
        raise UsageError(
            f"{err}\nFrom fab deploy or ups deploy, override a key with `--set KEY=VALUE` "
            "(repeatable, same as `ups launch --set`), e.g. `--set training.max_steps=100`."
        ) from None


def check_run_flag(run_id: str | None, flag: str = "--run") -> None:
    if run_id is not None and (problem := run_id_problem(run_id)):
        raise UsageError(f"{flag}: {problem}.")


def _launch_argv(
    spec: AddressedHost,
    remote_config: str,
    run_id: str,
    sets: list[str],
    node: Node | None,
    skip_preflight: bool,
) -> list[str]:
    """``ups launch`` as the run script starts it on the host."""
    argv = [spec.ups_bin, "launch", remote_config, "--run-id", run_id, *sets]
    if spec.gpus:
        argv += ["--nproc-per-node", str(spec.gpus)]
    if node is not None:
        argv += ["--nnodes", str(node.count), "--node-rank", str(node.rank)]
        argv += ["--rdzv-endpoint", node.rdzv_endpoint]
    # Deploy runs preflight itself (the plan's step) before anything is started.
    if skip_preflight:
        return [*argv, "--skip-preflight"]
    return [*argv, "--preflight-passed-by", "fab deploy"]


def build_plan(
    spec: AddressedHost,
    config: Path,
    *,
    cfg: Config,
    run_id: str | None = None,
    overrides: Sequence[str] = (),
    fresh: bool = False,
    follow: bool = True,
    skip_preflight: bool = False,
    env: dict[str, str] | None = None,
    node: Node | None = None,
) -> DeployPlan:
    """Plan a deploy of ``config`` to a ``container`` host (reads nothing remote)."""
    check_run_flag(run_id)
    fixed = run_id or cfg.run.run_id
    run_id = fixed or new_run_id(cfg.run.name)
    remote = rc.RemoteRun(
        workdir=spec.workdir, run_id=run_id, output_dir=cfg.run.output_dir.as_posix()
    )
    env = dict(os.environ) if env is None else env
    remote_config = remote.state("config.yaml")
    sets = [w for s in overrides for w in ("--set", s)]
    sync = cfg.checkpoint_sync
    bucket, endpoint = sync.url, sync.endpoint_url or endpoint_from_env(env)
    if bucket and sync.endpoint_url is None and endpoint:
        sets += ["--set", f"checkpoint_sync.endpoint_url={endpoint}"]  # the store used here
    access = None
    if bucket:  # on a host of your own, scoped only when asked (a rented host: rental_plan)
        access = Access(
            "scoped" if sync.credentials == "scoped" else "account",
            bucket,
            run_id,
            endpoint_url=endpoint,
            role_arn=sync.role_arn,
            hours=sync.credentials_hours,
            renew_before_s=sync.renew_before_s,
        )
    launch_argv = _launch_argv(spec, remote_config, run_id, sets, node, skip_preflight)
    rdzv_host = node is not None and node.rank == 0
    preflight = rc.preflight_argv(spec.ups_bin, remote_config, spec.gpus, check_port=rdzv_host)
    preflight += sets
    steps = [
        Step("connect", f"ssh {address(spec)}, verify host key against the ups known_hosts"),
        Step(
            "check-code",
            "compare remote ups/torch versions with this checkout's",
            rc.code_info_command(spec.ups_bin),
        ),
        Step("upload", "config, run script, secrets (0600)", rc.mkdir_command(remote.state_dir)),
    ]
    if not skip_preflight:
        steps.append(
            Step(
                "preflight",
                "run preflight remotely; stop on failure",
                rc.in_dir(spec.workdir, rc.argv(*preflight)),
            )
        )
    steps.append(Step("start", "start detached under setsid nohup", rc.start_command(remote)))
    if follow:
        steps.append(Step("follow", f"stream {remote.launch_log} until the launcher exits"))
    return DeployPlan(
        host=spec.name,
        kind="container",
        address=address(spec),
        image=spec.image,
        run_id=run_id,
        config=str(config),
        remote=remote,
        launch_argv=launch_argv,
        secrets=[name for name in SECRET_NAMES if env.get(name)],
        bucket=bucket,
        bucket_access=access,
        follow=follow,
        steps=steps,
        resume_name=None if (fixed or fresh or node) else cfg.run.name,
        node=node,
    )


def build_script_plan(
    spec: AddressedHost,
    workload: ScriptWorkload,
    *,
    run_id: str | None = None,
    fresh: bool = False,
    follow: bool = True,
    skip_preflight: bool = False,
    env: dict[str, str] | None = None,
) -> DeployPlan:
    """Plan a deploy of your own script to a ``container`` host (reads nothing remote):
    sync its workdir, run its setup (cached by content), preflight the host, launch it
    with ``ups launch --run-file``."""
    from ups.deploy.onhost.workdir import code_dir, setup_key, setup_marker

    check_run_flag(run_id)
    env = dict(os.environ) if env is None else env
    fixed = run_id
    run_id = fixed or new_run_id(workload.name)
    remote = rc.RemoteRun(workdir=spec.workdir, run_id=run_id)
    dest = code_dir(spec.workdir, workload)
    run_file = remote.state(rc.RUN_FILE)
    launch_argv = [spec.ups_bin, "launch", "--run-file", run_file, "--run-id", run_id]
    launch_argv += ["--output-dir", remote.output_dir]
    if spec.gpus:
        launch_argv += ["--nproc-per-node", str(spec.gpus)]
    launch_argv += (
        ["--skip-preflight"] if skip_preflight else ["--preflight-passed-by", "fab deploy"]
    )
    steps = [
        Step("connect", f"ssh {address(spec)}, verify host key against the ups known_hosts"),
        Step(
            "check-code",
            "compare remote ups/torch versions with this checkout's",
            rc.code_info_command(spec.ups_bin),
        ),
        Step(
            "sync",
            f"{workload.workdir} -> {dest}: changed files only (.gitignore, include/exclude)",
        ),
    ]
    for command in workload.setup:
        marker = setup_marker(spec.workdir, setup_key(workload, command))
        steps.append(
            Step(
                "setup",
                command,
                rc.setup_command(spec.ups_bin, dest, marker, command),
            )
        )
    if workload.data:
        steps.append(
            Step(
                "check-data",
                "the run file's data paths exist on the host",
                rc.missing_paths_command(dest, workload.data),
            )
        )
    steps.append(
        Step("upload", "run file, run script, secrets (0600)", rc.mkdir_command(remote.state_dir))
    )
    if not skip_preflight:
        preflight = rc.preflight_argv(spec.ups_bin, None, spec.gpus, check_port=False)
        steps.append(
            Step(
                "preflight",
                "run preflight remotely; stop on failure",
                rc.in_dir(spec.workdir, rc.argv(*preflight)),
            )
        )
    steps.append(Step("start", "start detached under setsid nohup", rc.start_command(remote)))
    if follow:
        steps.append(Step("follow", f"stream {remote.launch_log} until the launcher exits"))
    command = rc.argv(str(workload.workdir / workload.script), *workload.args)
    secrets = [n for n in SECRET_NAMES if env.get(n)] + [
        n for n in workload.env if n not in SECRET_NAMES
    ]
    access = None
    if (bucket := workload.checkpoint_sync) is not None:
        # The host uses the store used here; keys as for the trainer (a rented host's are
        # scoped to the run by rental_plan, a host of your own gets this machine's).
        endpoint = workload.sync_endpoint or endpoint_from_env(env)
        workload = dataclasses.replace(workload, sync_endpoint=endpoint)
        access = Access("account", bucket, run_id, endpoint_url=endpoint)
    return DeployPlan(
        host=spec.name,
        kind="container",
        address=address(spec),
        image=spec.image,
        run_id=run_id,
        config=f"{workload.source} ({command})",
        remote=remote,
        launch_argv=launch_argv,
        secrets=secrets,
        bucket=workload.checkpoint_sync,
        bucket_access=access,
        follow=follow,
        steps=steps,
        resume_name=None if (fixed or fresh) else workload.name,
        run_file=workload.for_host(dest),
    )


def script_for(plan: DeployPlan, remote_env: str | None) -> str:
    return rc.run_script(plan.remote, plan.launch_argv, remote_env)
