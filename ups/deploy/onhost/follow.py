"""Follow a deployed run's launch.log to its end and report how the run ended."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabric import Connection

from ups.console import ConsoleView
from ups.deploy.onhost.runs import read_result
from ups.deploy.transport import remote as rc
from ups.deploy.transport.session import Target
from ups.deploy.transport.stream import LogFollower


def follow(
    target: Target,
    found: rc.RemoteRun,
    mirror: Path | None = None,
    *,
    offset: int = 0,
    connect: Callable[[], Connection] | None = None,
    each_line: Callable[[bytes], None] | None = None,
    give_up_after_s: float = 600.0,
) -> int:
    """Stream the run's launch.log from ``offset`` until it ends; return the run's exit code.

    ``connect`` replaces ``target.connect`` for every (re)connection and ``each_line`` sees
    every line first: the vast kind uses them to notice a lost instance and keep the log.
    """
    view = ConsoleView(target.out)  # live progress and tables on a terminal, lines otherwise
    sink = mirror.open("wb") if mirror is not None else None
    conns: list[Connection] = []

    def open_transport() -> Any:
        conn = (connect or target.connect)()
        conns.append(conn)
        return conn.transport

    def on_line(line: bytes) -> None:
        if each_line is not None:
            each_line(line)
        if sink is not None:
            sink.write(line)
            sink.flush()
        view.feed(line.decode("utf-8", "replace").rstrip("\n"))

    follower = LogFollower(
        open_transport,
        found.launch_log,
        found.done_files,
        on_line,
        offset=offset,
        heartbeat_s=float(target.spec.keepalive_s),
        give_up_after_s=give_up_after_s,
    )
    try:
        stats = follower.follow()
        code, outcome = read_result(conns[-1], found, target.spec)
    finally:
        view.close()
        follower.close()
        for c in conns:
            c.close()
        if sink is not None:
            sink.close()
    summary = f"run {found.run_id}: {stats.lines} log lines, {stats.reconnects} reconnects; "
    if outcome is not None:
        summary += f"{outcome.outcome} (exit {code}): {outcome.reason}"
    else:
        summary += f"launcher exited {code} without writing outcome.json (see {found.state_dir})"
    target.say(summary)
    if code not in (0,) and found.deployed:
        # With --fresh the same command would start yet another run: --run names this one.
        target.say(
            "to continue it, run the same `fab deploy` (or `ups deploy`) again, with "
            f"--run {found.run_id} in place of --fresh if it had that"
        )
    return code
