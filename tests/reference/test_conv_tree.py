"""Tree-aware causal conv1d against a plain sequential conv over each root-to-node path."""

import pytest
import torch
import torch.nn.functional as F

from trtllm_bole import ops
from trtllm_bole.testing import chain_parents, forest, star_parents, topk_parents


def sequential_conv(history: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """torch's depthwise Conv1d over ``history [C, L]`` (committed state then path inputs); last output."""
    out = F.conv1d(history[None], weight[:, None, :], bias, groups=weight.shape[0])
    return F.silu(out[0, :, -1])


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("with_bias", [False, True])
def test_tree_conv_equals_sequential_conv_on_every_path(width, with_bias, gen):
    trees = [topk_parents(30, 3, 7), [-1], chain_parents(2), star_parents(6)]
    tree = forest(trees)
    c = 12
    x = torch.randn(tree.num_nodes, c, generator=gen, dtype=torch.float64)
    weight = torch.randn(c, width, generator=gen, dtype=torch.float64)
    bias = torch.randn(c, generator=gen, dtype=torch.float64) if with_bias else None
    slots = torch.tensor([2, 0, 4, 1])
    conv_state = torch.randn(5, c, width - 1, generator=gen, dtype=torch.float64)
    before = conv_state.clone()
    y = ops.tree_conv1d(x, weight, conv_state, tree, bias=bias, state_indices=slots)
    assert torch.equal(before, conv_state)
    for i in range(tree.num_nodes):
        b = int(tree.request[i])
        history = torch.cat([conv_state[slots[b]], x[tree.path(i)].T], dim=1)
        assert torch.allclose(y[i], sequential_conv(history, weight, bias), atol=1e-12)


def test_conv_state_commit_is_last_inputs_along_path(gen):
    trees = [topk_parents(20, 3, 6), chain_parents(1), chain_parents(2)]
    tree = forest(trees)
    layers, c, width = 2, 5, 4
    x = torch.randn(layers, tree.num_nodes, c, generator=gen)
    conv_state = torch.randn(layers, 3, c, width - 1, generator=gen)
    before = conv_state.clone()
    leaves = torch.tensor([17, 0, -1])
    ops.conv_state_commit(conv_state, x, tree, leaves)
    for layer in range(layers):
        for b, leaf in enumerate(leaves.tolist()):
            if leaf < 0:
                assert torch.equal(conv_state[layer, b], before[layer, b])
                continue
            node = int(tree.cu_seqlens[b]) + leaf
            history = torch.cat([before[layer, b], x[layer, tree.path(node)].T], dim=1)
            assert torch.equal(conv_state[layer, b], history[:, -(width - 1) :])


def test_conv_then_commit_then_conv_equals_one_longer_path(gen):
    """Committing a path and convolving the next token sees the same window as the whole path."""
    tree = forest([topk_parents(15, 2, 5)])
    c, width = 6, 4
    x = torch.randn(tree.num_nodes, c, generator=gen, dtype=torch.float64)
    weight = torch.randn(c, width, generator=gen, dtype=torch.float64)
    state = torch.randn(1, c, width - 1, generator=gen, dtype=torch.float64)
    y_full = ops.tree_conv1d(x, weight, state, tree)
    leaf = int(tree.paths[14, int(tree.depth[14]) - 2])  # commit node 14's parent, then verify node 14
    committed = state.clone()
    ops.conv_state_commit(committed, x, tree, torch.tensor([leaf]))
    single = forest([[-1]])
    y_next = ops.tree_conv1d(x[14:15], weight, committed, single)
    assert torch.allclose(y_next[0], y_full[14], atol=1e-12)
