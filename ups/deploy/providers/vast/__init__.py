"""Vast.ai as a provider: :mod:`client` (the real ``vastai`` SDK with retries and readable
errors), :mod:`provider` (the :class:`~ups.deploy.providers.Provider` over it),
:mod:`instance` (an instance's state), :mod:`offers` (choosing an offer under the price
cap), :mod:`faults` (whose fault a failure is), :mod:`errors` (messages and exit codes),
:mod:`watchdog` (runs on the instance; ends it at ``max_hours`` without the laptop)."""
