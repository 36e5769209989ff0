"""The short causal depthwise conv1d of a GDN layer, on draft trees (BOLE.md §4).

x ``[N, C]`` (the in-projected q/k/v channels of each node); weight ``[C, W]`` (``weight[:, -1]``
multiplies the newest input, as in ``torch.nn.Conv1d`` with left padding); conv_state
``[S, C, W - 1]``: the committed last ``W - 1`` inputs of each request, oldest first.

Node ``i``'s window is its own input and its ``W - 1`` nearest ancestors along its path, falling back
to the committed conv state where the path is shorter. The shapes are not checked here (a conv_state one
column short would read a node as its own ancestor): :func:`trtllm_bole.ops.tree_conv1d` checks them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_bole.tree import TreeBatch


def window_sources(tree: TreeBatch, nodes: torch.Tensor, width: int, state_width: int) -> torch.Tensor:
    """Where each of the ``width`` inputs ending at each node (oldest first, the node last) comes from.

    Returns int64 ``[len(nodes), width]``: ``>= 0`` is a packed node index along the node's path;
    ``-1 - c`` is column ``c`` of the request's committed conv state (``state_width`` columns). With
    ``width = W`` this is the conv window; with ``width = W - 1`` it is the conv state after
    committing the node.
    """
    depth = tree.depth[nodes][:, None]
    back = torch.arange(width - 1, -1, -1, device=nodes.device)[None, :]  # 0 = the node itself
    up = [nodes]  # the node, then its ancestors one step up the path at a time (-1 above the root)
    for _ in range(width - 1):
        up.append(torch.where(up[-1] >= 0, tree.global_parents[up[-1].clamp(min=0)], -1))
    from_path = torch.stack(up[::-1], dim=1)
    state_col = state_width - 1 - (back - depth)
    return torch.where(back < depth, from_path, -1 - state_col)


def _gather_windows(
    x: torch.Tensor, pre: torch.Tensor, sources: torch.Tensor, owner: torch.Tensor
) -> torch.Tensor:
    """``[n, C, W]`` windows: node inputs where ``sources >= 0``, else the owner's committed state."""
    from_nodes = x[sources.clamp(min=0)].transpose(1, 2)  # [n, C, W]
    state_cols = (-1 - sources).clamp(min=0, max=pre.shape[-1] - 1)
    from_state = torch.gather(pre[owner], 2, state_cols[:, None, :].expand(-1, pre.shape[1], -1))
    return torch.where((sources >= 0)[:, None, :], from_nodes, from_state)


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
    """Depthwise causal conv over each node's ancestor window (+ SiLU); conv_state is read-only."""
    width = weight.shape[1]
    nodes = torch.arange(tree.num_nodes, device=x.device)
    pre = conv_state if state_indices is None else conv_state[state_indices.long()]
    windows = _gather_windows(
        x, pre.to(x.dtype), window_sources(tree, nodes, width, conv_state.shape[-1]), tree.request
    )
    # Accumulate in float32 at least, as F.conv1d does for bf16: rounding each product to bf16 first
    # made a bf16 model measurably less accurate than transformers' (tests/models).
    dtype = torch.promote_types(torch.promote_types(x.dtype, weight.dtype), torch.float32)
    y = (windows.to(dtype) * weight.to(dtype)).sum(-1)
    if bias is not None:
        y = y + bias.to(dtype)
    if activation == "silu":
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    return y.to(x.dtype)


def conv_state_commit(
    conv_state: torch.Tensor,
    x: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    *,
    state_indices: torch.Tensor | None = None,
) -> None:
    """New conv state = the last ``W - 1`` inputs along the accepted path (in place)."""
    accepted = tree.accepted_nodes(accepted_leaf)
    keep = torch.nonzero(accepted >= 0).flatten()
    if keep.numel() == 0:
        return
    slots = (
        torch.arange(tree.num_requests, device=x.device) if state_indices is None else state_indices.long()
    )
    leaves = accepted[keep]
    sources = window_sources(tree, leaves, conv_state.shape[-1], conv_state.shape[-1])
    pre = conv_state[slots[keep]]
    local_owner = torch.arange(keep.numel(), device=x.device)
    conv_state[slots[keep]] = _gather_windows(x.to(conv_state.dtype), pre, sources, local_owner)
