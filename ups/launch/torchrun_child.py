"""Child process of ``ups launch``: torchrun in-process, its result written as JSON.

``python -m ups.launch.torchrun_child RESULT_JSON TORCHRUN_ARGS...`` parses the arguments
with torch's own parser, runs ``torch.distributed.run.run`` and writes what happened to
``RESULT_JSON``: ``{"status": "ok"|"failed"|"signal"|"error", "failures": {rank: ...},
"signal": name, "error": text}``. The parent reads that file rather than scraping
torchrun's log lines, so a failed rank's exit code and signal arrive exactly.

Exit code: 0 when every worker exited 0; 1 when a worker failed or torchrun itself
failed (what torchrun exits with); 128 + signum when this agent was stopped by a signal.

Status ``port_in_use``: the agent could not bind the rendezvous store's port (another
process took it after launch checked it). No worker has started at that point, so
launch can try again on another port; no traceback is printed for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch.distributed.run as torch_run
from torch.distributed import DistNetworkError
from torch.distributed.elastic.multiprocessing.api import (
    DefaultLogsSpecs,
    LogsDest,
    LogsSpecs,
    SignalException,
)
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run

from ups import jsonio
from ups.fsio import atomic_write_text
from ups.torchcompat import close_workers_within, torchrun_argv

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Get SIGTERM if ``ups launch`` dies without forwarding one (e.g. SIGKILL), on Linux."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the parent's forwarding still works
        pass


def _message(message: object) -> str:
    """The error text: @record's error file holds ``{"message": "RuntimeError: ...", ...}``."""
    if isinstance(message, dict):
        inner = message.get("message")
        return inner if isinstance(inner, str) else json.dumps(message)
    return str(message)


def _failures(err: ChildFailedError) -> dict[str, dict[str, Any]]:
    out = {}
    for rank, f in err.failures.items():
        out[str(rank)] = {
            "local_rank": f.local_rank,
            "exitcode": f.exitcode,
            "signal": f.signal_name() if f.exitcode < 0 else None,
            "error_file": f.error_file if Path(f.error_file).is_file() else None,
            "message": _message(f.message),
            "timestamp": f.timestamp,
            "pid": f.pid,
        }
    return out


def _write(path: Path, result: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, jsonio.dumps(result, indent=2, sort_keys=True) + "\n")
    except OSError as exc:  # a full disk: launch reports the missing file, with this line
        print(f"ups launch: could not write {path}: {exc}", file=sys.stderr, flush=True)


def _store_port_taken(err: DistNetworkError) -> bool:
    """The agent's store could not listen: its port is bound by another process."""
    text = str(err)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


class FifoLogsSpecs(DefaultLogsSpecs):
    """torchrun's per-rank output destinations (``--redirects``), made named pipes."""

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        for path in [*dest.stdouts.values(), *dest.stderrs.values()]:
            if path and path != os.devnull:
                with contextlib.suppress(OSError):  # no pipe here: torchrun writes a file
                    os.mkfifo(path, 0o600)
        return dest


def _fifo_logs_specs(logs_specs_name: str | None) -> type[LogsSpecs]:
    del logs_specs_name  # one kind here: launch's
    return FifoLogsSpecs


def main(argv: list[str]) -> int:
    _die_with_parent()
    result_path = Path(argv[0])
    torchrun_args, grace = torchrun_argv(argv[1:])
    if grace is not None:  # this torchrun has no --shutdown-timeout: the same another way
        close_workers_within(grace)
    args = get_args_parser().parse_args(torchrun_args)
    # Each rank's --redirects destinations become named pipes that launch reads
    # (ups.launch.ranklogs). torchrun picks its LogsSpecs class by entry-point name; this
    # child runs torchrun in-process, so it hands over the class directly instead of
    # depending on the package's installed metadata.
    torch_run._get_logs_specs_class = _fifo_logs_specs
    result: dict[str, Any] = {"status": "ok", "failures": {}, "signal": None, "error": None}
    rc = 0
    try:
        run(args)  # type: ignore[no-untyped-call]  # unannotated in torch
    except ChildFailedError as err:
        result.update(status="failed", failures=_failures(err))
        rc = 1
    except SignalException as err:
        result.update(status="signal", signal=signal.Signals(err.sigval).name)
        rc = 128 + int(err.sigval)
    except DistNetworkError as err:
        if not _store_port_taken(err):
            result.update(status="error", error=f"{type(err).__name__}: {err}")
            _write(result_path, result)
            raise
        result.update(status="port_in_use", error=f"{type(err).__name__}: {err}")
        rc = 1
    except Exception as err:
        result.update(status="error", error=f"{type(err).__name__}: {err}")
        _write(result_path, result)
        raise
    _write(result_path, result)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
