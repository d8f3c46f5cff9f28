"""Minimal reproduction: a compiled ConvTranspose2d whose input is a channels-last view fails
in its backward with ``AssertionError: expected size 64==64, stride 64==1 at dim=1; ...``
(``Error in op: torch.ops.aten.convolution_backward.default``).

Seen on the GPU suite's first H100 run (torch 2.11.0+cu130, step ``train-cuda-compile``;
benchmarks/results/gpu-suite-h100-2026-11-27-run2.json). ups's patch decoder turns latent
tokens ``(B, N, D)`` into a grid with ``transpose(1, 2).reshape(B, D, h, w)``: a view whose
strides are channels-last, ``(N*D, 1, w*D, D)``, fed to ``ConvTranspose2d(D, 1, p, stride=p)``.
Inductor's meta kernel for ``aten.convolution_backward`` predicts the gradient of that input
in the input's memory format (channels-last); the CUDA backend computes a transposed conv's
input gradient from the output gradient (one channel, contiguous) and returns it contiguous,
so the compiled backward's stride assertion fails. The values are right; the prediction is
wrong. Upstream, the same meta-kernel-vs-backend stride disagreement for
``convolution_backward``: https://github.com/pytorch/pytorch/issues/171622 (transposed
convs, channels-last, CUDA/MPS; CPU unaffected) and
https://github.com/pytorch/pytorch/issues/197514 (conv2d backward ``grad_input`` strides).

    python scripts/repro_compile_conv_stride.py               # cuda when there is one
    python scripts/repro_compile_conv_stride.py --device cpu
    python scripts/repro_compile_conv_stride.py --contiguous  # ups's layout: no failure

Prints one JSON line (torch, device, layout, ``reproduced``, the error) and exits 1 when the
failure reproduced, 0 when the compiled forward and backward ran and match eager, 2 when
something else went wrong (that error is printed). scripts/gpu_suite.py runs it to tell
this torch bug from a failure of ups's own.
"""

from __future__ import annotations

import argparse
import json
import sys

SIGNATURE = ("expected size", "stride", "convolution_backward")
"""What the failure says (its assertion and the op it names)."""


def matches_signature(text: str) -> bool:
    """True when ``text`` (an error and its context) is this failure."""
    return all(word in text for word in SIGNATURE)


def run(device: str, contiguous: bool) -> dict[str, object]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    batch, tokens, dim, patch = 32, 64, 64, 8  # the demo's Darcy decoder on a 64 x 64 grid
    grid = (8, 8)
    norm = nn.LayerNorm(dim).to(device)
    deconv = nn.ConvTranspose2d(dim, 1, kernel_size=patch, stride=patch).to(device)
    offset = torch.randn(1, 64, 64, device=device)

    def decode(z: torch.Tensor) -> torch.Tensor:  # ups.model.operator.PatchDecoder's forward
        x = norm(z).transpose(1, 2).reshape(batch, dim, *grid)  # channels-last strides
        if contiguous:
            x = x.contiguous()
        out: torch.Tensor = deconv(x) * 0.5 + offset
        return out

    z = torch.randn(batch, tokens, dim, device=device, requires_grad=True)
    eager = decode(z)
    eager.square().mean().backward()
    want = z.grad.clone()  # type: ignore[union-attr]
    z.grad = None
    compiled = torch.compile(decode)
    record: dict[str, object] = {
        "torch": str(torch.__version__),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else device,
        "layout": "contiguous" if contiguous else "channels-last view",
        "reproduced": False,
        "error": None,
    }
    try:
        compiled(z).square().mean().backward()
    except AssertionError as exc:
        text = str(exc)
        record.update(reproduced=matches_signature(text), error=text.splitlines()[0][:300])
        if not record["reproduced"]:
            raise
        return record
    close = torch.allclose(z.grad, want, rtol=1e-4, atol=1e-5)  # type: ignore[arg-type]
    record["matches_eager"] = bool(close)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when there is one")
    parser.add_argument("--contiguous", action="store_true", help="a contiguous input (ups's)")
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        record = run(device, args.contiguous)
    except Exception as exc:  # not this failure: say what it was
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:600], "reproduced": False}))
        return 2
    print(json.dumps(record))
    if record["reproduced"]:
        return 1
    return 0 if record.get("matches_eager") else 2


if __name__ == "__main__":
    sys.exit(main())
