"""The one place ups talks to Vast: the real ``vastai`` SDK, with backoff and readable errors.

The SDK finds the API key itself (``api_key=``, ``VAST_API_KEY``,
``~/.config/vastai/vast_api_key``, legacy ``~/.vast_api_key``); ups never reads, logs
or forwards it. Rate limiting (HTTP 429, sent without Retry-After) is retried with
Vast's :data:`BACKOFF` for ``UPS_VAST_RETRY_S`` seconds (default 120); every other HTTP
error is classified by what its body says (:func:`classify`: a wrong key answered with
404 ``auth_error`` is a rejected key, not a missing instance) and becomes the paragraph
:func:`~ups.deploy.providers.base.api_error` words the same for every provider.
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

from ups.backoff import Policy
from ups.deploy.providers.base import Account, ApiErrorKind, Backoff, ProviderApiError, api_error
from ups.retry import api_retryable

T = TypeVar("T")

ACCOUNT = Account(
    title="Vast",
    key_locations="VAST_API_KEY, ~/.config/vastai/vast_api_key or ~/.vast_api_key",
    key_page="https://cloud.vast.ai/manage-keys/",
    save_key="vastai set api-key KEY",
    console="https://cloud.vast.ai/instances/",
    status_page="https://status.vast.ai",
    query_help=(
        "Check the 'offer' query in hosts.yaml against `vastai search offers --help` (fields "
        "like gpu_name=RTX_4090 num_gpus=2 reliability>0.98)."
    ),
    retry_env="UPS_VAST_RETRY_S",
    endpoint_option="vast_url",
)
BACKOFF = Backoff(
    api=Policy("vast_api", first=0.5, factor=2.0, max_s=15.0),
    destroy=Policy("vast_destroy", first=1.0, factor=2.0, max_s=10.0),
    running=Policy("vast_running", first=1.0, factor=1.5, max_s=10.0),
    ssh=Policy("vast_ssh", first=1.0, factor=2.0, max_s=8.0),
)
"""Vast's 429s come without Retry-After; new instances are polled within its rate limit;
its sshd takes keys for a minute after 'running'."""


def _status(err: BaseException) -> int | None:
    if isinstance(err, requests.HTTPError) and err.response is not None:
        return int(err.response.status_code)
    return None


TAKEN = re.compile(r"no_such_ask|no longer available|is not available|already rented", re.I)
"""What the API says when an offer was rented by someone else between search and create."""


def _body(err: requests.HTTPError) -> object:
    resp = err.response
    if resp is None:
        return str(err)
    try:
        return resp.json()
    except ValueError:
        return (resp.text or resp.reason or "").strip()


def classify(status: int | None, body: object) -> ApiErrorKind:
    """What a Vast answer means: by the body's ``error`` first (Vast answers a wrong key
    with 404 ``auth_error`` on some endpoints), by the HTTP status where it says nothing."""
    code = str(body.get("error") or "") if isinstance(body, dict) else ""
    text = f"{code} {body.get('msg') or ''}" if isinstance(body, dict) else str(body)
    if code == "auth_error" or status in (401, 403):
        return ApiErrorKind.KEY_REJECTED
    if code == "no_such_ask" or TAKEN.search(text):
        return ApiErrorKind.OFFER_TAKEN
    if status == 429 or code == "rate_limited":
        return ApiErrorKind.RATE_LIMITED
    if status is not None and status >= 500:
        return ApiErrorKind.SERVER_ERROR
    if status == 400:
        return ApiErrorKind.BAD_REQUEST
    if status == 404:
        return ApiErrorKind.NOT_FOUND
    return ApiErrorKind.OTHER


def _retryable(kind: str) -> Callable[[BaseException], bool]:
    """The ``ups.retry.API_RETRY`` rule for calls of ``kind``."""

    def check(err: BaseException) -> bool:
        if isinstance(err, requests.ConnectionError | requests.Timeout):
            return api_retryable(kind, None)
        if not isinstance(err, requests.HTTPError):
            return False
        if classify(_status(err), _body(err)) is ApiErrorKind.KEY_REJECTED:
            return False  # a 5xx-looking auth error is still a wrong key
        return api_retryable(kind, _status(err))

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
    body = _body(err)
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
            raise api_error(ACCOUNT, ApiErrorKind.KEY_MISSING, "open the API") from None

    def call(self, what: str, fn: Callable[[], T], kind: str = "default") -> T:
        """Run one SDK call; retry what ``ups.retry.API_RETRY`` says for ``kind``, explain
        the rest."""
        retrying = Retrying(
            retry=retry_if_exception(_retryable(kind)),
            wait=_wait_hint(BACKOFF.destroy if kind == "destroy" else BACKOFF.api),
            stop=stop_after_delay(self.retry_s),
            reraise=True,
        )
        try:
            return retrying(fn)
        except requests.HTTPError as err:
            raise self._explain(what, err) from None
        except (requests.ConnectionError, requests.Timeout) as err:
            raise api_error(
                ACCOUNT,
                ApiErrorKind.UNREACHABLE,
                f"{what} (at {self.server_url or 'https://console.vast.ai'})",
                detail=type(err).__name__,
                retried_s=self.retry_s,
            ) from None

    def _explain(self, what: str, err: requests.HTTPError) -> ProviderApiError:
        status = _status(err)
        kind = classify(status, _body(err))
        if kind is ApiErrorKind.OFFER_TAKEN and not what.startswith("create"):
            kind = ApiErrorKind.NOT_FOUND if status == 404 else ApiErrorKind.OTHER
        return api_error(
            ACCOUNT, kind, what, status=status, detail=api_message(err), retried_s=self.retry_s
        )

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
                raise ProviderApiError(
                    f"the offer query {query!r} does not parse: {err}. Write it as "
                    "`field op value` terms separated by spaces, e.g. "
                    "'gpu_name=RTX_4090 num_gpus>=2'.",
                    None,
                    ApiErrorKind.BAD_REQUEST,
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
                if classify(_status(err), _body(err)) is ApiErrorKind.NOT_FOUND:
                    return None  # gone; a 404 auth_error is a wrong key, not a gone instance
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
