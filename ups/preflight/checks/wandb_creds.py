"""W&B: the mode the run will use and whether credentials exist. The key is never shown."""

from __future__ import annotations

import netrc
from pathlib import Path

from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status

_HOST = "api.wandb.ai"


def credential_source(env: dict[str, str] | None, home: Path) -> str | None:
    """Where a W&B key would come from (``"WANDB_API_KEY"``, ``"~/.netrc"``), or None."""
    if env and env.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    netrc_path = home / ".netrc"
    try:
        if netrc.netrc(str(netrc_path)).authenticators(_HOST):
            return "~/.netrc"
    except (OSError, netrc.NetrcParseError):
        return None
    return None


def run(ctx: Context) -> CheckResult:
    env = dict(ctx.env)
    configured = ctx.cfg.wandb.mode if ctx.cfg else "auto"
    mode = env.get("WANDB_MODE") or configured
    source = credential_source(env, Path(env.get("HOME", str(Path.home()))))
    has = source is not None
    details = {"mode": mode, "config_mode": configured, "credentials": source}
    if mode in {"disabled", "offline", "dryrun"}:
        return CheckResult(
            name="wandb",
            status=Status.PASS,
            message=f"W&B {mode}" + (", sync later with `wandb sync`" * (mode == "offline")),
            value=mode,
            details=details,
        )
    if mode == "online" and not has:
        return CheckResult(
            name="wandb",
            status=Status.FAIL,
            message="W&B mode is online but no credentials are present",
            value=mode,
            hint="export WANDB_API_KEY=... (or `wandb login`), or set wandb.mode=offline",
            details=details,
        )
    if mode == "auto":
        resolved = "online" if has else "offline"
        details["resolved"] = resolved
        return CheckResult(
            name="wandb",
            status=Status.PASS,
            message=f"W&B auto -> {resolved}"
            + (f" (key from {source})" if has else " (no credentials; runs log offline)"),
            value=resolved,
            details=details,
        )
    return CheckResult(
        name="wandb",
        status=Status.PASS,
        message=f"W&B {mode}, key from {source}",
        value=mode,
        details=details,
    )
