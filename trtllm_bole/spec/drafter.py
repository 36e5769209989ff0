"""Drafting trees with the model's MTP head, EAGLE-2 style, batched across requests (BOLE.md §4).

Every request's tree starts at its *pending* token (node 0: the bonus token of the last step, not
yet seen by the target; ρ = 1). At each depth the ``beam`` best frontier nodes by cumulative draft
probability ρ are expanded: the MTP head, run only on those nodes (on top of its committed cache
and the rows of their ancestors), gives each a draft distribution, and its ``top_k`` tokens become
children. Every child joins the candidate pool; the final tree is the pool's best nodes by ρ
(:mod:`trtllm_bole.spec.tree_select`), so it is prefix-connected by construction.

MTP rows (see :mod:`trtllm_bole.models.mtp`): a node's row pairs the state that predicted its token
— the target's last hidden state for node 0, the parent's MTP output for a draft — with the token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtllm_bole import ops
from trtllm_bole.models.cache import StepContext
from trtllm_bole.models.mtp import MTPHead
from trtllm_bole.spec.sampling import filter_floors, log_probs_at
from trtllm_bole.spec.tree_select import children_log_rho, compact_forest, rank_order, select_nodes
from trtllm_bole.transfer import device_tensor
from trtllm_bole.tree import TreeBatch


@dataclass(slots=True)
class CandidatePool:
    """Draft candidates of a batch in creation order (node 0 of each request first).

    ``parents`` are pool indices (-1 for node 0); a node's parent always precedes it. ``max_depth``
    (host): the deepest level added so far; ``root_children`` (host): each request's nodes at depth 2,
    the children of its pending token (the fairness floor's drafts, :func:`select_tree`).
    """

    tokens: torch.Tensor  # int64 [M]
    parents: torch.Tensor  # int64 [M]
    request: torch.Tensor  # int64 [M]
    depth: torch.Tensor  # int64 [M], 1 = the pending token
    log_rho: torch.Tensor  # float32 [M]
    max_depth: int = 1
    root_children: int = 0

    def extend(
        self,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        request: torch.Tensor,
        depth: int,
        log_rho: torch.Tensor,
    ) -> torch.Tensor:
        """Append nodes, all at ``depth``; returns their pool indices."""
        start = self.tokens.numel()
        self.tokens = torch.cat([self.tokens, tokens])
        self.parents = torch.cat([self.parents, parents])
        self.request = torch.cat([self.request, request])
        self.depth = torch.cat([self.depth, torch.full_like(tokens, depth)])
        self.log_rho = torch.cat([self.log_rho, log_rho])
        self.max_depth = max(self.max_depth, depth)
        return torch.arange(start, self.tokens.numel(), device=tokens.device)


@dataclass(slots=True)
class DraftSettings:
    """Per-request sampling settings, shaped ``[B]``, used to rank draft tokens the way the target
    will sample them (greedy requests rank by the plain softmax), and to accept them. ``kind``: known on
    the host when the settings are made, so that a batch skips what it does not need without a device
    sync: ``"greedy"`` (every request; no sampling at all), ``"sampled"`` (temperature only; no
    vocabulary sort) or ``"filtered"`` (a sampled request with top-k or top-p)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    kind: str = "filtered"

    @classmethod
    def of(
        cls, temperature: list[float], top_k: list[int], top_p: list[float], device: torch.device | str
    ) -> DraftSettings:
        sampled = [(k, p) for t, k, p in zip(temperature, top_k, top_p, strict=True) if t > 0]
        kind = "filtered" if any(k > 0 or p < 1 for k, p in sampled) else "sampled" if sampled else "greedy"
        tensors = (device_tensor(values, device) for values in (temperature, top_k, top_p))
        return cls(*tensors, kind)

    @property
    def all_greedy(self) -> bool:
        return self.kind == "greedy"

    def top_log_probs(
        self, logits: torch.Tensor, request: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` likeliest tokens of each row of ``logits [F, V]`` as its request (``request [F]``)
        samples them, best first, and their log-probabilities: ``(log_q, tokens)``, ``[F, k]`` each,
        ``-inf`` for a token its filters drop. A greedy request ranks by the plain softmax (a one-hot
        would leave a chain). Dividing by a positive temperature and filtering keep the logits' order,
        so a sampled row's tokens are its ``k`` largest logits, and their log-probabilities come from
        each row's argmax and normaliser (:func:`~trtllm_bole.spec.sampling.log_probs_at`), with no
        ``[F, V]`` probabilities."""
        if self.all_greedy:
            return F.log_softmax(logits.float(), -1).topk(k, dim=-1)
        tokens = logits.topk(k, dim=-1).indices
        temperature = self.temperature[request]
        floor = None
        if self.kind == "filtered":
            floor = filter_floors(logits, temperature, self.top_k[request], self.top_p[request])
        rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
        log_q, _ = log_probs_at(logits, temperature, floor, rows, tokens)
        return log_q.float(), tokens


def draft(
    mtp: MTPHead,
    pending: torch.Tensor,
    last_hidden: torch.Tensor,
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    mtp_context_lens: torch.Tensor,
    settings: DraftSettings,
    *,
    top_k: int,
    depth: int,
) -> CandidatePool:
    """Grow every request's candidate pool to ``depth`` draft levels.

    pending ``[B]``: each request's pending token; last_hidden ``[B, h]``: the target's hidden state
    at the last committed position; ``mtp_context_lens [B]``: rows in the MTP's committed cache.
    ``top_k`` children per expanded node and ``top_k`` expanded nodes per request and depth
    (EAGLE-2's beam).
    """
    device = pending.device
    b = pending.numel()
    requests = torch.arange(b, device=device)
    pool = CandidatePool(
        pending.long(),
        torch.full((b,), -1, dtype=torch.long, device=device),
        requests,
        torch.ones(b, dtype=torch.long, device=device),
        torch.zeros(b, device=device),
        root_children=top_k if depth > 0 else 0,
    )
    frontier = requests  # pool indices, grouped by request; their MTP rows run next
    frontier_hidden, past = last_hidden, None
    # The MTP forest, request by request ([B, nodes so far]): each request's earlier rows, then its
    # frontier's, all requests alike, so it grows by concatenation. Local parents and depths.
    parents, depths = torch.full((b, 1), -1, device=device), torch.ones(b, 1, dtype=torch.long, device=device)
    for level in range(depth):
        width = frontier.numel() // b  # frontier nodes per request: the last columns of the forest
        tree = ops.forest(
            parents.flatten(), torch.arange(0, parents.numel() + 1, parents.shape[1], device=device),
            depths.flatten(), max_depth=level + 1, max_nodes=parents.shape[1],
        )  # fmt: skip
        ctx = StepContext(slots, block_tables, mtp_context_lens, tree)
        # New rows come back in packed order, which is frontier order (grouped by request). The forest
        # grows from past's own forest here, so the MTP's check of that (a device sync) is skipped.
        hidden, logits, past = mtp.verify(
            frontier_hidden, pool.tokens[frontier], ctx, past=past, check_growth=False
        )
        log_q, tokens = settings.top_log_probs(logits, pool.request[frontier], top_k)
        log_rho = children_log_rho(pool.log_rho[frontier], log_q)
        children = pool.extend(
            tokens.flatten(),
            frontier.repeat_interleave(top_k),
            pool.request[frontier].repeat_interleave(top_k),
            level + 2,  # the frontier is at level + 1
            log_rho.flatten(),
        )
        best = _best_per_request(pool, children, b, top_k)  # [B, beam] of each request's children
        beam_parent = best // top_k  # each one's parent: its column of the request's frontier
        frontier = children.view(b, -1).gather(1, best).flatten()
        frontier_hidden = hidden[(requests[:, None] * width + beam_parent).flatten()]
        parents = torch.cat([parents, parents.shape[1] - width + beam_parent], dim=1)
        depths = torch.cat([depths, torch.full_like(beam_parent, level + 2)], dim=1)
    return pool


def _best_per_request(pool: CandidatePool, nodes: torch.Tensor, num_requests: int, beam: int) -> torch.Tensor:
    """The ``beam`` best of ``nodes`` by ρ in each request (best first), as columns ``[B, beam]`` of
    their ``[B, children]`` grid.

    ``nodes`` come grouped by request, each request's in creation order, as many per request (its
    frontier, 1 or ``beam`` nodes, times ``top_k >= beam`` children): a grid ranked row by row (small
    sorts along the rows instead of sorts over the batch; a boolean mask would wait for the device)."""
    if nodes.numel() % num_requests or nodes.numel() // num_requests < beam:
        raise ValueError(f"{nodes.numel()} candidates do not give {num_requests} requests {beam} each")
    grid = nodes.view(num_requests, -1)
    return rank_order(pool.log_rho[grid], pool.depth[grid])[:, :beam]


def selection_size(
    pool_size: int, num_requests: int, per_request: int, total: int | None, *, root_children: int
) -> tuple[int, int]:
    """How many nodes :func:`select_tree` keeps from a pool of ``pool_size`` (as many per request, each
    with ``root_children`` nodes at depth 2), and the most one request keeps. Keeping ``total`` equal to
    the first selects the same nodes as any ``total`` that gives it."""
    per_pool = min(per_request + 1, pool_size // num_requests)
    floor = min(1 + root_children, per_pool)  # the pending token and its best children
    num_kept = num_requests * per_pool
    if total is not None:
        num_kept = max(num_requests * floor, min(num_kept, total))
    return num_kept, min(per_pool, num_kept - (num_requests - 1) * floor)  # the others keep their floors


def select_tree(
    pool: CandidatePool, num_requests: int, *, per_request: int, total: int | None = None
) -> tuple[torch.Tensor, TreeBatch, torch.Tensor]:
    """The verification forest: each request's pending token plus its best ``per_request`` drafts,
    and with a budget at most ``total`` nodes over the batch beyond the fairness floor (BOLE.md §5):
    every request keeps its pending token and its children (the first draft level; the best
    ``per_request`` of them where fewer fit), whatever the budget, so that none falls back to plain
    decoding for a step. Without a budget there is no floor: each request keeps its best drafts by rho
    (the floor taken first there gave a cap of 4 drafts of top-4 trees the 4 children alone: mean
    accepted tokens 1.97 instead of 3.48).

    Queues no device sync: every request drafted as many nodes, so how many survive is known on the
    host, and the forest is derived on the device with the host's bounds for its largest request and
    depth (value-neutral padding, :func:`ops.forest`); the selection is prefix-closed by
    construction (:func:`select_nodes`), so the compaction skips its check.

    Returns the tokens ``[N]``, the forest, and the pool index of each node (for ρ and depth).
    """
    num_kept, max_nodes = selection_size(
        pool.tokens.numel(), num_requests, per_request, total, root_children=pool.root_children
    )
    grouped = torch.sort(pool.request, stable=True).indices  # parents still precede children
    request, depth, log_rho = pool.request[grouped], pool.depth[grouped], pool.log_rho[grouped]
    position = torch.empty_like(grouped)
    position[grouped] = torch.arange(grouped.numel(), device=grouped.device)
    parents = pool.parents[grouped]
    parents = torch.where(parents >= 0, position[parents.clamp(min=0)], -1)
    floor = depth <= 2 if total is not None else None  # the floor is against the budget only
    keep = select_nodes(
        log_rho, depth, request, num_requests, per_request=per_request + 1, total=total, floor=floor
    )
    local_parents, cu_seqlens, kept = compact_forest(
        parents, request, num_requests, keep, num_kept=num_kept, check=False
    )
    tree = ops.forest(local_parents, cu_seqlens, depth[kept], max_depth=pool.max_depth, max_nodes=max_nodes)
    return pool.tokens[grouped[kept]], tree, grouped[kept]
