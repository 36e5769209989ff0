"""Growing and pruning draft trees by cumulative draft probability ρ (BOLE.md §4–§5), as pure
tensor functions over a packed candidate pool.

Every candidate node carries ``log_rho`` (log ρ: the sum of log draft probabilities along its path,
0 for the pending token), its depth, its request and its parent. Because ρ never grows along a path,
keeping the nodes of highest ρ — with ties broken by smaller depth, then smaller index — always keeps
a node's parent: the kept set is prefix-connected by construction, with no repair step.
"""

from __future__ import annotations

import math

import torch


def children_log_rho(log_rho: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """The cumulative log ρ ``[F, k]`` of each frontier node's children, from the node's ``log_rho [F]``
    and the children's draft log-probabilities ``log_q [F, k]``
    (:meth:`~trtllm_bole.spec.drafter.DraftSettings.top_log_probs`). ``log q`` is clamped to ``<= 0``
    so rounding can never make a child look likelier than its parent, and a NaN (an MTP row that
    overflowed) reads as ``-inf``: a NaN ranked first, so a selection kept such a child without its
    parent."""
    return log_rho[:, None] + log_q.clamp(max=0.0).nan_to_num(nan=-math.inf, neginf=-math.inf)


def rank_order(log_rho: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """Indices along the last dimension sorted best first: higher log ρ, then smaller depth, then smaller
    index (each row of a 2-D input on its own)."""
    by_depth = torch.sort(depth, dim=-1, stable=True).indices
    by_rho = torch.sort(log_rho.gather(-1, by_depth), dim=-1, descending=True, stable=True).indices
    return by_depth.gather(-1, by_rho)


def select_nodes(
    log_rho: torch.Tensor,
    depth: torch.Tensor,
    request: torch.Tensor,
    num_requests: int,
    *,
    per_request: int | None = None,
    total: int | None = None,
    floor: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean keep-mask: the best nodes by ρ, at most ``per_request`` per request and ``total``
    over the whole batch (the batch-shared budget), always including the ``floor`` nodes that fit
    the per-request cap.

    The floor (the drafter's: each request's pending token and its children, BOLE.md §5's fairness
    floor) is kept first, each request's best first, and counts towards both limits; ``total`` does
    not cut it. The rest of the capacity goes to the highest ρ across the batch, ties to the earlier
    node (so to the earlier request). With ``log_rho`` non-increasing along paths and every floor
    node's parent in the floor, the result is prefix-connected.
    """
    n = log_rho.numel()
    device = log_rho.device
    floor = torch.zeros(n, dtype=torch.bool, device=device) if floor is None else floor
    order = rank_order(log_rho, depth)
    # Floor nodes first, then the rest in rank order (stable, so each part keeps its order).
    order = order[torch.sort((~floor[order]).to(torch.int8), stable=True).indices]
    # Rank of each node among its own request's nodes, in that order.
    req = request[order]
    grouped = torch.sort(req, stable=True).indices
    starts = torch.searchsorted(req[grouped], torch.arange(num_requests, device=device))
    rank_in_request = torch.empty(n, dtype=torch.long, device=device)
    rank_in_request[grouped] = torch.arange(n, device=device) - starts[req[grouped]]
    within = (
        torch.ones(n, dtype=torch.bool, device=device)
        if per_request is None
        else rank_in_request < per_request
    )
    position = torch.cumsum(within.long(), 0) - 1  # position among per-request survivors
    kept_sorted = within & ((position < total) | floor[order]) if total is not None else within
    keep = torch.zeros(n, dtype=torch.bool, device=device)
    keep[order] = kept_sorted
    return keep


def compact_forest(
    parents: torch.Tensor,
    request: torch.Tensor,
    num_requests: int,
    keep: torch.Tensor,
    *,
    num_kept: int | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop unkept nodes from a packed forest (kept nodes' parents must be kept).

    parents: int ``[N]`` global parent index (-1 = root child). Returns the new *local* parents,
    the new ``cu_seqlens`` and the global indices of the kept nodes (their new order).
    ``num_kept``: how many nodes ``keep`` holds, where the caller knows it on the host; with
    ``check=False`` (a selection prefix-closed by construction) nothing waits for the device.
    """
    if num_kept is None:
        num_kept = int(keep.sum())
    elif check and int(keep.sum()) != num_kept:
        raise ValueError(f"compact_forest: keep holds {int(keep.sum())} nodes, not num_kept={num_kept}")
    # The kept nodes in order without a data-dependent shape: each goes to its rank among them, the
    # others to a spare slot past the end.
    slot = torch.where(keep, torch.cumsum(keep, 0) - 1, num_kept)
    nodes = torch.arange(keep.numel(), device=keep.device)
    kept = torch.empty(num_kept + 1, dtype=torch.long, device=keep.device).scatter_(0, slot, nodes)[:num_kept]
    new_index = torch.full_like(parents, -1)
    new_index[kept] = torch.arange(num_kept, device=parents.device)
    counts = torch.zeros(num_requests, dtype=torch.long, device=keep.device)
    counts = counts.scatter_add_(0, request[kept], torch.ones_like(kept))
    cu_seqlens = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    kept_parents = parents[kept]
    if check and bool(((kept_parents >= 0) & ~keep[kept_parents.clamp(min=0)]).any()):
        raise ValueError("compact_forest: a kept node's parent was dropped (keep is not prefix-closed)")
    global_parents = torch.where(kept_parents >= 0, new_index[kept_parents.clamp(min=0)], -1)
    bos = cu_seqlens[:-1][request[kept]]
    return torch.where(global_parents >= 0, global_parents - bos, -1), cu_seqlens, kept
