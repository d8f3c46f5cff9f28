"""Deploy ups runs to hosts: ``fab deploy --host NAME`` (SSH hosts, Docker hosts, Vast).

The rooms, top to bottom; a room imports only from rooms below it (the import contract
in pyproject.toml, checked by ``lint-imports`` in CI):

- :mod:`tasks`: what the fabfile and ``ups deploy`` call (deploy, logs, status, stop...).
- ``kinds/``: the host kinds (``container``, ``docker``, ``vast``, ``group``) behind one
  :class:`~ups.deploy.kinds.HostKind` interface and one registry; the only place that
  picks a concrete provider.
- ``managed/``: a managed run across rented instances: its record, the fenced lease,
  the bucket mirror, the host ledger, acquiring past bad machines, one instance's
  lifecycle, watching, reconciling the record with what the provider lists, and the
  controller loop that recovers a lost instance.
- ``providers/``: rentable machines behind one :class:`~ups.deploy.providers.Provider`
  interface (Vast: ``providers/vast/``).
- ``onhost/``: a run on a host ups can reach: the printable plan, operating it (sync,
  preflight, start), which run, following its log, fetching it, one job on several hosts.
- ``transport/``: SSH (verified host keys, retried connects), every remote command
  built and quoted in one place, the byte-offset log stream, transfer progress.
- :mod:`request`, :mod:`hosts`, :mod:`errors`: what was asked (the validated request,
  hosts.yaml) and how deploy fails (messages and exit codes).
"""

from ups.deploy.errors import DeployError, HostKeyChanged, PreflightFailed, UsageError
from ups.deploy.hosts import HostSpec, get_host, get_hosts, load_hosts

__all__ = [
    "DeployError",
    "HostKeyChanged",
    "HostSpec",
    "PreflightFailed",
    "UsageError",
    "get_host",
    "get_hosts",
    "load_hosts",
]
