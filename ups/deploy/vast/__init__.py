"""Kept for one release: instances started by the previous release run
``python -m ups.deploy.vast.watchdog`` from their onstart script. The Vast provider now
lives in :mod:`ups.deploy.providers.vast`, managed runs in :mod:`ups.deploy.managed`."""
