"""The provider interface of the previous commit, kept only while the Vast provider and the
managed run move to :mod:`ups.deploy.providers.base` (this module goes when they have)."""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from ups.deploy.providers.base import LABEL_PREFIX, InstanceState, Side


def label_for(host: str, run_id: str) -> str:
    """The label ups gives an instance: the hosts.yaml entry and the run it serves."""
    return f"{LABEL_PREFIX}{host}:{run_id}"


def parse_label(label: str | None) -> tuple[str, str] | None:
    """``(host, run_id)`` of a ups label, or None for instances ups did not create."""
    if not label or not label.startswith(LABEL_PREFIX):
        return None
    host, _, run_id = label[len(LABEL_PREFIX) :].partition(":")
    return (host, run_id) if run_id else None


class RentedInstance(Protocol):
    """What the managed run reads of an instance, whatever its provider."""

    @property
    def id(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def status_msg(self) -> str: ...
    @property
    def ssh_host(self) -> str | None: ...
    @property
    def ssh_port(self) -> int | None: ...
    @property
    def dph_total(self) -> float: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def machine_id(self) -> int | None: ...
    @property
    def state(self) -> InstanceState: ...
    @property
    def cost_so_far(self) -> float: ...


class Provider(Protocol):
    name: str

    def search_offers(
        self, query: str, order: str, offer_type: str, disk_gb: float
    ) -> list[dict[str, Any]]: ...
    def get(self, instance_id: int) -> RentedInstance | None: ...
    def list(self, label: str | None = None) -> list[RentedInstance]: ...
    def create(self, offer_id: int, **fields: Any) -> int: ...
    def stop(self, instance_id: int) -> None: ...
    def destroy(self, instance_id: int) -> None: ...
    def fault_of(self, instance: RentedInstance) -> tuple[Side, str] | None: ...


def get(name: str, **options: Any) -> Provider:
    module = importlib.import_module({"vast": "ups.deploy.providers.vast.provider"}[name])
    provider: Provider = module.open_provider(**options)
    return provider
