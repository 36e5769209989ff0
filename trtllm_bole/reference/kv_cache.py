"""The paged KV cache's commit in plain torch: the truth of :func:`trtllm_bole.ops.kv_commit` and its CPU
path. A request's accepted path (root side first) goes to positions ``context_len .. context_len +
depth - 1`` of its block table; the other nodes are dropped."""

from __future__ import annotations

import torch

from trtllm_bole.tree import TreeBatch


def accepted_positions(
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per node ``[N]``: whether it is written (an ancestor of its request's accepted leaf, or the leaf:
    the pre-order interval test, no path table), its position ``context_len + depth - 1``, its
    block-table column (past the table is an error where ``keep`` holds: :func:`trtllm_bole.ops.kv_commit`
    checks it) and the table's entry there (at the last column where past it, the first where before it).
    ``accepted_leaf`` holds local indices in ``[-1, request size)``."""
    leaf = accepted_leaf.long()[tree.request]
    at = tree.dfs_order[(leaf + tree.cu_seqlens[:-1][tree.request]).clamp(min=0)]
    keep = (leaf >= 0) & (tree.dfs_order <= at) & (at < tree.dfs_order + tree.subtree_size)
    pos = context_lens.long()[tree.request] + tree.depth - 1
    column = pos // block_size
    if not block_tables.shape[1]:  # an empty table: every position is past it, on no block
        block_tables = block_tables.new_full((block_tables.shape[0], 1), -1)
    block = block_tables.long()[tree.request, column.clamp(0, block_tables.shape[1] - 1)]
    return keep, pos, column, block


def write_accepted_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    new_k: torch.Tensor,
    new_v: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    """Caches ``[L, num_blocks, block_size, KVH, d]``, new entries ``[L, N, KVH, d]`` (every layer in one
    indexed copy, in place whatever their strides); ``accepted_leaf == -1`` writes nothing. A position
    outside the request's table (below 0 or past its end) or on a negative entry (no block) is dropped:
    the checked op refuses it, and an unchecked caller's stray write lands in no other request's blocks
    (as the kernel drops it)."""
    num_blocks, block_size = k_cache.shape[1:3]
    keep, pos, column, blocks = accepted_positions(
        tree, accepted_leaf, context_lens, block_tables, block_size
    )
    in_table = (pos >= 0) & (column < block_tables.shape[1])  # a negative column would wrap around
    keep = keep & in_table & (blocks >= 0) & (blocks < num_blocks)
    nodes = torch.nonzero(keep).flatten()
    # Indexed in place, whatever the caches' strides (flattening a strided cache would copy it).
    at = (slice(None), blocks[nodes], pos[nodes] % block_size)
    k_cache[at] = new_k[:, nodes].to(k_cache.dtype)
    v_cache[at] = new_v[:, nodes].to(v_cache.dtype)
