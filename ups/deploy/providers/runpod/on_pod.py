"""RunPod as the watchdog on the pod sees it: the pod ends itself with no account key.

RunPod gives every pod ``RUNPOD_POD_ID`` and ``RUNPOD_API_KEY``, a key "limited in scope
to only the pod" (RunPod's pod environment variables): enough to stop or terminate this
pod and nothing else. A scoped key the user sent (``watchdog_key_file``) is used instead
when there is one. A key that may not terminate makes the pod stop instead, which ends
GPU billing (its volume still bills).
"""

from __future__ import annotations

import os

from ups.deploy.providers.base import ApiErrorKind, ProviderApiError
from ups.deploy.providers.runpod.client import RunPodApi


class OnPod:
    """:class:`~ups.deploy.providers.base.ComputeWithSelfDestruct` for a RunPod pod."""

    def __init__(self, endpoint: str | None, key: str | None) -> None:
        self.endpoint = endpoint
        self.key = key or os.environ.get("RUNPOD_API_KEY") or None

    def instance_id(self) -> str | None:
        return os.environ.get("RUNPOD_POD_ID") or None

    def end_self(self, action: str) -> None:
        pod = self.instance_id()
        if pod is None or self.key is None:
            raise ProviderApiError(
                "the watchdog cannot end this pod: no RUNPOD_POD_ID or no key in its "
                "environment (RunPod sets both in every pod)",
                kind=ApiErrorKind.KEY_MISSING,
            )
        api = RunPodApi(self.endpoint, api_key=self.key)
        if action == "destroy":
            try:
                api.call(f"terminate pod {pod}", lambda: api.sdk.terminate_pod(pod), kind="destroy")
                return
            except ProviderApiError as err:
                if err.kind is not ApiErrorKind.KEY_REJECTED:
                    raise
        if action in ("destroy", "stop"):
            api.call(f"stop pod {pod}", lambda: api.sdk.stop_pod(pod))
