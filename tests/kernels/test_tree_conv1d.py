"""The tree conv kernel against the float64 reference (BOLE.md §4)."""

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.helpers import DEVICE, rel_rms
from trtllm_bole.kernels.tree_conv1d import tree_conv1d
from trtllm_bole.reference import conv_tree
from trtllm_bole.testing import chain_parents, forest, star_parents, topk_parents
from trtllm_bole.tree import TreeBatch

TREES = {
    "single": [[-1]],
    "ragged": [topk_parents(40, 4, 8), [-1], chain_parents(9), star_parents(5)],
    "topk100": [topk_parents(100, 4, 8)],
}


def case(trees, channels, width, gen, dtype=torch.float32, num_slots=None):
    tree = forest(trees, device=DEVICE)
    x = torch.randn(tree.num_nodes, channels, generator=gen).to(DEVICE, dtype)
    weight = torch.randn(channels, width, generator=gen).to(DEVICE, dtype)
    bias = torch.randn(channels, generator=gen).to(DEVICE, dtype)
    state = torch.randn(num_slots or tree.num_requests, channels, width - 1, generator=gen).to(DEVICE, dtype)
    return tree, x, weight, bias, state


def reference(tree, x, weight, bias, state, **kw):
    return conv_tree.tree_conv1d(
        x.double(), weight.double(), state.double(), tree, bias=None if bias is None else bias.double(), **kw
    )


@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("width", [4, 2, 5])
def test_matches_reference(shape, width, gen, nan_outputs):
    tree, x, weight, bias, state = case(TREES[shape], 200, width, gen)
    y = tree_conv1d(x, weight, state, tree, bias=bias)
    assert rel_rms(y, reference(tree, x, weight, bias, state)) <= 1e-6


@pytest.mark.parametrize("activation", [None, "silu"])
def test_no_bias_bf16_and_slot_pool(activation, gen, nan_outputs):
    tree, x, weight, _, state = case(TREES["ragged"], 96, 4, gen, torch.bfloat16, num_slots=7)
    slots = torch.tensor([6, 1, 3, 0], device=DEVICE)
    before = state.clone()
    y = tree_conv1d(x, weight, state, tree, activation=activation, state_indices=slots)
    assert y.dtype == torch.bfloat16
    ref = reference(tree, x, weight, None, state, activation=activation, state_indices=slots)
    assert rel_rms(y, ref) <= 1e-2
    assert torch.equal(state, before)


def test_inputs_laid_out_transposed(gen, nan_outputs):
    """A full-size input whose strides are not row-major (a transpose) gives the same values, and the
    output is row-major (as the operator's fake says)."""
    tree, x, weight, bias, state = case(TREES["ragged"], 24, 4, gen)
    transposed = x.t().contiguous().t()
    y = tree_conv1d(transposed, weight, state, tree, bias=bias)
    assert y.is_contiguous() and torch.equal(y, tree_conv1d(x, weight, state, tree, bias=bias))


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_prompt_chains_without_a_paths_table_equal_a_causal_sequence_conv(impl, gen, nan_outputs):
    """Prompts longer than any tree carry no paths table (``TreeBatch.chains``): the window walks up
    ``global_parents``. Each prompt's output is the causal conv of its committed state then its inputs."""
    lengths, c, width = [100, 3, 70], 40, 4
    tree = TreeBatch.chains(lengths, device=DEVICE)
    assert not tree.has_paths
    x = torch.randn(tree.num_nodes, c, generator=gen).to(DEVICE)
    weight, bias = torch.randn(c, width, generator=gen).to(DEVICE), torch.randn(c, generator=gen).to(DEVICE)
    state = torch.randn(3, c, width - 1, generator=gen).to(DEVICE)
    run = tree_conv1d if impl == "kernel" else conv_tree.tree_conv1d
    y = run(x, weight, state, tree, bias=bias)
    for b, piece in enumerate(torch.arange(sum(lengths)).split(lengths)):
        history = torch.cat([state[b], x[piece].T], dim=1).double()[None]  # [1, C, W - 1 + L]
        want = F.silu(F.conv1d(history, weight.double()[:, None], bias.double(), groups=c))[0].T
        assert rel_rms(y[piece], want) <= 1e-6, b


def test_rejects_bad_arguments(gen):
    tree, x, weight, bias, state = case(TREES["single"], 16, 4, gen)
    with pytest.raises(ValueError, match="activation must be"):
        tree_conv1d(x, weight, state, tree, activation="gelu")
    with pytest.raises(ValueError, match=r"conv_state must be \[S, C=16, W-1=3\]"):
        tree_conv1d(x, weight, state[..., :2], tree)
    with pytest.raises(ValueError, match=r"bias must be \[C=16\]"):
        tree_conv1d(x, weight, state, tree, bias=bias[:3])


@pytest.mark.gpu
def test_real_size(gen):
    """Qwen3.5-9B GDN conv channels: q, k (16 x 128 each) and v (32 x 128)."""
    tree, x, weight, bias, state = case([topk_parents(64, 4, 8)] * 16, 8192, 4, gen, torch.bfloat16)
    y = tree_conv1d(x, weight, state, tree, bias=bias)
    assert rel_rms(y, reference(tree, x, weight, bias, state)) <= 1e-2
