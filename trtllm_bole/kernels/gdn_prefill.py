"""Chunked GDN prefill in one launch: a prompt's chunks are chains, verified and committed in turn.

A prompt's chunk ``c`` (positions ``c·C .. c·C + C - 1``) is a chain, and a chain is a tree. One program
per (value tile, value head, prompt) walks its prompt's chunks in order: the blocked verify kernel's
work on the chunk (:func:`~.gdn_tree_verify._verify_request`, reading the state as the chunks before left
it) gives the chunk's outputs and factors, and the factored commit of the chain's last node
(:func:`~.gdn_commit._commit_path`, every node of a chain is on its path) moves the program's columns of
the state past the chunk, in place, before the next chunk reads them. Each program owns its columns of
its prompt's state, so no program waits for another: a batch of prompts is one launch per GDN layer,
whatever their lengths (the rounds of launches it replaces, a verify and a commit per chunk index, were
most of a small model's prefill on the H200: benchmarks/results/profile_host_h200_prefill.txt).

The kernel config (:func:`prefill_config`) depends on the precision and the head dims only, never on the
batch: a prompt's prefill must not depend on which prompts share its launch (a shape-based choice would
switch kernels, and so rounding, with the batch, so that a prompt's state, and at a near-tie its greedy
output, would depend on how the scheduler grouped the prompts).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from trtllm_bole.kernels import gdn_tree_verify as verify_kernel
from trtllm_bole.kernels._common import MAX_DEPTH, pow2_at_least, tile_dividing
from trtllm_bole.kernels.gdn_commit import _commit_path
from trtllm_bole.kernels.gdn_tree_verify import VerifyConfig, _verify_request
from trtllm_bole.tree import PrefillChunks

COMMIT_BK = 16
"""dk rows of the state a chunk's commit updates at a time (the chain's U tile stays on chip beside them)."""


def prefill_config(dk: int, dv: int, fp32_exact: bool) -> VerifyConfig:
    """The blocked kernel's config for chains of up to 64 nodes, from the precision and head dims alone.
    fp32 q/k/v (``ieee`` dots): :func:`~.gdn_tree_verify.exact_config`. 16-bit ones (``bf16`` state
    products): row blocks of 16, dk in chunks of 64, value tiles of 64 at two warps; on chains of 64 at
    Qwen3.5-9B heads (benchmarks/results/verify_configs_h200.json, one chunk a request) 34.9 / 52.8 /
    185.5 µs at B = 1 / 8 / 32 against 30.5 / 66.6 / 213.0 for the explicit-inverse pair of launches the
    rounds ran, and 24.6 / 25.1 against 27.7 / 30.6 at the embedded model's heads (B = 8 / 32)."""
    if fp32_exact:
        return verify_kernel.exact_config(dk, dv)
    return VerifyConfig(16, tile_dividing(dk, 64), tile_dividing(dv, 64), num_warps=2, num_stages=2)


@triton.jit
def _gdn_prefill_kernel(
    q, k, v, g, beta, state, slots, cu_seqlens, dfs_order, subtree_size, o, u, log_p, a_log, dt_bias,
    scale, hv, first,
    H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, USE_SLOTS: tl.constexpr, PREC: tl.constexpr, S_BF16: tl.constexpr,
    UPCAST: tl.constexpr, RAW_GATES: tl.constexpr, LB: tl.constexpr, FUSED: tl.constexpr,
    DP: tl.constexpr, CK: tl.constexpr,
):  # fmt: skip
    """Grid ``(dv / BV, HV, prompts)``: the blocked verify kernel's arguments (``cu_seqlens`` etc. those of
    the chunks' chains) and ``first``, the prompts' first chunks. ``DP``: the chunk size rounded up to a
    power of two (>= 16), the rows of a chunk's commit; ``CK``: its dk rows at a time."""
    i_v, i_hv, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (hv // H)
    o_v = i_v * BV + tl.arange(0, BV)
    o_p = tl.arange(0, DP)
    slot = tl.load(slots + i_p).to(tl.int64) if USE_SLOTS else i_p.to(tl.int64)
    s_ptr = state + (slot * hv + i_hv) * (DK * DV)
    for i_b in range(tl.load(first + i_p), tl.load(first + i_p + 1)):
        _verify_request(q, k, v, g, beta, state, slots, cu_seqlens, dfs_order, subtree_size, o, u, log_p,
                        a_log, dt_bias, scale, hv, i_v, i_hv, i_b, i_p, H, DK, DV, BT, BK, BV,
                        USE_SLOTS, PREC, S_BF16, UPCAST, RAW_GATES, LB, FUSED)  # fmt: skip
        tl.debug_barrier()  # the chunk's U (this tile's columns) and logP are stored before the commit
        bos = tl.load(cu_seqlens + i_b).to(tl.int64)
        n_c = tl.load(cu_seqlens + i_b + 1) - bos
        lp_last = tl.load(log_p + (bos + n_c - 1) * hv + i_hv)
        _commit_path(s_ptr, k, u, log_p, bos + o_p, o_p < n_c, lp_last, i_h, i_hv, o_v, hv, H, DK, DV, CK)
        tl.debug_barrier()  # the state has moved past the chunk before the next one reads it


def gdn_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    prompts: Sequence[int] | PrefillChunks,
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
    chunk_size: int = MAX_DEPTH,
) -> torch.Tensor:
    """Packed prompts (rows ``[N, ...]``) through the recurrence; ``state`` (``[S, HV, dk, dv]`` fp32;
    prompt b's slot ``state_indices[b]``, or b) updated in place. ``prompts``: their lengths (host ints,
    cut into chunks of ``chunk_size`` here) or their chunks made already (:class:`PrefillChunks`, on
    ``state``'s device: a CUDA graph's, whose values change between replays). Returns ``o [N, HV, dv]``.
    Shapes and dtypes as :func:`.gdn_tree_verify.gdn_tree_verify`'s, and its checks; the slots' values
    are not checked here (no device sync): distinct slots are the caller's contract, since two prompts on
    one slot would write it at once (:func:`trtllm_bole.ops.gdn_prefill` checks them). One launch."""
    if isinstance(prompts, PrefillChunks):
        chunks = prompts
    else:
        if sum(prompts) != v.shape[0] or min(prompts, default=0) <= 0:
            raise ValueError(f"lengths {list(prompts)} must be positive and cover the {v.shape[0]} rows")
        chunks = PrefillChunks.of(prompts, chunk_size, state.device)
    num_prompts = chunks.first.numel() - 1
    config = prefill_config(q.shape[-1], v.shape[-1], fp32_exact=q.dtype == v.dtype == torch.float32)
    call, cfg = verify_kernel.checked_call(
        (q, k, v, g, beta), state, chunks.tree, num_prompts,
        scale=scale, state_indices=state_indices, precision=None, config=config,
    )  # fmt: skip
    (o, _, _), args, consts = verify_kernel.blocked_launch(call, cfg)
    grid = (v.shape[2] // cfg.bv, v.shape[1], num_prompts)
    depth = chunks.tree.max_depth
    _gdn_prefill_kernel[grid](*args, chunks.first, **consts, DP=pow2_at_least(depth, 16), CK=COMMIT_BK)
    return o


__all__ = ["COMMIT_BK", "gdn_prefill", "prefill_config"]
