"""The ``vast`` host kind: rent an instance, deploy to it as a container host, end it.

Modules: :mod:`errors` (messages and exit codes), :mod:`client` (the real ``vastai`` SDK,
with retries and readable errors), :mod:`instance` (an instance's state machine),
:mod:`offers` (choosing an offer under the price cap), :mod:`rental_plan` (the printable
plan), :mod:`rental` (one instance: create, wait, hand over to the container deploy,
fetch, end), :mod:`monitor` (watching an instance and the local log copy while a run is
followed), :mod:`keeper` (the run across instances: recovery), :mod:`watchdog` (runs on
the instance; ends it at ``max_hours`` without the laptop), :mod:`ops` (``fab
instances`` and ``fab down``).
"""
