"""Read pins.toml and compare pinned versions with runtime ones.

The one reader of pins.toml: preflight's versions check and deploy's remote code check
both find the file here, so ``$UPS_PINS`` means the same thing to both. No torch import.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_SHIPPED = Path(__file__).resolve().parent / "pins.toml"
"""The pins ups was built with: a link to the checkout's pins.toml, a copy of it in a wheel."""


def find_pins(explicit: Path | None, env: Mapping[str, str]) -> Path:
    """The pins file: explicit path, ``$UPS_PINS``, ``./pins.toml``, then the package's own."""
    if explicit is not None:
        return explicit
    if env.get("UPS_PINS"):
        return Path(env["UPS_PINS"])
    local = Path("pins.toml")
    return local if local.is_file() else _SHIPPED


def load_pins(path: Path) -> dict[str, Any]:
    """The whole pins file. Raises OSError or tomllib.TOMLDecodeError."""
    with path.open("rb") as fh:
        return tomllib.load(fh)


def pinned_versions(
    explicit: Path | None = None, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``[versions]`` table of :func:`find_pins`'s file; empty when there is no file."""
    path = find_pins(explicit, os.environ if env is None else env)
    if not path.is_file():
        return {}
    versions = load_pins(path).get("versions", {})
    return dict(versions) if isinstance(versions, dict) else {}


def versions_for_build(pins: Mapping[str, Any], *, cuda_build: bool) -> dict[str, Any]:
    """The ``[versions]`` that apply to this torch build: a CPU build (the ups:cpu image, a
    venv with the CPU wheel) runs the CPU base's Python, ``[image.cpu] python``."""
    versions = dict(pins.get("versions", {}))
    cpu_python = pins.get("image", {}).get("cpu", {}).get("python")
    if not cuda_build and cpu_python is not None:
        versions["python"] = cpu_python
    return versions


def public_version(version: str) -> str:
    """``"2.13.0+cu130"`` -> ``"2.13.0"`` (drop the local build tag)."""
    return version.split("+", 1)[0]


def matches(pin: str, actual: str) -> bool:
    """True when the pin's dot-separated parts equal the leading parts of ``actual``."""
    want = public_version(pin).split(".")
    have = public_version(actual).split(".")
    return have[: len(want)] == want


def cudnn_string(code: int) -> str:
    """``torch.backends.cudnn.version()`` (91002, or 8902 for cuDNN 8) as ``"9.10.2"``."""
    if code >= 10000:  # cuDNN 9+: major*10000 + minor*100 + patch
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


__all__ = [
    "cudnn_string",
    "find_pins",
    "load_pins",
    "matches",
    "pinned_versions",
    "public_version",
    "versions_for_build",
]
