"""Strict JSON for everything ups writes: log lines, outcomes, reports, results.

Python's ``json.dumps`` writes bare ``NaN``/``Infinity``, which strict parsers (jq,
JavaScript, Go, most log shippers) reject. ups writes a non-finite float as the string
``"NaN"``, ``"Infinity"`` or ``"-Infinity"``: still strict JSON, and the value is not lost.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _default(obj: object) -> Any:
    # numpy/torch scalars and other number-likes become floats (then checked for finiteness);
    # anything else is written as its str().
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            return _finite(item())
        except (TypeError, ValueError):
            pass
    return str(obj)


def dumps(obj: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """``json.dumps`` that never writes ``NaN``/``Infinity`` (``allow_nan=False`` enforced)."""
    separators = None if indent is not None else (",", ":")
    return json.dumps(
        _finite(obj),
        default=_default,
        allow_nan=False,
        indent=indent,
        sort_keys=sort_keys,
        separators=separators,
    )
