"""Where a deployed run lives on the remote host, and every shell command deploy sends there.

This module is the one place remote shell text is built. Pure functions: they build
strings, never touch a connection, so tests and ``--dry-run`` show exactly what will
run. Every value that comes from a config, a hosts file or a flag (run ids, paths,
executables, service names) goes through :func:`q` (``shlex.quote``) or :func:`argv`;
the fixed shell around them is literal text. Secrets never appear here (they travel in
a 0600 file that the run script sources).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ups.bucket.credentials import FILE_NAME as CREDENTIALS_FILE
from ups.bucket.credentials import RENEWABLE_ENV

STATE_DIR = ".ups/deploy"
RUN_FILE = "run-file.json"
"""A script run's run file as sent to the host (what ``ups launch --run-file`` reads): the
run's input, not a record of it. How the run ended is ``outcome.json`` alone; the managed
run's record (``runs/<id>/run.json`` on the laptop) keeps a copy of it, a view."""
"""Per-run deploy state under the remote workdir: config, run script, pid, exit code."""


def q(value: str) -> str:
    """One shell word, whatever ``value`` holds."""
    return shlex.quote(value)


def argv(*words: str) -> str:
    """A command line from an argv list: every word quoted."""
    return shlex.join(words)


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
    def fetched_mark(self) -> str:
        """Written by ``fab fetch`` once the run came home: ``ups dev-host down`` asks
        before deleting a run without it, or one that changed after it."""
        return self.state("fetched")

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
    """Prefix the host's ``remote_env`` line (hosts.yaml: the user's own shell, on purpose)."""
    return f"{remote_env}\n{command}" if remote_env else command


def in_dir(workdir: str, command: str) -> str:
    return f"cd {q(workdir)} && {command}"


def exists_command(*paths: str) -> str:
    """Exit 0 when any of ``paths`` exists."""
    return " || ".join(f"test -e {q(p)}" for p in paths) or "false"


def mkdir_command(*paths: str) -> str:
    return argv("mkdir", "-p", *paths)


def remove_tree_command(path: str) -> str:
    return argv("rm", "-rf", path)


def read_file_command(path: str) -> str:
    return f"cat {q(path)} 2>/dev/null || true"


def file_size_command(path: str) -> str:
    return f"if [ -f {q(path)} ]; then wc -c < {q(path)}; else echo 0; fi"


def secrets_line(run: RemoteRun) -> str:
    """Export the run's secrets file into the environment, when there is one, and point
    boto3 at the run's S3 credentials file (checkpoint_sync), when there is one."""
    path, aws = q(run.state("secrets.env")), q(run.state(CREDENTIALS_FILE))
    return (
        f"if [ -f {path} ]; then set -a; . {path}; set +a; fi; "
        f"if [ -f {aws} ]; then export AWS_SHARED_CREDENTIALS_FILE={aws} "
        f"{RENEWABLE_ENV}={aws}; fi"
    )


def run_script(run: RemoteRun, launch_argv: Sequence[str], remote_env: str | None) -> str:
    """The script the detached job runs: source secrets, launch, record pid and exit code.

    The pid is the launcher's own (``ups launch``), so ``stop`` sends SIGTERM to exactly
    the process that forwards it to the ranks.
    """
    s = run.state
    lines = [
        "#!/bin/sh",
        "# written by `fab deploy`; runs detached under setsid nohup",
        f"cd {q(run.workdir)} || exit 1",
        remote_env or "",
        secrets_line(run),
        f"export UPS_RUN_ID={q(run.run_id)}",
        argv(*launch_argv) + " &",
        f"echo $! > {q(s('pid'))}",
        "wait $!",
        f"echo $? > {q(s('exit.tmp'))} && mv {q(s('exit.tmp'))} {q(s('exit'))}",
    ]
    return "\n".join(line for line in lines if line) + "\n"


def start_command(run: RemoteRun) -> str:
    """Start the run script in its own session, immune to the SSH session ending."""
    s = run.state
    return (
        f"rm -f {q(s('exit'))} {q(s('pid'))}; "
        f"setsid nohup sh {q(s('run.sh'))} > {q(s('nohup.log'))} 2>&1 < /dev/null & "
        f"ln -sfn {q(run.run_id)} {q(latest_link(run.workdir))}; echo started"
    )


def status_command(run: RemoteRun) -> str:
    """Print ``pid=``, ``alive=``, ``exit=`` and ``last=`` (the log's last line) as lines."""
    s = run.state
    return (
        f"pid=$(cat {q(s('pid'))} 2>/dev/null); echo pid=$pid; "
        'if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo alive=1; else echo alive=0; fi; '
        f"[ -f {q(s('exit'))} ] && echo exit=$(cat {q(s('exit'))}); "
        f"[ -f {q(run.launch_log)} ] && printf 'last=%s\\n' \"$(tail -n 1 {q(run.launch_log)})\"; "
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


def follow_command(path: str, offset: int, done: Sequence[str], heartbeat_s: float) -> str:
    """The remote shell script: tail from byte ``offset`` until a done file exists."""
    tests = " && ".join(f"[ ! -e {q(p)} ]" for p in done) or "true"
    ticks = max(1, round(heartbeat_s / 0.2))
    log = q(path)
    beat = f"n=$((n+1)); if [ $n -ge {ticks} ]; then n=0; printf . >&2 || exit 1; fi"
    # tail -F on a missing file falls back to 1 s polling even after the file appears,
    # so wait for the file first; then tail uses inotify and lines arrive in milliseconds.
    return (
        f"n=0; while [ ! -e {log} ]; do {tests} || exit 0; sleep 0.1; {beat}; done; "
        f"tail -s 0.2 -c +{offset + 1} -F {log} 2>/dev/null & T=$!; "
        "trap 'kill $T 2>/dev/null' EXIT HUP PIPE TERM; "
        f"while {tests}; do sleep 0.2; {beat}; done; exit 0"
    )


def catch_up_command(path: str, offset: int) -> str:
    return f"[ -e {q(path)} ] && tail -c +{offset + 1} {q(path)} || true"


def tar_run_command(run: RemoteRun, exclude: Sequence[str] = ()) -> str:
    """Stream the run directory as a tar on stdout (for ``fetch``); links stay links.

    ``exclude`` names files (relative to the run directory) already copied home."""
    parent, name = posixpath.split(run.run_dir)
    skip = [f"--exclude={posixpath.join(name, path)}" for path in exclude]
    return argv("tar", "-C", parent, *skip, "-cf", "-", name)


def tar_paths_command(base: str, paths: Sequence[str]) -> str:
    """Stream ``paths`` (relative to ``base``) as a tar on stdout; one that is gone is left
    out rather than failing the rest (for ``fetch``: a script's outputs)."""
    return argv("tar", "-C", base, "--ignore-failed-read", "-cf", "-", "--", *paths)


def write_word_command(path: str, word: str) -> str:
    """Write one word (a number, an id) to ``path`` on the host."""
    return f"echo {q(word)} > {q(path)}"


def run_size_command(run: RemoteRun) -> str:
    """Print the run directory's apparent size in bytes (close to its tar's: a fetch ETA)."""
    return argv("du", "-sb", run.run_dir) + " | cut -f1"


def ups_python(ups_bin: str, *, required: bool = False) -> str:
    """Shell that sets ``$UPS`` to ``ups_bin``'s path and ``$PY`` to the interpreter in its
    ``#!`` line: the one way deploy finds the Python that runs ups on a host. ``required``
    exits 127 with a message when ``ups_bin`` is not found."""
    find = f"UPS=$(command -v {q(ups_bin)})"
    if required:
        find += f" || {{ echo {q(f'ups not found: {ups_bin}')} >&2; exit 127; }}"
    return find + '; PY=$(head -n 1 "$UPS" | sed "s/^#!//")'


def code_info_command(ups_bin: str) -> str:
    """Print the remote ``ups`` and ``torch`` versions as JSON, using ups's own interpreter.

    The versions come from torch's generated ``torch/version.py``, run on its own: importing
    torch would cost seconds of CPU on every deploy for two strings."""
    probe = (
        "import importlib.util, json, os, runpy, ups; "
        'torch = importlib.util.find_spec("torch").submodule_search_locations[0]; '
        'v = runpy.run_path(os.path.join(torch, "version.py")); '
        'print(json.dumps({"ups": ups.__version__, "torch": v["__version__"], "cuda": v["cuda"]}))'
    )
    return f"{ups_python(ups_bin, required=True)}; $PY -c {q(probe)}"


def pip_install_command(ups_bin: str, wheel: str) -> str:
    """Install ``wheel`` into the interpreter that runs ``ups_bin`` (``--sync-wheel``)."""
    return (
        f"{ups_python(ups_bin)}; $PY -m pip install --quiet --no-deps --force-reinstall {q(wheel)}"
    )


def preflight_argv(
    ups_bin: str, config: str | None, gpus: int, *, check_port: bool = True
) -> list[str]:
    """``ups preflight`` as deploy runs it: the table once, no repeated JSON events.

    ``check_port=False`` leaves the master-port check out, as ``ups launch``'s own gate
    does where the port is not this host's to hold: a single node moves to a free port
    by itself, and only node 0 of a multi-host job binds the rendezvous port.
    """
    words = [ups_bin, "preflight", "--events", "off"]
    if not check_port:
        words += ["--skip", "ports"]
    if config:
        words += ["--config", config]
    if gpus:
        words += ["--gpus", str(gpus)]
    return words


SYNC_MANIFEST = ".ups-sync.json"
"""In a synced code directory: what was sent (path -> size and SHA-256), for the next sync."""


def unpack_command(archive: str, dest: str, remove: Sequence[str]) -> str:
    """Unpack a sync archive into ``dest``, delete it, then the files gone from the workdir
    (``remove``, relative to ``dest``)."""
    gone = f" && cd {q(dest)} && rm -f -- {argv(*remove)}" if remove else ""
    return f"mkdir -p {q(dest)} && tar -xzf {q(archive)} -C {q(dest)} && rm -f {q(archive)}" + gone


SETUP_CACHED = "ups-setup-cached"


def setup_command(ups_bin: str, code_dir: str, marker: str, command: str) -> str:
    """Run the user's ``setup`` command once per ``marker`` (its content hash), in the
    synced code dir, with ups's own interpreter first on PATH (``pip`` installs where the
    script runs). ``command`` is the user's own shell text, sent as written."""
    return (
        f"if [ -f {q(marker)} ]; then echo {SETUP_CACHED}; exit 0; fi; "
        f'{ups_python(ups_bin)}; export PATH="$(dirname "$PY"):$PATH"; '
        # On lines of its own: a `#` comment in the command must not swallow the `)`.
        f"cd {q(code_dir)} && (\n{command}\n) && mkdir -p {q(posixpath.dirname(marker))} "
        f"&& touch {q(marker)}"
    )


def missing_paths_command(base: str, paths: Sequence[str]) -> str:
    """Print each of ``paths`` (relative to ``base``) that does not exist, one a line."""
    return f'cd {q(base)} && for p in {argv(*paths)}; do [ -e "$p" ] || echo "$p"; done'
