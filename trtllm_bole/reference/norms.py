"""Qwen3.5's norms and the GDN layer's elementwise inputs in plain torch: the truth of
:func:`trtllm_bole.ops.rms_norm`, :func:`~trtllm_bole.ops.gdn_inputs` and
:func:`~trtllm_bole.ops.gated_rms_norm`, and the path of every CPU forward and of training (they are
differentiable)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * (1 + w)`` over the last dimension in float32, cast back to x's dtype (transformers'
    Qwen3_5RMSNorm, operation for operation)."""
    x32 = x.float()
    out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).type_as(x)


L2NORM_EPS = 1e-6
"""The q/k L2 norm's epsilon, inside the root (flash-linear-attention's ``l2norm``, which transformers'
Qwen3.5 GDN layer calls)."""


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x / sqrt(sum(x²) + eps)`` over the last dimension, in float32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gdn_inputs(
    qk: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The GDN recurrence's inputs from the conv's q|k columns ``qk [N, 2 key_dim]`` and the projection's
    ``a``, ``b`` ``[N, HV]``: q and k ``[N, heads, dk]`` L2-normalised in float32 and handed on in qk's
    dtype, the log decay ``g = -exp(A_log) softplus(a + dt_bias)`` (float32, <= 0) and ``beta =
    sigmoid(b)`` (b's dtype), BOLE.md §1."""
    q, k = qk.unflatten(-1, (2, heads, -1)).unbind(-3)
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())  # float32 whatever the parameters'
    return l2norm(q).to(qk.dtype), l2norm(k).to(qk.dtype), g, b.sigmoid()


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The GDN output norm over the last dimension: plain weight (not zero-centred), then ``* silu(gate)``
    (transformers' Qwen3_5RMSNormGated, operation for operation), in x's dtype."""
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * normed * F.silu(gate.float())).to(x.dtype)
