#!/usr/bin/env python3
"""Find every message ups prints for a user mistake or a host fault, and its entry in
docs/troubleshooting.md.

    .venv/bin/python scripts/docs-messages.py            # messages without an entry, ready to paste
    .venv/bin/python scripts/docs-messages.py --all      # every message found, with where

How a message is found (an AST scan of ``ups/``; nothing is imported or run):

* every construction of a user-facing exception (``raise UsageError(f"...")``, ``return
  DeployError(...)``: any call of a class in :data:`USER_FACING`, or of a class of ``ups/``
  that derives from one): its message argument;
* every string added to a list named ``problems`` (``problems.append(f"...")``): a config,
  run-file or hosts.yaml problem, printed one per line under ``invalid config ...``;
* every ``parser.error("...")`` (argparse's usage errors) and ``SystemExit("...")``.

A message's *key* is its text with each formatted value shown as ``…``: ``host … is kind
…, not vast: ...``. An entry of the page (a ``### `KEY-PREFIX` `` heading) covers every
message whose key starts with the entry's text; it must hold at least three words of its
own, so that searching the page for the words on the screen finds it. A message with
fewer words of its own than that (``f"{flag}: {problem}."``) passes on words made
elsewhere: it must be listed in :data:`COMPOSED` with where they come from, and those
places are scanned too. Every exception class defined in ``ups/`` must be in
:data:`USER_FACING` or :data:`INTERNAL`, so a new one is classified before it passes.
tests/test_docs_messages.py holds the page to this scan both ways: every message has an
entry, every entry matches a message.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "troubleshooting.md"
GAP = "…"
MIN_WORDS = 3

USER_FACING = {
    # ups's own, printed as they are (one paragraph, the fix named) by the command's edge
    "DeployError",  # fab/ups deploy tasks; UsageError, HostGone, PreflightFailed... derive
    "ConfigError",
    "WorkloadError",
    "DevHostError",
    "DataError",
    "DemoDataError",  # ups data synth, ups demo: the demo files could not be written
    "ResumeRefused",
    "CacheError",
    "NothingToExport",
    "RunFailed",  # an outcome's reason
    "CheckpointSaveFailed",
    "BucketError",
    "NoCredentials",
    "CredentialsExpired",
    "MintRefused",
    "PydanticCustomError",  # a hosts.yaml problem worded by a validator
    # builtins ups raises for a user's mistake (STYLE: ValueError for user mistakes); the
    # command lines print them (ups launch, a config validator's problem line)
    "ValueError",
    "RuntimeError",
    "ArgumentTypeError",
    "SystemExit",
}
INTERNAL = {
    "InstanceLost": "caught by the managed run, which recovers; the user sees the recovery line",
    "ConnectionDropped": "caught by the log follower, which reconnects",
    "CheckpointCorrupt": "caught at resume: the previous checkpoint is used, with a warning",
    "OutOfMemoryFail": "turned into the run's agreed outcome (its reason is a RunFailed)",
    "CredentialsLapsed": "retried where the credentials are renewed",
    "BucketUnreachable": "retried by the uploader with backoff; the outcome says what is missing",
    "PreconditionFailed": "a lost race for the lease: LeaseHeld/LeaseLost say it to the user",
    "CheckpointMismatch": "a bucket checkpoint that fails its digest is skipped at restore",
    "UnsafeContent": "reported by preflight's cache check row",
    "_TooBig": "internal to the disk check",
    "_Stopped": "internal to ups launch's signal handling",
    "LeaseLost": "a SystemExit whose line is said when the loss is found (lease.py)",
    "OfferTaken": "the next offer is taken; only 'no offer' reaches the user",
    "Answer": "RunPod's answer to one call, turned into the one api_error paragraph (client.py)",
    "Unreachable": "no answer from RunPod, turned into the one api_error paragraph (client.py)",
}
INTERNAL_SITES = {
    # (path, key prefix): an invariant of ups's own code, never a user's mistake
    ("ups/data/loader.py", "set_start("): "the sampler's own bounds",
    ("ups/data/loader.py", "start_step"): "the sampler's own bounds",
    ("ups/data/synth.py", "Darcy CG did not reach"): "the demo data's solver (a bug if seen)",
    ("ups/train/faults.py", "injected exception fault"): "a drill the user asked for",
}
WORDS_FROM = {
    # (path, function) of a site that passes on words made elsewhere: the functions that
    # make them ("path:function"), whose strings are scanned as messages too
    ("ups/deploy/managed/ops.py", "supervise"): ("ups/runid.py:run_id_problem",),
    ("ups/deploy/onhost/plan.py", "check_run_flag"): ("ups/runid.py:run_id_problem",),
    ("ups/deploy/onhost/runs.py", "resolve_run"): ("ups/runid.py:run_id_problem",),
    ("ups/deploy/request.py", "__post_init__"): ("ups/runid.py:run_id_problem",),
    ("ups/launch/plan.py", "__post_init__"): ("ups/runid.py:run_id_problem",),
    ("ups/runid.py", "validate_run_id"): ("ups/runid.py:run_id_problem",),
    ("ups/workload.py", "_check"): ("ups/workload.py:_relative_problem",),
    ("ups/deploy/transport/connect.py", "_open"): (
        "ups/deploy/transport/hostkeys.py:changed_key_message",
    ),
    ("ups/deploy/transport/hostkeys.py", "missing_host_key"): (
        "ups/deploy/transport/hostkeys.py:changed_key_message",
    ),
    ("ups/train/compile.py", "compile_check"): ("ups/train/compile.py:compile_failure",),
    ("ups/deploy/providers/vast/client.py", "_explain"): (
        "ups/deploy/providers/vast/client.py:_explain",
    ),
    ("ups/config/load.py", "load_config"): (
        "ups/config/load.py:_apply",
        "ups/config/checks.py:unknown_key",
    ),
    ("ups/train/run.py", "_resume"): ("ups/train/resume.py:strategy_refusal",),
    ("ups/deploy/providers/base.py", "api_error"): ("ups/deploy/providers/base.py:api_error",),
    ("ups/launch/plan.py", "_script_env"): ("ups/workload.py:checkpoint_dir_problem",),
    ("ups/train/startcheck.py", "strategy_problems"): (
        "ups/train/startcheck.py:strategy_problems",
    ),
}
PASSES_ON = {
    # (path, function) of a site whose whole text is a message made and scanned elsewhere
    ("ups/cli/deploy.py", "_workload"): "a WorkloadError's message",
    ("ups/cli/launch.py", "_from_run_file"): "the run file's data problems (workload.py)",
    ("ups/config/checks.py", "file_problems"): "tasks.N.path (NAME): a DataError's message",
    ("ups/config/load.py", "_format_errors"): "KEY: pydantic's or a validator's message",
    ("ups/deploy/entries.py", "_slurm_fields"): "the problems appended just above, joined",
    ("ups/deploy/hosts.py", "_failover_entries"): "the problems appended just above, joined",
    ("ups/deploy/providers/runpod/entry.py", "_runpod_fields"): "the problems appended just "
    "above, joined",
    ("ups/cli/deploy.py", "_checked_workload"): "the files the sync would leave behind "
    "(ups/workfiles.py left_behind), as a WorkloadError",
    ("ups/deploy/managed/acquire.py", "move_on"): "the last search's NoOffer paragraph "
    "(offers.py), or the recovery policy's reason, which the caller words as an "
    "OffersExhausted or 'every offer tried was taken' paragraph (acquire.py _exhausted)",
    ("ups/deploy/managed/ops.py", "plan"): "each entry's NoOffer paragraph (offers.py), "
    "after the entry's name",
    ("ups/deploy/managed/controller.py", "host_or_user"): "a PreflightFailed's message",
    ("ups/deploy/managed/run.py", "run"): "the problems of ending instances (lifecycle.py)",
    ("ups/deploy/onhost/operate.py", "bucket_keys"): "a NoCredentials or MintRefused message",
    ("ups/deploy/onhost/plan.py", "load_run_config"): "a ConfigFileError's message",
    ("ups/launch/plan.py", "__post_init__"): "--rdzv-endpoint's ValueError (plan.py)",
    ("ups/preflight/cli.py", "main"): "select_checks's ValueError (runner.py)",
    ("ups/train/loop.py", "_save_failure"): "CheckpointSaveFailed's reason",
    ("ups/train/startcheck.py", "_inspect_tasks"): "tasks.N (NAME): a DataError's message",
    ("ups/train/startcheck.py", "start_problems"): "the problems of model_problems (fit.py), "
    "_cache_problems, device_problems and strategy_problems (scanned)",
    ("ups/train/worker.py", "work"): "start_problems (startcheck.py), as a ConfigError",
    ("ups/cli/launch.py", "_prepare"): "start_problems (startcheck.py), as a ConfigError",
    ("ups/workload.py", "_pydantic_problems"): "KEY: pydantic's message",
    ("ups/workload.py", "load_run_file"): "the problems of _check and pydantic, gathered",
    ("ups/workload.py", "script_workload"): "the problems of _check",
    ("ups/bucket/store.py", "_classify"): "the operation and key, then the S3 client's error",
    ("ups/bucket/checkpoints.py", "newest_script_checkpoint"): "the bucket key of a "
    "script's latest pointer, then what is wrong with it (unreadable, a bad name)",
    # preflight rows: each check's message is a row of the table, and each check has an
    # entry of its own under "Preflight" (keyed by the check's name)
    ("ups/preflight/checks/cache.py", "run"): "the cache check's row",
    ("ups/preflight/checks/data.py", "run"): "the data check's row",
    ("ups/preflight/checks/gpu.py", "_count_problems"): "the gpu check's row",
    ("ups/preflight/checks/gpu.py", "_health_problems"): "the gpu check's row",
    ("ups/preflight/checks/ulimits.py", "run"): "the ulimits check's row",
}
SELF_WORDED = {
    # classes that word their own message from their arguments: (its key, where)
    "ConfigError": ("invalid config …: … problem(s)", "ups/config/load.py"),
    "WorkloadError": ("invalid run …: … problem(s)", "ups/workload.py"),
    "CheckpointSaveFailed": ("checkpoint save failed: …", "ups/train/checkpoint.py"),
}


@dataclass(frozen=True)
class Message:
    key: str
    """The text with each formatted value as ``…``; ``None``-free."""
    where: str
    """``path:line`` of the site."""
    function: str
    """The function it is in (what :data:`COMPOSED` names: lines move, names rarely)."""
    kind: str
    """The class raised, ``problem``, ``usage`` or the self-worded class."""

    @property
    def words(self) -> int:
        return own_words(self.key)


def own_words(text: str) -> int:
    return len(re.findall(r"[A-Za-z]{2,}", text.replace(GAP, " ")))


@functools.cache
def normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def template(node: ast.expr | None) -> str | None:
    """A string expression's text, each formatted value as ``…``; None when it is not one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant) else GAP for v in node.values
        )  # fmt: skip
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left), template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else GAP) + (right if right is not None else GAP)
    return None


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def exception_classes(files: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Every class defined in ups/ with its base names (as written)."""
    classes: dict[str, set[str]] = {}
    for tree in files.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = {_name(b) for b in node.bases}
    return classes


def _derives(name: str, roots: set[str], classes: dict[str, set[str]]) -> bool:
    seen = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in roots:
            return True
        if current not in seen:
            seen.add(current)
            todo += classes.get(current, set())
    return False


def unclassified(files: dict[str, ast.Module]) -> list[str]:
    """Exception classes of ups/ neither user-facing nor internal."""
    classes = exception_classes(files)
    errors = {"Exception", "BaseException", "ValueError", "RuntimeError", "OSError", "SystemExit"}
    errors |= {"UnpicklingError", "KeyError"}
    return sorted(
        name
        for name in classes
        if _derives(name, errors, classes)
        and name not in INTERNAL
        and not _derives(name, USER_FACING, classes)
    )


def _message_arg(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg in ("message", "msg", "reason"):
            return keyword.value
    return call.args[0] if call.args else None


def _items(node: ast.expr) -> Iterator[ast.expr]:
    """The messages a list literal holds (a (message, hint) pair's message), or the node."""
    if isinstance(node, ast.List):
        for item in node.elts:
            yield from _items(item)
    elif isinstance(node, ast.Tuple) and node.elts:
        yield node.elts[0]
    else:
        yield node


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(the enclosing function's name, node) for every node of a module."""

    def visit(node: ast.AST, name: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else name
            )
            yield inner, child
            yield from visit(child, inner)

    yield from visit(tree, "<module>")


def scan(files: dict[str, ast.Module]) -> tuple[list[Message], list[Message]]:
    """(messages, composed sites): every user-facing message of ups/, and the sites whose
    text has fewer than MIN_WORDS words of its own."""
    classes = exception_classes(files)
    facing = {n for n in classes if _derives(n, USER_FACING, classes)} | USER_FACING
    facing -= set(INTERNAL)
    found: list[Message] = []
    for path, tree in files.items():
        for function, node in _functions(tree):
            found += _site(path, function, node, facing, set(classes))
    found += [Message(key, where, "__init__", cls) for cls, (key, where) in SELF_WORDED.items()]
    for sources in WORDS_FROM.values():
        for source in sources:
            if source.split(":")[0] in files:
                found += words_made_in(files, source)
    kept = list({(m.key, m.where): m for m in found if not _internal(m)}.values())
    composed = [m for m in kept if m.words < MIN_WORDS and not _listed_composed(m)]
    messages = [m for m in kept if m.words >= MIN_WORDS]
    return messages, composed


def _site(
    path: str, function: str, node: ast.AST, facing: set[str], ours: set[str]
) -> list[Message]:
    """The messages one node of ``path`` makes, if any."""

    def at(items: Iterator[ast.expr] | list[ast.expr], kind: str) -> list[Message]:
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        return [Message(template(item) or GAP, where, function, kind) for item in items]

    if (
        isinstance(node, ast.AugAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == "problems"
    ):
        return at(_items(node.value), "problem")
    if not isinstance(node, ast.Call):
        return []
    name = _name(node.func)
    receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
    receiver_name = _name(receiver) if receiver is not None else ""
    if name in SELF_WORDED and isinstance(node.func, ast.Name):
        if name in ("ConfigError", "WorkloadError") and len(node.args) > 1:
            return at(_items(node.args[1]), "problem")
        return []
    if name == "ConfigFileError" and len(node.args) > 1:  # "config file PATH: PROBLEM. FIX"
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        problem = template(node.args[1]) or GAP
        return [Message(f"config file {GAP}: {problem}", where, function, name)]
    if name == "PydanticCustomError" and len(node.args) > 1:
        # its first argument is the error's type id; {name} fields are filled in
        text = re.sub(r"\{\w+\}", GAP, template(node.args[1]) or GAP)
        return [Message(text, f"{path}:{node.lineno}", function, name)]
    if name in facing:
        if receiver_name in ("log", "logger", "self") and name not in ours:
            return []
        arg = _message_arg(node)
        if arg is None:
            return []  # raised bare: a re-raise of a known class with no words
        return at([arg], name)
    if name in ("append", "extend") and receiver_name == "problems" and node.args:
        return at(_items(node.args[0]), "problem")
    if name == "error" and receiver_name in ("p", "parser") and node.args:
        return at([node.args[0]], "usage")
    return []


def _internal(message: Message) -> bool:
    path = message.where.split(":")[0]
    return any(path == p and message.key.startswith(k) for p, k in INTERNAL_SITES)


def _listed_composed(message: Message) -> bool:
    site = (message.where.split(":")[0], message.function)
    return site in PASSES_ON or site in WORDS_FROM


def words_made_in(files: dict[str, ast.Module], source: str) -> list[Message]:
    """The messages function ``path:function`` makes: the strings it returns, and those it
    assigns to the name it returns (``return VastApiError(text, status)``); not the pieces
    it fills them with."""
    path, function = source.split(":")
    if path not in files:
        raise SystemExit(f"WORDS_FROM names {source}, but {path} does not exist")
    for node in ast.walk(files[path]):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            returns = [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value]
            names = {
                first.id
                for value in returns
                if isinstance(value, ast.Call)
                and value.args
                and isinstance(first := value.args[0], ast.Name)
            }
            texts = [item for v in returns for item in _items(v) if template(item) is not None]
            texts += [
                n.value
                for n in ast.walk(node)
                if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id in names for t in n.targets)
            ]
            return [
                Message(text, f"{path}:{v.lineno}", function, "words")
                for v in texts
                if (text := template(v)) is not None and own_words(text) >= MIN_WORDS
            ]
    raise SystemExit(f"WORDS_FROM names {source}, but {path} has no function {function}")


def stale_sites(files: dict[str, ast.Module]) -> list[str]:
    """Sites and sources named in WORDS_FROM, PASSES_ON and INTERNAL_SITES that no longer
    exist (a function renamed or moved)."""
    defined = {
        (path, node.name)
        for path, tree in files.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    named = set(WORDS_FROM) | set(PASSES_ON)
    named |= {tuple(s.split(":")) for sources in WORDS_FROM.values() for s in sources}  # type: ignore[misc]
    gone = [
        f"{path}:{function}" for path, function in sorted(named) if (path, function) not in defined
    ]
    gone += [f"{path} ({key})" for path, key in INTERNAL_SITES if path not in files]
    return gone


def read_files() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(REPO)): ast.parse(path.read_text())
        for path in sorted((REPO / "ups").rglob("*.py"))
    }


ENTRY = re.compile(r"^### (.+?)\s*$", re.M)


def entries(page: str) -> list[str]:
    """The headings of the page's entries (``### FIRST WORDS``), as written."""
    return [normal(key) for key in ENTRY.findall(page)]


@functools.cache
def check_names() -> tuple[str, ...]:
    """Preflight's checks: each has an entry keyed by its name (the row it prints)."""
    sys.path.insert(0, str(REPO))
    from ups.preflight.checks import CHECKS

    return tuple(check.name for check in CHECKS)


def covers(entry: str, message: Message) -> bool:
    return normal(message.key).startswith(entry)


def missing(messages: list[Message], keys: list[str]) -> list[Message]:
    """The messages no entry covers."""
    return [m for m in messages if not any(covers(k, m) for k in keys)]


def unused(messages: list[Message], keys: list[str]) -> list[str]:
    """Entries that cover no message (and name no check): stale, or mistyped."""
    checks = set(check_names())
    return [k for k in keys if k not in checks and not any(covers(k, m) for m in messages)]


def too_short(keys: list[str]) -> list[str]:
    """Entries with fewer than MIN_WORDS words of their own (a check's name aside)."""
    checks = set(check_names())
    return [k for k in keys if k not in checks and own_words(k) < MIN_WORDS]


def suggested_key(message: Message) -> str:
    """The first words of a message, as an entry's heading would hold them."""
    text = normal(message.key)
    cut = re.search(r"[.;:](\s|$)", text[20:])
    text = text[: 20 + cut.start() + 1] if cut else text
    return text if len(text) <= 80 else text[:80].rsplit(" ", 1)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--all", action="store_true", help="list every message found, with where")
    args = p.parse_args(argv)
    messages, composed = scan(read_files())
    if args.all:
        for m in sorted(messages, key=lambda m: m.where):
            print(f"{m.where}\t{m.kind}\t{normal(m.key)}")
        return 0
    keys = entries(PAGE.read_text())
    gaps = missing(messages, keys)
    for m in gaps:
        print(f"### `{suggested_key(m)}`\n\n<!-- {m.where} ({m.kind}) -->\n")
    for m in composed:
        print(f"composed: {m.where} in {m.function}(): {m.key!r}: list it in COMPOSED")
    return 1 if gaps or composed else 0


if __name__ == "__main__":
    sys.exit(main())
