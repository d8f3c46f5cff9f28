"""The burn-in's floors, its rows as deploy reads them back, the ledger's measurements and
offers ranked by expected $ per sample: pure logic, no process started. One test runs the
real burn-in rows in this process to bound their time."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.fault_helpers import strict_json
from ups.config import load_config
from ups.deploy.managed.faults import preflight_reason, preflight_side
from ups.deploy.managed.ledger import Failure, Ledger, Measurement, render_measured
from ups.deploy.managed.ranking import rank
from ups.deploy.providers import Side
from ups.deploy.providers.vast.offers import offer_of
from ups.preflight import PreflightOptions, Report, Status, run_preflight
from ups.preflight.checks.burnin import CPU_BUDGET_S, judge
from ups.preflight.figures import below_floor, figures, workload
from ups.preflight.known_good import DEMO_BF16, TABLE, known_good, lookup
from ups.preflight.options import Context


def _ctx(make_config: Callable[..., Path], mode: str, **preflight: Any) -> Context:
    cfg = load_config(make_config(preflight={"burn_in": mode, **preflight}), check_files=False)
    return Context(opts=PreflightOptions(config=cfg), cfg=cfg, config_path=None)


def test_known_good_table_names_the_model_and_its_source() -> None:
    """Device names as torch reports them find their row; the CPU and unknown GPUs find
    none (no floor); every point of every row says where its number comes from."""
    row = lookup("NVIDIA GeForce RTX 4090")
    assert row is not None and row.label == "an RTX 4090"
    assert all("zzc0721" in p.source for p in row.points)
    assert known_good("NVIDIA H100 80GB HBM3", "matmul_bf16") == (795.0, "an H100 SXM")
    assert lookup("NVIDIA H100 PCIe") is None
    assert known_good(None, "matmul_fp32") == (None, "this CPU")
    assert known_good("NVIDIA L4", "matmul_bf16") == (None, "NVIDIA L4")
    assert all(p.source for r in TABLE for p in r.points)


def test_one_device_name_is_one_row_for_every_figure() -> None:
    """The GPU suite's H100 ("NVIDIA H100 80GB HBM3") is named "an H100 SXM" by every figure,
    and its measured h2d and demo-step figures are known-good (the step only for the
    workload it was measured on); a figure the row lacks still names the row's label."""
    h100 = "NVIDIA H100 80GB HBM3"
    assert known_good(h100, "h2d") == (54.83, "an H100 SXM")
    assert known_good(h100, "step", DEMO_BF16) == (5345.0, "an H100 SXM")
    assert known_good(h100, "step", "another-workload") == (None, "an H100 SXM")
    assert known_good(h100, "matmul_fp16") == (None, "an H100 SXM")
    row = lookup(h100)
    assert row is not None
    measured = [p for p in row.points if "gpu-suite-h100-2026-11-27-run2.json" in p.source]
    assert {p.figure for p in measured} == {"matmul_bf16", "h2d", "step"}
    results = strict_json(REPO / "benchmarks/results/gpu-suite-h100-2026-11-27-run2.json")
    burn_in = next(s for s in results["steps"] if s["name"] == "burn-in")["details"]["figures"]
    for point in measured:
        name = "matmul" if point.figure.startswith("matmul_") else point.figure
        assert point.value == pytest.approx(burn_in[name]["value"], rel=1e-3), point


def test_the_demo_step_point_is_the_demo_configs_workload() -> None:
    """The H100's step point holds for configs/demo.yaml in bf16 (the GPU suite's burn-in):
    a change to the model, tasks or batch changes the digest, and this test says the point
    must be measured again."""
    cfg = load_config(REPO / "configs" / "demo.yaml", ["training.precision=bf16"],
                      check_files=False)  # fmt: skip
    assert workload(cfg) == DEMO_BF16


def test_floor_warns_enforce_fails_and_unknown_is_recorded(
    make_config: Callable[..., Path],
) -> None:
    """Below 0.7 of known-good: a warning under `warn`, a failure under `enforce`, with the
    figure, the ratio and the model in the message; no known-good: a pass, no floor."""
    warn = judge(_ctx(make_config, "warn"), "matmul", "bf16 matmul", 121.0, "TFLOP/s", 247.0,
                 "an RTX 4090")  # fmt: skip
    assert warn.status is Status.WARN and warn.threshold == 247.0
    assert warn.message == (
        "bf16 matmul 121 TFLOP/s, 0.49 of an RTX 4090's 247 (below the floor 0.7)"
    )
    enforce = judge(_ctx(make_config, "enforce"), "matmul", "bf16 matmul", 121.0, "TFLOP/s",
                    247.0, "an RTX 4090")  # fmt: skip
    assert enforce.status is Status.FAIL and enforce.hint
    fine = judge(_ctx(make_config, "enforce"), "matmul", "m", 200.0, "TFLOP/s", 247.0, "x")
    assert fine.status is Status.PASS and fine.details["ratio"] == 0.81
    unknown = judge(_ctx(make_config, "enforce"), "step", "training steps", 5.0, "samples/s")
    assert unknown.status is Status.PASS and "no floor" in unknown.message


def test_configured_known_good_and_floor_win(make_config: Callable[..., Path]) -> None:
    """preflight.known_good gives a figure the table lacks; burn_in_floor moves the floor."""
    ctx = _ctx(make_config, "enforce", known_good={"step": 100}, burn_in_floor=0.5)
    assert judge(ctx, "step", "training steps", 55.0, "samples/s").status is Status.PASS
    low = judge(ctx, "step", "training steps", 45.0, "samples/s")
    assert low.status is Status.FAIL
    assert "0.45 of the configured known-good 100 (below the floor 0.5)" in low.message


def test_rows_read_back_from_the_table_and_decide_the_side(
    make_config: Callable[..., Path],
) -> None:
    """The plain table a remote preflight prints gives the figures back (3 digits) with
    their known-good values; a burn-in row below its floor is the machine's fault and the
    reason names the figure; one that failed otherwise (it raised) is the user's."""
    ctx = _ctx(make_config, "enforce", known_good={"step": 1000})
    results = [
        judge(ctx, "matmul", "fp32 matmul", 93.4, "GFLOP/s"),
        judge(ctx, "step", "training steps", 123.4, "samples/s"),
    ]
    table = Report(results=results).render_table()
    found = figures(table)
    assert {k: (r.value, r.known) for k, r in found.items()} == {
        "matmul": (93.4, None),
        "step": (123.0, 1000.0),
    }
    assert list(below_floor(table)) == ["step"]
    assert preflight_side(table) is Side.HOST
    assert preflight_reason(table) == (
        "preflight failed there (step): training steps 123.4 samples/s, 0.12 of the configured "
        "known-good 1000 (below the floor 0.7)"
    )
    raised = re.sub(r"^matmul(\s+)PASS", r"matmul\1FAIL", table, flags=re.MULTILINE)
    assert preflight_side(raised) is Side.USER
    assert figures("CHECK STATUS\nshm  FAIL  64 MiB vs 1  small") == {}


def _offer(oid: int, price: float, gpu: str = "RTX 4090", reliability: float = 0.99) -> dict:
    return {"id": oid, "machine_id": oid * 10, "dph_total": price, "min_bid": 0.1,
            "gpu_name": gpu, "num_gpus": 2, "reliability": reliability}  # fmt: skip


def _measured(machine: int, step: float, gpu: str = "RTX 4090", work: str = "w") -> Measurement:
    return Measurement(machine_id=str(machine), gpu_name=gpu, num_gpus=2, figures={"step": step},
                       dph=0.5, workload=work, at=time.time(), run_id="r", host="vast",
                       passed=True)  # fmt: skip


def _rank(rows: list[dict], measured: list[Measurement]) -> list[int] | None:
    ranked = rank([offer_of(r, False) for r in rows], measured, "w", False)
    return None if ranked is None else [int(r.offer.id) for r in ranked]


def test_cheaper_but_slower_machine_loses_once_measured() -> None:
    """$0.62/h at 100 samples/s costs more per sample than $0.90/h at 400: measured order
    puts the dearer, faster machine first; dph_total order would not."""
    cheap, fast = _offer(102, 0.62), _offer(105, 0.90)
    measured = [_measured(1020, 100.0), _measured(1050, 400.0)]
    assert _rank([cheap, fast], measured) == [105, 102]
    ranked = rank([offer_of(r, False) for r in (cheap, fast)], measured, "w", False)
    assert ranked is not None
    assert ranked[0].usd_per_msample == pytest.approx(0.90 / (800 * 3600) * 1e6)
    assert "measured 800 /s" in ranked[0].line()


def test_unseen_offers_are_estimated_and_other_workloads_ignored() -> None:
    """An unseen machine takes the best figure of its model here times its reliability; a
    model never measured is scaled by known-good TFLOP/s; one with no known-good goes last.
    Figures of another workload count for nothing: the search's order stands."""
    seen = _offer(105, 0.90)
    unseen = _offer(101, 0.80, reliability=0.5)  # half as reliable: $0.80 buys 200 /s
    other = _offer(107, 0.95, gpu="RTX 5090", reliability=1.0)  # 400 x 240/165 = 582 /s
    mystery = _offer(108, 0.10, gpu="Some GPU")
    measured = [_measured(1050, 200.0)]  # 400 /s for the machine
    assert _rank([mystery, unseen, seen, other], measured) == [107, 105, 101, 108]
    assert _rank([mystery, seen], [_measured(1050, 200.0, work="other")]) is None


def test_ledger_keeps_failures_and_measurements_and_shows_cost_per_sample(
    tmp_path: Path,
) -> None:
    """Both kinds of entry share one strict-JSON file; the table shows $ per million
    samples from the step figure, the GPUs and the price."""
    ledger = Ledger(tmp_path / "hosts-ledger.json")
    ledger.record(Failure(machine_id="1", host_id=None, offer_id="2", instance_id="3",
                          failure="slow", at=time.time(), run_id="r", host="vast"))  # fmt: skip
    m = Measurement(machine_id="1050", gpu_name="RTX 4090", num_gpus=2,
                    figures={"matmul": 150.0, "busbw": 20.0, "step": 500.0}, dph=0.9,
                    workload="w", at=time.time(), run_id="r", host="vast", passed=True,
                    known_good={"matmul": 165.0})  # fmt: skip
    ledger.measured(m)
    data = json.loads(ledger.path.read_text())
    assert [f["machine_id"] for f in data["failures"]] == ["1"]
    assert ledger.measurements() == [m] and m.usd_per_msample() == pytest.approx(0.25)
    table = render_measured(ledger.measurements())
    assert "2x RTX 4090" in table and "150 vs 165 (0.91)" in table and "0.2500" in table


def test_workload_digest_follows_model_and_batch(make_config: Callable[..., Path]) -> None:
    """A step figure is comparable only for the same model, tasks, batch and precision."""
    a = load_config(make_config(), check_files=False)
    b = load_config(make_config(training={"batch_size": 16}), check_files=False)
    assert workload(a) == workload(load_config(make_config(), check_files=False))
    assert workload(a) != workload(b)


def test_burn_in_is_off_by_default_and_bounded_when_on(
    make_config: Callable[..., Path],
) -> None:
    """Without preflight.burn_in no burn-in row runs (preflight stays as cheap as before);
    with it, every row reports and together they take about CPU_BUDGET_S plus the first
    read of the data and the warm-up steps: bounded here at 3 s of wall time (0.6-0.8 s
    on an idle 2-core host; CI runs 4 workers on it). Importing torch is not counted: every
    preflight pays it already."""
    config = make_config()
    off = run_preflight(PreflightOptions(config=config, only=["burnin", "ulimits"]))
    assert [r.name for r in off.results] == ["config", "ulimits"]
    on = run_preflight(PreflightOptions(config=config, only=["burnin"], burn_in="warn"))
    rows = {r.name: r for r in on.results[1:]}
    wall = sum(r.duration_s for r in rows.values())
    assert list(rows) == ["matmul", "h2d", "disk_write", "disk_read", "loader", "step"]
    assert rows["h2d"].status is Status.SKIP  # no CUDA here
    for name in ("matmul", "disk_write", "disk_read", "loader", "step"):
        assert rows[name].status is Status.PASS and isinstance(rows[name].value, float)
        assert rows[name].value > 0 and "no floor" in rows[name].message
    assert rows["matmul"].unit == "GFLOP/s" and rows["step"].unit == "samples/s"
    assert CPU_BUDGET_S < 0.6 and wall < 3.0, wall
    print(f"\nMEASURE burn-in rows wall {wall:.2f} s (timed loops {CPU_BUDGET_S:.2f} s)")
