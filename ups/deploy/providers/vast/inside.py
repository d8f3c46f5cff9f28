"""What the watchdog on a Vast instance may do, with no account key there: end this very
instance with the scoped key the user sent, else the instance's own ``CONTAINER_API_KEY``
(Vast sets it, with ``CONTAINER_ID``, in every instance's environment)."""

from __future__ import annotations

import os

from ups.deploy.providers.base import ApiErrorKind, ProviderApiError
from ups.deploy.providers.vast.client import VastApi


class OnInstance:
    """:class:`~ups.deploy.providers.base.ComputeWithSelfDestruct` for Vast."""

    def __init__(self, endpoint: str | None, key: str | None) -> None:
        self.endpoint = endpoint
        self.key = key or os.environ.get("CONTAINER_API_KEY") or None

    def instance_id(self) -> str | None:
        found = os.environ.get("CONTAINER_ID", "")
        return found if found.isdigit() else None

    def end_self(self, action: str) -> None:
        instance = self.instance_id()
        if instance is None or self.key is None:
            # Not the laptop's paragraph (which key file to save where): on the instance the
            # id and key come from Vast's environment, or the key file ups sent.
            raise ProviderApiError(
                f"the watchdog cannot {action} this Vast instance: no CONTAINER_ID or no key "
                "in its environment (Vast sets CONTAINER_ID and CONTAINER_API_KEY in every "
                "instance)",
                kind=ApiErrorKind.KEY_MISSING,
            )
        api = VastApi(self.endpoint, api_key=self.key)
        if action == "destroy":
            api.destroy(int(instance))
        else:
            api.stop(int(instance))
