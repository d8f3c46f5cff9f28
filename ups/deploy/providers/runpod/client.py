"""The one place ups talks to RunPod: the real ``runpod`` SDK, with backoff and readable
errors.

The SDK (``runpod/api/graphql.py``) posts every call to ``$RUNPOD_API_BASE_URL/graphql``
(default ``https://api.runpod.io``) with the module's ``runpod.api_key``, which it reads
from ``~/.runpod/config.toml`` on import; ups sets it from ``RUNPOD_API_KEY`` when that is
set, and never logs, prints or forwards it. The SDK keeps no HTTP status but 401 (its
``AuthenticationError``): a GraphQL error arrives as ``QueryError(message)``, any other
page as ``requests.JSONDecodeError`` whose ``doc`` is the page. :func:`answer_of` turns
each into a (status, body) pair and :func:`classify` reads the body's words first, so a
rejected key reads the same whether RunPod says so with a 401 or in words.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import requests
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


def answer_of(err: BaseException) -> tuple[int | None, object] | None:
    """``(status, body)`` of an SDK failure that came from an answer; None for one that
    did not (no connection, a timeout) or is not the API's (a bug)."""
    from runpod import error

    if isinstance(err, error.AuthenticationError):
        return 401, str(err)
    if isinstance(err, error.QueryError):
        return None, {"errors": [{"message": str(err)}]}
    if isinstance(err, requests.JSONDecodeError):
        page = str(err.doc or "").strip()
        found = re.search(r"\b([45]\d\d)\b", page)
        # A page that is not the API's JSON is a gateway's: assume a bad gateway.
        return (int(found.group(1)) if found else 502), page[:300]
    if isinstance(err, KeyError | TypeError):  # a JSON answer without "data" (SDK indexes it)
        return 502, f"an answer without data ({type(err).__name__}: {err})"
    return None


def _status_for_retry(err: BaseException) -> int | bool | None:
    """The status ``ups.retry.API_RETRY`` judges ``err`` by; False: never retried."""
    if isinstance(err, requests.ConnectionError | requests.Timeout):
        return None
    answer = answer_of(err)
    if answer is None:
        return False
    status, body = answer
    kind = classify(status, body)
    if kind is ApiErrorKind.RATE_LIMITED:
        return 429
    if kind is ApiErrorKind.SERVER_ERROR:
        return status if status is not None and status >= 500 else 500
    return False


_SDK_LOCK = threading.Lock()


def import_sdk() -> Any:
    """``runpod``, imported without its side effect on logging: ``runpod.serverless``
    calls ``logging.basicConfig(level=INFO)`` on import, which would print every
    library's INFO lines through ups's console."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with _SDK_LOCK:
        import runpod

        root.handlers[:] = handlers
        root.setLevel(level)
    return runpod


class RunPodApi:
    """Typed, retried calls on the ``runpod`` SDK; returns the API's JSON as dicts."""

    def __init__(self, server_url: str | None = None, api_key: str | None = None) -> None:
        self.sdk: Any = import_sdk()
        self.server_url = server_url
        if server_url:
            # The SDK reads its API base from the environment at each call (there is no
            # setting of its own): the entry's runpod_url (a FAKE in the tests).
            os.environ["RUNPOD_API_BASE_URL"] = server_url.rstrip("/")
        self.retry_s = float(os.environ.get(ACCOUNT.retry_env, "120"))
        key = api_key or os.environ.get("RUNPOD_API_KEY") or self.sdk.api_key
        if not key:
            raise api_error(ACCOUNT, ApiErrorKind.KEY_MISSING, "use the RunPod API")
        self._key: str = key

    def call(self, what: str, fn: Callable[[], T], kind: str = "default") -> T:
        """Run one SDK call; retry what ``ups.retry.API_RETRY`` says for ``kind``, explain
        the rest in one paragraph (:func:`~ups.deploy.providers.base.api_error`)."""

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
        # The SDK's create/stop/resume/terminate take no key of their own: its module's.
        self.sdk.api_key = self._key
        try:
            return retrying(fn)
        except (requests.ConnectionError, requests.Timeout) as err:
            raise api_error(
                ACCOUNT, ApiErrorKind.UNREACHABLE, what,
                detail=f"{type(err).__name__} at {self._server()}", retried_s=self.retry_s,
            ) from None  # fmt: skip
        except Exception as err:
            answer = answer_of(err)
            if answer is None:
                raise
            status, body = answer
            kind_of = classify(status, body)
            raise api_error(
                ACCOUNT, kind_of, what, status=_STATUS.get(kind_of, status),
                detail=_words(body).rstrip("."), retried_s=self.retry_s,
            ) from None  # fmt: skip

    def _server(self) -> str:
        return self.server_url or os.environ.get("RUNPOD_API_BASE_URL", "https://api.runpod.io")

    def query(self, what: str, text: str, kind: str = "default") -> dict[str, Any]:
        """A GraphQL query or mutation the SDK has no function for, through its own client
        (``runpod.api.graphql.run_graphql_query``); the answer's ``data``."""
        from runpod.api.graphql import run_graphql_query

        def run() -> dict[str, Any]:
            data: dict[str, Any] = run_graphql_query(text)["data"]
            return data

        return self.call(what, run, kind)


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
