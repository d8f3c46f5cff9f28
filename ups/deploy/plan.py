"""The deploy plan: a plain, printable description of what ``fab deploy`` will do.

Built without touching the network (STYLE §7); ``--dry-run`` prints it, tests inspect
it, and :mod:`ups.deploy.execute` carries it out step by step.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ups import jsonio
from ups.config import load_config
from ups.deploy.hosts import HostSpec
from ups.deploy.remote import RemoteRun, run_script, start_command
from ups.runid import new_run_id

SECRET_NAMES = ("WANDB_API_KEY",)
"""Local environment variables forwarded to the run (values go in a 0600 file, never argv)."""


@dataclass(frozen=True)
class Step:
    name: str
    detail: str
    command: str | None = None
    """Remote shell command, when the step is one (shown by --dry-run)."""


@dataclass
class DeployPlan:
    host: str
    kind: str
    address: str
    image: str
    run_id: str
    config: str
    """Local config file uploaded as the run's config."""
    remote: RemoteRun
    launch_argv: list[str]
    secrets: list[str] = field(default_factory=list)
    """Names (never values) of secrets sent in a 0600 file."""
    follow: bool = True
    steps: list[Step] = field(default_factory=list)

    def to_json(self) -> str:
        data = asdict(self)
        data["remote"]["run_dir"] = self.remote.run_dir
        return jsonio.dumps(data, indent=2)

    def render(self) -> str:
        lines = [
            f"deploy plan: run {self.run_id} on {self.host} ({self.kind}, {self.address})",
            f"  image:    {self.image}",
            f"  config:   {self.config} -> {self.remote.state('config.yaml')}",
            f"  run dir:  {self.remote.run_dir}",
            f"  secrets:  {', '.join(self.secrets) or '(none)'} (0600 file, never on argv)",
            "  steps:",
        ]
        for i, step in enumerate(self.steps, 1):
            lines.append(f"    {i}. {step.name}: {step.detail}")
            if step.command:
                lines.append(f"         $ {step.command}")
        return "\n".join(lines)


def address(spec: HostSpec) -> str:
    user = f"{spec.user}@" if spec.user else ""
    port = f":{spec.port}" if spec.port else ""
    jump = f" via {spec.jump}" if spec.jump else ""
    return f"{user}{spec.host}{port}{jump}"


def build_plan(
    spec: HostSpec,
    config: Path,
    *,
    run_id: str | None = None,
    follow: bool = True,
    skip_preflight: bool = False,
    env: dict[str, str] | None = None,
) -> DeployPlan:
    """Plan a deploy of ``config`` to ``spec`` (reads the config, nothing remote)."""
    cfg = load_config(config, check_files=False)
    run_id = run_id or cfg.run.run_id or new_run_id(cfg.run.name)
    output_dir = cfg.run.output_dir.as_posix()
    remote = RemoteRun(workdir=spec.workdir, run_id=run_id, output_dir=output_dir)
    env = dict(os.environ) if env is None else env
    secrets = [name for name in SECRET_NAMES if env.get(name)]
    remote_config = remote.state("config.yaml")
    if spec.kind == "container":
        launch_argv = [spec.ups_bin, "launch", remote_config, "--run-id", run_id]
        if spec.gpus:
            launch_argv += ["--nproc-per-node", str(spec.gpus)]
        preflight = f"{spec.ups_bin} preflight --config {remote_config}"
        if spec.gpus:
            preflight += f" --gpus {spec.gpus}"
        launch_argv.append("--skip-preflight")
    else:
        raise NotImplementedError("docker kind is planned by ups.deploy.docker_plan")
    steps = [
        Step("connect", f"ssh {address(spec)}, verify host key against the ups known_hosts"),
        Step("check-code", "compare remote ups/torch versions with this checkout's"),
        Step("upload", "config, run script, secrets (0600)"),
    ]
    if not skip_preflight:
        steps.append(Step("preflight", "run preflight remotely; stop on failure", preflight))
    steps.append(Step("start", "start detached under setsid nohup", start_command(remote)))
    if follow:
        steps.append(Step("follow", f"stream {remote.launch_log} until outcome.json appears"))
    plan = DeployPlan(
        host=spec.name,
        kind=spec.kind,
        address=address(spec),
        image=spec.image,
        run_id=run_id,
        config=str(config),
        remote=remote,
        launch_argv=launch_argv,
        secrets=secrets,
        follow=follow,
        steps=steps,
    )
    return plan


def script_for(plan: DeployPlan, remote_env: str | None) -> str:
    return run_script(plan.remote, plan.launch_argv, remote_env)
