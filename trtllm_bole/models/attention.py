"""Full attention over a paged KV cache plus a forest of new tokens (BOLE.md §4).

Node ``i`` of request ``b`` attends to the ``context_lens[b]`` committed tokens of its request (read
from the paged cache through the block table) and to its draft ancestors and itself. A prompt is a
chain, so prefill is the same computation with a causal mask.

Paged cache: ``[num_blocks, block_size, KVH, head_dim]`` per layer; position ``p`` of request ``b``
lives in row ``p % block_size`` of block ``block_tables[b, p // block_size]``.

This is the torch path (SDPA with an explicit boolean mask over a padded batch): exact, simple, and
the reference for a fused tree-attention kernel. The committed window it gathers is the whole block
table width, so no host sync is needed for the context length: launched eagerly, the executor's
table is as wide as the largest block reservation in the batch (a request reserves blocks for its
prompt, its ``max_tokens`` and a tree); replayed from CUDA graphs it is as wide as the largest
reservation can be (``spec.scheduler.kv_tokens`` over the block size; :mod:`trtllm_bole.spec.verify_graphs`).
Either way its cost grows with the reservation, not with the tokens committed so far.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtllm_bole.tree import TreeBatch


@dataclass(frozen=True, slots=True)
class TreeAttention:
    """Per-step attention metadata, shared by every attention layer of one forward."""

    mask: torch.Tensor  # bool [B, 1, T, W + T]: committed window W, then the padded new nodes
    committed_rows: torch.Tensor  # int64 [B, W]: row of each committed position in the flat cache
    padded_nodes: torch.Tensor  # int64 [B, T]: packed node of each padded slot (N = padding)
    request: torch.Tensor  # int64 [N]
    local: torch.Tensor  # int64 [N]: index of each node inside its request

    @classmethod
    def build(
        cls,
        tree: TreeBatch,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        block_size: int,
        num_blocks: int,
    ) -> TreeAttention:
        num_nodes, batch = tree.num_nodes, tree.num_requests
        device = tree.parents.device
        width = tree.max_nodes  # the largest request, a host int: no sync
        local = torch.arange(num_nodes, device=device) - tree.cu_seqlens[:-1][tree.request]
        padded_nodes = torch.full((batch, width), num_nodes, dtype=torch.long, device=device)
        padded_nodes[tree.request, local] = torch.arange(num_nodes, device=device)
        real_row = padded_nodes < num_nodes

        window = block_tables.shape[1] * block_size
        pos = torch.arange(window, device=device)
        blocks = block_tables.long()[:, pos // block_size].clamp(0, num_blocks - 1)
        committed_rows = blocks * block_size + pos % block_size
        committed = pos[None, :] < context_lens[:, None]

        # Ancestor-or-self by DFS interval (see TreeBatch); padding has an empty interval.
        order = torch.full((batch, width), -1, dtype=torch.long, device=device)
        end = torch.full((batch, width), -1, dtype=torch.long, device=device)
        order[tree.request, local] = tree.dfs_order
        end[tree.request, local] = tree.dfs_order + tree.subtree_size
        ancestor = (order[:, None, :] <= order[:, :, None]) & (order[:, :, None] < end[:, None, :])
        mask = torch.cat([committed[:, None, :].expand(batch, width, window), ancestor], dim=2)
        # Padded query rows see everything: an all-False row would make SDPA return NaN there.
        mask = mask | ~real_row[:, :, None]
        return cls(mask[:, None], committed_rows, padded_nodes, tree.request, local)


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: TreeAttention,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """k/v ``[N, KVH, d]`` of every node of the forest; caches of one layer; q ``[N, Hq, d]``, or only
    the queries of the nodes ``rows`` (``[R]``) when a forest grows a pass at a time (the other
    nodes' K/V come from earlier passes). Returns ``[N or R, Hq, d]``."""
    if rows is not None:
        q = q.new_zeros(k.shape[0], *q.shape[1:]).index_copy(0, rows, q)

    def padded(new: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        committed = cache.flatten(0, 1)[meta.committed_rows]  # [B, W, KVH, d]
        fresh = torch.cat([new, new.new_zeros(1, *new.shape[1:])])[meta.padded_nodes]
        return torch.cat([committed, fresh], dim=1).transpose(1, 2)

    queries = torch.cat([q, q.new_zeros(1, *q.shape[1:])])[meta.padded_nodes].transpose(1, 2)
    out = F.scaled_dot_product_attention(
        queries,
        padded(k, k_cache),
        padded(v, v_cache),
        attn_mask=meta.mask,
        scale=q.shape[-1] ** -0.5,
        enable_gqa=True,
    )
    out = out.transpose(1, 2)[meta.request, meta.local]
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
