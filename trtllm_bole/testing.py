"""Tree shapes (chains, stars, draft-like top-k trees) and random Gated DeltaNet inputs, shared by the
tests, the benchmarks, the demo and the budget calibration (which times draft-like trees)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtllm_bole.tree import MAX_TREE_DEPTH, TreeBatch

# A tiny Qwen3.5, small enough for two CPU cores; dv != dk and HV = 2H so that transposed or mis-grouped
# heads fail.
TINY_CONFIG = {
    "model_type": "qwen3_5_text",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 4,
    "full_attention_interval": 2,
}

# GDN head dims the CUDA kernels tile (their smallest tensor-core tiles): a tiny config on CUDA takes these
# (the model refuses the tiny config's 8 and 4 there, Qwen35Config.check_cuda_tiles).
CUDA_HEADS = {"linear_key_head_dim": 16, "linear_value_head_dim": 16}

# The tiny config with an MTP layer, for executor-level tests. Its smaller vocabulary makes random
# drafts land often, so acceptance paths are really exercised.
TINY_MTP_CONFIG = {**TINY_CONFIG, "vocab_size": 16, "mtp_num_hidden_layers": 1}


def chain_parents(n: int) -> list[int]:
    return list(range(-1, n - 1))


def star_parents(n: int) -> list[int]:
    """One root child, every other node its child (depth 2)."""
    return [-1] + [0] * (n - 1)


def topk_parents(n: int, top_k: int, depth: int) -> list[int]:
    """A draft-like tree of exactly ``n`` nodes and depth ``min(depth, n)``.

    One root child (the pending token), a spine of ``depth`` nodes (the best guess at every level),
    then the remaining nodes breadth-first as up to ``top_k`` children per node, never deeper than
    ``depth``: the shape EAGLE-style drafting produces. Where ``n`` nodes do not fit under that
    fan-out, the fan-out grows until they do (a depth-2 tree of 64 nodes is a star).
    """
    depth = min(depth, n)
    while sum(top_k**i for i in range(depth)) < n:
        top_k += 1
    parents = chain_parents(depth)
    node_depth = list(range(1, depth + 1))
    children = [1] * (depth - 1) + [0]
    frontier = 0
    while len(parents) < n:
        if node_depth[frontier] < depth and children[frontier] < top_k:
            parents.append(frontier)
            node_depth.append(node_depth[frontier] + 1)
            children[frontier] += 1
            children.append(0)
        else:
            frontier += 1
    return _topological(parents)


def random_parents(n: int, max_depth: int, generator: torch.Generator) -> list[int]:
    """Each node picks a uniformly random earlier node (or the root) whose depth leaves room."""
    parents: list[int] = []
    depth: list[int] = []
    for i in range(n):
        allowed = [-1] + [j for j in range(i) if depth[j] < max_depth]
        p = allowed[int(torch.randint(len(allowed), (1,), generator=generator))]
        parents.append(p)
        depth.append(1 if p < 0 else depth[p] + 1)
    return parents


def _topological(parents: list[int]) -> list[int]:
    order = sorted(range(len(parents)), key=lambda i: _depth_of(parents, i))
    rank = {old: new for new, old in enumerate(order)}
    return [-1 if parents[old] < 0 else rank[parents[old]] for old in order]


def _depth_of(parents: list[int], i: int) -> int:
    d = 1
    while parents[i] >= 0:
        i, d = parents[i], d + 1
    return d


def forest(
    trees: list[list[int]], device: torch.device | str = "cpu", max_depth: int = MAX_TREE_DEPTH
) -> TreeBatch:
    parents = torch.tensor([p for t in trees for p in t], dtype=torch.long, device=device)
    cu = torch.tensor([0, *[len(t) for t in trees]], device=device).cumsum(0)
    return TreeBatch.build(parents, cu, max_supported_depth=max_depth)


@dataclass(slots=True)
class GDNInputs:
    q: torch.Tensor  # [N, H, dk], L2-normalised
    k: torch.Tensor  # [N, H, dk], L2-normalised
    v: torch.Tensor  # [N, HV, dv]
    g: torch.Tensor  # [N, HV], log decay <= 0
    beta: torch.Tensor  # [N, HV] in (0, 1)
    state: torch.Tensor  # [B, HV, dk, dv]
    scale: float

    def cast(self, dtype: torch.dtype, state_dtype: torch.dtype | None = None) -> GDNInputs:
        """Inputs in ``dtype``; the state in ``state_dtype`` (default: float32 unless float64)."""
        if state_dtype is None:
            state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        return GDNInputs(
            *(t.to(dtype) for t in (self.q, self.k, self.v, self.g, self.beta)),
            self.state.to(state_dtype),
            self.scale,
        )


def random_gdn_inputs(
    num_nodes: int,
    num_requests: int,
    h: int,
    hv: int,
    dk: int,
    dv: int,
    *,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> GDNInputs:
    """float64 inputs with the statistics of a real GDN layer: unit q/k, gates from Qwen3.5's
    formulas. ``.cast`` them for lower-precision runs."""

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q = F.normalize(randn(num_nodes, h, dk), dim=-1)
    k = F.normalize(randn(num_nodes, h, dk), dim=-1)
    v = randn(num_nodes, hv, dv)
    a_log = torch.log(torch.rand(hv, generator=generator, dtype=torch.float64) * 15.99 + 0.01)
    g = -a_log.exp() * F.softplus(randn(num_nodes, hv) - 4.0)
    beta = torch.sigmoid(randn(num_nodes, hv))
    state = randn(num_requests, hv, dk, dv) * 0.1
    return GDNInputs(*(t.to(device) for t in (q, k, v, g, beta, state)), 1.0 / math.sqrt(dk))


def pools_settled(executor) -> bool:
    """Nothing queued or running, every state slot and KV block back in its pool."""
    scheduler = executor.scheduler
    return (
        not executor.has_unfinished
        and scheduler.slots.num_free == scheduler.slots.num_slots
        and scheduler.blocks.num_free == scheduler.blocks.num_blocks
    )


FLOOR_NEAR = 1e-5
"""A nucleus boundary closer than this to ``top_p`` may fall either way in float32 (the radix select and
the sort sum the masses in different orders); the float64 definition decides the rest."""


def floor_agreement(
    found: torch.Tensor,
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> dict[str, int]:
    """How a top-k / top-p floor ``found [N]`` (:func:`trtllm_bole.ops.filter_floor` of these arguments)
    agrees with the sorting reference: ``admissible`` rows keep what the float64 definition keeps (on the
    float32 scaled logits) at some top-p within :data:`FLOOR_NEAR`; ``decided`` rows are those where that
    is one floor, and ``equal`` of them match the float32 reference bit for bit (``same``: the rows that
    match it, decided or not). A correct floor has every row admissible and every decided row equal."""
    from trtllm_bole.reference.sampling import filter_floor

    x, p = (logits.float() / temperature[:, None]).double(), top_p.double()
    ones = torch.ones_like(p)
    low_p, high_p = torch.maximum(p - FLOOR_NEAR, p / 2), torch.minimum(p + FLOOR_NEAR, (1 + p) / 2)
    low, high = (filter_floor(x, ones, top_k, q).float() for q in (low_p, high_p))
    decided = low == high
    same = found == filter_floor(logits, temperature, top_k, top_p)
    return {
        "rows": found.numel(),
        "admissible": int(((high <= found) & (found <= low)).sum()),
        "decided": int(decided.sum()),
        "equal": int((decided & same).sum()),
        "same": int(same.sum()),
    }


def floors_agree(agreement: dict[str, int]) -> bool:
    """Whether a :func:`floor_agreement` is that of a correct floor."""
    return agreement["admissible"] == agreement["rows"] and agreement["equal"] == agreement["decided"]
