"""Where ups keeps what it remembers for this user across commands (not per run).

``$UPS_STATE_DIR`` when set (tests, several accounts), else ``$XDG_STATE_HOME/ups``, else
``~/.local/state/ups`` (the XDG base directory default for state that survives restarts
but is not configuration).
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """The user's ups state directory (not created here)."""
    explicit = os.environ.get("UPS_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(base) / "ups"
