"""The latent operator model, as pure logic: shapes, the residual form, config errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ups.config import ModelConfig
from ups.model import LatentOperator, TaskShape, build_model, model_problems

ADVECTION = TaskShape("advection", 1, 1, (64,), steady=False)
DARCY = TaskShape("darcy", 1, 1, (16, 16), steady=True)
REACTION = TaskShape("reaction", 2, 2, (16, 8), steady=False)
SMALL = ModelConfig(latent_dim=16, depth=1, heads=2, patch_1d=8, patch_2d=4)


def _model(*shapes: TaskShape) -> LatentOperator:
    torch.manual_seed(0)
    return build_model(list(shapes), SMALL)


def test_predictions_have_each_tasks_input_shape() -> None:
    """One forward call serves 1D and 2D tasks (one and two channels) with shapes unchanged."""
    model = _model(ADVECTION, DARCY, REACTION)
    batch = {
        "advection": torch.randn(3, 1, 64),
        "darcy": torch.randn(5, 1, 16, 16),
        "reaction": torch.randn(2, 2, 16, 8),
    }
    out = model(batch)
    assert set(out) == set(batch)
    for task, x in batch.items():
        assert out[task].shape == x.shape, task
        assert out[task].dtype == torch.float32


def test_forward_on_a_subset_of_tasks() -> None:
    """Evaluation feeds one task at a time; the model does not need every task in a batch."""
    model = _model(ADVECTION, DARCY)
    out = model({"darcy": torch.randn(4, 1, 16, 16)})
    assert list(out) == ["darcy"]
    assert out["darcy"].shape == (4, 1, 16, 16)


def _zero_decoders(model: LatentOperator) -> None:
    with torch.no_grad():
        for decoder in model.decoders.values():
            proj = decoder.proj
            assert isinstance(proj, nn.ConvTranspose1d | nn.ConvTranspose2d)
            assert proj.bias is not None
            proj.weight.zero_()
            proj.bias.zero_()


def test_time_tasks_predict_input_plus_change() -> None:
    """With a zeroed decoder a time-dependent task predicts exactly its input frame
    (persistence), so training starts from the identity; a steady task predicts zero."""
    model = _model(ADVECTION, DARCY, REACTION)
    _zero_decoders(model)
    batch = {
        "advection": torch.randn(3, 1, 64),
        "darcy": torch.randn(2, 1, 16, 16),
        "reaction": torch.randn(2, 2, 16, 8),
    }
    out = model(batch)
    torch.testing.assert_close(out["advection"], batch["advection"], rtol=0, atol=0)
    torch.testing.assert_close(out["reaction"], batch["reaction"], rtol=0, atol=0)
    assert torch.count_nonzero(out["darcy"]) == 0


def test_every_task_shares_the_operator() -> None:
    """One transformer serves all tasks: a gradient from any one task reaches the shared
    operator, and only that task's own encoder/decoder."""
    model = _model(ADVECTION, DARCY)
    # Decoders start at zero (the untrained model is the baseline); give this one weights
    # so the gradient can flow back through it.
    torch.nn.init.normal_(model.decoders["advection"].proj.weight)
    model({"advection": torch.randn(2, 1, 64)})["advection"].pow(2).mean().backward()
    shared = [p.grad for p in model.operator.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in shared)
    assert all(p.grad is None for p in model.encoders["darcy"].parameters())
    assert all(p.grad is None for p in model.decoders["darcy"].parameters())


def test_patch_not_dividing_a_2d_grid_names_model_patch_2d() -> None:
    """A 2D patch size that does not divide the grid is refused with the key to change."""
    cfg = SMALL.model_copy(update={"patch_2d": 5})
    with pytest.raises(ValueError, match=r"model\.patch_2d=5") as info:
        build_model([ADVECTION, DARCY], cfg)
    message = str(info.value)
    assert "'darcy'" in message and "(16, 16)" in message
    assert "patch_1d" not in message  # the 1D task fits: only the culprit is named


def test_every_misfit_is_listed_at_once() -> None:
    """Both patch sizes wrong: both keys appear, so the user fixes them in one pass."""
    cfg = SMALL.model_copy(update={"patch_1d": 7, "patch_2d": 3})
    problems = model_problems([ADVECTION, DARCY], cfg)
    assert len(problems) == 2
    assert problems[0].startswith("model.patch_1d=7")
    assert problems[1].startswith("model.patch_2d=3")
    assert model_problems([ADVECTION, DARCY], SMALL) == []


def test_untrained_model_is_the_baseline() -> None:
    """Zero-initialised decoders: an untrained model predicts persistence for time tasks and
    the given mean field for steady ones, so training starts from the baseline."""
    mean = torch.rand(1, 16, 16)
    darcy = TaskShape("darcy", 1, 1, (16, 16), steady=True, out_offset=mean, out_scale=0.1)
    model = _model(ADVECTION, darcy)
    x1, x2 = torch.randn(3, 1, 64), torch.randn(3, 1, 16, 16)
    out = model({"advection": x1, "darcy": x2})
    assert torch.equal(out["advection"], x1)
    assert torch.equal(out["darcy"], mean.expand(3, 1, 16, 16))


def test_decoders_feed_their_conv_a_contiguous_grid() -> None:
    """Every decoder's transposed conv gets a contiguous grid, never the channels-last view
    of the transposed tokens: compiled on CUDA, that view failed inductor's stride check in
    the conv's backward (torch 2.11; scripts/repro_compile_conv_stride.py)."""
    model = _model(ADVECTION, DARCY, REACTION)
    seen: dict[str, bool] = {}
    for task, decoder in model.decoders.items():
        decoder.proj.register_forward_pre_hook(
            lambda _m, args, task=task: seen.__setitem__(task, args[0].is_contiguous())
        )
    model({"advection": torch.randn(3, 1, 64), "darcy": torch.randn(5, 1, 16, 16),
           "reaction": torch.randn(2, 2, 16, 8)})  # fmt: skip
    assert seen == {"advection": True, "darcy": True, "reaction": True}
