"""Factored commit (BOLE.md §3) of every GDN layer of every request in one launch, and the conv-state
commit (BOLE.md §4). Both update the states in place and leave requests with nothing accepted
(``accepted_leaf == -1``) untouched, bit for bit.

GDN: one program per (value tile, value head, layer × request). It gathers the accepted path (at most
the tree depth, padded to ``DP`` >= 16 rows for ``tl.dot``) of ``k``, ``u`` and ``logP``, and streams
the state in ``BK × BV`` chunks: ``S_new = P_a S + (D_a K_a)ᵀ U_a`` with
``D_a = diag(exp(logP_a - logP_j))``. Each committed state is read once and written once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trtllm_bole.kernels._common import (
    GDNTreeFactors,
    check_commit_factors,
    check_contiguous,
    check_conv_commit_shapes,
    check_depth,
    check_device,
    check_leaves,
    check_slot_count,
    pow2_at_least,
    slot_indices,
    tile_dividing,
    tiles_head_dims,
)
from trtllm_bole.tree import TreeBatch


@dataclass(frozen=True, slots=True)
class CommitConfig:
    bk: int  # dk rows per chunk
    bv: int  # value channels per program
    num_warps: int = 4
    outer: bool = False  # rank-1 updates node by node instead of one tl.dot over the padded path


COMMIT_CONFIGS = tuple(
    CommitConfig(bk, bv, w, outer)
    for bk, bv, w, outer in (
        (16, 128, 4, False),
        (32, 64, 4, False),
        (16, 64, 2, False),
        (128, 32, 4, True),
        (128, 16, 2, True),
        (64, 64, 4, True),
    )
)
"""Candidates the benchmark sweeps. The dot form gathers the whole path at once; the outer form keeps
only the state tile on chip (fewer registers, more programs in flight per SM)."""


def default_commit_config(dk: int, dv: int, max_depth: int) -> CommitConfig:
    """The commit's config for trees at most ``max_depth`` nodes deep (the longest accepted path). The
    outer form's time grows with the path it walks, the dot form's barely does (it pads the path to
    ``DP`` rows, a power of two >= 16). Measured on the H200 (benchmarks/probe_commit_paths.py,
    results/probe_commit_paths_h200.json: 24 layers of Qwen3.5-9B heads, batch 16, bf16 k, state slots,
    trees 9 deep), as a share of the copy bandwidth: the outer form ``(64, 64, 4 warps)`` 94 % at 1-node
    paths, 83 % at 4, 60 % at 9; the dot form ``(16, 64, 2 warps)`` 82 % at 1, 80 % at 4, 78 % at 9. So
    trees of at most 4 nodes a path take the outer form, and trees up to 16 deep (``DP = 16``, as
    measured) the dot form. Deeper trees keep the outer form: padded to 64 rows the dot form takes 255
    registers and spills 256 bytes (sm_90, triton 3.6; 120 at ``DP = 16``), the outer form 80 at any
    depth; neither is measured there."""
    if 4 < max_depth <= 16:
        return CommitConfig(16, tile_dividing(dv, 64), 2, outer=False)
    return CommitConfig(tile_dividing(dk, 64), tile_dividing(dv, 64), 4, outer=True)


@triton.jit
def _accepted_node(accepted_leaf, slots, cu_seqlens, i_lb, num_requests, USE_SLOTS: tl.constexpr):
    """Program index ``i_lb`` over (layer × request) -> the layer, whether the request accepted a node
    (a leaf index out of range counts as none: the caller then touches no memory), the request's state
    slot and the packed index of its accepted node."""
    i_l = i_lb // num_requests
    i_b = i_lb % num_requests
    leaf = tl.load(accepted_leaf + i_b).to(tl.int64)
    bos = tl.load(cu_seqlens + i_b)
    accepted = (leaf >= 0) & (leaf < tl.load(cu_seqlens + i_b + 1) - bos)
    slot = tl.load(slots + i_b).to(tl.int64) if USE_SLOTS else i_b.to(tl.int64)
    return i_l, accepted, slot, bos + leaf


@triton.jit
def _commit_path(s_ptr, k, u, log_p, rows, m_p, lp_leaf, i_h, i_hv, o_v, hv, H: tl.constexpr,
                 DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """``S[:, o_v] = P_a S[:, o_v] + (D_a K_a)ᵀ U_a[:, o_v]`` in place, for the accepted path's packed
    ``rows`` (``m_p`` masks the padding), the state streamed in ``BK`` rows of dk at a time."""
    o_k = tl.arange(0, BK)
    lp_path = tl.load(log_p + rows * hv + i_hv, mask=m_p, other=0.0)
    weight = tl.where(m_p, tl.exp(lp_leaf - lp_path), 0.0)
    u_path = tl.load(u + (rows * hv + i_hv)[:, None] * DV + o_v[None, :], mask=m_p[:, None], other=0.0)
    k_row = (rows * H + i_h) * DK
    for kc in range(0, DK, BK):
        k_path = tl.load(k + k_row[:, None] + kc + o_k[None, :], mask=m_p[:, None], other=0.0)
        wk = weight[:, None] * k_path.to(tl.float32)
        s_ptrs = s_ptr + (kc + o_k)[:, None] * DV + o_v[None, :]
        s = tl.exp(lp_leaf) * tl.load(s_ptrs)
        tl.store(s_ptrs, s + tl.dot(tl.trans(wk), u_path, input_precision="ieee"))


@triton.jit(do_not_specialize=["num_requests", "num_slots", "num_nodes", "max_depth"])
def _gdn_commit_kernel(
    state,
    k,
    u,
    log_p,
    accepted_leaf,
    slots,
    cu_seqlens,
    depth,
    paths,
    num_requests,
    num_slots,
    num_nodes,
    max_depth,
    H: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    DP: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_SLOTS: tl.constexpr,
    OUTER: tl.constexpr,
):
    i_v, i_hv = tl.program_id(0), tl.program_id(1)
    i_l, accepted, slot, node = _accepted_node(
        accepted_leaf, slots, cu_seqlens, tl.program_id(2), num_requests, USE_SLOTS
    )
    if accepted:
        n_path = tl.load(depth + node).to(tl.int32)
        layer_rows = i_l.to(tl.int64) * num_nodes  # layer-major rows of the stacked factors
        lp_leaf = tl.load(log_p + (layer_rows + node) * HV + i_hv)
        o_v = i_v * BV + tl.arange(0, BV)
        o_k = tl.arange(0, BK)
        s_ptr = state + ((i_l.to(tl.int64) * num_slots + slot) * HV + i_hv) * (DK * DV)
        i_h = i_hv // (HV // H)
        if OUTER:
            for kc in range(0, DK, BK):
                s_ptrs = s_ptr + (kc + o_k)[:, None] * DV + o_v[None, :]
                s = tl.exp(lp_leaf) * tl.load(s_ptrs)
                for j in range(0, n_path):
                    row = layer_rows + tl.load(paths + node * max_depth + j)
                    w_j = tl.exp(lp_leaf - tl.load(log_p + row * HV + i_hv))
                    k_j = tl.load(k + (row * H + i_h) * DK + kc + o_k).to(tl.float32)
                    u_j = tl.load(u + (row * HV + i_hv) * DV + o_v)
                    s += (w_j * k_j)[:, None] * u_j[None, :]
                tl.store(s_ptrs, s)
        else:
            o_p = tl.arange(0, DP)
            m_p = o_p < n_path
            row = layer_rows + tl.load(paths + node * max_depth + o_p, mask=m_p, other=0)
            _commit_path(s_ptr, k, u, log_p, row, m_p, lp_leaf, i_h, i_hv, o_v, HV, H, DK, DV, BK)


@triton.jit(do_not_specialize=["num_requests", "num_slots", "num_nodes"])
def _conv_state_commit_kernel(
    conv_state,
    x,
    accepted_leaf,
    slots,
    cu_seqlens,
    depth,
    global_parents,
    num_requests,
    num_slots,
    num_nodes,
    C: tl.constexpr,
    WS: tl.constexpr,
    WP: tl.constexpr,
    BC: tl.constexpr,
    USE_SLOTS: tl.constexpr,
):
    """New conv state column j (oldest first) = the input ``WS - 1 - j`` steps before the leaf along
    its path (``WS - 1 - j`` steps up ``global_parents``), or the old state's column ``j + depth`` where
    the path is shorter."""
    i_c = tl.program_id(0)
    i_l, accepted, slot, node = _accepted_node(
        accepted_leaf, slots, cu_seqlens, tl.program_id(1), num_requests, USE_SLOTS
    )
    if accepted:
        n_path = tl.load(depth + node).to(tl.int32)
        o_j = tl.arange(0, WP)
        back = WS - 1 - o_j  # steps before the leaf; 0 = the leaf itself
        m_j = o_j < WS
        on_path = m_j & (back < n_path)
        src = tl.zeros([WP], dtype=tl.int64)
        up = node
        for step in tl.static_range(WS):  # the leaf, then one step up the path at a time
            if step > 0:
                up = tl.load(global_parents + tl.maximum(up, 0), mask=up >= 0, other=-1)
            src = tl.where(back == step, up, src)
        o_c = i_c * BC + tl.arange(0, BC)
        m_c = o_c < C
        s_ptr = conv_state + (i_l.to(tl.int64) * num_slots + slot) * (C * WS)
        from_x = tl.load(
            x + (i_l.to(tl.int64) * num_nodes + src)[None, :] * C + o_c[:, None],
            mask=m_c[:, None] & on_path[None, :],
            other=0.0,
        )
        from_state = tl.load(
            s_ptr + o_c[:, None] * WS + (o_j + n_path)[None, :],
            mask=m_c[:, None] & (m_j & ~on_path)[None, :],
            other=0.0,
        )
        new = tl.where(on_path[None, :], from_x.to(tl.float32), from_state.to(tl.float32))
        tl.debug_barrier()  # every old column is read before any is overwritten
        tl.store(
            s_ptr + o_c[:, None] * WS + o_j[None, :],
            new.to(conv_state.dtype.element_ty),
            mask=m_c[:, None] & m_j[None, :],
        )


def gdn_commit(
    state: torch.Tensor,
    factors: GDNTreeFactors,
    accepted_leaf: torch.Tensor,
    *,
    state_indices: torch.Tensor | None = None,
    config: CommitConfig | None = None,
) -> None:
    """``S_new = P_a S_pre + (D_a K_a)ᵀ U_a`` along each accepted path, in place, one launch.

    Shapes: state ``[L, S, HV, dk, dv]`` fp32 with stacked factors (k ``[L, N, H, dk]``, u
    ``[L, N, HV, dv]``, log_decay ``[L, N, HV]``), or state ``[S, HV, dk, dv]`` with unstacked ones;
    ``accepted_leaf`` int ``[B]`` (local index of the deepest accepted node, -1 = untouched);
    ``state_indices`` int ``[B]`` slots (default: request b owns slot b). Values are not checked here
    (no device sync); :func:`trtllm_bole.ops.gdn_commit` checks them.
    """
    tree = factors.tree
    k, u, log_p = factors.k, factors.u, factors.log_decay
    layers = factors.num_layers or 1
    check_commit_factors(state, factors)
    hv, dk, dv = state.shape[-3:]
    n, h = tree.num_nodes, k.shape[-2]
    if state.dtype != torch.float32 or not tiles_head_dims(dk, dv):
        raise ValueError(
            f"the commit kernel takes a float32 state with dk and dv multiples of 16, got {state.dtype} "
            f"{tuple(state.shape)}"
        )
    check_device(tree, state.device, k=k, u=u, log_decay=log_p)
    check_contiguous(state=state)
    check_depth(tree, "gdn_commit")
    leaves = check_leaves(accepted_leaf, tree, state.device)
    num_slots = state.shape[-4]
    check_slot_count(num_slots, tree.num_requests, state_indices)
    slots = slot_indices(state_indices, tree.num_requests, state.device)
    cfg = config or default_commit_config(dk, dv, tree.max_depth)
    if dk % cfg.bk or dv % cfg.bv:
        raise ValueError(f"{cfg} does not tile dk={dk}, dv={dv}")
    grid = (dv // cfg.bv, hv, layers * tree.num_requests)
    _gdn_commit_kernel[grid](
        state, k.contiguous(), u.contiguous(), log_p.contiguous(), leaves, slots,
        tree.cu_seqlens, tree.depth, tree.paths, tree.num_requests, num_slots, n, tree.paths.shape[1],
        H=h, HV=hv, DK=dk, DV=dv, DP=pow2_at_least(tree.max_depth, 16), BK=cfg.bk, BV=cfg.bv,
        USE_SLOTS=state_indices is not None, OUTER=cfg.outer, num_warps=cfg.num_warps,
    )  # fmt: skip


def conv_state_commit(
    conv_state: torch.Tensor,
    x: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    *,
    state_indices: torch.Tensor | None = None,
) -> None:
    """New conv state = the last ``W - 1`` inputs along each accepted path, in place, one launch.

    Shapes: conv_state ``[S, C, W - 1]`` with x ``[N, C]``, or all layers at once: ``[L, S, C, W - 1]``
    with ``[L, N, C]``; accepted_leaf int ``[B]`` (-1 = untouched); state_indices int ``[B]``.
    """
    check_conv_commit_shapes(conv_state, x, tree)
    layers = x.shape[0] if x.dim() == 3 else 1
    c, ws = conv_state.shape[-2:]
    check_device(tree, conv_state.device, x=x)
    check_contiguous(conv_state=conv_state)
    leaves = check_leaves(accepted_leaf, tree, conv_state.device)
    num_slots = conv_state.shape[-3]
    check_slot_count(num_slots, tree.num_requests, state_indices, "conv_state")
    slots = slot_indices(state_indices, tree.num_requests, conv_state.device)
    bc = min(256, triton.next_power_of_2(c))
    grid = (triton.cdiv(c, bc), layers * tree.num_requests)
    _conv_state_commit_kernel[grid](
        conv_state, x.contiguous(), leaves, slots, tree.cu_seqlens, tree.depth, tree.global_parents,
        tree.num_requests, num_slots, tree.num_nodes,
        C=c, WS=ws, WP=triton.next_power_of_2(ws), BC=bc, USE_SLOTS=state_indices is not None,
    )  # fmt: skip


__all__ = ["COMMIT_CONFIGS", "CommitConfig", "conv_state_commit", "default_commit_config", "gdn_commit"]
