"""``kind: vast`` in hosts.yaml: the rented entry every provider shares, plus Vast's own
options (docs/vast.md)."""

from __future__ import annotations

from typing import Literal

from ups.deploy.entries import RentedHost


class VastHost(RentedHost):
    """``kind: vast``: no address, ups rents a Vast instance for the run
    (ups/deploy/providers/vast/, ups/deploy/managed/, docs/vast.md). ``offer`` is Vast's
    own query syntax (``vastai search offers``)."""

    kind: Literal["vast"] = "vast"
    vast_url: str | None = None
    """API server (default: the SDK's, console.vast.ai)."""
