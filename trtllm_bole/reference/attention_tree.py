"""Full attention over a paged KV cache plus a forest of new tokens, in plain torch: the truth of
:func:`trtllm_bole.ops.tree_attention` and its CPU path (BOLE.md §4).

Node ``i`` of request ``b`` attends to the ``context_lens[b]`` committed tokens of its request (read
from the paged cache through the block table) and to its draft ancestors and itself. A prompt is a
chain, so prefill is the same computation with a causal mask.

Paged cache: ``[num_blocks, block_size, KVH, head_dim]`` per layer; position ``p`` of request ``b``
lives in row ``p % block_size`` of block ``block_tables[b, p // block_size]``.

SDPA with an explicit boolean mask over a padded batch: exact, simple, and what the Triton kernel
(:mod:`trtllm_bole.kernels.tree_attention`) is checked against. The committed window it gathers is the
whole block table's width, so no host sync is needed for the context length; its cost grows with the
table's width, not with the tokens committed so far.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_bole.tree import TreeBatch


def _padded_nodes(tree: TreeBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` packed node of each padded slot (``N`` = padding, T the largest request) and each
    node's index inside its request ``[N]``."""
    num_nodes, device = tree.num_nodes, tree.parents.device
    local = torch.arange(num_nodes, device=device) - tree.cu_seqlens[:-1][tree.request]
    padded = torch.full((tree.num_requests, tree.max_nodes), num_nodes, dtype=torch.long, device=device)
    padded[tree.request, local] = torch.arange(num_nodes, device=device)
    return padded, local


def _mask(
    tree: TreeBatch, padded: torch.Tensor, local: torch.Tensor, context_lens: torch.Tensor, window: int
) -> torch.Tensor:
    """bool ``[B, 1, T, W + T]``: the committed positions below each request's length, then the padded
    nodes that are ancestors of (or are) the query node, by DFS interval (see TreeBatch). Padded query
    rows see everything: an all-False row would make SDPA return NaN there."""
    batch, width = padded.shape
    device = padded.device
    committed = torch.arange(window, device=device)[None, :] < context_lens[:, None]
    order = torch.full((batch, width), -1, dtype=torch.long, device=device)
    end = torch.full((batch, width), -1, dtype=torch.long, device=device)
    order[tree.request, local] = tree.dfs_order
    end[tree.request, local] = tree.dfs_order + tree.subtree_size
    ancestor = (order[:, None, :] <= order[:, :, None]) & (order[:, :, None] < end[:, None, :])
    mask = torch.cat([committed[:, None, :].expand(batch, width, window), ancestor], dim=2)
    return (mask | (padded >= tree.num_nodes)[:, :, None])[:, None]


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    tree: TreeBatch,
    scale: float,
) -> torch.Tensor:
    """q ``[N, Hq, d]``, k/v ``[N, KVH, d]`` of every node of the forest; caches ``[num_blocks,
    block_size, KVH, d]`` of one layer; block_tables int ``[B, W]``, context_lens ``[B]``. Returns
    ``[N, Hq, d]`` in q's dtype (query head ``h`` reads key/value head ``h // (Hq / KVH)``)."""
    num_blocks, block_size = k_cache.shape[:2]
    padded, local = _padded_nodes(tree)
    pos = torch.arange(block_tables.shape[1] * block_size, device=q.device)
    blocks = block_tables.long()[:, pos // block_size].clamp(0, num_blocks - 1)
    committed_rows = blocks * block_size + pos % block_size  # [B, W]: row in the flat cache

    def keys(new: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        committed = cache.flatten(0, 1)[committed_rows]  # [B, W, KVH, d]
        fresh = torch.cat([new, new.new_zeros(1, *new.shape[1:])])[padded]
        return torch.cat([committed, fresh], dim=1).transpose(1, 2)

    queries = torch.cat([q, q.new_zeros(1, *q.shape[1:])])[padded].transpose(1, 2)
    out = F.scaled_dot_product_attention(
        queries,
        keys(k, k_cache),
        keys(v, v_cache),
        attn_mask=_mask(tree, padded, local, context_lens, pos.numel()),
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2)[tree.request, local]
