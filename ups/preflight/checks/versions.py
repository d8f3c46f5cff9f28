"""Versions: torch, CUDA, cuDNN, NCCL and python at run time vs pins.toml.

The pins are the one release the image is built with and CI tests; ups runs on any torch in
its supported range (``ups.torchcompat.SUPPORTED_TORCH``). So a torch outside the range
fails (with the install that fixes it); a difference from the pins inside the range warns,
naming both (``--strict`` makes that fail, for a host that must match the image exactly).
"""

from __future__ import annotations

import sys
import tomllib
from typing import Any

from ups.pins import cudnn_string, find_pins, load_pins, matches, versions_for_build
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status
from ups.torchcompat import in_supported_range, supported_range_text

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
    """Per component: ``{"pinned", "actual", "status", "reason"}``. A difference warns; only
    a torch outside the supported range fails."""
    out: dict[str, dict[str, Any]] = {}
    for name, pinned in pins.items():
        have = actual.get(name)
        entry: dict[str, Any] = {"pinned": str(pinned), "actual": have}
        if have is None:
            entry.update(status=Status.SKIP.value, reason=CPU_BUILD)
        elif matches(str(pinned), have):
            entry.update(status=Status.PASS.value, reason="matches")
        elif name == "torch" and not in_supported_range(have):
            entry.update(
                status=Status.FAIL.value,
                reason=f"running {have}, outside ups's supported range torch"
                f"{supported_range_text()} (pinned {pinned})",
            )
        else:
            entry.update(status=Status.WARN.value, reason=f"pinned {pinned}, running {have}")
        out[name] = entry
    return out


def judge(pins: dict[str, Any], actual: dict[str, str | None], path: str) -> CheckResult:
    """The check's row from the pins that apply to this build and what is running."""
    table = compare(pins, actual)
    failed = [f"{n}: {e['reason']}" for n, e in table.items() if e["status"] == "fail"]
    drift = [f"{n}: {e['reason']}" for n, e in table.items() if e["status"] == "warn"]
    skipped = [n for n, e in table.items() if e["status"] == "skip"]
    same = [f"{n} {e['actual']}" for n, e in table.items() if e["status"] == "pass"]
    pinned_torch = table.get("torch", {}).get("pinned")
    hint = None
    if failed:
        status, msg = Status.FAIL, "; ".join(failed + drift)
        hint = (
            f"install a supported torch into this environment: pip install 'torch=={pinned_torch}' "
            f"(the pinned release), or any torch{supported_range_text()}; or use the ups image "
            "(`docker compose build`)"
        )
    elif drift:
        status = Status.WARN
        msg = (
            "differs from pins.toml (the image's tested versions): "
            + "; ".join(drift)
            + f"; torch inside ups's supported range {supported_range_text()}, so ups runs"
        )
        hint = (
            "nothing to do unless this host must match the image: then use the ups image "
            f"built from pins.toml (`docker compose build`), or update {path} if the new "
            "versions are intended"
        )
    else:
        status, msg = Status.PASS, "matches pins: " + ", ".join(same)
        if skipped:
            msg += f"; {'/'.join(skipped)} {CPU_BUILD}"
    return CheckResult(
        name="versions",
        status=status,
        message=msg,
        value=table.get("torch", {}).get("actual"),
        threshold=pinned_torch,
        hint=hint,
        details={"pins_file": path, "supported_torch": supported_range_text(),
                 "components": table},
    )  # fmt: skip


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
    applies = versions_for_build(pins, cuda_build=actual["cuda"] is not None)
    return judge(applies, actual, str(path))
