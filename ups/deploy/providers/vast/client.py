"""The one place ups talks to Vast: the real ``vastai`` SDK, with backoff and readable errors.

The SDK finds the API key itself (``api_key=``, ``VAST_API_KEY``,
``~/.config/vastai/vast_api_key``, legacy ``~/.vast_api_key``); ups never reads, logs
or forwards it. Rate limiting (HTTP 429, sent without Retry-After) is retried with
exponential backoff for ``UPS_VAST_RETRY_S`` seconds (default 120); every other HTTP
error becomes one :class:`VastApiError` paragraph.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

import requests
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
)

from ups.backoff import VAST_API, VAST_DESTROY, Policy
from ups.deploy.frontend import command
from ups.deploy.providers import OfferTaken, ProviderApiError
from ups.deploy.providers.vast.errors import VastApiError
from ups.retry import api_retryable

T = TypeVar("T")

KEY_LOCATIONS = "VAST_API_KEY, ~/.config/vastai/vast_api_key or ~/.vast_api_key"


def _status(err: BaseException) -> int | None:
    if isinstance(err, requests.HTTPError) and err.response is not None:
        return int(err.response.status_code)
    return None


TAKEN = re.compile(r"no_such_ask|no longer available|is not available|already rented", re.I)
"""What the API says when an offer was rented by someone else between search and create."""


def _retryable(kind: str) -> Callable[[BaseException], bool]:
    """The ``ups.retry.API_RETRY`` rule for calls of ``kind``."""

    def check(err: BaseException) -> bool:
        if isinstance(err, requests.ConnectionError | requests.Timeout):
            return api_retryable(kind, None)
        return isinstance(err, requests.HTTPError) and api_retryable(kind, _status(err))

    return check


def _wait_hint(policy: Policy) -> Callable[[RetryCallState], float]:
    """Honour Retry-After when the server sends one; else ``policy``'s backoff."""

    def wait(state: RetryCallState) -> float:
        outcome = state.outcome
        err = outcome.exception() if outcome is not None else None
        if isinstance(err, requests.HTTPError) and err.response is not None:
            after = err.response.headers.get("Retry-After")
            if after and after.replace(".", "", 1).isdigit():
                return min(float(after), 60.0)
        return float(policy.wait()(state))

    return wait


def api_message(err: requests.HTTPError) -> str:
    """The API's own explanation (``msg`` or ``error`` in its JSON body), else the reason."""
    resp = err.response
    if resp is None:
        return str(err)
    try:
        body = resp.json()
    except ValueError:
        return (resp.text or resp.reason or "").strip()[:300]
    if isinstance(body, dict):
        return str(body.get("msg") or body.get("error") or body)[:300]
    return str(body)[:300]


class VastApi:
    """Typed, retried calls on :class:`vastai.VastAI`; returns the API's JSON as dicts."""

    def __init__(self, server_url: str | None = None, api_key: str | None = None) -> None:
        from vastai import VastAI  # the SDK configures logging on import: only when used

        self.server_url = server_url
        self.retry_s = float(os.environ.get("UPS_VAST_RETRY_S", "120"))
        try:
            # retry=1: the SDK's own retries wait 0.15 s; ups backs off itself (below).
            self.sdk = VastAI(api_key=api_key, server_url=server_url, retry=1, raw=True)
        except RuntimeError:
            raise VastApiError(
                f"no Vast API key found: set VAST_API_KEY or save the key from "
                f"https://cloud.vast.ai/manage-keys/ with `vastai set api-key KEY` (looked in "
                f"{KEY_LOCATIONS}). ups never takes the key on its command line."
            ) from None

    def call(self, what: str, fn: Callable[[], T], kind: str = "default") -> T:
        """Run one SDK call; retry what ``ups.retry.API_RETRY`` says for ``kind``, explain
        the rest."""
        retrying = Retrying(
            retry=retry_if_exception(_retryable(kind)),
            wait=_wait_hint(VAST_DESTROY if kind == "destroy" else VAST_API),
            stop=stop_after_delay(self.retry_s),
            reraise=True,
        )
        try:
            return retrying(fn)
        except requests.HTTPError as err:
            raise self._explain(what, err) from None
        except (requests.ConnectionError, requests.Timeout) as err:
            raise VastApiError(
                f"cannot reach the Vast API at {self._server()} to {what} after "
                f"{self.retry_s:.0f} s of retries: {type(err).__name__}. Check the network "
                "(or `vast_url` in hosts.yaml) and run the command again."
            ) from None

    def _server(self) -> str:
        return self.server_url or "https://console.vast.ai"

    def _explain(self, what: str, err: requests.HTTPError) -> ProviderApiError:
        status = _status(err)
        detail = api_message(err)
        if what.startswith("create") and TAKEN.search(detail):
            return OfferTaken(
                f"the offer was taken before ups could rent it (HTTP {status} when trying to "
                f"{what}): {detail}. Someone else rented it between the search and the create; "
                "ups moves on to the next matching offer.",
                status,
            )
        if status in (401, 403):
            text = (
                f"the Vast API rejected the API key (HTTP {status}) when trying to {what}: "
                f"{detail}. The key in {KEY_LOCATIONS} is wrong, revoked or lacks the "
                "permission; create a new one at https://cloud.vast.ai/manage-keys/ and save it "
                "with `vastai set api-key KEY`."
            )
        elif status == 429:
            text = (
                f"the Vast API kept rate-limiting us (HTTP 429) for {self.retry_s:.0f} s while "
                f"trying to {what}: {detail}. Wait a minute and run the command again (or raise "
                "UPS_VAST_RETRY_S)."
            )
        elif status is not None and status >= 500:
            text = (
                f"the Vast API failed to {what} (HTTP {status}, a server error): "
                f"{detail}. This is Vast's side, not your request: wait a few minutes (see "
                f"https://status.vast.ai) and run the command again; {command('instances')} "
                "shows whether anything was left running."
            )
        elif status == 400:
            text = (
                f"the Vast API rejected the request to {what} (HTTP 400): {detail}. Check the "
                "'offer' query in hosts.yaml against `vastai search offers --help` (fields like "
                "gpu_name=RTX_4090 num_gpus=2 reliability>0.98)."
            )
        else:
            text = f"the Vast API failed to {what} (HTTP {status}): {detail}."
        return VastApiError(text, status)

    # The calls ups makes, each one SDK method.
    def search_offers(
        self, query: str, order: str, offer_type: str, disk_gb: float
    ) -> list[dict[str, Any]]:
        def search() -> list[dict[str, Any]]:
            try:
                return list(
                    self.sdk.search_offers(
                        query=query, type=offer_type, order=order, storage=disk_gb
                    )
                )
            except ValueError as err:  # the SDK parses the query before sending it
                raise VastApiError(
                    f"the offer query {query!r} does not parse: {err}. Write it as "
                    "`field op value` terms separated by spaces, e.g. "
                    "'gpu_name=RTX_4090 num_gpus>=2'."
                ) from None

        return self.call("search offers", search)

    def create(self, offer_id: int, **fields: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.call(
            f"create an instance from offer {offer_id}",
            lambda: self.sdk.create_instance(id=offer_id, **fields),
        )
        return result

    def show(self, instance_id: int) -> dict[str, Any] | None:
        def show() -> dict[str, Any] | None:
            try:
                row: dict[str, Any] | None = self.sdk.show_instance(id=instance_id)
            except requests.HTTPError as err:
                if _status(err) == 404:
                    return None
                raise
            return row

        return self.call(f"show instance {instance_id}", show)

    def list(self) -> list[dict[str, Any]]:
        return list(self.call("list instances", self.sdk.show_instances))

    def stop(self, instance_id: int) -> None:
        self.call(f"stop instance {instance_id}", lambda: self.sdk.stop_instance(id=instance_id))

    def destroy(self, instance_id: int) -> None:
        self.call(
            f"destroy instance {instance_id}",
            lambda: self.sdk.destroy_instance(id=instance_id),
            kind="destroy",
        )

    def label(self, instance_id: int, label: str) -> None:
        self.call(
            f"label instance {instance_id}",
            lambda: self.sdk.label_instance(id=instance_id, label=label),
        )

    def logs(self, instance_id: int, tail: int = 50) -> str:
        text = self.call(
            f"read the logs of instance {instance_id}",
            lambda: self.sdk.logs(instance_id=instance_id, tail=str(tail)),
        )
        return text if isinstance(text, str) else str(text)
