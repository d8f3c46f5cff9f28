"""RunPod as the watchdog on the pod sees it: the pod ends itself with no account key.

RunPod gives every pod ``RUNPOD_POD_ID`` and ``RUNPOD_API_KEY``, a key "limited in scope
to only the pod" (RunPod's pod environment variables): enough to stop or terminate this
pod and nothing else. A scoped key the user sent (``watchdog_key_file``) is used instead
when there is one. A key that may not terminate makes the pod stop instead, which ends
GPU billing (its volume still bills).

The image has no RunPod SDK (docker/lock.sh): the two mutations go through
:class:`~ups.deploy.providers.runpod.client.PlainApi`, in the SDK's own words
(``runpod/api/mutations/pods.py``), with the same retries and error paragraphs as the SDK's
calls on the laptop.
"""

from __future__ import annotations

import os

from ups.deploy.providers.base import ApiErrorKind, ProviderApiError
from ups.deploy.providers.runpod.client import PlainApi, graphql_string


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
        api = PlainApi(self.endpoint, self.key)
        if action == "destroy":
            try:
                api.query(f"terminate pod {pod}", terminate_mutation(pod), kind="destroy")
                return
            except ProviderApiError as err:
                if err.kind is not ApiErrorKind.KEY_REJECTED:
                    raise
        if action in ("destroy", "stop"):
            api.query(f"stop pod {pod}", stop_mutation(pod))


def terminate_mutation(pod_id: str) -> str:
    """The SDK's ``terminate_pod`` mutation (``generate_pod_terminate_mutation``)."""
    return f"""
    mutation {{
        podTerminate(input: {{ podId: "{graphql_string(pod_id)}" }})
    }}
    """


def stop_mutation(pod_id: str) -> str:
    """The SDK's ``stop_pod`` mutation (``generate_pod_stop_mutation``)."""
    return f"""
    mutation {{
        podStop(input: {{ podId: "{graphql_string(pod_id)}" }}) {{
            id
            desiredStatus
        }}
    }}
    """
