"""Reaching a host: :mod:`connect` (verified SSH, retried with tenacity), :mod:`hostkeys`,
:mod:`session` (a target, its connection, running one command), :mod:`remote` (every
remote path and shell command, quoted in one place), :mod:`stream` (the byte-offset log
stream), :mod:`progress` (transfer progress)."""
