"""ups-preflight: is this host fit to train? One command on a fresh instance, and the gate
in front of every training start. See docs/preflight.md for the checks and the JSON schema.
"""

from ups.preflight.options import PreflightOptions
from ups.preflight.result import CheckResult, Report, Status
from ups.preflight.runner import run_preflight, select_checks

__all__ = ["CheckResult", "PreflightOptions", "Report", "Status", "run_preflight", "select_checks"]
