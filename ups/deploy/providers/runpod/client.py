"""How ups talks to RunPod's API, by either of its two ways, with backoff and readable
errors.

RunPod's API is GraphQL: every call is ``POST {base}/graphql`` with ``{"query": ...}`` and
``Authorization: Bearer KEY`` (``runpod/api/graphql.py``); the base is the entry's
``runpod_url``, else ``$RUNPOD_API_BASE_URL``, else ``https://api.runpod.io``. The laptop
calls it through RunPod's SDK (:mod:`ups.deploy.providers.runpod.sdk`); on the pod, whose
image carries no SDK (docker/lock.sh), the watchdog's two mutations go through
:class:`PlainApi`, the standard library making the same request. Either way a call that
fails becomes an :class:`Answer` (the HTTP status and the body) or :class:`Unreachable`,
which :meth:`Calls.call` retries or explains in one paragraph: :func:`classify` reads the
body's words first, so a rejected key reads the same whether RunPod says so with a 401 or
in words. ups never logs, prints or forwards the key.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay

from ups.backoff import Policy
from ups.deploy.providers.base import Account, ApiErrorKind, api_error
from ups.retry import api_retryable

T = TypeVar("T")

ACCOUNT = Account(
    title="RunPod",
    key_locations="RUNPOD_API_KEY, then ~/.runpod/config.toml (written by `runpod config`)",
    key_page="https://console.runpod.io/user/settings",
    save_key="runpod config",
    console="https://console.runpod.io/pods",
    status_page="https://uptime.runpod.io",
    query_help=(
        "Check `gpu:` and `offer:` in hosts.yaml: `offer` lists RunPod GPU type ids "
        '(e.g. "NVIDIA GeForce RTX 4090") as `python -c "import runpod; '
        'print(runpod.get_gpus())"` prints them.'
    ),
    retry_env="UPS_RUNPOD_RETRY_S",
    endpoint_option="runpod_url",
)

RUNPOD_API = Policy("runpod_api", first=0.5, factor=2.0, max_s=15.0)
"""RunPod's 429 pages and gateway errors (it sends no Retry-After the SDK would keep)."""
RUNPOD_DESTROY = Policy("runpod_destroy", first=1.0, factor=2.0, max_s=10.0)
"""Terminating a pod again after a server error, and showing it until it is gone."""
RUNPOD_RUNNING = Policy("runpod_running", first=1.0, factor=1.5, max_s=10.0)
"""Polling a new pod until it has a runtime and its SSH port."""
RUNPOD_SSH = Policy("runpod_ssh", first=1.0, factor=2.0, max_s=8.0)
"""A running pod whose sshd or keys are not there yet."""

# The body's words, first match wins (RunPod words errors in GraphQL's ``errors``; a page
# that is not JSON comes from a gateway or the rate limiter in front of it).
RULES: tuple[tuple[re.Pattern[str], ApiErrorKind], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), kind)
    for pattern, kind in (
        (
            r"unauthori[sz]ed|api key|forbidden|not authenticated|permission",
            ApiErrorKind.KEY_REJECTED,
        ),
        (r"too many requests|rate.?limit|\b429\b", ApiErrorKind.RATE_LIMITED),
        (
            r"no longer any instances available|no instances? (are )?available|"
            r"not enough (free )?gpus|out of stock|below the minimum bid",
            ApiErrorKind.OFFER_TAKEN,
        ),
        (r"not found|does not exist", ApiErrorKind.NOT_FOUND),
        (
            r"\b5\d\d\b|bad gateway|service unavailable|gateway time-?out|"
            r"internal server error|something went wrong",
            ApiErrorKind.SERVER_ERROR,
        ),
        (
            r"syntax error|cannot query field|unknown argument|expected type",
            ApiErrorKind.BAD_REQUEST,
        ),
    )
)
_STATUS = {ApiErrorKind.KEY_REJECTED: 401, ApiErrorKind.RATE_LIMITED: 429}


def classify(status: int | None, body: object) -> ApiErrorKind:
    """What an answer means: the body's words first, then the status."""
    text = _words(body)
    for pattern, kind in RULES:
        if pattern.search(text):
            return kind
    if status in (401, 403):
        return ApiErrorKind.KEY_REJECTED
    if status == 429:
        return ApiErrorKind.RATE_LIMITED
    if status is not None and status >= 500:
        return ApiErrorKind.SERVER_ERROR
    return ApiErrorKind.OTHER


def _words(body: object) -> str:
    if isinstance(body, dict):
        errors = body.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            return str(errors[0].get("message") or "")
        return json.dumps(body)[:300]
    return str(body or "")[:300]


DEFAULT_SERVER = "https://api.runpod.io"
"""The SDK's API base when ``RUNPOD_API_BASE_URL`` is not set."""


class Answer(Exception):
    """RunPod answered, but not with the data asked for: ``status`` (None for GraphQL
    ``errors`` in an answer, which the SDK reports without its status) and the body."""

    def __init__(self, status: int | None, body: object) -> None:
        super().__init__(f"HTTP {status}: {_words(body)}")
        self.status = status
        self.body = body


class Unreachable(Exception):
    """No answer from RunPod at all: the connection failed or timed out."""


def _status_for_retry(err: BaseException) -> int | bool | None:
    """The status ``ups.retry.API_RETRY`` judges ``err`` by; False: never retried."""
    if isinstance(err, Unreachable):
        return None
    if not isinstance(err, Answer):
        return False
    kind = classify(err.status, err.body)
    if kind is ApiErrorKind.RATE_LIMITED:
        return 429
    if kind is ApiErrorKind.SERVER_ERROR:
        return err.status if err.status is not None and err.status >= 500 else 500
    return False


class Calls:
    """Retried calls on RunPod's API, whichever way they are made: what fails is retried as
    ``ups.retry.API_RETRY`` says for the call's kind (RUNPOD_DESTROY's backoff for
    ``destroy``, else RUNPOD_API's), for at most ``UPS_RUNPOD_RETRY_S``, and what still
    fails is one paragraph (:func:`~ups.deploy.providers.base.api_error`)."""

    def __init__(self, server_url: str | None, key: str) -> None:
        self.server_url = server_url
        self.key = key
        self.retry_s = float(os.environ.get(ACCOUNT.retry_env, "120"))

    @property
    def server(self) -> str:
        """The API base every call of this client goes to (no trailing slash)."""
        base = self.server_url or os.environ.get("RUNPOD_API_BASE_URL") or DEFAULT_SERVER
        return base.rstrip("/")

    def call(self, what: str, fn: Callable[[], T], kind: str = "default") -> T:
        """Run ``fn``, which raises :class:`Answer` or :class:`Unreachable` when the call
        fails; retry it or explain it, in one paragraph naming ``what`` was tried."""

        def retryable(err: BaseException) -> bool:
            status = _status_for_retry(err)
            return status is not False and api_retryable(kind, status or None)

        policy = RUNPOD_DESTROY if kind == "destroy" else RUNPOD_API
        retrying = Retrying(
            retry=retry_if_exception(retryable),
            wait=_wait(policy),
            stop=stop_after_delay(self.retry_s),
            reraise=True,
        )
        try:
            return retrying(fn)
        except Unreachable as err:
            raise api_error(
                ACCOUNT, ApiErrorKind.UNREACHABLE, what,
                detail=f"{err} at {self.server}", retried_s=self.retry_s,
            ) from None  # fmt: skip
        except Answer as err:
            kind_of = classify(err.status, err.body)
            raise api_error(
                ACCOUNT, kind_of, what, status=_STATUS.get(kind_of, err.status),
                detail=_words(err.body).rstrip("."), retried_s=self.retry_s,
            ) from None  # fmt: skip


USER_AGENT = "ups (RunPod pod watchdog; Python urllib)"
"""Not urllib's own ``Python-urllib/3.x``, which gateways in front of APIs often refuse."""


class PlainApi(Calls):
    """RunPod's API with the standard library only: what the pod's watchdog uses, in an
    image without the SDK. Each call is the request the SDK makes (``run_graphql_query``):
    the same endpoint, headers, body and 30 s timeout."""

    def query(self, what: str, text: str, kind: str = "default") -> dict[str, Any]:
        """A GraphQL query or mutation; the answer's ``data``."""
        return self.call(what, lambda: self._post(text), kind)

    def _post(self, text: str) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.server}/graphql",
            data=json.dumps({"query": text}).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                "Authorization": f"Bearer {self.key}",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, page = int(response.status), response.read()
        except urllib.error.HTTPError as err:  # an answer: 4xx, 5xx
            status, page = err.code, err.read()
        except (OSError, http.client.HTTPException) as err:  # URLError is an OSError
            reason = getattr(err, "reason", err)  # URLError's: the socket's error
            said = type(reason).__name__ if isinstance(reason, BaseException) else str(reason)
            raise Unreachable(said) from None
        return data_of(status, page.decode(errors="replace"))


def data_of(status: int, page: str) -> dict[str, Any]:
    """The ``data`` of RunPod's answer ``page`` with HTTP ``status``, or the
    :class:`Answer` the SDK's failure for it would become (``sdk.answer_of``): a 401 first,
    then a page that is not JSON (a gateway's or the rate limiter's), GraphQL ``errors``,
    no ``data``."""
    if status == 401:
        raise Answer(401, page.strip()[:300])
    try:
        body = json.loads(page)
    except ValueError:
        raise Answer(status if status >= 400 else 502, page.strip()[:300]) from None
    if not isinstance(body, dict):
        raise Answer(502, f"an answer that is not a JSON object: {page.strip()[:200]}")
    if "errors" in body:
        raise Answer(status if status >= 400 else None, body)
    data = body.get("data")
    if not isinstance(data, dict):
        raise Answer(502, f"an answer without data (HTTP {status})")
    return data


def _wait(policy: Policy) -> Callable[[RetryCallState], float]:
    backoff = policy.wait()

    def wait(state: RetryCallState) -> float:
        return float(backoff(state))

    return wait


def graphql_string(value: str) -> str:
    """``value`` as the inside of a GraphQL string literal (GraphQL's escapes are JSON's):
    the SDK puts values between double quotes as they are, so a quote or a backslash in
    one would break its query."""
    return json.dumps(value)[1:-1]
