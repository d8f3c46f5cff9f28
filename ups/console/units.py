"""Byte formatting shared by the checks."""

from __future__ import annotations

GiB = 1024**3
MiB = 1024**2


def human_bytes(n: float) -> str:
    """``1536 MiB`` -> ``"1.5 GiB"``; binary units, 3 significant digits."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            value = n / size
            # .3g writes 1000-1023 (below the next unit) as "1e+03": whole numbers from 100.
            return f"{value:.0f} {unit}" if abs(value) >= 100 else f"{value:.3g} {unit}"
    return f"{int(n)} B"
