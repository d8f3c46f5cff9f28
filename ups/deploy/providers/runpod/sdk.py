"""RunPod's SDK on the laptop: :class:`RunPodApi`, the SDK's calls retried and explained
by :class:`~ups.deploy.providers.runpod.client.Calls`.

The SDK (``runpod/api/graphql.py``) posts every call to ``$RUNPOD_API_BASE_URL/graphql``
with the module's ``runpod.api_key``, which it reads from ``~/.runpod/config.toml`` on
import; ups sets it from ``RUNPOD_API_KEY`` when that is set. The SDK keeps no HTTP status
but 401 (its ``AuthenticationError``): a GraphQL error arrives as ``QueryError(message)``,
any other page as ``requests.JSONDecodeError`` whose ``doc`` is the page. :func:`answer_of`
turns each into the (status, body) of an
:class:`~ups.deploy.providers.runpod.client.Answer`.

Only the laptop imports this module, and only when a provider is opened: the ups image has
no SDK (docker/lock.sh), and the pod's watchdog talks to RunPod without it.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import requests

from ups.deploy.providers.base import ApiErrorKind, api_error
from ups.deploy.providers.runpod.client import ACCOUNT, Answer, Calls, Unreachable

T = TypeVar("T")


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


class RunPodApi(Calls):
    """Typed, retried calls on the ``runpod`` SDK; returns the API's JSON as dicts."""

    def __init__(self, server_url: str | None = None, api_key: str | None = None) -> None:
        self.sdk: Any = import_sdk()
        if server_url:
            # The SDK reads its API base from the environment at each call (there is no
            # setting of its own): the entry's runpod_url (a FAKE in the tests).
            os.environ["RUNPOD_API_BASE_URL"] = server_url.rstrip("/")
        key = api_key or os.environ.get("RUNPOD_API_KEY") or self.sdk.api_key
        if not key:
            raise api_error(ACCOUNT, ApiErrorKind.KEY_MISSING, "use the RunPod API")
        super().__init__(server_url, key)

    def call(self, what: str, fn: Callable[[], T], kind: str = "default") -> T:
        """One SDK call, its failures as :class:`Calls` reads them."""

        def through_sdk() -> T:
            # The SDK's create/stop/resume/terminate take no key of their own: its module's.
            self.sdk.api_key = self.key
            try:
                return fn()
            except (requests.ConnectionError, requests.Timeout) as err:
                raise Unreachable(type(err).__name__) from err
            except Exception as err:
                answer = answer_of(err)
                if answer is None:
                    raise
                raise Answer(*answer) from err

        return super().call(what, through_sdk, kind)

    def query(self, what: str, text: str, kind: str = "default") -> dict[str, Any]:
        """A GraphQL query or mutation the SDK has no function for, through its own client
        (``runpod.api.graphql.run_graphql_query``); the answer's ``data``."""
        from runpod.api.graphql import run_graphql_query

        def run() -> dict[str, Any]:
            data: dict[str, Any] = run_graphql_query(text)["data"]
            return data

        return self.call(what, run, kind)
