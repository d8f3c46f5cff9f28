"""Where a deployed run lives on the remote host, and the shell text that drives it.

Pure functions: they build strings, never touch a connection, so tests and ``--dry-run``
can show exactly what will run. Every path is quoted; secrets never appear here (they
travel in a 0600 file that the run script sources).
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

STATE_DIR = ".ups/deploy"
"""Per-run deploy state under the remote workdir: config, run script, pid, exit code."""


def q(value: str) -> str:
    return shlex.quote(value)


@dataclass(frozen=True)
class RemoteRun:
    """Remote paths of one run (all absolute, POSIX)."""

    workdir: str
    run_id: str
    output_dir: str = "runs"
    """``cfg.run.output_dir`` as the remote process sees it (relative to workdir)."""
    deployed: bool = True
    """Started by ``fab deploy`` (has a state dir whose exit file marks the launcher's end)."""

    @property
    def state_dir(self) -> str:
        return posixpath.join(self.workdir, STATE_DIR, self.run_id)

    def state(self, name: str) -> str:
        return posixpath.join(self.state_dir, name)

    @property
    def run_dir(self) -> str:
        return posixpath.join(self.workdir, self.output_dir, self.run_id)

    @property
    def launch_log(self) -> str:
        return posixpath.join(self.run_dir, "logs", "launch.log")

    @property
    def outcome(self) -> str:
        return posixpath.join(self.run_dir, "outcome.json")

    @property
    def exit_file(self) -> str:
        return self.state("exit")

    @property
    def done_files(self) -> list[str]:
        """The file whose appearance means the log is complete.

        For a deployed run that is the launcher's exit file: ``ups launch`` still appends
        its final lines to launch.log after the trainer wrote outcome.json.
        """
        return [self.exit_file] if self.deployed else [self.outcome]


def latest_link(workdir: str) -> str:
    return posixpath.join(workdir, STATE_DIR, "latest")


def with_env(remote_env: str | None, command: str) -> str:
    return f"{remote_env}\n{command}" if remote_env else command


def run_script(run: RemoteRun, launch_argv: list[str], remote_env: str | None) -> str:
    """The script the detached job runs: source secrets, launch, record pid and exit code.

    The pid is the launcher's own (``ups launch`` or ``docker compose``), so ``stop``
    sends SIGTERM to exactly the process that forwards it to the ranks.
    """
    s = run.state
    lines = [
        "#!/bin/sh",
        "# written by `fab deploy`; runs detached under setsid nohup",
        f"cd {q(run.workdir)} || exit 1",
        remote_env or "",
        f"if [ -f {q(s('secrets.env'))} ]; then set -a; . {q(s('secrets.env'))}; set +a; fi",
        f"export UPS_RUN_ID={q(run.run_id)}",
        " ".join(q(a) for a in launch_argv) + " &",
        f"echo $! > {q(s('pid'))}",
        "wait $!",
        f"echo $? > {q(s('exit.tmp'))} && mv {q(s('exit.tmp'))} {q(s('exit'))}",
    ]
    return "\n".join(line for line in lines if line) + "\n"


def start_command(run: RemoteRun) -> str:
    """Start the run script in its own session, immune to the SSH session ending."""
    s = run.state
    return (
        f"setsid nohup sh {q(s('run.sh'))} > {q(s('nohup.log'))} 2>&1 < /dev/null & "
        f"ln -sfn {q(run.run_id)} {q(latest_link(run.workdir))}; echo started"
    )


def status_command(run: RemoteRun) -> str:
    s = run.state
    return (
        f"pid=$(cat {q(s('pid'))} 2>/dev/null); echo pid=$pid; "
        'if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo alive=1; else echo alive=0; fi; '
        f"[ -f {q(s('exit'))} ] && echo exit=$(cat {q(s('exit'))}); "
        f"[ -f {q(run.launch_log)} ] && echo last=$(tail -n 1 {q(run.launch_log)} | cut -c1-300); "
        "true"
    )


def stop_command(run: RemoteRun) -> str:
    s = run.state
    return (
        f"pid=$(cat {q(s('pid'))} 2>/dev/null) || {{ echo 'no pid file'; exit 3; }}; "
        'kill -TERM "$pid" 2>/dev/null && echo signalled || echo not-running'
    )


def resolve_latest_command(workdir: str) -> str:
    return f"readlink {q(latest_link(workdir))}"


def read_file_command(path: str) -> str:
    return f"cat {q(path)} 2>/dev/null || true"


def tar_run_command(run: RemoteRun) -> str:
    """Stream the run directory as a tar on stdout (for ``fetch``)."""
    parent, name = posixpath.split(run.run_dir)
    return f"tar -C {q(parent)} -cf - {q(name)}"


def code_info_command(ups_bin: str, remote_env: str | None) -> str:
    """Print the remote ``ups`` and ``torch`` versions as JSON, using ups's own interpreter."""
    probe = (
        "import json, ups, torch; "
        "print(json.dumps({'ups': ups.__version__, 'torch': torch.__version__, "
        "'cuda': torch.version.cuda}))"
    )
    return with_env(
        remote_env,
        f'UPS=$(command -v {q(ups_bin)}) || {{ echo "ups not found: {ups_bin}" >&2; exit 127; }}; '
        'PY=$(head -n 1 "$UPS" | sed "s/^#!//"); '
        f"$PY -c {q(probe)}",
    )
