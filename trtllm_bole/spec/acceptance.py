"""Which drafted nodes a verify step accepts (BOLE.md §4), as small pure functions.

Conventions (shared with the drafter and the executor): in every request's tree, node 0 is the
*pending* token — the bonus token of the previous step, already emitted but not yet processed by
the target — and it is always accepted. Every other node is a draft. The target's distribution at
node ``i`` is its prediction for the token after ``i``.

- Greedy: follow the child whose token equals the target argmax at its parent, as long as one
  exists; the bonus token is the argmax at the last accepted node. Output equals plain greedy
  decoding token for token.
- Sampling: recursive rejection sampling over each accepted node's children. Drafts are
  deterministic candidates (the drafter's top-k, pruned by the budget), so each child's proposal is
  the point mass ``q = one_hot(x)``: accept ``x`` with probability ``min(1, p(x) / q(x)) = p(x)``,
  else continue with the residual ``norm(max(p - q, 0))`` — ``p`` with ``x`` removed. After the last
  rejected child the bonus token is drawn from the residual. For any candidate set chosen before
  the coins are tossed, the emitted token is distributed exactly as ``p``, so pruning the tree by
  draft probability (the budget) never biases the output.

Both run on the tensors' device without a sync (every node's choice is computed at once, the walk
read off them), so that a step's acceptance queues behind its verify, or replays with it from a CUDA
graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from trtllm_bole.spec.sampling import ProcessedLogits
from trtllm_bole.tree import TreeBatch


class Sampling(NamedTuple):
    """A sampled batch's acceptance inputs, per request ``[B]``: its settings (those of
    :func:`~trtllm_bole.spec.sampling.process_logits`; temperature 0 accepts greedily) and its coins
    ``[B, C]`` (:func:`draw_coins`)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    coins: torch.Tensor


def accept(
    tree: TreeBatch,
    tokens: torch.Tensor,
    logits: torch.Tensor,
    sampling: Sampling | None,
    *,
    filtered: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A verify's acceptance from the target's logits ``[N, V]``: greedy when ``sampling`` is None, else
    sampled with each request's settings (``filtered``: as :func:`~.sampling.process_logits` takes
    it), reading the distributions where the walk reads them (:class:`ProcessedLogits`). Returns
    ``accepted_leaf [B]`` (local) and ``bonus [B]``."""
    if sampling is None:
        return greedy_accept(tree, tokens, logits.argmax(-1))
    rows, s = tree.request, sampling
    probs = ProcessedLogits.of(logits, s.temperature[rows], s.top_k[rows], s.top_p[rows], filtered=filtered)
    return sample_accept(tree, tokens, probs, sampling.coins)


def greedy_accept(
    tree: TreeBatch, tokens: torch.Tensor, target_argmax: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``accepted_leaf [B]`` (local index) and ``bonus [B]`` for greedy verification.

    tokens, target_argmax: int ``[N]``. Vectorised: a node is accepted when every draft on its path
    matches the target argmax at its parent; the deepest accepted node wins (lowest index on ties,
    i.e. the first matching sibling).
    """
    parent = tree.global_parents
    matches = (parent < 0) | (tokens == target_argmax[parent.clamp(min=0)])
    on_path = tree.paths >= 0
    path_ok = torch.where(on_path, matches[tree.paths.clamp(min=0)], True).all(dim=1)
    leaf = deepest_per_request(tree, path_ok)
    return leaf - tree.cu_seqlens[:-1], target_argmax[leaf]


def deepest_per_request(tree: TreeBatch, eligible: torch.Tensor) -> torch.Tensor:
    """Global index of the deepest eligible node of each request (lowest index among equals).

    Node 0 of every request must be eligible (it is the pending token).
    """
    n = tree.num_nodes
    index = torch.arange(n, device=eligible.device)
    # One sortable key: deeper first, then lower index.
    key = torch.where(eligible, tree.depth * n + (n - 1 - index), -1)
    best = torch.full((tree.num_requests,), -1, dtype=key.dtype, device=key.device)
    best = best.scatter_reduce(0, tree.request, key, reduce="amax")
    return n - 1 - best % n


def sample_accept(
    tree: TreeBatch, tokens: torch.Tensor, probs: torch.Tensor | ProcessedLogits, coins: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless recursive rejection sampling, on the tensors' device with no sync. Returns
    ``accepted_leaf [B]`` (local) and ``bonus [B]``.

    probs: the target distribution at every node, float ``[N, V]`` or the verify's logits processed on
    demand (:class:`~trtllm_bole.spec.sampling.ProcessedLogits`: it reads one value a node, each node's
    parent's total, and the leaves' rows). coins: ``[B, C]`` uniforms in ``[0, 1)`` with
    ``C > tree.max_nodes`` (:func:`draw_coins`): a draft's test uses its request's coin at its local
    index, the bonus token the last one. The walk tests each node at most once, so coins by node are as
    good as coins drawn in turn.

    The walk, vectorised: a parent's children are tried in index order; child ``x`` passes when its coin
    is below the residual at ``x``, ``p(x) / (total - mass of the tokens of the siblings tried before)``
    (zero for a token an earlier sibling already carried); the walk takes a parent's first passing child,
    so a node is on it when every node of its path is its parent's first passing child. The bonus token
    is drawn, by inverse CDF, from the leaf's distribution with its children's tokens removed.
    """
    if coins.shape != (tree.num_requests, coins.shape[1]) or coins.shape[1] <= tree.max_nodes:
        raise ValueError(
            f"coins must be [{tree.num_requests}, > {tree.max_nodes}] (a request's nodes and its bonus), "
            f"got {tuple(coins.shape)}"
        )
    parent = tree.global_parents.clamp(min=0)
    local = torch.arange(tree.num_nodes, device=tokens.device) - tree.cu_seqlens[tree.request]
    is_draft = tree.global_parents >= 0
    probs = probs if isinstance(probs, ProcessedLogits) else _Dense(probs)
    siblings = _Siblings.of(tree, tokens, probs.vocab)
    p, total = (t.double() for t in probs.at(parent, tokens))
    tried = torch.where(is_draft & ~siblings.repeated, p, 0.0)
    left = total - siblings.before(tried)
    residual = torch.where(siblings.repeated, 0.0, torch.where(left > 0, p / left, p))
    passes = is_draft & (coins[tree.request, local] < residual)
    first_pass = passes & (siblings.before(passes.long()) == 0)
    taken = torch.where(is_draft, first_pass, local == 0)
    on_walk = torch.where(tree.paths >= 0, taken[tree.paths.clamp(min=0)], True).all(dim=1)
    leaf = deepest_per_request(tree, on_walk)
    return leaf - tree.cu_seqlens[:-1], _bonus(tree, tokens, probs, leaf, coins[:, -1])


def _bonus(
    tree: TreeBatch,
    tokens: torch.Tensor,
    probs: ProcessedLogits | _Dense,
    leaf: torch.Tensor,
    coin: torch.Tensor,
) -> torch.Tensor:
    """A token from each leaf's residual (its distribution without its children's tokens, all rejected)
    by inverse CDF at ``coin``. A residual of no mass (rounding: a coin below 1 rejected a token of
    probability 1) falls back to the leaf's distribution."""
    at_leaf = probs.rows(leaf).double()
    child = (tree.global_parents >= 0) & (tree.global_parents == leaf[tree.request])
    vocab = probs.vocab
    removed = (
        torch.zeros_like(at_leaf).view(-1).scatter_add_(0, tree.request * vocab + tokens, child.double())
    )
    residual = at_leaf.masked_fill(removed.view_as(at_leaf) > 0, 0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, at_leaf)
    return inverse_cdf(residual, coin.double())


CDF_BLOCK = 1024
"""Weights a block of :func:`inverse_cdf`'s two-level scan."""


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Each row's first index whose cumulative weight exceeds ``u [B]`` (in ``[0, 1)``) times the row's
    total, for weights ``[B, V]`` (nonnegative, a positive total): a token drawn by inverse CDF, always one
    of positive weight. torch scans a single row with the whole GPU but several rows one thread block
    each (H200, rows of 151,936 float64: 15 µs for one row, 0.29-0.30 ms for 8 or 32;
    benchmarks/probe_inverse_cdf.py), so one row takes :func:`scanned_cdf` and several
    :func:`two_level_cdf`."""
    return scanned_cdf(weights, u) if weights.shape[0] == 1 else two_level_cdf(weights, u)


def scanned_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """:func:`inverse_cdf` by one scan along each whole row."""
    cdf = weights.cumsum(-1)
    token = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return token.clamp(max=weights.shape[1] - 1)


def two_level_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """:func:`inverse_cdf` without a scan along a whole row: the rows' sums of blocks of :data:`CDF_BLOCK`
    weights are scanned to find the block, then that block's weights (H200: 64-100 µs for 8-32 rows of
    151,936, 45 for one). Rounding may put the target past the block's own scan: then its last positive
    weight is the token."""
    rows, vocab = weights.shape
    blocks = torch.nn.functional.pad(weights, (0, -vocab % CDF_BLOCK)).view(rows, -1, CDF_BLOCK)
    totals = blocks.sum(-1).cumsum(-1)
    target = u * totals[:, -1]
    block = torch.searchsorted(totals, target[:, None], right=True)[:, 0].clamp(max=totals.shape[1] - 1)
    before = torch.where(block > 0, totals.gather(1, (block - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    inside = blocks[torch.arange(rows, device=weights.device), block]
    at = torch.searchsorted(inside.cumsum(-1), (target - before)[:, None], right=True)[:, 0]
    positions = torch.arange(CDF_BLOCK, device=weights.device)
    last = torch.where(inside > 0, positions, -1).amax(-1)
    return block * CDF_BLOCK + torch.where(at < CDF_BLOCK, at, last)


def draw_coins(
    generators: list[torch.Generator | None], count: int, device: torch.device | str
) -> torch.Tensor:
    """``[B, count]`` float64 uniforms in ``[0, 1)`` for :func:`sample_accept`, row ``b`` from request
    ``b``'s own generator; the requests without one (None) share one draw from the global RNG. A fixed
    count a step keeps a seeded request's draws its own, whatever its batch or its tree. Float64: float32
    coins are multiples of 2⁻²⁴, so a draft of probability below that passed with probability 2⁻²⁴, and a
    bonus token whose CDF interval held no multiple could never be drawn (at 151,936 tokens, a total
    variation of 1.5e-3 from the target)."""
    unseeded = torch.rand(sum(g is None for g in generators), count, device=device, dtype=torch.float64)
    rows = iter(unseeded)
    return torch.stack(
        [
            next(rows) if g is None else torch.rand(count, generator=g, device=device, dtype=torch.float64)
            for g in generators
        ]
    )


@dataclass(frozen=True, slots=True)
class _Dense:
    """Distributions ``[N, V]`` given whole, read as :class:`ProcessedLogits` reads them."""

    probs: torch.Tensor

    @property
    def vocab(self) -> int:
        return self.probs.shape[1]

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        return self.probs[index]

    def at(self, rows: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.probs[rows, columns], self.probs.sum(-1)[rows]


@dataclass(frozen=True, slots=True)
class _Siblings:
    """Each node's place among its parent's children, in index order (the order the walk tries them)."""

    order: torch.Tensor  # nodes sorted by (parent, index)
    start: torch.Tensor  # for each sorted position, where its parent's run of children starts
    repeated: torch.Tensor  # bool [N]: an earlier sibling carries the same token

    @classmethod
    def of(cls, tree: TreeBatch, tokens: torch.Tensor, vocab: int) -> _Siblings:
        n = tree.num_nodes
        index = torch.arange(n, device=tokens.device)
        parent = tree.global_parents + 1  # roots share run 0, which the walk never tries
        order = (parent * n + index).argsort()
        key = parent * vocab + tokens
        by_token = (key * n + index).argsort()  # ties on key broken by index: a repeat follows its first
        same = torch.zeros(n, dtype=torch.bool, device=tokens.device)
        same[1:] = key[by_token[1:]] == key[by_token[:-1]]
        repeated = torch.zeros_like(same).scatter_(0, by_token, same)
        new_run = torch.ones(n, dtype=torch.bool, device=tokens.device)
        new_run[1:] = parent[order[1:]] != parent[order[:-1]]
        start = torch.where(new_run, index, 0).cummax(0).values
        return cls(order, start, repeated)

    def before(self, values: torch.Tensor) -> torch.Tensor:
        """The sum of ``values`` over each node's earlier siblings."""
        sorted_values = values[self.order]
        exclusive = sorted_values.cumsum(0) - sorted_values
        return torch.empty_like(values).scatter_(0, self.order, exclusive - exclusive[self.start])
