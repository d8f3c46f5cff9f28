"""Where a run resumes after losing its instance: the newest good checkpoint (the bucket's
first, when newer) and the run's log cut back to it and marked, with the lines of the lost
instance nobody followed taken from the bucket first. :class:`ResumePoints` is what the
controller (:mod:`ups.deploy.managed.controller`) asks at each recovery or adoption.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ups.bucket import Bucket, BucketError
from ups.deploy.managed.checkpoints import newest_good
from ups.deploy.managed.record import Supervision
from ups.deploy.managed.store import fetch_newer
from ups.deploy.managed.watch import LocalLog, Pending


class ResumePoints:
    """The run's local checkpoints and log (and its bucket, when it has one)."""

    def __init__(
        self,
        run_id: str,
        run_dir: Path,
        log: LocalLog,
        sup: Supervision,
        bucket: Bucket | None,
        say: Callable[[str], None],
        script: bool = False,
    ) -> None:
        self.run_id, self.run_dir, self.log, self.sup = run_id, run_dir, log, sup
        self.bucket, self.say = bucket, say
        self.script = script
        """Your own script: the instance's ``ups launch`` restores its newest checkpoint
        from the bucket itself (``ups.launch.scriptrun``); nothing is fetched or sent here."""

    @property
    def recoveries(self) -> int:
        return self.sup.state.recoveries

    def newest(self) -> tuple[int, Path | None]:
        """The newest good checkpoint here after fetching the bucket's when it is newer."""
        if self.script:
            return 0, None
        if self.bucket is not None:
            found = fetch_newer(self.bucket, self.run_id, self.run_dir / "checkpoints", self.say)
            if found is not None:
                self.sup.bucket_has(found)  # the record names the bucket's newest checkpoint
        newest = newest_good(self.run_dir / "checkpoints")
        return newest if newest else (0, None)

    def adopted(self) -> Pending:
        """What an adopted instance resumes from: the newest good checkpoint here (the
        bucket's first, when newer). The log stays as the interrupted recovery cut and
        marked it."""
        step, path = self.newest()
        return Pending(self.recoveries, "adopted", step, path, 0, time.monotonic())

    def after_loss(
        self, reason: str, instance: str | None, detected: float, counted: bool = True
    ) -> Pending:
        """The newest good checkpoint here (the bucket's first, when newer); the log cut
        back to it and marked; the record says where the counted recovery resumes."""
        if self.bucket is not None:
            self.catch_up_log()
        step, path = self.newest()
        lost = self.run_dir / "logs" / f"lost-{instance or 'before'}.log"
        last, moved = self.log.cut_after(step, lost)
        if moved and self.bucket is not None:
            self.keep_in_bucket(lost)
        if counted:
            self.sup.resumes_from(step, last - step)
        self.log.mark(
            recovery=self.recoveries,
            reason=reason,
            lost_instance=instance,
            resume_step=step,
            steps_lost=last - step,
        )
        return Pending(self.recoveries, reason, step, path, last - step, detected)

    def catch_up_log(self) -> None:
        """The lines the lost instance logged while no supervisor followed it: its last
        upload of the log to the bucket, when it continues the copy here."""
        assert self.bucket is not None
        key = f"{self.run_id}/logs/launch.log"
        try:
            data = self.bucket.get_bytes(key)
        except BucketError as err:
            self.say(f"warning: the run's log in the bucket could not be read ({err})")
            return
        if data is not None and (added := self.log.catch_up(data)):
            self.say(f"took {added} bytes of the run's log from {self.bucket.url_of(key)}")

    def keep_in_bucket(self, lost: Path) -> None:
        """The lines after the checkpoint a recovery resumes from (recomputed, so cut from
        the log) stay in the bucket under their own name: the next upload of the log
        replaces ``launch.log`` there."""
        assert self.bucket is not None
        try:
            self.bucket.put_bytes(f"{self.run_id}/logs/{lost.name}", lost.read_bytes())
        except BucketError as err:
            self.say(f"warning: {lost.name} could not be kept in the bucket ({err})")
