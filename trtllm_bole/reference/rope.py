"""Qwen3.5's partial rotary embedding in plain torch: rotate-half RoPE on the leading ``rotary_dim``
channels of each head (Qwen3.5's multimodal RoPE gives the T, H and W sections the same position for
text tokens, so it is plain 1-D RoPE; checked against transformers in tests). The truth of
:func:`trtllm_bole.ops.rms_norm_rope` and the path of every CPU forward and of training.

``cos`` and ``sin`` are kept at half width (``rotary_dim / 2``: transformers' tables repeat each
frequency twice); :func:`apply_rope` gives the values of transformers' ``x * cos + rotate_half(x) * sin``
bit for bit, each product and the sum rounded to x's dtype as there.
"""

from __future__ import annotations

import functools

import torch

from trtllm_bole.reference import norms


@functools.lru_cache(maxsize=16)
def inv_freq(theta: float, rotary_dim: int, device: torch.device) -> torch.Tensor:
    """``theta ** (-2i / rotary_dim)`` for ``i < rotary_dim / 2`` (float32), made once per device: every
    forward needs it, and a forward replayed from a CUDA graph must not allocate it."""
    steps = torch.arange(0, rotary_dim, 2, dtype=torch.float, device=device)
    return 1.0 / (theta ** (steps / rotary_dim))


def cos_sin(
    positions: torch.Tensor, freqs: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width cos/sin ``[..., rotary_dim / 2]`` for integer ``positions`` and :func:`inv_freq`'s
    ``freqs``, in ``dtype`` (transformers rounds its tables to the model's dtype)."""
    angles = positions.float()[..., None] * freqs
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the leading ``2 · cos.shape[-1]`` channels of ``x [..., heads, head_dim]``
    (``cos``, ``sin``: ``[..., rotary_dim / 2]``, broadcast over the heads)."""
    half = cos.shape[-1]
    cos, sin = cos[..., None, :], sin[..., None, :]
    x1, x2, x_pass = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat([x1 * cos + -x2 * sin, x2 * cos + x1 * sin, x_pass], dim=-1)


def rms_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Each head of ``x [N, heads, head_dim]`` normalised (:func:`.norms.rms_norm`), then rotated at its
    token's ``cos``/``sin`` ``[N, rotary_dim / 2]``: the attention's q and k."""
    return apply_rope(norms.rms_norm(x, weight, eps), cos, sin)
