"""Qwen3.5's zero-centred RMSNorm as one kernel: ``x / rms(x) * (1 + w)`` in float32, cast back; and the
attention's q/k norm with its rotary embedding in one kernel.

Unfused, the norm is seven elementwise and reduction kernels (upcast, square, mean, add, rsqrt, two
products, downcast); a draft step runs seven norms per MTP pass, eight passes a step, and every kernel
of a replayed graph costs ~2 µs on the H200 whatever its size (benchmarks/README.md). One program
normalises one row in registers. The rotary embedding after the q and k norms was another twelve
kernels per attention layer (slices, negation, products, sums, concatenations); :func:`rms_norm_rope`
does both in one, each product and the sum rounded to x's dtype as the torch reference
(:mod:`trtllm_bole.reference.rope`) rounds them. It is compiled without floating-point contraction:
with it, ``x1 cos - x2 sin`` became one fused multiply-add that skipped the rounding of ``x1 cos`` to
bf16 (15% of the rotated channels one bf16 ulp off the torch path on the H200).
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


@triton.jit
def _rms_norm_rope_kernel(x, weight, cos, sin, out, heads, n_cols, stride_n, stride_h, eps,
                          HALF: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """One program per (token, head) row: the norm (rounded to x's dtype, as the reference's norm
    returns it), then RoPE on the leading ``2 HALF`` channels, each channel's partner (``c ± HALF``)
    normalised from a second load of the row."""
    row = tl.program_id(0).to(tl.int64)
    token = row // heads
    base = x + token * stride_n + (row % heads) * stride_h
    dtype = out.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x_row * x_row, axis=0) / n_cols + eps)
    y = (x_row * inv_rms * (1.0 + tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32))).to(dtype)
    rotary = cols < 2 * HALF
    first = cols < HALF
    partner = tl.where(first, cols + HALF, cols - HALF)
    x_p = tl.load(base + partner, mask=rotary, other=0.0).to(tl.float32)
    w_p = tl.load(weight + partner, mask=rotary, other=0.0).to(tl.float32)
    y_p = (x_p * inv_rms * (1.0 + w_p)).to(dtype).to(tl.float32)
    c = tl.load(cos + token * HALF + cols % HALF, mask=rotary, other=0.0).to(tl.float32)
    s = tl.load(sin + token * HALF + cols % HALF, mask=rotary, other=0.0).to(tl.float32)
    a = (y.to(tl.float32) * c).to(dtype).to(tl.float32)  # x1 cos, x2 cos
    b = (tl.where(first, -y_p, y_p) * s).to(dtype).to(tl.float32)  # -x2 sin, x1 sin
    tl.store(out + row * n_cols + cols, tl.where(rotary, (a + b).to(dtype), y), mask=mask)


def rms_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """:func:`rms_norm` of every head of ``x [N, heads, head_dim]`` (its last dim contiguous, the others
    any stride: q is a split of its projection), then RoPE at ``cos``/``sin`` ``[N, rotary_dim / 2]`` (x's
    dtype). Returns a contiguous tensor of x's shape and dtype."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not x.numel():
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    n, heads, d = x.shape
    _rms_norm_rope_kernel[(n * heads,)](
        x, weight.contiguous(), cos.contiguous(), sin.contiguous(), out, heads, d, x.stride(0), x.stride(1),
        eps, HALF=cos.shape[-1], BLOCK=triton.next_power_of_2(d), enable_fp_fusion=False,
    )  # fmt: skip
    return out
