"""Full attention for the model's two forwards: over a forest of new tokens on top of the paged KV cache
(:func:`trtllm_bole.ops.tree_attention`: the torch path on CPU, one Triton launch on CUDA), and over whole
sequences without a cache (training, and checking logits against transformers)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_bole import ops
from trtllm_bole.tree import TreeBatch


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    tree: TreeBatch,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """k/v ``[N, KVH, d]`` of every node of the forest; caches of one layer; q ``[N, Hq, d]``, or only
    the queries of the nodes ``rows`` (``[R]``) when a forest grows a pass at a time (the other
    nodes' K/V come from earlier passes). Returns ``[N or R, Hq, d]``."""
    if rows is not None:
        q = q.new_zeros(k.shape[0], *q.shape[1:]).index_copy(0, rows, q)
    out = ops.tree_attention(
        q, k, v, k_cache, v_cache, block_tables, context_lens, tree, scale=q.shape[-1] ** -0.5
    )
    return out if rows is None else out[rows]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Whole sequences without a cache: q ``[B, L, Hq, d]``, k/v ``[B, L, KVH, d]`` -> ``[B, L, Hq, d]``."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        is_causal=True,
        scale=q.shape[-1] ** -0.5,
        enable_gqa=True,
    )
    return out.transpose(1, 2)
