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
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trtllm_bole.tree import TreeBatch


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
    tree: TreeBatch,
    tokens: torch.Tensor,
    target_probs: Callable[[int], torch.Tensor],
    generators: list[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless recursive rejection sampling. Returns ``accepted_leaf [B]`` (local) and ``bonus [B]``.

    ``target_probs(node)``: the processed target distribution ``[V]`` at a packed node (see
    :func:`trtllm_bole.spec.sampling.process_logits`), asked only along the walked path; one
    generator per request (None = the global RNG).
    """
    children = _children_lists(tree)
    leaves, bonus = [], []
    for b in range(tree.num_requests):
        node = int(tree.cu_seqlens[b])
        while True:
            accepted_child, residual = rejection_step(
                target_probs(node), tokens[children[node]], generators[b]
            )
            if accepted_child is None:
                break
            node = children[node][accepted_child]
        leaves.append(node - int(tree.cu_seqlens[b]))
        bonus.append(int(torch.multinomial(residual, 1, generator=generators[b])))
    device = tokens.device
    return torch.tensor(leaves, device=device), torch.tensor(bonus, device=device)


def rejection_step(
    p: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator | None
) -> tuple[int | None, torch.Tensor]:
    """Try deterministic candidates in order against target distribution ``p`` ``[V]``.

    Returns the index of the accepted candidate and the residual it was tested against, or None and the
    residual after rejecting every candidate: then the distribution the bonus token is drawn from
    (``p`` itself when there are no candidates).
    """
    residual = p.float()
    for i, token in enumerate(candidates.tolist()):
        coin = torch.rand((), generator=generator, device=residual.device)
        if coin < residual[token]:
            return i, residual
        residual = residual_after_rejecting(residual, token)
    return None, residual


def residual_after_rejecting(p: torch.Tensor, token: int) -> torch.Tensor:
    """``norm(max(p - q, 0))`` with the point-mass proposal ``q = one_hot(token)``."""
    q = torch.zeros_like(p)
    q[token] = 1.0
    residual = (p - q).clamp(min=0)
    total = residual.sum()
    # total == 0 means p was the point mass on the rejected token, which a coin < p(token) = 1
    # cannot reject; keep p to stay well defined under rounding.
    return residual / total if total > 0 else p


def _children_lists(tree: TreeBatch) -> list[list[int]]:
    children: list[list[int]] = [[] for _ in range(tree.num_nodes)]
    for node, parent in enumerate(tree.global_parents.tolist()):
        if parent >= 0:
            children[parent].append(node)
    return children
