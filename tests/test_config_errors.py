"""Config mistakes are caught before any process group starts, with the key path named.

Two tiers: pure-logic tests of ``load_config`` (every problem listed at once, ``--set``
overrides), and the real trainer (``python -m ups.train.main``, once under torchrun) that
must exit 2 without creating a run directory or starting training.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import PYTHON, REPO, parse_events, torchrun, worker_env
from tests.repo_scripts import captures
from ups.cli.launch import main as launch_main
from ups.config import ConfigError, ConfigFileError, load_config
from ups.data.layouts import inspect_task
from ups.outcome import EXIT_CONFIG

MakeConfig = Callable[..., Path]


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _minimal(path: str = "missing.h5") -> dict[str, Any]:
    return {"tasks": [{"name": "advection", "layout": "single_1d", "path": path}]}


# Pure logic: load_config


def test_every_schema_problem_is_listed_in_one_error(tmp_path: Path) -> None:
    """Several mistakes in one file come back together, each line led by its key path,
    so the user fixes the config in one pass instead of one run per mistake."""
    data = _minimal()
    data["training"] = {"bach_size": 8, "epochs": "four", "batch_size": 0}
    data["model"] = {"latent_dim": 30, "heads": 4}
    data["tasks"][0]["layout"] = "single_3d"
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, data), check_files=False)
    problems = info.value.problems
    keys = sorted(p.split(":")[0] for p in problems)
    assert keys == [
        "model",  # the cross-field check names both keys in its text
        "tasks.0.layout",
        "training.bach_size",
        "training.batch_size",
        "training.epochs",
    ], problems
    text = str(info.value)
    assert "5 problem(s)" in text
    assert "unknown key" in text
    assert "model.latent_dim (30) must be divisible by model.heads (4)" in text
    assert "(got 'four')" in text
    assert "greater than or equal to 1 (got 0)" in text


def test_every_file_problem_is_listed_in_one_error(tmp_path: Path) -> None:
    """Missing data files and duplicate task names are reported together, by key path."""
    data = {
        "tasks": [
            {"name": "a", "layout": "single_1d", "path": str(tmp_path / "nope1.hdf5")},
            {"name": "a", "layout": "darcy_2d", "path": str(tmp_path / "nope2.hdf5")},
        ]
    }
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, data))
    problems = info.value.problems
    assert [p.split(":")[0] for p in problems] == ["tasks.0.path", "tasks.1.name", "tasks.1.path"]
    assert "nope1.hdf5" in problems[0] and "does not exist" in problems[0]
    assert "duplicate task name 'a'" in problems[1]


def test_set_reads_values_as_typed_yaml(tmp_path: Path) -> None:
    """``--set training.lr=1e-4`` is the float 1e-4 (not the string YAML 1.1 would give),
    ``tasks.0.weight=2`` indexes the task list, booleans and lists parse too."""
    data = _minimal()
    data["tasks"].append({"name": "darcy", "layout": "darcy_2d", "path": "d.h5"})
    cfg = load_config(
        _write(tmp_path, data),
        [
            "training.lr=1e-4",
            "tasks.0.weight=2",
            "tasks.1.test_fraction=.25",
            "training.record_sample_ids=true",
            "cache.extra_files=[a.pt, b.pt]",
            "run.name=exp-7",
        ],
        check_files=False,
    )
    assert cfg.training.lr == pytest.approx(1e-4)
    assert isinstance(cfg.training.lr, float)
    assert cfg.tasks[0].weight == 2.0
    assert cfg.tasks[1].weight == 1.0  # untouched sibling
    assert cfg.tasks[1].test_fraction == 0.25
    assert cfg.training.record_sample_ids is True
    assert [p.name for p in cfg.cache.extra_files] == ["a.pt", "b.pt"]
    assert cfg.run.name == "exp-7"


def test_exponent_floats_in_the_yaml_file(tmp_path: Path) -> None:
    """``lr: 1e-4`` written in the file itself is a float too, not a type error."""
    data = _minimal()
    path = _write(tmp_path, data)
    path.write_text(path.read_text() + "training:\n  lr: 1e-4\n  weight_decay: 5E-2\n")
    cfg = load_config(path, check_files=False)
    assert cfg.training.lr == pytest.approx(1e-4)
    assert cfg.training.weight_decay == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("training.lr", "'training.lr': expected KEY.PATH=VALUE"),
        ("=3", "'=3': expected KEY.PATH=VALUE"),
        ("tasks.3.weight=2", "tasks.3.weight: index 3 does not exist"),
        ("training.bogus=1", "training.bogus: unknown key"),
        ("training.epochs=two", "training.epochs: Input should be a valid integer"),
        ("training.batch_size=0", "training.batch_size: Input should be greater than or equal"),
    ],
)
def test_bad_overrides_name_their_key(tmp_path: Path, override: str, expected: str) -> None:
    """A wrong ``--set`` is reported with the key path it tried to set."""
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, _minimal()), [override], check_files=False)
    assert expected in str(info.value)


def _readme_case(root: Path, advection: Path) -> Path:
    """configs/x.yaml under ``root`` as the docs' config-error example has it: the demo
    config with ``batch_size: 0``, ``epochs`` misspelt and Darcy's file missing."""
    demo = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    demo["training"]["batch_size"] = 0
    demo["training"]["epocs"] = demo["training"].pop("epochs")
    demo["tasks"][0]["path"] = str(advection)
    demo["tasks"][1]["path"] = "data/x.h5"
    (root / "configs").mkdir()
    path = root / "configs" / "x.yaml"
    path.write_text(yaml.safe_dump(demo, sort_keys=False))
    return path


def test_the_readme_config_error_is_what_ups_launch_prints(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tiny_data: dict[str, Path],
) -> None:
    """`ups launch configs/x.yaml` with a schema error, a misspelt key and a missing data
    file reports all three in one paragraph (the typo with the key it meant), exit 2, no
    run directory: exactly the docs' example, which this keeps true."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(tiny_data["advection"], tmp_path / "advection.h5")
    _readme_case(tmp_path, Path("advection.h5"))
    assert launch_main(["configs/x.yaml"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert captures().check("config-error", err) == [], err
    assert not (tmp_path / "runs").exists()


def test_launch_refuses_what_the_workers_would_before_starting_anything(
    make_config: MakeConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What only a worker used to refuse (its start check: a patch that does not divide a
    grid, fp16 on a run that trains on the CPU, the nccl backend or an ``alloc`` fault
    without CUDA, FSDP on a torch without FSDP2's reset) is refused by ``ups launch``
    itself, in the workers' words: exit 2, one paragraph, no run directory, and no
    process started (this test has no ``slow`` marker: conftest fails it if preflight or
    torchrun start). Without a CUDA device on the host (this machine) every device line
    shows; with one, only fp16's under gloo."""
    import torch

    from ups.torchcompat import fsdp_missing

    cuda = torch.cuda.is_available()
    monkeypatch.setenv("UPS_FAULTS", "alloc@0:3")
    config = make_config()
    sets = ["model.patch_2d=5", "training.precision=fp16", "distributed.backend=gloo"]
    assert launch_main([str(config), *(f"--set={s}" for s in sets)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith(f"invalid config {config}: ")
    assert "model.patch_2d=5 does not divide task 'darcy''s grid (16, 16)" in err
    assert (
        "training.precision: fp16 needs CUDA (its loss scaler and fast kernels are GPU "
        "features), and this run trains on the CPU "
        f"({'distributed.backend: gloo' if cuda else 'this host'}); use bf16 or fp32"
    ) in err
    assert ("faults: kind alloc needs CUDA" in err) is not cuda
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()

    monkeypatch.delenv("UPS_FAULTS")
    sets = ["distributed.backend=nccl", "training.strategy=fsdp"]
    code = launch_main([str(config), "--dry-run", *(f"--set={s}" for s in sets)])
    err = capsys.readouterr().err
    assert ("distributed.backend: nccl needs CUDA" in err) is not cuda
    if fsdp_missing() is not None:  # torch 2.11, 2.12 (CI's oldest-torch tier)
        assert (
            "training.strategy: fsdp needs FSDPModule.reset_iter_state, which torch "
            f"{torch.__version__} lacks (torch 2.13 has it)"
        ) in err
    assert code == (0 if cuda and fsdp_missing() is None else EXIT_CONFIG), err
    assert not (tmp_path / "runs").exists()


def test_a_file_that_does_not_match_its_layout_is_listed_with_the_schema_problems(
    tmp_path: Path, tiny_data: dict[str, Path]
) -> None:
    """A Darcy task pointed at the advection file (the wrong layout) is reported by the
    same error as an unknown key elsewhere, when the config is checked with the data."""
    data = {
        "tasks": [{"name": "darcy", "layout": "darcy_2d", "path": str(tiny_data["advection"])}],
        "model": {"depht": 2},
    }
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, data), check_data=inspect_task)
    problems = info.value.problems
    assert [p.split(":")[0] for p in problems] == ["model.depht", "tasks.0.path (darcy)"], problems
    assert "did you mean model.depth?" in problems[0]
    assert "key 'nu'" in problems[1] and "Check tasks[].layout" in problems[1]


def test_an_unknown_key_far_from_any_lists_the_keys_of_its_section(tmp_path: Path) -> None:
    """No near miss: the keys the section has are listed instead of a guess."""
    data = {**_minimal(), "wandb": {"colour": "red"}}
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, data), check_files=False)
    assert info.value.problems == [
        "wandb.colour: unknown key (the keys of wandb are: mode, project, entity, online_on_host)"
    ]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: p / "nope.yaml", "cannot read it (No such file or directory). Check the path"),
        (lambda p: p, "cannot read it (Is a directory). Give the path of a run config YAML"),
        (lambda p: _text(p, "tasks: [a\n"), "not valid YAML: while parsing"),
        (lambda p: _text(p, "- a\n- b\n"), "expected a mapping of sections"),
    ],
)
def test_a_config_file_that_cannot_be_read_gets_its_own_message(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], Path],
    expected: str,
) -> None:
    """A missing, unreadable or unparsable config file is named as a file problem, not
    as keys to fix; `ups launch` exits 2 with that one paragraph."""
    path = make(tmp_path)
    with pytest.raises(ConfigFileError) as info:
        load_config(path)
    assert str(info.value).startswith(f"config file {path}: ")
    assert expected in str(info.value) and "Fix the keys" not in str(info.value)
    assert launch_main([str(path)]) == EXIT_CONFIG
    assert capsys.readouterr().err.strip() == str(info.value)


def _text(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


# The real trainer: exit 2 before any process group


def _run_trainer(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "ups.train.main", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=worker_env(),
        cwd=REPO,
    )


def _no_run_dir(output_dir: Path) -> bool:
    return not output_dir.exists() or not any(output_dir.iterdir())


CASES: dict[str, tuple[dict[str, Any], list[str], list[str]]] = {
    # name: (config sections, --set args, substrings the error must contain)
    "unknown key": ({"training": {"epochs": 1, "batch_size": 8, "bach_size": 4}}, [], [
        "training.bach_size: unknown key"
    ]),
    "wrong type": ({"training": {"epochs": 1, "batch_size": "eight"}}, [], [
        "training.batch_size: Input should be a valid integer", "(got 'eight')"
    ]),
    "batch size 0": ({}, ["training.batch_size=0"], [
        "training.batch_size: Input should be greater than or equal to 1 (got 0)"
    ]),
    "missing data file": ({}, ["tasks.1.path=/nonexistent/2D_DarcyFlow.hdf5"], [
        "tasks.1.path: data file '/nonexistent/2D_DarcyFlow.hdf5' does not exist"
    ]),
    "empty eval split": ({}, ["tasks.0.test_fraction=0.01"], [
        # 24 samples * 0.01 -> int(0.24) == 0 test samples
        "test split of task 'advection' is empty", "tasks[].test_fraction", "0 test"
    ]),
    "patch does not divide grid": ({}, ["model.patch_2d=5"], [
        "model.patch_2d=5 does not divide task 'darcy'", "(16, 16)"
    ]),
    "bad --set syntax": ({}, ["training.lr"], ["'training.lr': expected KEY.PATH=VALUE"]),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_trainer_exits_2_naming_the_key(make_config: MakeConfig, tmp_path: Path, case: str) -> None:
    """Each kind of config mistake makes ``python -m ups.train.main`` exit 2 with one
    error event naming the key, before a run directory or a process group exists."""
    sections, overrides, expected = CASES[case]
    config = make_config(**sections)
    args = [a for o in overrides for a in ("--set", o)]
    proc = _run_trainer(config, *args)
    assert proc.returncode == EXIT_CONFIG, (proc.stdout, proc.stderr)
    events = parse_events(proc.stdout)
    invalid = [e for e in events if e["event"] == "config_invalid"]
    assert len(invalid) == 1, proc.stdout
    assert invalid[0]["level"] == "error"
    for text in expected:
        assert text in invalid[0]["error"], invalid[0]["error"]
    assert not {"train_start", "wandb_started"} & {e["event"] for e in events}
    assert _no_run_dir(tmp_path / "runs")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_under_torchrun_every_rank_stops_before_training(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    """Under torchrun a bad config ends the job within seconds (not after the 120 s init
    timeout): the workers exit 2 with the key named, no run dir, no ``train_start``.

    The first worker to exit 2 makes torchrun stop the other; when that one has not
    parsed its config yet it ends by torchrun's SIGTERM instead of logging the error
    itself (a race CI hit), so one or both ranks name the key."""
    config = make_config(distributed={"init_timeout_s": 120, "collective_timeout_s": 30})
    started = time.monotonic()
    result = torchrun(config, "--set", "training.batch_size=0", timeout=180)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    events = result.events()
    assert "train_start" not in {e["event"] for e in events}
    invalid = [e for e in events if e["event"] == "config_invalid"]
    ranks = sorted(e["rank"] for e in invalid)
    assert ranks in ([0], [1], [0, 1]), ranks
    assert all("training.batch_size" in e["error"] for e in invalid)
    assert "exitcode  : 2" in result.stderr  # torchrun's failure summary names each worker's code
    assert _no_run_dir(tmp_path / "runs")
    assert elapsed < 90, f"took {elapsed:.0f}s: something waited for a peer or a timeout"
