"""Chunked GDN prefill from the tree kernels: a prompt's chunk is a chain, and a chain is a tree.

Round ``c`` takes chunk ``c`` (positions ``c·C .. c·C + C - 1``) of every prompt that long, as one
packed forest of chains: the closed-form verify (:mod:`.gdn_tree_verify`) gives the chunk's outputs
and factors, and the factored commit (:mod:`.gdn_commit`) of each chain's last node moves the state
past the chunk. A batch of prompts takes ``ceil(longest / C)`` rounds of a verify and a commit each,
instead of the torch reference's dozens of small operations per chunk and prompt.

Every round runs the same kernel config (:func:`prefill_config`) on chains bounded by the chunk size
(what picks the factor kernel and the number of squarings), whatever the batch: a prompt's prefill
must not depend on which prompts share its rounds. The launcher's shape-based default would switch
kernels (and so rounding) with a round's average chunk, and a round's longest chunk would switch the
factor kernel of its shorter ones, so that a prompt's state, and at a near-tie its greedy output, would
depend on how the scheduler grouped the prompts.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trtllm_bole.kernels import gdn_commit as commit_kernel
from trtllm_bole.kernels import gdn_tree_verify as verify_kernel
from trtllm_bole.kernels._common import MAX_DEPTH, GDNTreeFactors, tile_dividing
from trtllm_bole.kernels.gdn_tree_verify import VerifyConfig
from trtllm_bole.kernels.gdn_tree_verify_inverse import InverseConfig, loads_key_dim
from trtllm_bole.tree import TreeBatch


@dataclass(frozen=True, slots=True)
class PrefillRound:
    """Chunk ``c`` of every prompt longer than ``c·C``: its slices of the plan's rows and prompts, and the
    chains' tree."""

    rows: slice  # of PrefillPlan.rows: this round's nodes
    requests: slice  # of PrefillPlan.requests: the prompts taking part
    tree: TreeBatch  # one chain per taking-part prompt
    last: torch.Tensor  # int64 [b]: local index of each chain's last node (the committed leaf)


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    """The rounds of a batch of prompts, their rows and prompts laid out round after round: a layer
    gathers each input in this order once, and every round reads a slice (a view), instead of gathering
    its rows of every input and scattering its output back, round by round."""

    rows: torch.Tensor  # int64 [N]: packed prompt rows, round after round
    requests: torch.Tensor  # int64: the prompts taking part, round after round
    rounds: tuple[PrefillRound, ...]


@functools.lru_cache(maxsize=16)
def prefill_plan(lengths: tuple[int, ...], chunk_size: int, device: torch.device) -> PrefillPlan:
    """The plan of a batch of prompts (cached: every GDN layer of a prefill asks for the same)."""
    if not 1 <= chunk_size <= MAX_DEPTH:
        raise ValueError(f"chunk_size must lie in [1, {MAX_DEPTH}] (the kernels' depth), got {chunk_size}")
    starts = [0, *itertools.accumulate(lengths)]
    rows, requests, last, rounds = [], [], [], []
    for lo in range(0, max(lengths), chunk_size):
        taking = [b for b, n in enumerate(lengths) if n > lo]
        sizes = tuple(min(chunk_size, lengths[b] - lo) for b in taking)
        spans = (slice(len(rows), len(rows) + sum(sizes)), slice(len(requests), len(requests) + len(taking)))
        rows += [starts[b] + lo + i for b, size in zip(taking, sizes, strict=True) for i in range(size)]
        requests += taking
        last += [size - 1 for size in sizes]  # one per taking prompt: laid out as the requests
        rounds.append((*spans, _chains(sizes, chunk_size, device)))
    last_nodes = torch.tensor(last, device=device)
    return PrefillPlan(
        torch.tensor(rows, device=device),
        torch.tensor(requests, device=device),
        tuple(PrefillRound(r, b, tree, last_nodes[b]) for r, b, tree in rounds),
    )


@functools.lru_cache(maxsize=64)
def _chains(sizes: tuple[int, ...], chunk_size: int, device: torch.device) -> TreeBatch:
    """A round's chains (cached apart from the plans: a round of whole chunks recurs across prefills)."""
    return TreeBatch.chains(list(sizes), device=device, max_depth=chunk_size)


def prefill_config(dk: int, dv: int, fp32_exact: bool) -> VerifyConfig | InverseConfig:
    """Serving precisions: the explicit-inverse path in one tile of 64 (any chunk fits), factors and values
    in two launches. fp32 q/k/v (``ieee`` dots): :func:`~.gdn_tree_verify.exact_config`, 12x faster there
    on chains of 64 (40 against 500 µs at the embedded model's heads, benchmarks/results/
    verify_configs_h200.json); its blocked kernel also serves a dk that is not a power of two, which the
    explicit-inverse path cannot load."""
    if fp32_exact or not loads_key_dim(dk):
        return verify_kernel.exact_config(dk, dv)
    return InverseConfig(64, tile_dividing(dk, 64), tile_dividing(dv, 64), num_warps=4, launches=2, warps1=4)


def gdn_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    lengths: Sequence[int],
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
    chunk_size: int = MAX_DEPTH,
) -> torch.Tensor:
    """Packed prompts (rows ``[N, ...]``, prompt ``b`` of ``lengths[b]`` rows) through the recurrence;
    ``state`` (``[S, HV, dk, dv]`` fp32) updated in place. Returns ``o [N, HV, dv]``.

    Shapes and dtypes as :func:`.gdn_tree_verify.gdn_tree_verify`; values are not checked here (no
    device sync): :func:`trtllm_bole.ops.gdn_prefill` checks them.
    """
    if sum(lengths) != v.shape[0] or min(lengths, default=0) <= 0:
        raise ValueError(f"lengths {list(lengths)} must be positive and cover the {v.shape[0]} rows")
    slots = torch.arange(len(lengths), device=state.device) if state_indices is None else state_indices.long()
    config = prefill_config(q.shape[-1], v.shape[-1], fp32_exact=q.dtype == v.dtype == torch.float32)
    plan = prefill_plan(tuple(lengths), chunk_size, state.device)
    q, k, v, g, beta = (t[plan.rows] for t in (q, k, v, g, beta))  # round after round
    slots, outputs = slots[plan.requests], []
    for r in plan.rounds:
        chunk_slots, k_r = slots[r.requests], k[r.rows]
        o_r, u, log_p = verify_kernel.gdn_tree_verify(
            q[r.rows], k_r, v[r.rows], g[r.rows], beta[r.rows], state, r.tree,
            scale=scale, state_indices=chunk_slots, config=config,
        )  # fmt: skip
        commit_kernel.gdn_commit(
            state, GDNTreeFactors(r.tree, k_r, u, log_p), r.last, state_indices=chunk_slots
        )
        outputs.append(o_r)
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    o[plan.rows] = torch.cat(outputs)
    return o


__all__ = ["PrefillPlan", "PrefillRound", "gdn_prefill", "prefill_config", "prefill_plan"]
