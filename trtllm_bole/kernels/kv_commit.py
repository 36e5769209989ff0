"""The paged KV cache's commit as one launch for every attention layer: each request's accepted path
goes to positions ``context_len .. context_len + depth - 1`` of its block table.

One program per (node, layer) copies the node's K and V rows (``KVH × d`` each) where the node lies on
its request's accepted path (an ancestor of the accepted leaf, or the leaf: the forest's pre-order
interval test, so no path table is read and a prefill's chains, which carry none, commit the same way),
to position ``context_len + depth - 1``; off the path it stores nothing: masked stores instead of the
reference's boolean indexing, whose output size the host would wait for
(:mod:`trtllm_bole.reference.kv_cache`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_bole.kernels._common import check_contiguous, check_kv_shapes, check_leaves
from trtllm_bole.tree import TreeBatch


@triton.jit(do_not_specialize=["n_nodes", "cache_rows", "table_width"])
def _kv_commit_kernel(
    k_cache, v_cache, new_k, new_v, accepted_leaf, cu_seqlens, request, depth, dfs_order, subtree_size,
    block_tables, context_lens, n_nodes, cache_rows, table_width,
    ROW: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Runtime sizes are not specialised: one compiled variant per model, whatever the step."""
    node, layer = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    b = tl.load(request + node)
    leaf = tl.load(accepted_leaf + b).to(tl.int64)
    start = tl.load(cu_seqlens + b)
    accepted = (leaf >= 0) & (leaf < tl.load(cu_seqlens + b + 1) - start)  # out of range: nothing
    at = tl.load(dfs_order + start + tl.where(accepted, leaf, 0))
    first = tl.load(dfs_order + node)
    on_path = accepted & (first <= at) & (at < first + tl.load(subtree_size + node))
    pos = tl.load(context_lens + b).to(tl.int64) + tl.load(depth + node) - 1
    column = pos // PAGE
    inside = (pos >= 0) & (column < table_width)
    block = tl.load(block_tables + b * table_width + column, mask=inside, other=-1).to(tl.int64)
    row = block * PAGE + pos % PAGE
    keep = on_path & (block >= 0) & (row < cache_rows)  # drop writes outside the blocks
    cols = tl.arange(0, BLOCK)
    mask = cols < tl.where(keep, ROW, 0)  # nothing off the accepted path
    src = (layer * n_nodes + node) * ROW + cols
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
    (the arguments' values are checked by :func:`trtllm_bole.ops.kv_commit`; unchecked, a leaf outside
    its request writes nothing, and a position outside the request's table (below 0 or past its end) or
    on a negative entry (no block) is dropped)."""
    check_kv_shapes(k_cache, v_cache, new_k, new_v, tree, block_tables, context_lens)
    check_contiguous(k_cache=k_cache, v_cache=v_cache)
    leaves = check_leaves(accepted_leaf, tree, k_cache.device)
    layers, num_blocks, page = k_cache.shape[:3]
    row = k_cache.shape[3] * k_cache.shape[4]
    new_k, new_v = new_k.contiguous(), new_v.contiguous()
    grid = (tree.num_nodes, layers)
    _kv_commit_kernel[grid](
        k_cache, v_cache, new_k, new_v, leaves, tree.cu_seqlens, tree.request, tree.depth, tree.dfs_order,
        tree.subtree_size, block_tables.contiguous(), context_lens.contiguous(), tree.num_nodes,
        num_blocks * page, block_tables.shape[1],
        ROW=row, PAGE=page, BLOCK=triton.next_power_of_2(row),
    )  # fmt: skip
