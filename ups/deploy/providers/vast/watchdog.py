"""``python -m ups.deploy.providers.vast.watchdog``, as the previous release's onstart
script names it: the one watchdog (:mod:`ups.deploy.providers.watchdog`) for Vast. Its
files stay where that release put them (``.ups/vast``)."""

from __future__ import annotations

import sys

from ups.deploy.providers import watchdog

if __name__ == "__main__":
    sys.exit(watchdog.main(["--provider", "vast", "--watch-dir", ".ups/vast", *sys.argv[1:]]))
