"""Versions: torch, CUDA, cuDNN, NCCL and python at run time vs pins.toml; drift fails."""

from __future__ import annotations

import sys
import tomllib
from typing import Any

from ups.pins import cudnn_string, find_pins, load_pins, matches, versions_for_build
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status

CPU_BUILD = "not available (CPU build of torch)"


def runtime_versions() -> dict[str, str | None]:
    """What this process runs with; None for what this torch build does not have."""
    import torch

    cuda = torch.version.cuda
    versions: dict[str, str | None] = {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}",
        "torch": str(torch.__version__),
        "cuda": cuda,
        "cudnn": None,
        "nccl": None,
    }
    if cuda is not None:
        code = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]  # unannotated in torch
        versions["cudnn"] = cudnn_string(code) if code else None
        if torch.distributed.is_nccl_available():
            nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # unannotated in torch
            versions["nccl"] = ".".join(map(str, nccl))
    return versions


def compare(pins: dict[str, Any], actual: dict[str, str | None]) -> dict[str, dict[str, Any]]:
    """Per component: ``{"pinned", "actual", "status", "reason"}``."""
    out: dict[str, dict[str, Any]] = {}
    for name, pinned in pins.items():
        have = actual.get(name)
        entry: dict[str, Any] = {"pinned": str(pinned), "actual": have}
        if have is None:
            entry.update(status=Status.SKIP.value, reason=CPU_BUILD)
        elif matches(str(pinned), have):
            entry.update(status=Status.PASS.value, reason="matches")
        else:
            entry.update(status=Status.FAIL.value, reason=f"pinned {pinned}, running {have}")
        out[name] = entry
    return out


def run(ctx: Context) -> CheckResult:
    path = find_pins(ctx.opts.pins_path, ctx.env)
    try:
        pins = load_pins(path)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        return CheckResult(
            name="versions",
            status=Status.FAIL,
            message=f"cannot read the pins file {path}: {exc}",
            hint="run from the repo root, or pass --pins PATH (or set UPS_PINS)",
        )
    actual = runtime_versions()
    table = compare(versions_for_build(pins, cuda_build=actual["cuda"] is not None), actual)
    drift = [f"{n}: {e['reason']}" for n, e in table.items() if e["status"] == "fail"]
    skipped = [n for n, e in table.items() if e["status"] == "skip"]
    same = [f"{n} {e['actual']}" for n, e in table.items() if e["status"] == "pass"]
    if drift:
        status, msg = Status.FAIL, "version drift: " + "; ".join(drift)
    else:
        status, msg = Status.PASS, "matches pins: " + ", ".join(same)
        if skipped:
            msg += f"; {'/'.join(skipped)} {CPU_BUILD}"
    return CheckResult(
        name="versions",
        status=status,
        message=msg,
        value=table.get("torch", {}).get("actual"),
        threshold=table.get("torch", {}).get("pinned"),
        hint=None
        if not drift
        else (
            "rebuild or pull the ups image built from pins.toml (`docker compose build`), or "
            f"update {path} if the new versions are intended"
        ),
        details={"pins_file": str(path), "components": table},
    )
