"""``UPS_FAULTS``: faults armed from the environment, joined to the config's ``faults:``.

The env form is for tests and drills (``UPS_FAULTS="oom@1:5,segfault@1:3"`` =
kind@rank:step, or ``oom@1:5:optimizer`` = kind@rank:step:point); ``ups launch`` reads it
before anything starts and every worker reads it again (``ups.train.startcheck``), so a
malformed value is refused the same way in both. What the faults do is
``ups.train.faults``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import get_args

from pydantic import ValidationError

from ups.config.schema import Config, FaultConfig, FaultKind, FaultPoint

ENV_VAR = "UPS_FAULTS"


def parse_faults(text: str) -> list[FaultConfig]:
    """Parse ``kind@rank:step[:point][,...]``. Raises ValueError naming the bad item."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            kind, _, where = item.partition("@")
            rank, step, *point = where.split(":")
            fields = {"kind": kind, "rank": int(rank), "step": int(step)}
            if point:
                fields["point"] = point[0] if len(point) == 1 else ":".join(point)
            faults.append(FaultConfig.model_validate(fields))
        except ValueError as exc:
            why = str(exc)
            if isinstance(exc, ValidationError):  # its own words, without pydantic's frame
                why = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
            raise ValueError(
                f"{ENV_VAR}: cannot read {item!r}; expected kind@rank:step[:point] with kind "
                f"one of {', '.join(get_args(FaultKind))} and point one of "
                f"{', '.join(get_args(FaultPoint))} ({why})"
            ) from None
    return faults


def with_env_faults(cfg: Config, environ: Mapping[str, str]) -> Config:
    """``cfg`` with the faults ``environ``'s ``UPS_FAULTS`` arms added. Raises ValueError."""
    faults = parse_faults(environ.get(ENV_VAR, ""))
    return cfg.model_copy(update={"faults": [*cfg.faults, *faults]}) if faults else cfg
