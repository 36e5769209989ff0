"""Qwen3.5's zero-centred RMSNorm in plain torch: the truth of :func:`trtllm_bole.ops.rms_norm` and the
path of every CPU forward and of training (it is differentiable)."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * (1 + w)`` over the last dimension in float32, cast back to x's dtype (transformers'
    Qwen3_5RMSNorm, operation for operation)."""
    x32 = x.float()
    out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).type_as(x)
