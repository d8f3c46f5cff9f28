"""``kind: runpod`` in hosts.yaml: the rented entry with RunPod's own options."""

from __future__ import annotations

import posixpath
from typing import Literal

from pydantic import Field, model_validator

from ups.deploy.entries import RentedHost, SafeWord


class RunPodHost(RentedHost):
    """``kind: runpod``: ups rents a pod for the run (docs/runpod.md)."""

    kind: Literal["runpod"] = "runpod"
    runpod_url: str | None = None
    """API server (default: the SDK's, https://api.runpod.io); the SDK posts to
    ``<runpod_url>/graphql``."""
    cloud_type: Literal["ALL", "SECURE", "COMMUNITY"] = "ALL"
    """RunPod's Secure Cloud (its data centres), Community Cloud (hosts' machines), or
    either."""
    volume_mount_path: SafeWord = "/workspace"
    """Where the pod's volume is mounted: it outlives a stop or a spot interruption (the
    container disk does not), so ``workdir`` must be under it."""
    container_disk_gb: float = Field(20.0, gt=0)
    """The container disk (the image, /tmp, HOME): wiped whenever the pod stops."""

    @model_validator(mode="after")
    def _runpod_fields(self) -> RunPodHost:
        problems = []
        if self.min_reliability is not None:
            problems.append(
                "min_reliability: RunPod reports no reliability figure for its machines; "
                "use cloud_type: SECURE for its own data centres"
            )
        inside = posixpath.normpath(self.workdir).startswith(
            posixpath.normpath(self.volume_mount_path).rstrip("/") + "/"
        )
        if not inside:
            problems.append(
                f"workdir {self.workdir!r} is not under volume_mount_path "
                f"{self.volume_mount_path!r}: a pod's container disk is wiped when it stops, "
                "so the run's checkpoints must be on its volume"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
