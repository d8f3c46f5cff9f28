"""What a run runs: the ups trainer with a config, or your own script (docs/script.md).

A script comes as ``--script PATH -- ARGS`` or as a run file (``ups-run.yaml``)::

    script: train.py              # relative to workdir
    args: [--steps, "20"]
    workdir: .                    # relative to the run file; synced to the host by deploy
    setup: ["pip install -r requirements.txt"]   # once per content of the files named
    env: [HF_TOKEN]               # secret names: values from this machine's env or env_file
    env_file: .env                # NAME=VALUE lines (optional)
    checkpoint_dir: checkpoints   # relative to workdir (default: <run dir>/checkpoints)
    data: [data/train.h5]         # must exist (relative to workdir) before the run starts
    outputs: [lightning_logs]     # what else the script writes (globs, relative to workdir):
                                  # `fab fetch` and the bucket's last pass bring it home
    include: []                   # synced even when .gitignore leaves them out
    exclude: ["*.log"]            # never synced
    stop_grace_s: 120             # SIGTERM -> SIGKILL of the ranks
    checkpoint_sync:              # ups uploads the newest committed checkpoint there and
      url: s3://bucket/prefix     # restores it on a new host (optional)
      endpoint_url: https://...   # an S3-compatible store other than AWS (optional)
      credentials: auto           # a rented host's keys: auto|scoped (minted), account

Every problem is found at once and reported together (:class:`WorkloadError`, exit 2).
Nothing here imports torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ups.bucket.store import parse_url

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV = ("UPS_CHECKPOINT_DIR", "UPS_RESUME", "UPS_RUN_ID", "UPS_RUN_DIR")


class WorkloadError(ValueError):
    """The script or run file is invalid; the message lists every problem, one paragraph
    each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        body = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid run {source}: {len(problems)} problem(s)\n{body}")


def _bucket_url(url: str) -> str:
    parse_url(url)  # raises ValueError naming the form to write
    return url


class _Sync(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, AfterValidator(_bucket_url)]
    endpoint_url: str | None = None
    credentials: Literal["auto", "scoped", "account"] = "auto"


class _RunFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    script: str
    args: list[str] = Field(default_factory=list)
    workdir: str = "."
    setup: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list)
    env_file: str | None = None
    checkpoint_dir: str | None = None
    data: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    stop_grace_s: int | None = Field(None, ge=1)
    checkpoint_sync: _Sync | None = None


@dataclass(frozen=True, kw_only=True)
class ScriptWorkload:
    """Your own torchrun-compatible script, and what ups needs to run it anywhere."""

    script: str
    """Path relative to ``workdir`` (or absolute, for ``--script`` outside any workdir)."""
    workdir: Path
    args: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    """Names of secrets the script reads; values never travel on a command line."""
    env_file: Path | None = None
    checkpoint_dir: str | None = None
    """Relative to ``workdir``; None: the run directory's ``checkpoints/``."""
    data: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    """What the script writes besides its checkpoints (globs relative to ``workdir``):
    ``fab fetch`` and a bucket's last pass bring them home with the run."""
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    stop_grace_s: int | None = None
    checkpoint_sync: str | None = None
    """``s3://bucket/prefix``: ups uploads the newest committed checkpoint to
    ``<url>/<run id>/`` and restores it into ``checkpoint_dir`` on a new host."""
    sync_endpoint: str | None = None
    """The S3 endpoint of a store other than AWS."""
    sync_credentials: Literal["auto", "scoped", "account"] = "auto"
    """What a rented host gets (``checkpoint_sync.credentials`` of the trainer's config):
    ``auto`` and ``scoped``: keys minted for the run; ``account``: this machine's."""
    source: str = "--script"
    """Where it came from, for messages: ``--script`` or the run file's path."""

    @property
    def name(self) -> str:
        """The run name (run ids start with it): the script's stem."""
        return PurePosixPath(self.script).stem

    def secrets(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The values of ``env``: from ``env_file`` when it sets them, else ``environ``."""
        values = dict(environ)
        if self.env_file is not None and self.env_file.is_file():
            values.update(_read_env_file(self.env_file))
        return {name: values[name] for name in self.env if name in values}

    def missing_data(self) -> list[str]:
        """``data`` paths that do not exist under ``workdir``."""
        return [d for d in self.data if not (self.workdir / d).exists()]

    def for_host(self, workdir: str) -> dict[str, Any]:
        """The run file ``ups launch --run-file`` reads on the host: the code already
        synced to ``workdir``, setup done, secrets in the run's environment."""
        return {
            "script": self.script,
            "args": list(self.args),
            "workdir": workdir,
            "checkpoint_dir": self.checkpoint_dir,
            "data": list(self.data),
            "outputs": list(self.outputs),
            "stop_grace_s": self.stop_grace_s,
            "checkpoint_sync": (
                {"url": self.checkpoint_sync, "endpoint_url": self.sync_endpoint}
                if self.checkpoint_sync
                else None
            ),
        }


def _relative_problem(key: str, value: str) -> str | None:
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts:
        return (
            f"{key}: {value!r} must be a path inside workdir (relative, no '..'): it names the "
            "same place on this machine and on the host"
        )
    return None


def _read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.removeprefix("export ").partition("=")
            values[key.strip()] = value.strip().strip("'\"")
    return values


def _check(w: ScriptWorkload, environ: Mapping[str, str], local: bool) -> list[str]:
    problems = []
    if not w.workdir.is_dir():
        problems.append(f"workdir: {str(w.workdir)!r} is not a directory")
    elif not (w.workdir / w.script).is_file():
        problems.append(
            f"script: {w.script!r} is not a file in workdir {str(w.workdir)!r}; give its path "
            "relative to workdir"
        )
    elif not w.script.endswith(".py"):
        problems.append(f"script: {w.script!r} must be a Python file (torchrun runs it)")
    if w.checkpoint_dir is not None and PurePosixPath(w.checkpoint_dir) == PurePosixPath("."):
        problems.append(WORKDIR_AS_CHECKPOINTS)
    relative = [("checkpoint_dir", w.checkpoint_dir)] if w.checkpoint_dir else []
    listed = [*(("data", d) for d in w.data), *(("outputs", o) for o in w.outputs)]
    for key, value in [*relative, *listed]:
        if problem := _relative_problem(key, value):
            problems.append(problem)
    if local and w.env_file is not None and not w.env_file.is_file():
        problems.append(f"env_file: {str(w.env_file)!r} does not exist")
    values = w.secrets(environ)
    for name in w.env:
        if not _NAME.fullmatch(name):
            problems.append(f"env: {name!r} is not a variable name (letters, digits, '_')")
        elif name in RESERVED_ENV:
            problems.append(f"env: {name} is set by ups for every rank; pick another name")
        elif local and name not in values:
            problems.append(
                f"env: {name} is not set here: export it, or put `{name}=...` in the env_file"
            )
    return problems


WORKDIR_AS_CHECKPOINTS = (
    "checkpoint_dir: '.' is the workdir itself: every file and folder in it (your code, ups's "
    "runs/) would count as a committed checkpoint, and UPS_RESUME would name one of them; "
    "give the checkpoints a folder of their own, e.g. `checkpoint_dir: checkpoints`"
)


def checkpoint_dir_problem(directory: Path, workdir: Path, output_dir: Path) -> str | None:
    """Why ``directory`` cannot be a script's ``UPS_CHECKPOINT_DIR``: it is the workdir, or
    ups's output directory is in it (every run directory would look like a checkpoint)."""
    where, out = directory.resolve(), output_dir.resolve()
    if where == workdir.resolve():
        return WORKDIR_AS_CHECKPOINTS.replace("'.'", f"{str(directory)!r}", 1)
    if where == out or where in out.parents:
        return (
            f"checkpoint_dir: {str(directory)!r} holds ups's output directory {str(out)!r}: its "
            "run directories would count as committed checkpoints, and UPS_RESUME would name "
            "one of them; give the checkpoints a folder of their own (the default, "
            "<run dir>/checkpoints, needs no setting)"
        )
    return None


_PATH_KEYS = ("script", "workdir", "env_file")
"""Keys naming files checked even when other keys are refused (errors all at once)."""


def _pydantic_problems(err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors():
        key = ".".join(map(str, e["loc"])) or "(top level)"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "extra_forbidden":
            msg += f" (the keys are: {', '.join(_RunFile.model_fields)})"
        problems.append(f"{key}: {msg}")
    return problems


def load_run_file(
    path: Path, environ: Mapping[str, str] | None = None, *, local: bool = True
) -> ScriptWorkload:
    """Read and check a run file. ``local``: this is the machine the run is sent from
    (secrets must be available); on the host they are already in the environment.
    Raises :class:`WorkloadError` listing every problem."""
    source = str(path)
    environ = os.environ if environ is None else environ
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise WorkloadError(source, [f"cannot read it: {err.strerror or err}"]) from None
    except yaml.YAMLError as err:
        raise WorkloadError(source, [f"not valid YAML: {err}"]) from None
    if not isinstance(raw, dict):
        raise WorkloadError(source, ["must be a mapping with at least `script: PATH`"])
    base = path.parent
    try:
        model = _RunFile.model_validate(raw)
    except ValidationError as err:
        # Every problem at once: what the schema refuses, and what the well-formed keys
        # name that is not there (a missing workdir, script or env_file).
        problems = _pydantic_problems(err)
        refused = {p.split(":", 1)[0].split(".", 1)[0] for p in problems}
        known = {k: v for k, v in raw.items() if k in _PATH_KEYS and k not in refused}
        if isinstance(known.get("script", ""), str) and all(
            isinstance(v, str) for v in known.values()
        ):
            partial = ScriptWorkload(
                script=known.get("script", ""),
                workdir=base / known.get("workdir", "."),
                env_file=(base / known["env_file"]) if "env_file" in known else None,
            )
            found = _check(partial, environ, local)
            problems += [p for p in found if p.split(":", 1)[0] in known]
        raise WorkloadError(source, problems) from None
    workdir = base / model.workdir
    workload = ScriptWorkload(
        script=model.script,
        workdir=workdir,
        args=tuple(model.args),
        setup=tuple(model.setup),
        env=tuple(model.env),
        env_file=(base / model.env_file) if model.env_file else None,
        checkpoint_dir=model.checkpoint_dir,
        data=tuple(model.data),
        outputs=tuple(model.outputs),
        include=tuple(model.include),
        exclude=tuple(model.exclude),
        stop_grace_s=model.stop_grace_s,
        checkpoint_sync=model.checkpoint_sync.url if model.checkpoint_sync else None,
        sync_endpoint=model.checkpoint_sync.endpoint_url if model.checkpoint_sync else None,
        sync_credentials=model.checkpoint_sync.credentials if model.checkpoint_sync else "auto",
        source=source,
    )
    problems = _check(workload, environ, local)
    if problems:
        raise WorkloadError(source, problems)
    return workload


def script_workload(script: str, args: list[str] | tuple[str, ...] = ()) -> ScriptWorkload:
    """``--script PATH -- ARGS``: the script's directory is the workdir."""
    path = Path(script)
    workload = ScriptWorkload(script=path.name, workdir=path.parent, args=tuple(args))
    problems = _check(workload, {}, local=True)
    if problems:
        raise WorkloadError("--script", problems)
    return workload


def with_args(workload: ScriptWorkload, args: list[str]) -> ScriptWorkload:
    """Arguments after ``--`` replace the run file's ``args`` when given."""
    return replace(workload, args=tuple(args)) if args else workload
