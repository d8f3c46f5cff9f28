"""``python -m ups.deploy.vast.watchdog``, as the previous release's onstart script names
it: the same watchdog as :mod:`ups.deploy.providers.vast.watchdog` (kept for one release)."""

from __future__ import annotations

import sys

from ups.deploy.providers.vast.watchdog import main

if __name__ == "__main__":
    sys.exit(main())
