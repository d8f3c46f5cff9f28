"""Deploy ups runs to SSH hosts (Vast instances, Docker GPU boxes): ``fab deploy --host NAME``.

Modules: :mod:`hosts` (hosts.yaml), :mod:`hostkeys` and :mod:`connect` (verified SSH,
retried with tenacity), :mod:`remote` (every remote path and shell command, quoted),
:mod:`deploy_plan` (printable plan), :mod:`request` (the validated request),
:mod:`kinds` (the host kinds behind one interface, and their registry),
:mod:`session` (what the host kinds share: target, connection, running a command),
:mod:`runs` (which run, alive, outcome; continuing one), :mod:`operate` (deploying to a
container host; logs, status, stop), ``kinds/docker/`` (hosts with a Docker daemon),
``vast/`` (rented Vast instances), :mod:`follow` and :mod:`stream` (byte-offset log follower),
:mod:`fetch`, :mod:`group` (one job on several hosts), :mod:`tasks` (what the fabfile
and ``ups deploy`` call).
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
