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
    SQUARINGS: tl.constexpr,
    LB: tl.constexpr,
    FUSED: tl.constexpr,
    PREC: tl.constexpr,
):
    # g stands in for the raw-gate pointers (A_log, dt_bias): RAW_GATES is off, they are never read.
    _gdn_tree_verify_kernel(
        q=q, k=k, v=v, g=g, beta=beta, state=state, slots=state_indices, cu_seqlens=cu_seqlens,
        dfs_order=dfs_order, subtree_size=subtree_size, o=o, u=u, log_p=log_p, a_log=g, dt_bias=g,
        scale=SCALE, hv=HV, n_squarings=SQUARINGS, H=H, DK=DK, DV=DV, BT=BT, BK=BK, BV=BV, LB=LB,
        FUSED=FUSED, USE_SLOTS=True, PREC=PREC, S_BF16=False, UPCAST=False, RAW_GATES=False,
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
