"""The torchrun environment, read once at start."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class DistEnv:
    rank: int
    """Global rank (``RANK``); 0 for a plain process."""
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None
    under_torchrun: bool
    """True when started by torchrun (or anything that sets RANK and WORLD_SIZE)."""

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {key}={raw!r} is not an integer") from None


def read_dist_env(env: Mapping[str, str] | None = None) -> DistEnv:
    """Read RANK/WORLD_SIZE/... once. Raises ValueError when they contradict each other."""
    env = os.environ if env is None else env
    under = "RANK" in env and "WORLD_SIZE" in env
    world = _int(env, "WORLD_SIZE", 1)
    rank = _int(env, "RANK", 0)
    local_rank = _int(env, "LOCAL_RANK", rank)
    local_world = _int(env, "LOCAL_WORLD_SIZE", world)
    port = env.get("MASTER_PORT")
    problems = []
    if world < 1:
        problems.append(f"WORLD_SIZE={world} must be at least 1")
    if not 0 <= rank < max(world, 1):
        problems.append(f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
    if not 0 <= local_rank < max(local_world, 1):
        problems.append(f"LOCAL_RANK={local_rank} is outside 0..LOCAL_WORLD_SIZE-1 ({local_world})")
    if local_world > world:
        problems.append(f"LOCAL_WORLD_SIZE={local_world} exceeds WORLD_SIZE={world}")
    if under and world > 1 and not (env.get("MASTER_ADDR") and port):
        problems.append("MASTER_ADDR and MASTER_PORT must be set when WORLD_SIZE > 1")
    if problems:
        raise ValueError(
            "inconsistent distributed environment: " + "; ".join(problems) + ". Start workers "
            "with `ups launch` or torchrun, which set these variables together."
        )
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        master_addr=env.get("MASTER_ADDR"),
        master_port=int(port) if port else None,
        under_torchrun=under,
    )
