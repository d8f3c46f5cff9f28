"""Was it the OOM killer? The cgroup's counters before and after, the kernel log, limits.

When a rank dies by SIGKILL, the usual suspect is the kernel's OOM killer, but
``docker kill``, a host agent or torchrun's own shutdown send the same signal. The
container's memory cgroup counts OOM kills (v2 ``memory.events`` ``oom_kill``, v1
``memory.oom_control`` ``oom_kill``): launch reads it before torchrun starts and after
it ends. The kernel log is read too when this process may (often not in containers).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
_UNLIMITED = 1 << 60
"""cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages)."""


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    oom_kills: int | None
    """The cgroup's OOM-kill counter; None when no counter is readable."""
    limit_bytes: int | None
    """The cgroup's memory limit; None when unlimited or unreadable."""
    source: str
    """Which file the numbers came from."""


def _cgroup_dirs(proc_cgroup: str, root: Path) -> list[tuple[str, Path]]:
    """Candidate (version, directory) pairs for this process's memory cgroup."""
    found = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":
            found += [("v2", root / rel), ("v2", root)]
        elif "memory" in controllers.split(","):
            # Inside a container the cgroup namespace usually mounts our own group as root.
            found += [("v1", root / "memory" / rel), ("v1", root / "memory")]
    return found


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" or not text.isdigit() else int(text)


def _counter(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        return None
    return None


def snapshot(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
) -> MemorySnapshot:
    try:
        lines = proc_cgroup.read_text()
    except OSError:
        return MemorySnapshot(None, None, "no /proc/self/cgroup")
    for version, d in _cgroup_dirs(lines, root):
        events, limit_file = (
            (d / "memory.events", d / "memory.max")
            if version == "v2"
            else (d / "memory.oom_control", d / "memory.limit_in_bytes")
        )
        kills = _counter(events, "oom_kill")
        if kills is not None:
            limit = _read_int(limit_file)
            limit = None if limit is not None and limit >= _UNLIMITED else limit
            return MemorySnapshot(kills, limit, str(events))
    return MemorySnapshot(None, None, "no readable memory cgroup")


def kernel_log_oom_kills(pids: set[int]) -> bool | None:
    """True when the kernel log names one of ``pids`` as OOM-killed; None when unreadable."""
    try:
        text = subprocess.run(
            ["dmesg"], capture_output=True, text=True, timeout=5, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    killed = {int(m) for m in re.findall(r"Killed process (\d+)", text)}
    return bool(killed & pids)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def explain_sigkill(
    before: MemorySnapshot,
    after: MemorySnapshot,
    peak_rss: dict[int, int],
    rank: int,
    kernel_log: bool | None,
) -> dict[str, Any]:
    """The outcome's ``memory`` entry and a hint, for a rank that died by SIGKILL."""
    oom: bool | None = None
    evidence = "no OOM-kill counter readable"
    if before.oom_kills is not None and after.oom_kills is not None:
        delta = after.oom_kills - before.oom_kills
        oom = delta > 0
        evidence = f"{after.source} oom_kill {before.oom_kills} -> {after.oom_kills}"
    if kernel_log is not None and not oom:
        oom = True if kernel_log else (oom if oom is not None else False)
        evidence += "; kernel log " + ("names the rank" if kernel_log else "has no OOM kill")
    limit = after.limit_bytes
    peaks = ", ".join(f"rank {r} {_gib(b)}" for r, b in sorted(peak_rss.items())) or "none"
    limit_s = _gib(limit) if limit is not None else "no limit"
    if oom:
        hint = (
            f"the kernel's OOM killer ended rank {rank} (memory limit {limit_s}; sampled peak "
            f"RSS {peaks}): lower training.batch_size or training.num_workers (each loader "
            "worker is a process), enable cache.enabled, or give the container more memory"
        )
    elif oom is False:
        hint = (
            f"not the kernel's OOM killer ({evidence}): something else sent SIGKILL to rank "
            f"{rank} (docker kill, a host agent, or torchrun after distributed.stop_grace_s); "
            f"memory limit {limit_s}, sampled peak RSS {peaks}"
        )
    else:
        hint = (
            f"cannot tell whether the OOM killer ended rank {rank} ({evidence}); memory limit "
            f"{limit_s}, sampled peak RSS {peaks}; if it was memory, lower training.batch_size"
        )
    return {
        "oom_killer": oom,
        "evidence": evidence,
        "limit_bytes": limit,
        "peak_rss_bytes": {str(r): b for r, b in sorted(peak_rss.items())},
        "hint": hint,
    }
