"""Child process of ``ups launch``: torchrun in-process, its result written as JSON.

``python -m ups.launch.torchrun_child RESULT_JSON TORCHRUN_ARGS...`` parses the arguments
with torch's own parser, runs ``torch.distributed.run.run`` and writes what happened to
``RESULT_JSON``: ``{"status": "ok"|"failed"|"signal"|"error", "failures": {rank: ...},
"signal": name, "error": text}``. The parent reads that file rather than scraping
torchrun's log lines, so a failed rank's exit code and signal arrive exactly.

``"workers"``: how every worker this agent started ended, by global rank (``exitcode``: the
code, or minus the signal number; ``signal``: its name), read from the processes themselves
(:class:`WorkerWatch`). torchrun's own failure list is empty when the agent was stopped by
a signal, whatever the workers did then; these statuses are what a stop's outcome is
built from. ``"store_keys"``: keys in the rendezvous store when the workers started and
when they had all exited 0, or null (a process group writes keys there: none written by
several ranks means they never met).

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
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
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


class WorkerWatch:
    """The workers torchrun's agent starts in this process, kept to read how each ended.

    Hooked into the agent where it starts the workers (``_start_workers``) and where it
    waits for the other nodes once every local worker exited 0 (``_exit_barrier``). The
    agent closes the workers on every path (SIGTERM, then SIGKILL after
    ``--shutdown-timeout``) before ``run`` returns or raises, so each process's return
    code is final when :meth:`exits` reads it.
    """

    def __init__(self) -> None:
        self._context: Any = None
        self._store: Any = None
        self.keys_at_start: int | None = None
        self.keys_at_end: int | None = None

    def install(self) -> None:
        start, exit_barrier = LocalElasticAgent._start_workers, LocalElasticAgent._exit_barrier

        def _start_workers(agent: LocalElasticAgent, worker_group: Any) -> dict[int, Any]:
            pids: dict[int, Any] = start(agent, worker_group)
            self._context, self._store = agent._pcontext, worker_group.store
            self.keys_at_start = self._num_keys()
            return pids

        def _exit_barrier(agent: Any) -> None:
            self.keys_at_end = self._num_keys()  # before the agents' own barrier keys
            exit_barrier(agent)  # type: ignore[no-untyped-call]  # unannotated in torch

        LocalElasticAgent._start_workers = _start_workers  # type: ignore[method-assign]
        LocalElasticAgent._exit_barrier = _exit_barrier  # type: ignore[method-assign]

    def _num_keys(self) -> int | None:
        try:
            return int(self._store.num_keys())
        except Exception:  # a store that cannot count: say nothing about meeting
            return None

    def exits(self) -> dict[str, dict[str, Any]]:
        """``{global rank: {local_rank, exitcode, signal, pid}}`` of every worker started."""
        handlers = getattr(self._context, "subprocess_handlers", None) or {}
        out = {}
        for local_rank, handler in handlers.items():
            code = handler.proc.poll()
            if code is None:  # still running: the sweep in ups launch ends it
                continue
            rank = self._context.envs[local_rank]["RANK"]
            out[rank] = {
                "local_rank": local_rank,
                "exitcode": code,
                "signal": signal.Signals(-code).name if code < 0 else None,
                "pid": handler.proc.pid,
            }
        return out


def main(argv: list[str]) -> int:
    _die_with_parent()
    result_path = Path(argv[0])
    args = get_args_parser().parse_args(argv[1:])
    # Each rank's --redirects destinations become named pipes that launch reads
    # (ups.launch.ranklogs). torchrun picks its LogsSpecs class by entry-point name; this
    # child runs torchrun in-process, so it hands over the class directly instead of
    # depending on the package's installed metadata.
    torch_run._get_logs_specs_class = _fifo_logs_specs
    watch = WorkerWatch()
    watch.install()
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
            _write(result_path, _with_workers(result, watch))
            raise
        result.update(status="port_in_use", error=f"{type(err).__name__}: {err}")
        rc = 1
    except Exception as err:
        result.update(status="error", error=f"{type(err).__name__}: {err}")
        _write(result_path, _with_workers(result, watch))
        raise
    _write(result_path, _with_workers(result, watch))
    return rc


def _with_workers(result: dict[str, Any], watch: WorkerWatch) -> dict[str, Any]:
    keys = None
    if watch.keys_at_start is not None and watch.keys_at_end is not None:
        keys = {"at_start": watch.keys_at_start, "at_end": watch.keys_at_end}
    return {**result, "workers": watch.exits(), "store_keys": keys}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
