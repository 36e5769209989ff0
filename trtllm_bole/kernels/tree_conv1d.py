"""Tree-aware causal depthwise conv1d (+ SiLU) of a GDN layer (BOLE.md §4).

Node ``i``'s window is its own input and its ``W - 1`` nearest ancestors along its path (``W - 1``
steps up ``tree.global_parents``: no path table, which a long prompt's chain does not carry), falling
back to the request's committed conv state where the path is shorter. One program per (``BN`` nodes,
``BC`` channels); the conv state is read, never written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_bole.kernels._common import (
    INPUT_DTYPES,
    check_conv_shapes,
    check_device,
    check_slot_count,
    slot_indices,
)
from trtllm_bole.tree import TreeBatch


@triton.jit(do_not_specialize=["num_nodes"])
def _tree_conv1d_kernel(
    x,
    weight,
    bias,
    conv_state,
    y,
    slots,
    request,
    depth,
    global_parents,
    num_nodes,
    C: tl.constexpr,
    W: tl.constexpr,
    BN: tl.constexpr,
    BC: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    USE_SLOTS: tl.constexpr,
):
    i_c, i_n = tl.program_id(0), tl.program_id(1)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < num_nodes
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    n_path = tl.load(depth + o_n, mask=m_n, other=1).to(tl.int32)
    req = tl.load(request + o_n, mask=m_n, other=0)
    slot = tl.load(slots + req, mask=m_n, other=0) if USE_SLOTS else req
    s_row = slot * (C * (W - 1))
    acc = tl.zeros([BN, BC], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + o_c, mask=m_c, other=0.0).to(tl.float32)[None, :]
    src = tl.where(m_n, o_n, -1).to(tl.int64)
    for back in tl.static_range(W):  # steps before the node: the node itself, then up its path
        if back > 0:
            src = tl.load(global_parents + tl.maximum(src, 0), mask=src >= 0, other=-1)
        on_path = src >= 0
        from_x = tl.load(x + src[:, None] * C + o_c[None, :], mask=on_path[:, None] & m_c[None, :], other=0.0)
        col = W - 2 - back + n_path  # committed column: state_width - 1 - (back - depth)
        from_state = tl.load(
            conv_state + s_row[:, None] + o_c[None, :] * (W - 1) + col[:, None],
            mask=(m_n & ~on_path)[:, None] & m_c[None, :],
            other=0.0,
        )
        tap = tl.load(weight + o_c * W + (W - 1 - back), mask=m_c, other=0.0).to(tl.float32)
        window = tl.where(on_path[:, None], from_x.to(tl.float32), from_state.to(tl.float32))
        acc += window * tap[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(
        y + o_n.to(tl.int64)[:, None] * C + o_c[None, :],
        acc.to(y.dtype.element_ty),
        mask=m_n[:, None] & m_c[None, :],
    )


def tree_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    tree: TreeBatch,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Depthwise causal conv over each node's ancestor window, then SiLU (or none).

    Shapes: x ``[N, C]``; weight ``[C, W]`` (``weight[:, -1]`` multiplies the node's own input);
    conv_state ``[S, C, W - 1]`` (the committed last inputs, oldest first; slots ``state_indices``
    int ``[B]`` or S = B); bias ``[C]``. Returns y ``[N, C]`` in x's dtype (fp32 accumulation).
    """
    check_conv_shapes(x, weight, conv_state, bias, activation, tree)
    c, width = weight.shape
    for name, t in (("x", x), ("weight", weight), ("conv_state", conv_state)):
        if t.dtype not in INPUT_DTYPES:
            raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    check_device(tree, x.device, weight=weight, conv_state=conv_state, bias=bias)
    check_slot_count(conv_state.shape[0], tree.num_requests, state_indices, "conv_state")
    slots = slot_indices(state_indices, tree.num_requests, x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # row-major, as the kernel writes it
    bn, bc = 16, min(128, triton.next_power_of_2(c))
    grid = (triton.cdiv(c, bc), triton.cdiv(tree.num_nodes, bn))
    _tree_conv1d_kernel[grid](
        x.contiguous(), weight.contiguous(), x if bias is None else bias.contiguous(),
        conv_state.contiguous(), y, slots, tree.request, tree.depth, tree.global_parents, tree.num_nodes,
        C=c, W=width, BN=bn, BC=bc, HAS_BIAS=bias is not None, SILU=activation == "silu",
        USE_SLOTS=state_indices is not None,
    )  # fmt: skip
    return y


__all__ = ["tree_conv1d"]
