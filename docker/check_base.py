"""Stop the image build when the base image does not hold the versions pins.toml names.

Run by the Dockerfile right after FROM, before anything is installed:

    python check_base.py PINS_TOML cuda    # the GPU image: a CUDA build of torch
    python check_base.py PINS_TOML cpu     # the CPU image: a CPU build of torch

It compares ``sys.version``, ``torch.__version__``, ``torch.version.cuda``,
``torch.backends.cudnn.version()`` and ``torch.cuda.nccl.version()`` with ``[versions]``
(the CPU image: its Python from ``[image.cpu] python``; no CUDA, cuDNN or NCCL), by the
rule preflight's versions check uses (ups.pins.matches): a pin's dot-separated parts equal
the leading parts of the version found. None of these calls needs a GPU. Any difference
ends the build with one line per component naming both versions, and exit code 1.
Standalone on purpose (stdlib and torch only): ups is not installed yet.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Mapping
from typing import Any

COMPONENTS = ("python", "torch", "cuda", "cudnn", "nccl")
CUDA_ONLY = ("cuda", "cudnn", "nccl")


def matches(pin: str, actual: str) -> bool:
    """ups.pins.matches: ``"2.13.0"`` matches ``"2.13.0+cu130"``, ``"9"`` matches ``"9.10.2"``."""
    want = pin.split("+", 1)[0].split(".")
    have = actual.split("+", 1)[0].split(".")
    return have[: len(want)] == want


def cudnn_string(code: int) -> str:
    """ups.pins.cudnn_string: ``91002`` (cuDNN 9+) as ``"9.10.2"``, ``8902`` as ``"8.9.2"``."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def expected(pins: Mapping[str, Any], build: str) -> dict[str, str | None]:
    """What the base must hold for ``build`` (``cuda`` or ``cpu``); None: must be absent."""
    versions = {name: str(pins["versions"][name]) for name in COMPONENTS}
    if build == "cpu":
        versions["python"] = str(pins["image"]["cpu"]["python"])
        versions.update(dict.fromkeys(CUDA_ONLY, None))
    return dict(versions)


def found() -> dict[str, str | None]:
    """The base's versions; None for what its torch build does not have."""
    import warnings

    # numpy comes with the lock, after this check: torch's warning about it is noise here.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

    have: dict[str, str | None] = {
        "python": sys.version.split()[0],
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
    }
    if torch.version.cuda is not None:
        code = torch.backends.cudnn.version()
        have["cudnn"] = cudnn_string(code) if code else None
        if torch.distributed.is_nccl_available():
            have["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return have


def problems(want: Mapping[str, str | None], have: Mapping[str, str | None]) -> list[str]:
    """One line per component whose version differs, naming both."""
    out = []
    for name, pin in want.items():
        actual = have.get(name)
        if pin is None and actual is not None:
            out.append(f"{name}: the CPU image's base must have none, it has {actual}")
        elif pin is not None and actual is None:
            out.append(f"{name}: pinned {pin}, the base has none (a CPU build of torch?)")
        elif pin is not None and actual is not None and not matches(pin, actual):
            out.append(f"{name}: pinned {pin}, the base has {actual}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("cuda", "cpu"):
        sys.stderr.write("usage: check_base.py PINS_TOML cuda|cpu\n")
        return 2
    with open(argv[0], "rb") as fh:
        want = expected(tomllib.load(fh), argv[1])
    have = found()
    wrong = problems(want, have)
    if wrong:
        sys.stderr.write(
            f"check_base: this base image does not hold the versions pins.toml names "
            f"({argv[1]} image):\n  " + "\n  ".join(wrong) + "\nBuild FROM the image "
            "pins.toml names ([image] base, tag and digest), or, if the new versions are "
            "intended, update pins.toml to them (then preflight checks hosts against them too).\n"
        )
        return 1
    print("check_base: the base holds " + ", ".join(f"{k} {v}" for k, v in have.items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
