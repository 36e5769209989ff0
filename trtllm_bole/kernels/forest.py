"""A forest's metadata (:class:`~trtllm_bole.tree.TreeBatch`) in one launch, from local parents and depths.

:meth:`TreeBatch.on_device` derives the same fields with ~65 torch operations (a gather per ancestor
level, path-key words and stable sorts for the pre-order): drafting does it once per level and tree
selection once per step, and every kernel of a replayed graph costs ~2 µs on the H200 whatever its size
(benchmarks/README.md). Here one program serves one request, whose nodes fit one block:

1. ``request``, ``global_parents``;
2. ``paths``: each node walks up its ancestors (one dependent load per level), writing the ``k``-th at
   column ``depth - 1 - k`` and -1 from column ``depth`` on;
3. after a barrier (the paths are read back across the program's threads), pairwise over the request's
   nodes: ``subtree_size[i]`` counts the nodes whose path holds ``i`` at ``i``'s depth; the pre-order rank
   counts the nodes whose path is lexicographically smaller (fields: local index + 1, 0 past the depth;
   an ancestor is a prefix, so it comes first). ``dfs_order = cu_seqlens[r] + rank``: requests follow one
   another in the forest's pre-order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_NODES = 128
"""Largest request one program serves (its pairwise ``[nodes, nodes]`` tiles stay in registers)."""


@triton.jit(do_not_specialize=["max_depth"])
def _forest_kernel(
    parents, cu_seqlens, depth, request, global_parents, paths, dfs_order, subtree_size, max_depth,
    BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    bos = tl.load(cu_seqlens + r)
    n = tl.load(cu_seqlens + r + 1) - bos
    local = tl.arange(0, BLOCK)
    m = local < n
    node = bos + local
    par = tl.load(parents + node, mask=m, other=-1)
    dep = tl.load(depth + node, mask=m, other=1)
    tl.store(request + node, tl.zeros([BLOCK], dtype=tl.int64) + r, mask=m)
    tl.store(global_parents + node, tl.where(par >= 0, par + bos, -1), mask=m)

    row = paths + node * max_depth
    cur = local.to(tl.int64)
    for k in range(0, max_depth):
        col = dep - 1 - k
        tl.store(row + col, bos + cur, mask=m & (col >= 0) & (col < max_depth))
        tl.store(row + dep + k, tl.full([BLOCK], -1, tl.int64), mask=m & (dep + k < max_depth))
        # Guarded against depths that disagree with the parents (garbage out, never out of bounds).
        cur = tl.load(parents + bos + cur, mask=m & (col > 0) & (cur >= 0), other=-1)
    tl.debug_barrier()  # every path is written before any thread reads another node's

    m2 = m[:, None] & m[None, :]
    # [i, j]: j at i's depth or deeper (and i's depth within the paths' columns)
    deeper = m2 & (dep[None, :] >= dep[:, None]) & (dep <= max_depth)[:, None]
    at_depth = tl.load(paths + node[None, :] * max_depth + (dep - 1)[:, None], mask=deeper, other=-1)
    size = tl.sum((deeper & (at_depth == node[:, None])).to(tl.int64), axis=1)
    before = tl.zeros([BLOCK, BLOCK], dtype=tl.int1)
    tied = m2
    for c in range(0, max_depth):
        p = tl.load(row + c, mask=m, other=-1)
        field = tl.where(p >= 0, p - bos + 1, 0)
        before = before | (tied & (field[None, :] < field[:, None]))
        tied = tied & (field[None, :] == field[:, None])
    rank = tl.sum(before.to(tl.int64), axis=1)
    tl.store(subtree_size + node, size, mask=m)
    tl.store(dfs_order + node, bos + rank, mask=m)


def forest_metadata(
    parents: torch.Tensor, cu_seqlens: torch.Tensor, depth: torch.Tensor, *, max_depth: int, max_nodes: int
) -> tuple[torch.Tensor, ...]:
    """``(request, global_parents, paths [N, max_depth], dfs_order, subtree_size)`` (int64) of the forest
    of local ``parents`` (-1: child of the committed root), ``cu_seqlens`` and node ``depth`` (>= 1), as
    :meth:`TreeBatch.on_device` derives them; ``max_depth`` / ``max_nodes`` bound the deepest path and the
    largest request (no value checks: for forests the caller built)."""
    if max_nodes > MAX_NODES:
        raise ValueError(f"forest_metadata serves requests of up to {MAX_NODES} nodes, got {max_nodes}")
    n, batch = parents.numel(), cu_seqlens.numel() - 1
    out = [torch.empty(n, dtype=torch.long, device=parents.device) for _ in range(4)]
    request, global_parents, dfs_order, subtree_size = out
    paths = torch.empty((n, max_depth), dtype=torch.long, device=parents.device)
    if n and batch:
        block = max(16, triton.next_power_of_2(max_nodes))
        flat = (t.long().contiguous() for t in (parents, cu_seqlens, depth))  # the kernel indexes them flat
        _forest_kernel[(batch,)](
            *flat, request, global_parents, paths, dfs_order, subtree_size, max_depth, BLOCK=block,
            num_warps=8 if block > 64 else 4,
        )  # fmt: skip
    return request, global_parents, paths, dfs_order, subtree_size


__all__ = ["MAX_NODES", "forest_metadata"]
