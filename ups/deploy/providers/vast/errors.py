"""Errors of the Vast provider; each is one paragraph naming the problem and the fix.

Whose they are (exit codes): ``ups.deploy.providers`` (the API, offers) and
``ups.deploy.managed.errors`` (an instance that fails, recoveries, an interrupted run)."""

from __future__ import annotations

from ups.deploy.providers import ProviderApiError


class VastApiError(ProviderApiError):
    """The Vast API refused or could not answer (exit 5)."""
