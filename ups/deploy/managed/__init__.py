"""A managed run: one run across rented instances, recovered when an instance is lost.

:mod:`record` (the run's record: ``runs/<id>/run.json``), :mod:`errors` and
:mod:`faults` (how a managed run fails, and whose fault it is), :mod:`store` (its
bucket mirror and checkpoints there), :mod:`lease` (one supervisor per run),
:mod:`ledger` (machines that failed), :mod:`rental_plan` (the printable rental plan and
offer choice), :mod:`acquire` (rent past bad machines), :mod:`lifecycle` (one instance:
create, wait, hand over, end), :mod:`watch` (an instance and its log while followed),
:mod:`reconcile` (the record against what the provider lists: a pure function),
:mod:`checkpoints` (checkpoint sync home and to the bucket), :mod:`resume` (where a run
resumes after a loss: checkpoint, log cut and marked), :mod:`controller` (the loop:
follow, recover), :mod:`run` (a deploy around the controller: every instance ended on
every path), :mod:`background` (the detached supervisor's process), :mod:`ops` (``fab
instances``, ``fab down``, ``ups supervise``).
"""
