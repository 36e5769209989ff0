"""Every bad input to the public ops is a ValueError that says what was wrong."""

import numpy as np
import pytest
import torch

from trtllm_bole import ops
from trtllm_bole.testing import forest, random_gdn_inputs, topk_parents


@pytest.fixture
def case(gen):
    tree = forest([topk_parents(6, 2, 3), [-1]])
    return tree, random_gdn_inputs(tree.num_nodes, 2, 2, 4, 8, 4, generator=gen).cast(torch.float32)


def verify(x, tree, **overrides):
    args = dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, state=x.state)
    args.update(overrides)
    return ops.gdn_tree_verify(**args, parents=tree, scale=x.scale)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (lambda x: {"q": x.q[:, :1]}, r"q, k must be \[N, H, dk\] and v \[N, HV, dv\]"),
        (lambda x: {"q": x.q[:-1], "k": x.k[:-1], "v": x.v[:-1]}, "must have N=7 rows"),
        (lambda x: {"v": x.v[:, :3], "g": x.g[:, :3], "beta": x.beta[:, :3]}, "multiple of key heads"),
        (lambda x: {"g": x.g[:, :2]}, r"g must be \[N=7, HV=4\]"),
        (lambda x: {"beta": x.beta[:-1]}, r"beta must be \[N=7, HV=4\]"),
        (lambda x: {"state": x.state[:, :, :4]}, r"state must be float32 or float64 \[S, HV=4, dk=8, dv=4\]"),
        (lambda x: {"state": x.state.bfloat16()}, "float32 or float64"),
        (lambda x: {"v": x.v.int()}, "v must be float32, bfloat16, float16 or float64, got torch.int32"),
        (lambda x: {"state": x.state[:1]}, "state holds 1 slots but the tree has 2 requests"),
        (lambda x: {"q": x.q.bfloat16()}, "q and k must share a dtype"),
        (
            lambda x: {"q": x.q[:, :0], "k": x.k[:, :0]},
            "key heads H=0, at least one",
        ),  # was ZeroDivisionError
    ],
)
def test_verify_rejects(case, override, match):
    tree, x = case
    with pytest.raises(ValueError, match=match):
        verify(x, tree, **override(x))


def sequences(x, **overrides):
    """The case's 7 nodes as one sequence of 7 tokens through ``ops.chunk_gated_delta_rule``."""
    args = {name: getattr(x, name)[None] for name in ("q", "k", "v", "g", "beta")}
    args["initial_state"] = x.state[:1]
    args.update(overrides)
    return ops.chunk_gated_delta_rule(**args, scale=x.scale)


@pytest.mark.parametrize(
    ("override", "match"),
    [  # these shapes broadcast (one gate or state shared by every head or sequence) or failed unnamed
        (lambda x: {"g": x.g[None, :, :1]}, r"g must be \[B=1, L=7, HV=4\]"),
        (lambda x: {"beta": x.beta[None, :, :1]}, r"beta must be \[B=1, L=7, HV=4\]"),
        (lambda x: {"initial_state": x.state[0]}, r"state must be float32 or float64 \[S, HV=4"),
        (lambda x: {"initial_state": x.state}, r"initial_state must be \[B=1, HV, dk, dv\]"),
        (lambda x: {"k": x.k[:, None]}, r"q, k must be \[B, L, H, dk\]"),
        (lambda x: {"v": x.v[None, :, :1], "g": x.g[None, :, :1], "beta": x.beta[None, :, :1]}, "multiple"),
        (
            lambda x: {n: getattr(x, n)[None, :0] for n in ("q", "k", "v", "g", "beta")},
            r"no tokens \(L = 0\)",
        ),
        (lambda x: {"v": x.v[None].int()}, "v must be float32, bfloat16, float16 or float64"),
    ],
)
def test_sequences_reject(case, override, match):
    _, x = case
    with pytest.raises(ValueError, match=match):
        sequences(x, **override(x))


def test_sequences_run_as_the_tree_of_their_chain(case):
    _, x = case
    chain = forest([[-1, *range(6)]])
    o, final = sequences(x)
    o_chain, factors = ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state[:1], chain, scale=x.scale)
    state = x.state[:1].clone()
    ops.gdn_commit(state, factors, torch.tensor([6]))
    torch.testing.assert_close(o[0], o_chain)
    torch.testing.assert_close(final, state)


def test_tree_arguments(case):
    tree, x = case
    with pytest.raises(ValueError, match="cu_seqlens is required"):
        ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree.parents)
    with pytest.raises(ValueError, match="not both"):
        ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree, tree.cu_seqlens)
    o, _ = ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree.parents, tree.cu_seqlens)
    assert o.shape == x.v.shape


@pytest.mark.parametrize(
    ("indices", "match"),
    [
        (torch.tensor([0]), r"integer tensor \[B=2\]"),
        (torch.tensor([0.0, 1.0]), r"integer tensor \[B=2\]"),
        (torch.tensor([True, False]), r"integer tensor \[B=2\]"),
        (torch.tensor([0, 5]), r"must lie in \[0, 3\)"),
        (torch.tensor([1, 1]), "distinct slots"),
    ],
)
def test_state_indices_rejected(case, indices, match):
    tree, x = case
    pool = torch.zeros(3, *x.state.shape[1:])
    with pytest.raises(ValueError, match=match):
        ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, pool, tree, state_indices=indices)


def test_slot_indices_that_passed_are_checked_again_once_changed(case):
    """Checked slot indices pass again without a device sync only while unmodified and in range."""
    tree, x = case
    pool = torch.zeros(3, *x.state.shape[1:])
    indices = torch.tensor([2, 0])
    ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, pool, tree, state_indices=indices)
    ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, pool, tree, state_indices=indices)
    with pytest.raises(ValueError, match=r"must lie in \[0, 2\)"):
        ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, pool[:2], tree, state_indices=indices)
    indices[1] = 2
    with pytest.raises(ValueError, match="distinct slots"):
        ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, pool, tree, state_indices=indices)


@pytest.fixture
def undispatched(monkeypatch):
    """Every ``bole::`` implementation fails if reached: a refusal under it comes from the op's own checks,
    before the dispatcher picks the device (so the kernels are as protected as the reference)."""
    from trtllm_bole.ops import library

    def reached(*args, **kwargs):
        raise AssertionError("a bad input reached the implementation")

    for name in ("gdn_commit", "gdn_snapshot_commit", "conv_state_commit", "tree_conv1d", "gdn_prefill",
                 "kv_commit"):  # fmt: skip
        monkeypatch.setattr(library, name, reached)


def test_commit_rejects_mismatched_state_and_leaves(case, undispatched):
    tree, x = case
    _, factors = verify(x, tree)
    with pytest.raises(ValueError, match=r"state must be \[S, HV, dk, dv\]"):
        ops.gdn_commit(x.state[None], factors, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"request 1: accepted_leaf 1 is outside \[-1, 1\)"):
        ops.gdn_commit(x.state, factors, torch.tensor([0, 1]))
    stacked = ops.stack_factors([factors, factors])
    with pytest.raises(ValueError, match="holds 3 layers but the factors 2"):
        ops.gdn_commit(torch.stack([x.state] * 3), stacked, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="at least one"):
        ops.stack_factors([])
    for bad, match in [
        (
            ops.GDNTreeFactors(tree, x.k, factors.u, factors.log_decay[:, :1]),
            r"factors\.log_decay must be \[7, 4\]",
        ),
        (
            ops.GDNTreeFactors(tree, x.k[..., :4], factors.u, factors.log_decay),
            r"factors\.k must be \[7, 2, 8\]",
        ),
        (ops.GDNTreeFactors(tree, x.k, factors.u[:-1], factors.log_decay), r"factors\.u must be \[7, 4, 4\]"),
        # Ran on the CPU, failed inside the kernel on CUDA (Triton's "Both operands must be same dtype").
        (
            ops.GDNTreeFactors(tree, x.k, factors.u.bfloat16(), factors.log_decay),
            r"in the state's dtype \(torch\.float32\).*got u torch\.bfloat16",
        ),
        (
            ops.GDNTreeFactors(tree, x.k, factors.u, factors.log_decay.double()),
            r"log_decay torch\.float64",
        ),
        (
            ops.GDNTreeFactors(tree, x.k.long(), factors.u, factors.log_decay),
            r"k floating point.*k torch\.int64",
        ),
    ]:
        with pytest.raises(ValueError, match=match):
            ops.gdn_commit(x.state, bad, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="float32 or float64"):
        ops.gdn_commit(x.state.long(), factors, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"snapshots must be torch\.float32 like the state"):
        snapshots = torch.zeros(tree.num_nodes, *x.state.shape[1:], dtype=torch.float64)
        ops.gdn_snapshot_commit(x.state, snapshots, tree, torch.tensor([0, 0]))
    for leaf, got in [
        (torch.tensor([3.9, 0.2]), "torch.float32"),
        ([0, 0], "list"),
        (torch.tensor([0]), r"torch.int64 \(1,\)"),
    ]:
        with pytest.raises(ValueError, match=rf"accepted_leaf must be an integer tensor \[B=2\].*got {got}"):
            ops.gdn_commit(x.state, factors, leaf)
    for commit in (ops.gdn_commit, ops.gdn_snapshot_commit, ops.conv_state_commit):
        args = {
            ops.gdn_commit: (x.state, factors),
            ops.gdn_snapshot_commit: (x.state, torch.zeros(tree.num_nodes, *x.state.shape[1:]), tree),
            ops.conv_state_commit: (torch.zeros(2, 6, 3), torch.zeros(tree.num_nodes, 6), tree),
        }[commit]
        with pytest.raises(ValueError, match=r"request 0: accepted_leaf 6 is outside \[-1, 6\)"):
            commit(*args, torch.tensor([6, 0]))


def test_commits_refuse_leaves_on_another_device(case, gen):
    """The device is the dispatcher's choice (any CUDA argument picks the kernels): every tensor of a
    commit must be where its state is."""
    tree, x = case
    _, factors = verify(x, tree)
    elsewhere = torch.tensor([0, 0], device="meta")
    with pytest.raises(ValueError, match="accepted_leaf is on meta but the data is on cpu"):
        ops.gdn_commit(x.state, factors, elsewhere)
    moved = ops.GDNTreeFactors(tree, factors.k, factors.u, factors.log_decay.to("meta"))
    with pytest.raises(ValueError, match="log_decay is on meta"):
        ops.gdn_commit(x.state, moved, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="bias is on meta"):
        ops.tree_conv1d(torch.zeros(tree.num_nodes, 6), torch.zeros(6, 4), torch.zeros(2, 6, 3), tree,
                        bias=torch.zeros(6, device="meta"))  # fmt: skip
    with pytest.raises(ValueError, match="accepted_leaf is on meta"):
        ops.gdn_snapshot_commit(x.state, torch.zeros(tree.num_nodes, *x.state.shape[1:]), tree, elsewhere)
    with pytest.raises(ValueError, match="accepted_leaf is on meta"):
        ops.conv_state_commit(torch.zeros(2, 6, 3), torch.zeros(tree.num_nodes, 6), tree, elsewhere)
    cache, new = torch.zeros(1, 4, 4, 1, 8), torch.zeros(1, tree.num_nodes, 1, 8)
    tables, lengths = torch.tensor([[0, 1], [2, 3]]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="context_lens is on meta"):
        ops.kv_commit(cache, cache.clone(), new, new, tree, torch.tensor([0, 0]), tables, lengths.to("meta"))


def test_norms_and_sampling_ops_refuse_tensors_on_another_device():
    """As the commits: one tensor elsewhere is named (the dispatcher would pick the kernels for a CUDA
    one and hand them the others' memory)."""
    meta = {"device": "meta"}
    x, w = torch.zeros(3, 2, 8), torch.zeros(8)
    cos, sin = torch.zeros(3, 2), torch.zeros(3, 2)
    with pytest.raises(ValueError, match="weight is on meta but x is on cpu"):
        ops.rms_norm(x, torch.zeros(8, **meta), 1e-6)
    with pytest.raises(ValueError, match="sin is on meta but x is on cpu"):
        ops.rms_norm_rope(x, w, 1e-6, cos, sin.to("meta"))
    with pytest.raises(ValueError, match="gate is on meta but x is on cpu"):
        ops.gated_rms_norm(x, x.to("meta"), w, 1e-6)
    qk, a = torch.zeros(3, 16), torch.zeros(3, 2)
    with pytest.raises(ValueError, match="dt_bias is on meta but qk is on cpu"):
        ops.gdn_inputs(qk, a, a, torch.zeros(2), torch.zeros(2, **meta), 1)
    logits, rows = torch.zeros(2, 5), torch.ones(2)
    with pytest.raises(ValueError, match="top_p is on meta but logits is on cpu"):
        ops.filter_floor(logits, rows, torch.zeros(2, dtype=torch.long), rows.to("meta"))
    with pytest.raises(ValueError, match="floor is on meta but logits is on cpu"):
        ops.softmax_stats(logits, rows, rows.to("meta"))


def test_conv_rejects(case, gen, undispatched):
    tree, _ = case
    x = torch.randn(tree.num_nodes, 6, generator=gen)
    w = torch.randn(6, 4, generator=gen)
    state = torch.zeros(2, 6, 3)
    with pytest.raises(ValueError, match=r"x must be \[N=7, C\]"):
        ops.tree_conv1d(x[:-1], w, state, tree)
    with pytest.raises(ValueError, match=r"weight must be \[C=6, W>=2\]"):
        ops.tree_conv1d(x, w[:5], state, tree)
    with pytest.raises(ValueError, match=r"conv_state must be \[S, C=6, W-1=3\]"):
        ops.tree_conv1d(x, w, state[:, :, :2], tree)
    with pytest.raises(ValueError, match="activation"):
        ops.tree_conv1d(x, w, state, tree, activation="gelu")
    with pytest.raises(ValueError, match=r"expected x \[\(L,\) N, C\]"):
        ops.conv_state_commit(state, x[:-1], tree, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"expected x \[\(L,\) N, C\]"):  # 2 layers of x, 3 of state
        ops.conv_state_commit(torch.stack([state] * 3), torch.stack([x] * 2), tree, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"bias must be \[C=6\]"):
        ops.tree_conv1d(x, w, state, tree, bias=torch.zeros(1))
    with pytest.raises(ValueError, match="x must be a floating-point tensor"):
        ops.tree_conv1d(x.long(), w, state, tree)
    with pytest.raises(ValueError, match="conv_state holds 3 slots but the tree has 2 requests"):
        ops.tree_conv1d(x, w, torch.zeros(3, 6, 3), tree)
    with pytest.raises(ValueError, match="conv_state holds 3 slots but the tree has 2 requests"):
        ops.conv_state_commit(torch.zeros(3, 6, 3), x, tree, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"conv_state must be a floating-point tensor, got torch.int64"):
        ops.conv_state_commit(state.long(), x, tree, torch.tensor([0, 0]))  # truncated what it committed


def test_kv_commit_refuses_caches_it_would_truncate(case):
    tree, _ = case
    cache, new = torch.zeros(1, 4, 4, 1, 8), torch.zeros(1, tree.num_nodes, 1, 8)
    tables, lengths = torch.tensor([[0, 1], [2, 3]]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match=r"k_cache must be a floating-point tensor, got torch.int64"):
        ops.kv_commit(cache.long(), cache.long(), new, new, tree, torch.tensor([0, 0]), tables, lengths)
    with pytest.raises(ValueError, match=r"new_v must be a floating-point tensor, got torch.int32"):
        ops.kv_commit(cache, cache.clone(), new, new.int(), tree, torch.tensor([0, 0]), tables, lengths)


def test_prefill_rejects_bad_offsets(case, undispatched):
    _, x = case
    with pytest.raises(ValueError, match="increase strictly"):
        ops.gdn_prefill(x.q, x.k, x.v, x.g, x.beta, x.state, torch.tensor([0, 7, 7]))
    with pytest.raises(ValueError, match="increase strictly"):
        ops.gdn_prefill(x.q, x.k, x.v, x.g, x.beta, x.state, [0, 7, 7])
    with pytest.raises(ValueError, match="at least one prompt"):
        ops.gdn_prefill(x.q[:0], x.k[:0], x.v[:0], x.g[:0], x.beta[:0], x.state[:0], torch.tensor([0]))
    for bounds in ([0, 3.0, 7], [0, True, 7], torch.tensor([0.0, 3, 7])):
        with pytest.raises(ValueError, match="cu_seqlens must"):
            ops.gdn_prefill(x.q, x.k, x.v, x.g, x.beta, x.state, bounds)
    for chunk_size in (0, -2, 65, 2.0):
        with pytest.raises(ValueError, match=r"chunk_size must be an integer in \[1, 64\]"):
            ops.gdn_prefill(
                x.q, x.k, x.v, x.g, x.beta, x.state, torch.tensor([0, 3, 7]), chunk_size=chunk_size
            )


def test_prefill_takes_its_bounds_as_a_tensor_or_as_host_ints(case):
    """A prefill's bounds are known on the host (the executor cuts the prompts): as ints they spare the
    copy from the device, and give what the same bounds as a tensor give."""
    _, x = case
    by_ints, by_tensor = x.state.clone(), x.state.clone()
    o_ints = ops.gdn_prefill(x.q, x.k, x.v, x.g, x.beta, by_ints, (0, 3, np.int64(7)), scale=x.scale)
    o_tensor = ops.gdn_prefill(x.q, x.k, x.v, x.g, x.beta, by_tensor, torch.tensor([0, 3, 7]), scale=x.scale)
    assert torch.equal(o_ints, o_tensor) and torch.equal(by_ints, by_tensor)
    assert not torch.equal(by_ints, x.state)


def test_trees_deeper_than_the_kernels_are_refused_on_every_device(gen):
    """The closed form is exact (and tested) to depth 64, the kernels' compiled maximum; on CPU a chain of
    100 once ran and drifted (1.2e-4 against transformers, 0.42 at 200) where CUDA refused it."""
    from trtllm_bole.tree import TreeBatch

    tree = TreeBatch.chains([65])
    x = random_gdn_inputs(tree.num_nodes, 1, 1, 2, 8, 4, generator=gen).cast(torch.float32)
    with pytest.raises(ValueError, match="tree depth 65 exceeds the kernels' compiled maximum depth 64"):
        ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    ops.gdn_tree_verify(x.q[:64], x.k[:64], x.v[:64], x.g[:64], x.beta[:64], x.state, TreeBatch.chains([64]))
