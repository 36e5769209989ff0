"""Qwen3.5's zero-centred RMSNorm as one kernel: ``x / rms(x) * (1 + w)`` in float32, cast back.

Unfused, the norm is seven elementwise and reduction kernels (upcast, square, mean, add, rsqrt, two
products, downcast); a draft step runs seven norms per MTP pass, eight passes a step, and every kernel
of a replayed graph costs ~2 µs on the H200 whatever its size (benchmarks/README.md). One program
normalises one row in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x, weight, out, n_cols, row_stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = tl.load(x + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x_row * x_row, axis=0) / n_cols + eps)
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
    y = x_row * inv_rms * (1.0 + w)
    tl.store(out + row * n_cols + cols, y.to(out.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The norm of every row of ``x [..., n]`` (rows may be strided, e.g. a split of a projection);
    ``weight [n]``. Returns a contiguous tensor of x's shape and dtype."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not x.numel():
        return out
    n = x.shape[-1]
    rows = x.reshape(-1, n)  # a view for the layers' inputs; a copy only for an unusual layout
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    _rms_norm_kernel[(rows.shape[0],)](
        rows, weight.contiguous(), out, n, rows.stride(0), eps, BLOCK=triton.next_power_of_2(n)
    )
    return out
