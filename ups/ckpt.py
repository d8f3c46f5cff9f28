"""The checkpoint contract for your own script, as a few helpers (docs/script.md).

ups starts every rank of a ``--script`` run with ``UPS_CHECKPOINT_DIR`` (where to save),
``UPS_RUN_ID`` and ``UPS_RESUME`` (the newest committed checkpoint there when the run
started, or empty). A checkpoint counts as *committed* when it is complete:

- written under a temporary name (``*.tmp``, or a name starting with ``.``) and renamed
  to its final name (``os.replace``; :func:`commit` does that for a ``*.tmp`` path), or
- named through :func:`commit` (recorded in ``.ups-committed`` in the directory). Once a
  directory has that record, only the checkpoints it names count.

Under ``--stall-timeout`` (docs/script.md) every call of :func:`should_stop`, :func:`commit`
and :func:`progress` is also a heartbeat: at most once a second it rewrites
``$UPS_PROGRESS_DIR/rank<RANK>`` (with the last step given to :func:`progress`), which ups
reads as "this rank is making progress".

This module uses only the standard library and nothing else of ups: copy it into your
project, or ``from ups import ckpt``. Using it is optional; the environment variables
and the naming rule are the whole contract.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType

ENV_DIR = "UPS_CHECKPOINT_DIR"
ENV_RESUME = "UPS_RESUME"
ENV_RUN_ID = "UPS_RUN_ID"
ENV_PROGRESS = "UPS_PROGRESS_DIR"
"""Where the heartbeats go (set by ``ups launch`` when it watches for stalls)."""
BEAT_EVERY_S = 1.0
RECORD = ".ups-committed"
"""Names committed through :func:`commit`, one a line, oldest first."""
TMP_SUFFIX = ".tmp"
DEFAULT_DIR = "checkpoints"
"""Where :func:`checkpoint_dir` points outside ups (the script run bare under torchrun)."""

_stop = threading.Event()
_handler_installed = False
_beat_at = float("-inf")
_beat_step: int | None = None


def checkpoint_dir() -> Path:
    """``$UPS_CHECKPOINT_DIR`` (``./checkpoints`` when not run by ups), created if missing."""
    path = Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def is_rank0() -> bool:
    """True on global rank 0 (``RANK``; a script run without torchrun is rank 0)."""
    return os.environ.get("RANK", "0") == "0"


def is_complete_name(name: str) -> bool:
    """A final name by the rename rule: not hidden, not ``*.tmp``."""
    return not name.startswith(".") and not name.endswith(TMP_SUFFIX)


def committed(directory: Path) -> list[Path]:
    """The committed checkpoints in ``directory``, oldest first (modification time, then
    name). Files and directories both count (a sharded checkpoint is a directory)."""
    record = directory / RECORD
    try:
        named = record.read_text().splitlines()
    except FileNotFoundError:
        named = None
    except NotADirectoryError:
        return []
    if named is not None:
        found = [directory / n for n in dict.fromkeys(named) if n and (directory / n).exists()]
    else:
        try:
            found = [p for p in directory.iterdir() if is_complete_name(p.name)]
        except (FileNotFoundError, NotADirectoryError):
            return []
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))


def latest(directory: Path | None = None) -> Path | None:
    """The newest committed checkpoint in ``directory`` (default :func:`checkpoint_dir`),
    read now; ``$UPS_RESUME`` is the same answer taken when the run started."""
    found = committed(directory if directory is not None else checkpoint_dir())
    return found[-1] if found else None


def resume_path() -> Path | None:
    """``$UPS_RESUME`` as a path, or None when the run starts from the beginning."""
    value = os.environ.get(ENV_RESUME, "")
    return Path(value) if value else None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(path: str | os.PathLike[str]) -> Path:
    """Mark the checkpoint at ``path`` complete; returns its committed path.

    A ``*.tmp`` file is renamed to its name without ``.tmp``; any other name is added to
    the directory's ``.ups-committed`` record (from then on only recorded names count).
    Call it on one rank (usually rank 0), after the file is fully written.
    """
    source = Path(path)
    if source.is_file():
        with source.open("rb") as f:
            os.fsync(f.fileno())
    if source.name.endswith(TMP_SUFFIX):
        _beat()
        final = source.with_name(source.name.removesuffix(TMP_SUFFIX))
        os.replace(source, final)
        _fsync_dir(final.parent)
        return final
    record = source.parent / RECORD
    names = record.read_text().splitlines() if record.exists() else []
    if not names:
        # The first recorded name switches the directory to the record: keep the
        # checkpoints committed by the rename rule until now.
        names = [p.name for p in committed(source.parent) if p != source]
    _beat()
    names.append(source.name)
    staged = record.with_name(RECORD + TMP_SUFFIX)
    staged.write_text("".join(f"{n}\n" for n in names))
    with staged.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(staged, record)
    _fsync_dir(source.parent)
    return source


def _on_term(_signum: int, _frame: FrameType | None) -> None:
    _stop.set()


def should_stop() -> bool:
    """True once this process got SIGTERM (a preemption, ``fab stop``): save and exit.

    The first call installs the handler (call it once early, before training starts).
    Ranks can see the signal at different steps: agree on it, e.g. with an
    ``all_reduce(MAX)`` of the flag each step, before saving.
    """
    global _handler_installed
    if not _handler_installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_term)
        _handler_installed = True
    _beat()
    return _stop.is_set()


def progress(step: int | None = None) -> None:
    """Tell ups this rank is making progress (``step``: where it is, shown if it stalls).

    A script that calls :func:`should_stop` every step needs nothing more. Call this where
    a rank works for long without printing or calling anything here (a long evaluation
    loop); it costs a clock read, and a file write at most once a second.
    """
    _beat(step)


def _beat(step: int | None = None) -> None:
    global _beat_at, _beat_step
    if step is not None:
        _beat_step = step
    now = time.monotonic()
    if now - _beat_at < BEAT_EVERY_S:
        return
    _beat_at = now
    directory = os.environ.get(ENV_PROGRESS)
    if not directory:
        return
    path = Path(directory) / f"rank{os.environ.get('RANK', '0')}"
    # A heartbeat that cannot be written (a full disk) must not fail the training it
    # reports on; the watcher still sees the rank's CPU, I/O and output.
    with contextlib.suppress(OSError):
        path.write_text("" if _beat_step is None else f"{_beat_step}\n")
