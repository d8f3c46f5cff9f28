"""Deploy ups runs to SSH hosts (Vast instances, Docker GPU boxes): ``fab deploy --host NAME``.

Modules: :mod:`hosts` (hosts.yaml), :mod:`hostkeys` and :mod:`connect` (verified SSH),
:mod:`plan` (printable plan), :mod:`remote` (remote paths and shell text), :mod:`execute`
(carry out a plan; logs, status, stop, fetch), :mod:`stream` (byte-offset log follower),
:mod:`docker_kind` and :mod:`layers` (image transfer to hosts with a Docker daemon),
:mod:`tasks` (what the fabfile calls).
"""

from ups.deploy.errors import DeployError, HostKeyChanged, PreflightFailed
from ups.deploy.hosts import HostSpec, get_host, load_hosts

__all__ = ["DeployError", "HostKeyChanged", "HostSpec", "PreflightFailed", "get_host", "load_hosts"]
