"""``ups launch``: plan a run (ids, ports, torchrun argv, env), then execute it.

:func:`build_plan` decides everything and starts nothing; :func:`execute` runs preflight,
torchrun and the outcome bookkeeping for a plan.
"""

from ups.launch.plan import LaunchPlan, LaunchRequest, build_plan

__all__ = ["LaunchPlan", "LaunchRequest", "build_plan"]
