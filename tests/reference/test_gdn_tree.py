"""The closed form and the factored commit against the serial float64 oracle (BOLE.md §2–§3)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trtllm_bole import ops
from trtllm_bole.reference import gdn_tree
from trtllm_bole.testing import (
    chain_parents,
    forest,
    random_gdn_inputs,
    random_parents,
    star_parents,
    topk_parents,
)
from trtllm_bole.tree import TreeBatch

SHAPES = {
    "single": [[-1]],
    "pair": [chain_parents(2)],
    "seven": [topk_parents(7, 2, 3)],
    "chain16": [chain_parents(16)],
    "star64": [star_parents(64)],
    "topk63": [topk_parents(63, 4, 8)],
    "topk64": [topk_parents(64, 4, 8)],
    "topk128_d16": [topk_parents(128, 4, 16)],
    "ragged": [topk_parents(100, 4, 8), [-1], chain_parents(9), star_parents(5)],
}


def serial_truth(x, tree, indices=None):
    return gdn_tree.serial_tree_recurrence(
        x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale, state_indices=indices
    )


@pytest.mark.parametrize("heads", [(2, 2), (2, 4), (1, 3)], ids=["H=HV", "grouped", "one-key-head"])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_closed_form_equals_serial_float64(shape, heads, gen):
    tree = forest(SHAPES[shape])
    h, hv = heads
    x = random_gdn_inputs(tree.num_nodes, tree.num_requests, h, hv, 16, 8, generator=gen)
    o_ref, _ = serial_truth(x, tree)
    o, _ = ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    assert o.dtype == torch.float64
    assert (o - o_ref).abs().max() <= 1e-10
    o_neumann, _, _ = gdn_tree.closed_form_tree_verify(  # Lemma 3 (G^d = 0), on random keys
        x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale, solver="neumann"
    )
    assert (o_neumann - o_ref).abs().max() <= 1e-10


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_commit_every_leaf_equals_serial_state(shape, gen):
    tree = forest(SHAPES[shape])
    x = random_gdn_inputs(tree.num_nodes, tree.num_requests, 2, 4, 16, 8, generator=gen)
    _, states = serial_truth(x, tree)
    _, factors = ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    lengths = (tree.cu_seqlens[1:] - tree.cu_seqlens[:-1]).tolist()
    for leaf in range(max(lengths)):
        accepted = torch.tensor([min(leaf, n - 1) for n in lengths])
        state = x.state.clone()
        ops.gdn_commit(state, factors, accepted)
        truth = states[tree.accepted_nodes(accepted)]
        assert (state - truth).abs().max() <= 1e-10


def test_nothing_accepted_leaves_state_bit_identical(gen):
    tree = forest([topk_parents(20, 3, 5), chain_parents(4)])
    x = random_gdn_inputs(tree.num_nodes, 2, 2, 4, 16, 8, generator=gen).cast(torch.float32)
    _, factors = ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    state = x.state.clone()
    ops.gdn_commit(state, factors, torch.tensor([-1, 3]))
    assert torch.equal(state[0], x.state[0])
    assert not torch.equal(state[1], x.state[1])


def test_verify_never_writes_the_committed_state(gen):
    tree = forest([topk_parents(30, 4, 6)])
    x = random_gdn_inputs(tree.num_nodes, 1, 2, 2, 16, 8, generator=gen)
    before = x.state.clone()
    ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    assert torch.equal(before, x.state)


def test_slot_pool_and_stacked_layers(gen):
    tree = forest([topk_parents(12, 3, 4), chain_parents(5)])
    slots = torch.tensor([3, 1])
    layers = [random_gdn_inputs(tree.num_nodes, 4, 2, 4, 16, 8, generator=gen) for _ in range(3)]
    pool = torch.stack([x.state for x in layers])  # [L, S=4, HV, dk, dv]
    factors, truth = [], []
    for i, x in enumerate(layers):
        o, f = ops.gdn_tree_verify(
            x.q, x.k, x.v, x.g, x.beta, pool[i], tree, scale=x.scale, state_indices=slots
        )
        o_ref, states = serial_truth(x, tree, slots)
        assert (o - o_ref).abs().max() <= 1e-10
        factors.append(f)
        truth.append(states)
    accepted = torch.tensor([7, -1])
    ops.gdn_commit(pool, ops.stack_factors(factors), accepted, state_indices=slots)
    for i, x in enumerate(layers):
        assert (pool[i, 3] - truth[i][7]).abs().max() <= 1e-10
        for untouched in (0, 1, 2):
            assert torch.equal(pool[i, untouched], x.state[untouched])


def test_float32_close_to_float64_truth(gen):
    tree = forest([topk_parents(64, 4, 8), topk_parents(33, 2, 10)])
    x = random_gdn_inputs(tree.num_nodes, 2, 2, 4, 64, 32, generator=gen)
    o_ref, states = serial_truth(x, tree)
    x32 = x.cast(torch.float32)
    o, factors = ops.gdn_tree_verify(x32.q, x32.k, x32.v, x32.g, x32.beta, x32.state, tree, scale=x.scale)
    assert o.dtype == torch.float32 and factors.u.dtype == torch.float32
    rel = (o.double() - o_ref).norm() / o_ref.norm()
    assert rel < 1e-5
    state = x32.state.clone()
    leaves = torch.tensor([63, 32])
    ops.gdn_commit(state, factors, leaves)
    truth = states[tree.accepted_nodes(leaves)]
    assert (state.double() - truth).norm() / truth.norm() < 1e-5


def test_bf16_inputs_fp32_state_serving_mode(gen):
    tree = forest([topk_parents(64, 4, 8)])
    x = random_gdn_inputs(tree.num_nodes, 1, 2, 4, 64, 32, generator=gen)
    o_ref, _ = serial_truth(x, tree)
    xb = x.cast(torch.bfloat16, state_dtype=torch.float32)
    o, _ = ops.gdn_tree_verify(xb.q, xb.k, xb.v, xb.g, xb.beta, xb.state, tree, scale=x.scale)
    assert o.dtype == torch.bfloat16
    assert (o.double() - o_ref).norm() / o_ref.norm() < 2e-2


def test_serial_ops_and_snapshot_commit_match_factored(gen):
    tree = forest([topk_parents(16, 3, 5), star_parents(3)])
    x = random_gdn_inputs(tree.num_nodes, 2, 1, 2, 16, 8, generator=gen)
    o_s, snaps = ops.gdn_tree_verify_serial(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    o_f, factors = ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    assert (o_s - o_f).abs().max() <= 1e-10
    a, b = x.state.clone(), x.state.clone()
    leaves = torch.tensor([9, 2])
    ops.gdn_snapshot_commit(a, snaps, tree, leaves)
    ops.gdn_commit(b, factors, leaves)
    assert (a - b).abs().max() <= 1e-10


def test_chunked_prefill_equals_serial_chain(gen):
    lengths = [70, 5, 130]
    tree = forest([chain_parents(n) for n in lengths], max_depth=max(lengths))
    x = random_gdn_inputs(tree.num_nodes, 3, 2, 4, 16, 8, generator=gen)
    o_ref, states = serial_truth(x, tree)
    state = x.state.clone()
    o = ops.gdn_prefill(x.q, x.k, x.v, x.g, x.beta, state, tree.cu_seqlens, scale=x.scale, chunk_size=32)
    assert (o - o_ref).abs().max() <= 1e-10
    last = tree.cu_seqlens[1:] - 1
    assert (state - states[last]).abs().max() <= 1e-10


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 24), min_size=1, max_size=4),
    max_depth=st.integers(1, 16),
    group=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_random_forests(sizes, max_depth, group, seed):
    gen = torch.Generator().manual_seed(seed)
    tree = forest([random_parents(n, max_depth, gen) for n in sizes])
    x = random_gdn_inputs(tree.num_nodes, len(sizes), 2, 2 * group, 8, 4, generator=gen)
    o_ref, states = serial_truth(x, tree)
    o, factors = ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    assert (o - o_ref).abs().max() <= 1e-10
    leaves = torch.tensor([int(torch.randint(-1, n, (1,), generator=gen)) for n in sizes])
    state = x.state.clone()
    ops.gdn_commit(state, factors, leaves)
    for b, leaf in enumerate(leaves.tolist()):
        expected = x.state[b] if leaf < 0 else states[int(tree.cu_seqlens[b]) + leaf]
        assert (state[b] - expected).abs().max() <= 1e-10


def test_batched_chunk_form_matches_serial_and_is_differentiable(gen):
    batch, length = 2, 11
    tree = forest([chain_parents(length)] * batch)
    x = random_gdn_inputs(tree.num_nodes, batch, 1, 2, 4, 3, generator=gen)
    o_ref, states = serial_truth(x, tree)

    def rows(t):
        return t.reshape(batch, length, *t.shape[1:])

    inputs = [rows(t).requires_grad_() for t in (x.q, x.k, x.v, x.g, x.beta)]
    o, final = gdn_tree.chunk_gated_delta_rule(*inputs, x.state, scale=x.scale, chunk_size=4)
    assert (o - rows(o_ref)).abs().max() <= 1e-10
    assert (final - states[tree.cu_seqlens[1:] - 1]).abs().max() <= 1e-10

    def f(*a):
        return gdn_tree.chunk_gated_delta_rule(*a, x.state, scale=x.scale, chunk_size=4)[0]

    assert torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize(("h", "hv", "dk", "dv"), [(2, 2, 8, 8), (2, 4, 16, 8), (1, 3, 12, 5)])
def test_the_serial_oracle_on_chains_is_transformers_recurrence(h, hv, dk, dv, gen):
    """The oracle itself against the model it stands for: on chains (each node the previous one's child),
    transformers' Qwen3.5 recurrence (float32 inside) with its in-kernel L2 norm and 1/sqrt(dk) scale,
    grouped heads included. The other reference tests compare our functions with each other, which a
    head mapping or scale shared by all of them would pass."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    batch, length = 2, 9
    x = random_gdn_inputs(batch * length, batch, h, hv, dk, dv, generator=gen)
    q_raw, k_raw = (torch.randn(batch * length, h, dk, generator=gen, dtype=torch.float64) for _ in range(2))
    o_hf, s_hf = torch_recurrent_gated_delta_rule(
        *(t.reshape(batch, length, *t.shape[1:]) for t in (q_raw, k_raw, x.v, x.g, x.beta)),
        initial_state=x.state, output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip

    def l2(t):
        return t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6)  # transformers' l2norm

    chains = TreeBatch.chains([length] * batch)
    o, states = gdn_tree.serial_tree_recurrence(
        l2(q_raw), l2(k_raw), x.v, x.g, x.beta, x.state, chains, scale=dk**-0.5
    )
    assert (o - o_hf.reshape(o.shape).double()).abs().max() <= 1e-5
    assert (states[chains.cu_seqlens[1:] - 1] - s_hf.double()).abs().max() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_gate_of_full_forgetting_is_the_documented_clamp(gen, dtype):
    """g = -inf (the serial walk takes it) is NaN in the closed form (``-inf - (-inf)``): the ops' docs say
    so, and that a clamp at -110, where exp(g) is 0 in float32, gives the serial walk's outputs."""
    tree = forest([[-1, 0, 1, 2, 1]])
    x = random_gdn_inputs(5, 1, 1, 2, 4, 4, generator=gen).cast(dtype)
    g = x.g.clone()
    g[1] = -float("inf")  # node 1 forgets everything before it
    o_serial, snapshots = ops.gdn_tree_verify_serial(x.q.double(), x.k.double(), x.v.double(), g.double(),
                                                     x.beta.double(), x.state.double(), tree)  # fmt: skip
    o_nan, _ = ops.gdn_tree_verify(x.q, x.k, x.v, g, x.beta, x.state, tree)
    assert o_nan.isnan().any() and o_serial.isfinite().all()
    o, factors = ops.gdn_tree_verify(x.q, x.k, x.v, g.clamp(min=-110), x.beta, x.state, tree)
    state = x.state.clone()
    ops.gdn_commit(state, factors, torch.tensor([3]))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert (o.double() - o_serial).abs().max() < tol
    assert (state.double() - snapshots[3]).abs().max() < tol
