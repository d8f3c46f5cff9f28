"""Cache is CPU: no cached ``.pt`` file may hold a CUDA storage.

A latent cache saved with CUDA tensors makes DataLoader workers die silently
(``share_memory_()`` works on CPU tensors only). Files are read with the restricted
reader in :mod:`ups.preflight.torchfile`: no code from the file runs, no GPU is touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status
from ups.preflight.torchfile import scan_file

SUFFIXES = (".pt", ".pth")


def _files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for p in paths:
        if p.is_dir():
            found.extend(sorted(f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file()))
        elif p.is_file():
            found.append(p)
    return found


def _rebuild_hint(ctx: Context) -> str:
    config = str(ctx.config_path) if ctx.config_path else "CONFIG"
    return f"rebuild the cache on CPU: ups cache build {config}"


def run(ctx: Context) -> CheckResult:
    roots = list(ctx.opts.cache_paths)
    missing: list[str] = []
    if ctx.cfg is not None:
        cache = ctx.cfg.cache
        if cache.dir.is_dir():
            roots.append(cache.dir)
        elif cache.enabled:
            missing.append(f"cache.dir {cache.dir} does not exist")
        for extra in cache.extra_files:
            if extra.is_file():
                roots.append(extra)
            else:
                missing.append(f"cache.extra_files: {extra} is missing")
    files = _files(roots)
    if not files and not missing:
        return CheckResult(
            name="cache",
            status=Status.SKIP,
            message="no cache directory or .pt files to scan",
            details={"roots": [str(r) for r in roots]},
        )
    gpu_files: dict[str, list[str]] = {}
    unreadable: dict[str, str] = {}
    for f in files:
        scan = scan_file(f)
        if scan.error:
            unreadable[str(f)] = scan.error
        if scan.non_cpu:
            gpu_files[str(f)] = sorted({s.location for s in scan.non_cpu})
    details: dict[str, Any] = {
        "roots": [str(r) for r in roots],
        "files_scanned": len(files),
        "non_cpu_files": gpu_files,
        "unreadable": unreadable,
        "missing": missing,
    }
    problems = [f"{f} has storages on {', '.join(locs)}" for f, locs in gpu_files.items()]
    problems += [f"{f}: {why}" for f, why in unreadable.items()]
    problems += missing
    if problems:
        return CheckResult(
            name="cache",
            status=Status.FAIL,
            message=f"{len(gpu_files)} of {len(files)} file(s) hold non-CPU tensors; "
            + "; ".join(problems),
            value=len(gpu_files),
            threshold=0,
            unit="files",
            hint=_rebuild_hint(ctx),
            details=details,
        )
    return CheckResult(
        name="cache",
        status=Status.PASS,
        message=f"{len(files)} file(s) hold CPU tensors only",
        value=0,
        threshold=0,
        unit="files",
        details=details,
    )
