"""Run the selected checks, each under its own deadline, and collect a Report."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ups.config import Config, ConfigError, load_config
from ups.log import get_logger
from ups.preflight.checks import CHECKS, GROUPS, CheckSpec
from ups.preflight.options import Context, PreflightOptions
from ups.preflight.result import CheckResult, Report, Status

# get_logger(name) stays lazy (component=name), so events follow the caller's later setup
# (e.g. `ups launch` teeing them into launch.log); .bind() here would freeze the default.
log = get_logger("preflight")


def select_checks(only: list[str], skip: list[str]) -> list[CheckSpec]:
    """The checks named by ``only``/``skip`` (names or group names), in the standard order.

    Raises ValueError naming every unknown name.
    """
    known = {spec.name for spec in CHECKS}

    def expand(names: list[str]) -> set[str]:
        out: set[str] = set()
        unknown = []
        for raw in names:
            for name in filter(None, (n.strip() for n in raw.split(","))):
                if name in GROUPS:
                    out.update(GROUPS[name])
                elif name in known:
                    out.add(name)
                else:
                    unknown.append(name)
        if unknown:
            choices = ", ".join(sorted(known | set(GROUPS)))
            raise ValueError(f"unknown check(s) {', '.join(unknown)}; choose from: {choices}")
        return out

    chosen = expand(only) if only else known
    dropped = expand(skip)
    return [spec for spec in CHECKS if spec.name in chosen and spec.name not in dropped]


def _load_context(opts: PreflightOptions) -> tuple[Context, CheckResult | None]:
    """Load the config once; its outcome is itself a result (``config``)."""
    if isinstance(opts.config, Config):
        return Context(opts=opts, cfg=opts.config, config_path=None), None
    if opts.config is None:
        ctx = Context(opts=opts, cfg=None, config_path=None)
        return ctx, CheckResult(
            name="config",
            status=Status.SKIP,
            message="no run config given; checks that need one (data, config cache) are skipped",
            hint="ups-preflight --config CONFIG.yaml",
        )
    path = Path(opts.config)
    start = time.perf_counter()
    try:
        # Missing data files are the data check's business, reported with more detail there.
        cfg = load_config(path, opts.overrides, check_files=False)
    except ConfigError as exc:
        ctx = Context(opts=opts, cfg=None, config_path=path, config_error=str(exc))
        return ctx, CheckResult(
            name="config",
            status=Status.FAIL,
            message=f"{path}: {len(exc.problems)} problem(s): " + "; ".join(exc.problems),
            hint=f"fix the keys named above in {path} (or the --set overrides)",
            duration_s=time.perf_counter() - start,
            details={"problems": exc.problems},
        )
    ctx = Context(opts=opts, cfg=cfg, config_path=path)
    return ctx, CheckResult(
        name="config",
        status=Status.PASS,
        message=f"{path} is valid ({len(cfg.tasks)} task(s))",
        value=str(path),
        duration_s=time.perf_counter() - start,
    )


def run_with_deadline(name: str, fn: Callable[[], CheckResult], timeout_s: float) -> CheckResult:
    """Run ``fn`` in a daemon thread; a check still running after ``timeout_s`` is a failure.

    A hung check's thread is abandoned (it is a daemon, so it never keeps the process
    alive); checks that start processes enforce their own deadline and kill them.
    """
    box: list[CheckResult] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # reported as this check's failure, never swallowed
            errors.append(exc)

    start = time.perf_counter()
    thread = threading.Thread(target=target, name=f"preflight-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    elapsed = time.perf_counter() - start
    if thread.is_alive():
        return CheckResult(
            name=name,
            status=Status.FAIL,
            message=f"did not finish within its {timeout_s:g} s timeout (hung)",
            threshold=timeout_s,
            unit="s",
            hint=f"find what blocks it, or raise the limit: --timeout {name}=SECONDS",
            duration_s=elapsed,
        )
    if errors:
        exc = errors[0]
        return CheckResult(
            name=name,
            status=Status.FAIL,
            message=f"the check itself raised {type(exc).__name__}: {exc}",
            duration_s=elapsed,
            details={"exception": type(exc).__name__, "error": str(exc)},
        )
    result = box[0]
    result.duration_s = elapsed
    return result


def _log(result: CheckResult) -> None:
    level = {Status.FAIL: "error", Status.WARN: "warning"}.get(result.status, "info")
    getattr(log, level)(
        "preflight_check",
        check=result.name,
        status=result.status.value,
        value=result.value,
        threshold=result.threshold,
        unit=result.unit,
        duration_s=round(result.duration_s, 4),
        message=result.message,
        hint=result.hint,
    )


def run_preflight(options: PreflightOptions | None = None) -> Report:
    """Run the selected checks in order and return their results. Never raises for a bad host.

    Raises ValueError only for unknown check names in ``only``/``skip``.
    """
    opts = options or PreflightOptions()
    specs = select_checks(opts.only, opts.skip)
    start = time.perf_counter()
    ctx, config_result = _load_context(opts)
    if ctx.burn_in == "off":
        specs = [spec for spec in specs if not spec.burn_in]
    results: list[CheckResult] = []
    if config_result is not None:
        results.append(config_result)
        _log(config_result)
    if any(spec.uses_torch for spec in specs):
        import torch  # noqa: F401  (before any deadline starts; see CheckSpec.uses_torch)
    for spec in specs:
        timeout = ctx.timeout(spec.name, spec.timeout_s)
        result = run_with_deadline(spec.name, functools.partial(spec.run, ctx), timeout)
        results.append(result)
        _log(result)
    report = Report(results=results, duration_s=time.perf_counter() - start)
    ok, seconds = report.ok(opts.strict), round(report.duration_s, 3)
    log.info("preflight_done", ok=ok, duration_s=seconds, **report.counts())
    return report
