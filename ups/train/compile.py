"""``training.compile``: compile the model once, before the first step, on every rank together.

``torch.compile`` compiles lazily, at the first forward, and a failure there (no C++
compiler for the CPU backend, an unsupported operation) would surface as an exception on
some ranks in the middle of a step, while the others wait in a collective for them. So
the trainer compiles up front: every rank runs one forward and backward of the first
batch outside any collective, then all ranks exchange how it went (one unconditional
``all_gather_object``, reached on every path) and either all train or all stop with the
same error, naming each failed rank's reason and the fix.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch import nn

from ups.log import get_logger
from ups.outcome import EXIT_CONFIG
from ups.train.failures import RunFailed
from ups.train.loop import Batch, Trainer

log = get_logger()
_COMPILER_WORDS = ("cxx", "c++ compiler", "g++", "gcc", "cc1", "compiler found")


def compile_model(model: nn.Module) -> None:
    """Compile ``model`` in place (its ``state_dict`` keys stay the same for checkpoints)."""
    model.compile()


def compile_check(trainer: Trainer, batch: Batch) -> None:
    """Compile on every rank with one real forward/backward of ``batch``; raise
    :class:`RunFailed` on every rank when any rank failed. Changes no state: the RNG is
    restored and the gradients cleared.

    Local rank 0 compiles first and the other ranks of its host after it: they then load
    its kernels from inductor's on-disk cache instead of all building the same ones at once
    (a 2-rank CPU compile took ~70 s per rank in parallel, ~6 s from the cache).
    """
    error = None
    if trainer.env.local_rank == 0:
        error = _try_compile(trainer, batch)
    dist.barrier()  # every rank, on every path: no collective inside the attempts
    if trainer.env.local_rank != 0:
        error = _try_compile(trainer, batch)
    errors: list[str | None] = [None] * trainer.env.world_size
    dist.all_gather_object(errors, error)
    failed = {rank: text for rank, text in enumerate(errors) if text is not None}
    if failed:
        raise RunFailed(compile_failure(failed), exit_code=EXIT_CONFIG, cause="config",
                        failed_rank=min(failed))  # fmt: skip
    trainer.compiled = True
    log.info("compiled", model=type(trainer.model.module).__name__)


def _try_compile(trainer: Trainer, batch: Batch) -> str | None:
    """This rank's compile error (first line), or None when forward and backward ran."""
    if trainer.device.type == "cpu":
        try:
            _find_cxx()
        except Exception as exc:  # the host has no compiler: its setup, no traceback
            missing = _first_line(exc)
            log.error("compile_failed", error=missing, stage="compiler_search")
            return missing
    error: str | None = None
    devices = [trainer.device] if trainer.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        try:
            trainer.forward_backward(batch, step=-1, sync=False)  # no collective inside
        except Exception as exc:  # any failure to compile is this rank's answer
            error = _first_line(exc)
            log.error("compile_failed", error=error, stage="trace", exc_info=True)
    trainer.optimizer.zero_grad(set_to_none=True)
    return error


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]


def _find_cxx() -> None:
    """Inductor's own search for the C++ compiler its CPU backend builds with (it honours
    ``CXX``), before any tracing: without one, the forward would fail the same way, but
    only after tracing the whole model on every rank (on the tiny test model ~10 s per
    rank; on a real one minutes). Raises inductor's ``InvalidCxxCompiler``."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
    except ImportError:  # a torch without it: the forward below finds out
        return
    if inspect.signature(get_cpp_compiler).parameters:  # a private API: only as 2.11-2.13 have it
        return
    get_cpp_compiler()


def compile_failure(failed: dict[int, str]) -> str:
    """The reason for a failed compile: which ranks, what each said, and the fix."""
    said = "; ".join(f"rank {rank}: {text}" for rank, text in sorted(failed.items()))
    fix = "set training.compile: false (or --set training.compile=false)"
    if any(word in text.lower() for text in failed.values() for word in _COMPILER_WORDS):
        fix = (
            "install a C++ compiler (torch.compile's CPU backend builds C++; on Debian/Ubuntu "
            f"`apt-get install build-essential`), or {fix}"
        )
    return (
        f"torch.compile failed before the first step on rank(s) {sorted(failed)} ({said}); "
        f"no rank trained. Fix: {fix}"
    )
