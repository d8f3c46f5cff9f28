"""A multi-task latent operator.

Each task has an encoder from its grid to latent tokens (non-overlapping patches, a
learned position embedding and a task embedding) and a decoder back to the grid. One
transformer, shared by every task, advances the latent state by one step. Time-dependent
tasks predict the change of the field (the decoder output is added to the input frame);
steady tasks (Darcy) predict the solution from the coefficient field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ups.config import ModelConfig
from ups.model.fit import model_problems

if TYPE_CHECKING:
    from ups.data.pdebench import TaskInfo


@dataclass(frozen=True)
class TaskShape:
    """What the model needs to know about a task's samples."""

    name: str
    channels_in: int
    channels_out: int
    spatial: tuple[int, ...]
    steady: bool
    out_offset: Tensor | None = None
    """Steady tasks: the mean training solution. The decoder predicts the deviation from it
    and starts at zero, so an untrained model already equals the mean-field baseline."""
    out_scale: float = 1.0
    """Typical size of what the decoder predicts (the field for steady tasks, the one-step
    change for time tasks); the decoder works in units of it, so training starts at the
    right magnitude instead of spending its first hundreds of steps finding it."""


def task_shapes(
    infos: Mapping[str, TaskInfo],
    scales: Mapping[str, float] | None = None,
    offsets: Mapping[str, Tensor] | None = None,
) -> list[TaskShape]:
    """Each task's shape as the model needs it, from what the data files say."""
    scales, offsets = scales or {}, offsets or {}
    return [
        TaskShape(
            i.name,
            i.channels,
            i.channels,
            tuple(i.spatial),
            i.steady,
            out_offset=offsets.get(i.name),
            out_scale=scales.get(i.name, 1.0),
        )
        for i in infos.values()
    ]


class PatchEncoder(nn.Module):
    """Grid (B, C, *spatial) -> tokens (B, N, D)."""

    def __init__(self, shape: TaskShape, patch: int, dim: int) -> None:
        super().__init__()
        ndim = len(shape.spatial)
        conv = nn.Conv1d if ndim == 1 else nn.Conv2d
        self.proj = conv(shape.channels_in, dim, kernel_size=patch, stride=patch)
        n_tokens = 1
        for size in shape.spatial:
            n_tokens *= size // patch
        self.pos = nn.Parameter(torch.randn(1, n_tokens, dim) * 0.02)
        self.task = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x: Tensor) -> Tensor:
        tokens: Tensor = self.proj(x).flatten(2).transpose(1, 2)
        return tokens + self.pos + self.task


class PatchDecoder(nn.Module):
    """Tokens (B, N, D) -> grid (B, C, *spatial)."""

    def __init__(self, shape: TaskShape, patch: int, dim: int) -> None:
        super().__init__()
        ndim = len(shape.spatial)
        deconv = nn.ConvTranspose1d if ndim == 1 else nn.ConvTranspose2d
        self.norm = nn.LayerNorm(dim)
        self.proj = deconv(dim, shape.channels_out, kernel_size=patch, stride=patch)
        self.grid = tuple(size // patch for size in shape.spatial)
        # Zero-initialised: the untrained model is the baseline (persistence or mean field).
        nn.init.zeros_(self.proj.weight)
        if self.proj.bias is not None:
            nn.init.zeros_(self.proj.bias)
        self.register_buffer("scale", torch.tensor(float(shape.out_scale)))
        offset = shape.out_offset
        if offset is None:
            offset = torch.zeros(shape.channels_out, *shape.spatial)
        self.register_buffer("offset", offset.reshape(shape.channels_out, *shape.spatial).clone())

    def forward(self, z: Tensor) -> Tensor:
        z = self.norm(z).transpose(1, 2)
        # Contiguous, not the channels-last view the reshape of the transpose is: compiled
        # (torch.compile) on CUDA, a transposed conv's backward on that view failed inductor's
        # stride check in torch 2.11 (scripts/repro_compile_conv_stride.py).
        grid = z.reshape(*z.shape[:2], *self.grid).contiguous()
        out: Tensor = self.proj(grid) * self.scale + self.offset
        return out


class LatentOperator(nn.Module):
    """Encode each task's grid, advance the latent state one step, decode."""

    def __init__(self, shapes: list[TaskShape], cfg: ModelConfig) -> None:
        super().__init__()
        self.shapes = {s.name: s for s in shapes}
        self.encoders = nn.ModuleDict()
        self.decoders = nn.ModuleDict()
        for shape in shapes:
            patch = cfg.patch_1d if len(shape.spatial) == 1 else cfg.patch_2d
            self.encoders[shape.name] = PatchEncoder(shape, patch, cfg.latent_dim)
            self.decoders[shape.name] = PatchDecoder(shape, patch, cfg.latent_dim)
        layer = nn.TransformerEncoderLayer(
            d_model=cfg.latent_dim,
            nhead=cfg.heads,
            dim_feedforward=4 * cfg.latent_dim,
            dropout=cfg.dropout,
            batch_first=True,
            norm_first=True,
        )
        self.operator = nn.TransformerEncoder(
            layer, num_layers=cfg.depth, enable_nested_tensor=False
        )

    def encode(self, task: str, x: Tensor) -> Tensor:
        out: Tensor = self.encoders[task](x)
        return out

    def step(self, z: Tensor) -> Tensor:
        """Advance latent tokens by one step (residual, so the identity is easy to learn)."""
        out: Tensor = z + self.operator(z)
        return out

    def decode(self, task: str, z: Tensor, x: Tensor) -> Tensor:
        out: Tensor = self.decoders[task](z)
        return out if self.shapes[task].steady else x + out

    def forward(
        self, batches: Mapping[str, Tensor], latents: Mapping[str, Tensor] | None = None
    ) -> dict[str, Tensor]:
        """Predict the next state for every task's batch: ``{task: x}`` -> ``{task: y_hat}``.

        ``latents`` gives precomputed encodings (the latent cache) for some tasks.
        """
        latents = latents or {}
        out = {}
        for task, x in batches.items():
            z = latents[task] if task in latents else self.encode(task, x)
            out[task] = self.decode(task, self.step(z), x)
        return out


def build_model(shapes: list[TaskShape], cfg: ModelConfig) -> LatentOperator:
    """Build the model, or raise ValueError naming every grid a patch size does not divide."""
    problems = model_problems(shapes, cfg)
    if problems:
        raise ValueError("model does not fit the data:\n  - " + "\n  - ".join(problems))
    return LatentOperator(shapes, cfg)
