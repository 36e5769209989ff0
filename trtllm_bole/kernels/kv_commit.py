"""The paged KV cache's commit as one launch for every attention layer: each request's accepted path
goes to positions ``context_len .. context_len + depth - 1`` of its block table.

One program per (request, path slot, layer) copies one node's K and V rows (``KVH × d`` each) or, off
the accepted path, nothing: masked stores instead of the reference's boolean indexing, whose output
size the host would wait for (:mod:`trtllm_bole.reference.kv_cache`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_bole.kernels._common import check_contiguous, check_kv_shapes, check_leaves
from trtllm_bole.tree import TreeBatch


@triton.jit(do_not_specialize=["n_nodes", "cache_rows", "table_width", "depth"])
def _kv_commit_kernel(
    k_cache, v_cache, new_k, new_v, accepted_leaf, cu_seqlens, paths, block_tables, context_lens,
    n_nodes, cache_rows, table_width, depth,
    ROW: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Runtime sizes are not specialised: one compiled variant per model, whatever the step."""
    b, j, layer = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    leaf = tl.load(accepted_leaf + b).to(tl.int64)
    node = tl.load(paths + (tl.maximum(leaf, 0) + tl.load(cu_seqlens + b).to(tl.int64)) * depth + j).to(
        tl.int64
    )
    pos = tl.load(context_lens + b).to(tl.int64) + j
    column = pos // PAGE
    inside = (pos >= 0) & (column < table_width)
    block = tl.load(block_tables + b * table_width + column, mask=inside, other=-1).to(tl.int64)
    row = block * PAGE + pos % PAGE
    keep = (leaf >= 0) & (node >= 0) & (block >= 0) & (row < cache_rows)  # drop writes outside the blocks
    cols = tl.arange(0, BLOCK)
    mask = cols < tl.where(keep, ROW, 0)  # nothing off the accepted path
    src = (layer * n_nodes + tl.maximum(node, 0)) * ROW + cols
    dst = (layer * cache_rows + row) * ROW + cols
    tl.store(k_cache + dst, tl.load(new_k + src, mask=mask).to(k_cache.dtype.element_ty), mask=mask)
    tl.store(v_cache + dst, tl.load(new_v + src, mask=mask).to(v_cache.dtype.element_ty), mask=mask)


def kv_commit(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    new_k: torch.Tensor,
    new_v: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    """Caches ``[L, num_blocks, block_size, KVH, d]``, new entries ``[L, N, KVH, d]``; in place, no sync
    (the arguments' values are checked by :func:`trtllm_bole.ops.kv_commit`; unchecked, a position
    outside the request's table (below 0 or past its end) or on a negative entry (no block) is
    dropped)."""
    check_kv_shapes(k_cache, v_cache, new_k, new_v, tree, block_tables, context_lens)
    check_contiguous(k_cache=k_cache, v_cache=v_cache)
    leaves = check_leaves(accepted_leaf, tree, k_cache.device)
    layers, num_blocks, page = k_cache.shape[:3]
    row = k_cache.shape[3] * k_cache.shape[4]
    new_k, new_v = new_k.contiguous(), new_v.contiguous()
    grid = (tree.num_requests, tree.paths.shape[1], layers)
    _kv_commit_kernel[grid](
        k_cache, v_cache, new_k, new_v, leaves, tree.cu_seqlens, tree.paths, block_tables.contiguous(),
        context_lens.contiguous(), tree.num_nodes, num_blocks * page, block_tables.shape[1],
        tree.paths.shape[1],
        ROW=row, PAGE=page, BLOCK=triton.next_power_of_2(row),
    )  # fmt: skip
