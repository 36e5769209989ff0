"""Argument-order adapters for ahead-of-time launches of the Bole kernels (TensorRT's convention).

A TensorRT AOT plugin launches its kernel with the parameters ``(inputs..., extra int32 scalars...,
outputs...)``. Each adapter below takes exactly that order and calls the unchanged ``@triton.jit`` kernel
of :mod:`trtllm_bole.kernels` (inlined: the PTX holds the same code, nothing is re-implemented);
settings the runtime launchers pass as arguments become compile-time constants here. Calls are by
keyword, so a change to a kernel's signature fails to compile here instead of binding wrongly.
"""

from __future__ import annotations

import triton
import triton.language as tl

from trtllm_bole.kernels.gdn_commit import _gdn_commit_kernel
from trtllm_bole.kernels.gdn_tree_verify import _gdn_tree_verify_kernel
from trtllm_bole.kernels.gdn_tree_verify_inverse import _gdn_tree_verify_inverse_kernel, _path_factors_kernel
from trtllm_bole.kernels.tree_conv1d import _tree_conv1d_kernel


@triton.jit
def gdn_tree_verify_aot(
    q,
    k,
    v,
    g,
    beta,
    state,
    state_indices,
    cu_seqlens,
    dfs_order,
    subtree_size,
    o,
    u,
    log_p,
    SCALE: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    LB: tl.constexpr,
    FUSED: tl.constexpr,
    PREC: tl.constexpr,
):
    # g stands in for the raw-gate pointers (A_log, dt_bias): RAW_GATES is off, they are never read.
    _gdn_tree_verify_kernel(
        q=q, k=k, v=v, g=g, beta=beta, state=state, slots=state_indices, cu_seqlens=cu_seqlens,
        dfs_order=dfs_order, subtree_size=subtree_size, o=o, u=u, log_p=log_p, a_log=g, dt_bias=g,
        scale=SCALE, hv=HV, H=H, DK=DK, DV=DV, BT=BT, BK=BK, BV=BV, LB=LB,
        FUSED=FUSED, USE_SLOTS=True, PREC=PREC, S_BF16=False, UPCAST=False, RAW_GATES=False,
    )  # fmt: skip


@triton.jit
def gdn_tree_factors_aot(
    q,
    k,
    g,
    beta,
    cu_seqlens,
    depth,
    paths,
    num_nodes,
    max_depth,
    factors,
    log_p,
    scratch,
    SCALE: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    BT: tl.constexpr,
    DP: tl.constexpr,
    SW: tl.constexpr,
    PREC: tl.constexpr,
):
    # The factor kernel takes the value-tile kernel's argument list; the pointers it never reads (v, the
    # state and its slots, the pre-order, o and u, the raw-gate parameters) are stood in for by q.
    _path_factors_kernel(
        q=q, k=k, v=q, g=g, beta=beta, state=q, slots=cu_seqlens, cu_seqlens=cu_seqlens, dfs_order=depth,
        subtree_size=depth, depth=depth, paths=paths, o=q, u=q, log_p=log_p, factors=factors, scratch=scratch,
        a_log=g, dt_bias=g, scale=SCALE, hv=HV, n_total=num_nodes, d=max_depth,
        H=H, DK=DK, BT=BT, DP=DP, SW=SW, PREC=PREC, UPCAST=False, RAW_GATES=False,
    )  # fmt: skip


@triton.jit
def gdn_tree_values_aot(
    q,
    k,
    v,
    state,
    state_indices,
    cu_seqlens,
    dfs_order,
    subtree_size,
    depth,
    log_p,
    factors,
    num_nodes,
    max_depth,
    o,
    u,
    SCALE: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PREC: tl.constexpr,
    S_BF16: tl.constexpr,
):
    # Phase 2 of the explicit inverse from the stored factors; log_p stands in for the pointers it never
    # reads (the gates, the raw-gate parameters, the paths and the factor kernel's scratch).
    _gdn_tree_verify_inverse_kernel(
        q=q, k=k, v=v, g=log_p, beta=log_p, state=state, slots=state_indices, cu_seqlens=cu_seqlens,
        dfs_order=dfs_order, subtree_size=subtree_size, depth=depth, paths=depth, o=o, u=u, log_p=log_p,
        factors=factors, scratch=log_p, a_log=log_p, dt_bias=log_p, scale=SCALE, hv=HV, n_total=num_nodes,
        d=max_depth, H=H, DK=DK, DV=DV, BT=BT, BK=BK, BV=BV, PHASE=2,
        USE_SLOTS=True, PREC=PREC, S_BF16=S_BF16, UPCAST=False, RAW_GATES=False, BLOCKED=False,
    )  # fmt: skip


@triton.jit
def gdn_commit_aot(
    state,
    k,
    u,
    log_p,
    accepted_leaf,
    state_indices,
    cu_seqlens,
    depth,
    paths,
    num_requests,
    num_slots,
    num_nodes,
    max_depth,
    state_out,
    H: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    DP: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    OUTER: tl.constexpr,
):
    # state_out aliases state (an in-place plugin): the commit reads and writes through the output.
    _gdn_commit_kernel(
        state=state_out, k=k, u=u, log_p=log_p, accepted_leaf=accepted_leaf, slots=state_indices,
        cu_seqlens=cu_seqlens, depth=depth, paths=paths, num_requests=num_requests, num_slots=num_slots,
        num_nodes=num_nodes, max_depth=max_depth, H=H, HV=HV, DK=DK, DV=DV, DP=DP, BK=BK, BV=BV,
        USE_SLOTS=True, OUTER=OUTER,
    )  # fmt: skip


@triton.jit
def tree_conv1d_aot(
    x,
    weight,
    conv_state,
    state_indices,
    request,
    depth,
    global_parents,
    num_nodes,
    y,
    C: tl.constexpr,
    W: tl.constexpr,
    BN: tl.constexpr,
    BC: tl.constexpr,
    SILU: tl.constexpr,
):
    # x stands in for the bias pointer: HAS_BIAS is off (Qwen3.5's conv has no bias).
    _tree_conv1d_kernel(
        x=x, weight=weight, bias=x, conv_state=conv_state, y=y, slots=state_indices, request=request,
        depth=depth, global_parents=global_parents, num_nodes=num_nodes, C=C, W=W, BN=BN, BC=BC,
        HAS_BIAS=False, SILU=SILU, USE_SLOTS=True,
    )  # fmt: skip
