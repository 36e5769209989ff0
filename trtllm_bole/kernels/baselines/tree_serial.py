"""Today's tree verification ("tree-serial", the SGLang-Tree scheme), written with the same care as
Bole's kernels so that the comparison is about the algorithm, not the implementation.

Verify: one program per (request, value head, value tile) walks the request's nodes in order. A
node starts from its parent's state: still in registers when the parent is the previous node (a
chain), otherwise re-read from the parent's snapshot (L2-hot) or from the committed state. Every
node's full fp32 state is written as a snapshot ``[N, HV, dk, dv]`` (BOLE.md §1, L1–L2).

Commit: copy the accepted node's snapshot into the state slot, all requests in one launch, all layers
too where the snapshots are stacked ``[L, N, ...]`` (the benchmarks'; the model keeps a tensor a layer
and commits them a launch each); requests with nothing accepted are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trtllm_bole.kernels._common import (
    check_contiguous,
    check_device,
    check_gdn_operands,
    check_leaves,
    check_slot_count,
    gdn_shapes,
    slot_indices,
    tile_dividing,
)
from trtllm_bole.kernels.gdn_commit import _accepted_node
from trtllm_bole.tree import TreeBatch


@dataclass(frozen=True, slots=True)
class SerialConfig:
    bv: int  # value channels per program (the full dk rows are kept on chip)
    num_warps: int = 1


SERIAL_CONFIGS = (SerialConfig(16, 1), SerialConfig(32, 2), SerialConfig(32, 4), SerialConfig(64, 4))


@triton.jit
def _tree_serial_kernel(
    q,
    k,
    v,
    g,
    beta,
    state,
    slots,
    cu_seqlens,
    parents,
    o,
    snapshots,
    scale,
    hv,
    H: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BV: tl.constexpr,
    USE_SLOTS: tl.constexpr,
):
    i_v, i_hv, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (hv // H)
    bos = tl.load(cu_seqlens + i_b).to(tl.int64)
    n_t = (tl.load(cu_seqlens + i_b + 1) - bos).to(tl.int32)
    slot = tl.load(slots + i_b).to(tl.int64) if USE_SLOTS else i_b.to(tl.int64)
    o_k = tl.arange(0, DK)
    o_v = i_v * BV + tl.arange(0, BV)
    tile = o_k[:, None] * DV + o_v[None, :]
    pre = state + (slot * hv + i_hv) * (DK * DV)
    h = tl.zeros([DK, BV], dtype=tl.float32)
    for t in range(0, n_t):
        node = bos + t
        parent = tl.load(parents + node)
        if parent < 0:
            h = tl.load(pre + tile)
        elif parent != t - 1:
            h = tl.load(snapshots + ((bos + parent) * hv + i_hv) * (DK * DV) + tile)
        q_t = tl.load(q + (node * H + i_h) * DK + o_k).to(tl.float32)
        k_t = tl.load(k + (node * H + i_h) * DK + o_k).to(tl.float32)
        v_t = tl.load(v + (node * hv + i_hv) * DV + o_v).to(tl.float32)
        h *= tl.exp(tl.load(g + node * hv + i_hv).to(tl.float32))
        u_t = tl.load(beta + node * hv + i_hv).to(tl.float32) * (v_t - tl.sum(h * k_t[:, None], axis=0))
        h += k_t[:, None] * u_t[None, :]
        o_t = tl.sum(h * q_t[:, None], axis=0) * scale
        tl.store(o + (node * hv + i_hv) * DV + o_v, o_t.to(o.dtype.element_ty))
        tl.store(snapshots + (node * hv + i_hv) * (DK * DV) + tile, h)
        tl.debug_barrier()  # a later sibling may re-read this snapshot with another thread layout


@triton.jit(do_not_specialize=["num_requests", "num_slots", "num_nodes"])
def _snapshot_commit_kernel(
    state,
    snapshots,
    accepted_leaf,
    slots,
    cu_seqlens,
    num_requests,
    num_slots,
    num_nodes,
    ENTRY: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_SLOTS: tl.constexpr,
):
    i_blk = tl.program_id(0)
    i_l, accepted, slot, node = _accepted_node(
        accepted_leaf, slots, cu_seqlens, tl.program_id(1), num_requests, USE_SLOTS
    )
    if accepted:
        offs = i_blk * BLOCK + tl.arange(0, BLOCK)
        m = offs < ENTRY  # a state that is no multiple of the block (3 value heads of 16 x 16: 768)
        src = snapshots + (i_l.to(tl.int64) * num_nodes + node) * ENTRY
        dst = state + (i_l.to(tl.int64) * num_slots + slot) * ENTRY
        tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


def gdn_tree_verify_serial(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    tree: TreeBatch,
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
    config: SerialConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Serial per-node tree recurrence; the committed state is read, never written.

    Shapes: q, k ``[N, H, dk]``; v ``[N, HV, dv]``; g, beta ``[N, HV]``; state ``[S, HV, dk, dv]`` fp32
    (slots ``state_indices`` int ``[B]`` or S = B). Returns ``o [N, HV, dv]`` (v's dtype) and
    ``snapshots [N, HV, dk, dv]`` fp32 (every node's post-update state). dk must be a power of two.
    """
    n, h, dk, hv, dv = gdn_shapes(q, k, v)
    if n != tree.num_nodes or dk & (dk - 1) or dv % 16:
        raise ValueError(
            f"need N = tree nodes ({n} vs {tree.num_nodes}), dk a power of two ({dk}) and dv a multiple of "
            f"16 ({dv})"
        )
    check_gdn_operands(q, k, v, g, beta, state)
    check_device(tree, state.device, q=q, k=k, v=v, g=g, beta=beta)
    check_contiguous(state=state)
    check_slot_count(state.shape[0], tree.num_requests, state_indices)
    slots = slot_indices(state_indices, tree.num_requests, state.device)
    cfg = config or SerialConfig(tile_dividing(dv, 32), 2)
    if dv % cfg.bv:
        raise ValueError(f"{cfg} does not tile dv={dv}")
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)  # row-major, as the kernel writes it
    snapshots = torch.empty((n, hv, dk, dv), dtype=torch.float32, device=v.device)
    grid = (dv // cfg.bv, hv, tree.num_requests)
    _tree_serial_kernel[grid](
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), state, slots,
        tree.cu_seqlens, tree.parents, o, snapshots, 1.0 if scale is None else float(scale), hv,
        H=h, DK=dk, DV=dv, BV=cfg.bv, USE_SLOTS=state_indices is not None,
        num_warps=cfg.num_warps,
    )  # fmt: skip
    return o, snapshots


def gdn_snapshot_commit(
    state: torch.Tensor,
    snapshots: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    *,
    state_indices: torch.Tensor | None = None,
) -> None:
    """Copy each request's accepted snapshot into its state slot, every layer in one launch.

    Shapes: state ``[(L,) S, HV, dk, dv]`` fp32 and snapshots ``[(L,) N, HV, dk, dv]`` fp32;
    accepted_leaf int ``[B]`` (local index, -1 = untouched); state_indices int ``[B]``.
    """
    if state.dim() not in (4, 5) or snapshots.dim() != state.dim():
        raise ValueError(
            f"state [(L,) S, HV, dk, dv] and snapshots [(L,) N, HV, dk, dv] expected, got "
            f"{tuple(state.shape)} and {tuple(snapshots.shape)}"
        )
    if snapshots.shape[-3:] != state.shape[-3:] or snapshots.shape[-4] != tree.num_nodes:
        raise ValueError(f"snapshots {tuple(snapshots.shape)} do not match state {tuple(state.shape)}")
    if state.shape[:-4] != snapshots.shape[:-4] or state.dtype != snapshots.dtype:
        raise ValueError("state and snapshots must have the same layers and dtype")
    check_device(tree, state.device, snapshots=snapshots)
    check_contiguous(state=state, snapshots=snapshots)
    leaves = check_leaves(accepted_leaf, tree, state.device)
    num_slots = state.shape[-4]
    check_slot_count(num_slots, tree.num_requests, state_indices)
    slots = slot_indices(state_indices, tree.num_requests, state.device)
    layers = state.shape[0] if state.dim() == 5 else 1
    entry = state.shape[-3] * state.shape[-2] * state.shape[-1]
    block = min(4096, triton.next_power_of_2(entry))
    grid = (triton.cdiv(entry, block), layers * tree.num_requests)
    _snapshot_commit_kernel[grid](
        state, snapshots, leaves, slots, tree.cu_seqlens,
        tree.num_requests, num_slots, tree.num_nodes,
        ENTRY=entry, BLOCK=block, USE_SLOTS=state_indices is not None, num_warps=4,
    )  # fmt: skip


__all__ = ["SERIAL_CONFIGS", "SerialConfig", "gdn_snapshot_commit", "gdn_tree_verify_serial"]
