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

The GDN layer's elementwise work around its recurrence is two more: :func:`gdn_inputs` (the q and k L2
norms, the decay and beta: 16 torch kernels in float32, 22 in bf16, counted on the CPU) and
:func:`gated_rms_norm` (the output norm and its SiLU gate: 8 and 12), each the torch reference's
arithmetic (:mod:`trtllm_bole.reference.norms`) in one launch, for every GDN layer of every forward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_bole.reference.norms import L2NORM_EPS


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


@triton.jit
def softplus(x):
    """``log(1 + exp(x))`` in float32 as torch computes it (``x`` itself above its threshold 20), with
    ``log1p`` written out: ``log(1 + e)`` alone is 0 for ``e`` below float32's epsilon, and the GPU's
    approximate log loses digits near 1, so ``e <= 1/4`` takes ``2 atanh(e / (2 + e))``'s series
    (``s <= 1/9``: five terms, 3e-11 relative) and larger ``e`` the log (within 6e-7 there)."""
    e = tl.exp(tl.minimum(x, 20.0))
    s = e / (2.0 + e)
    s2 = s * s
    series = 2.0 * s * (1.0 + s2 * (1.0 / 3.0 + s2 * (1.0 / 5.0 + s2 * (1.0 / 7.0 + s2 / 9.0))))
    return tl.where(x > 20.0, x, tl.where(e <= 0.25, series, tl.log(1.0 + e)))


@triton.jit
def _gdn_inputs_kernel(qk, a, b, a_log, dt_bias, q_out, k_out, g_out, beta_out, heads, dk, hv, key_dim,
                       stride_qk, stride_a, stride_b, eps, HP: tl.constexpr, DKP: tl.constexpr,
                       HVP: tl.constexpr):  # fmt: skip
    """One program per token: its q and k heads (``[HP, DKP]`` tiles) normalised, and its gates."""
    row = tl.program_id(0).to(tl.int64)
    o_h, o_d = tl.arange(0, HP), tl.arange(0, DKP)
    m = (o_h < heads)[:, None] & (o_d < dk)[None, :]
    cols = o_h[:, None] * dk + o_d[None, :]
    for half in tl.static_range(2):  # q, then k
        x = tl.load(qk + row * stride_qk + half * key_dim + cols, mask=m, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(tl.sum(x * x, axis=1) + eps)[:, None]
        out = q_out if half == 0 else k_out
        tl.store(out + row * key_dim + cols, y.to(out.dtype.element_ty), mask=m)
    o_v = tl.arange(0, HVP)
    m_v = o_v < hv
    x_a = tl.load(a + row * stride_a + o_v, mask=m_v, other=0.0).to(tl.float32)
    decay = tl.exp(tl.load(a_log + o_v, mask=m_v, other=0.0).to(tl.float32))
    x_a += tl.load(dt_bias + o_v, mask=m_v, other=0.0).to(tl.float32)
    tl.store(g_out + row * hv + o_v, -decay * softplus(x_a), mask=m_v)
    x_b = tl.load(b + row * stride_b + o_v, mask=m_v, other=0.0).to(tl.float32)
    tl.store(beta_out + row * hv + o_v, (1.0 / (1.0 + tl.exp(-x_b))).to(beta_out.dtype.element_ty), mask=m_v)


def gdn_inputs(
    qk: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`trtllm_bole.reference.norms.gdn_inputs` in one launch: ``qk [N, 2 key_dim]``, ``a``, ``b``
    ``[N, HV]`` (rows may be strided: they are splits of the layer's projections, last dim contiguous);
    ``A_log``, ``dt_bias`` ``[HV]``. Returns contiguous q, k ``[N, heads, dk]`` (qk's dtype), g (float32)
    and beta (b's dtype) ``[N, HV]``."""
    n, key_dim, hv = qk.shape[0], qk.shape[1] // 2, a.shape[-1]
    dk = key_dim // heads
    q = torch.empty((n, heads, dk), dtype=qk.dtype, device=qk.device)
    k = torch.empty_like(q)
    g = torch.empty((n, hv), dtype=torch.float32, device=qk.device)
    beta = torch.empty((n, hv), dtype=b.dtype, device=qk.device)
    if n:
        qk, a, b = (t if t.stride(-1) == 1 else t.contiguous() for t in (qk, a, b))
        _gdn_inputs_kernel[(n,)](
            qk, a, b, a_log.contiguous(), dt_bias.contiguous(), q, k, g, beta, heads, dk, hv, key_dim,
            qk.stride(0), a.stride(0), b.stride(0), L2NORM_EPS, HP=triton.next_power_of_2(heads),
            DKP=triton.next_power_of_2(dk), HVP=triton.next_power_of_2(hv),
        )  # fmt: skip
    return q, k, g, beta


@triton.jit
def _gated_rms_norm_kernel(x, gate, weight, out, heads, n_cols, stride_x, stride_xh, stride_g, stride_gh,
                           eps, BLOCK: tl.constexpr, ROUND_WEIGHTED: tl.constexpr):  # fmt: skip
    """One program per (token, head) row; the products rounded to x's dtype where the reference's are
    (``weight * normed`` only where the weight's dtype is not wider than x's)."""
    row = tl.program_id(0).to(tl.int64)
    token, head = row // heads, row % heads
    dtype = out.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = tl.load(x + token * stride_x + head * stride_xh + cols, mask=mask, other=0.0).to(tl.float32)
    normed = (x_row * tl.rsqrt(tl.sum(x_row * x_row, axis=0) / n_cols + eps)).to(dtype).to(tl.float32)
    weighted = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32) * normed
    if ROUND_WEIGHTED:
        weighted = weighted.to(dtype).to(tl.float32)
    z = tl.load(gate + token * stride_g + head * stride_gh + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * n_cols + cols, (weighted * (z / (1.0 + tl.exp(-z)))).to(dtype), mask=mask)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`trtllm_bole.reference.norms.gated_rms_norm` of ``x [N, heads, n]`` with ``gate`` of its shape
    (either may be strided along its first two dims: the gate is a split of the layer's projection);
    ``weight [n]`` (in x's dtype, or a wider one: torch's product is then not rounded to x's). Returns a
    contiguous tensor of x's shape and dtype."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not x.numel():
        return out
    x, gate = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, gate))
    n, heads, d = x.shape
    _gated_rms_norm_kernel[(n * heads,)](
        x, gate, weight.contiguous(), out, heads, d, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
        eps, BLOCK=triton.next_power_of_2(d),
        ROUND_WEIGHTED=torch.promote_types(weight.dtype, x.dtype) == x.dtype,
    )  # fmt: skip
    return out
