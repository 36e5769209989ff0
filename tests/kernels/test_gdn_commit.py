"""The one-launch factored commit and the conv-state commit against the float64 references."""

import pytest
import torch

from tests.kernels.helpers import DEVICE, rel_rms
from trtllm_bole import ops
from trtllm_bole.kernels import MAX_DEPTH
from trtllm_bole.kernels import gdn_commit as kernel
from trtllm_bole.reference import conv_tree, gdn_tree
from trtllm_bole.testing import chain_parents, forest, random_gdn_inputs, star_parents, topk_parents
from trtllm_bole.tree import TreeBatch

TREES = [topk_parents(30, 3, 6), [-1], chain_parents(20), star_parents(6)]


def verified_layers(tree, num_layers, num_slots, gen, h=2, hv=4, dk=32, dv=32):
    """Per layer: float64 inputs, the serial states of every node and float64 factors."""
    layers = []
    for _ in range(num_layers):
        x = random_gdn_inputs(tree.num_nodes, num_slots, h, hv, dk, dv, generator=gen, device=DEVICE)
        x.state = x.state.float().double()
        _, states = gdn_tree.serial_tree_recurrence(
            x.q, x.k, x.v, x.g, x.beta, x.state[: tree.num_requests], tree, scale=x.scale
        )
        _, u, log_p = gdn_tree.closed_form_tree_verify(
            x.q, x.k, x.v, x.g, x.beta, x.state[: tree.num_requests], tree, scale=x.scale
        )
        layers.append((x, states, ops.GDNTreeFactors(tree, x.k.float(), u.float(), log_p.float())))
    return layers


FORMS = [None, kernel.CommitConfig(16, 16, 2, outer=False), kernel.CommitConfig(32, 16, 2, outer=True)]


@pytest.mark.parametrize("cfg", FORMS, ids=["default", "dot", "outer"])
@pytest.mark.parametrize("leaves", [[17, -1, 19, 5], [0, 0, 0, 0], [29, -1, -1, -1]])
def test_unstacked_commit_equals_serial_state(leaves, cfg, gen):
    tree = forest(TREES, device=DEVICE)
    ((x, states, factors),) = verified_layers(tree, 1, tree.num_requests, gen)
    state = x.state.float()
    accepted = torch.tensor(leaves, device=DEVICE)
    kernel.gdn_commit(state, factors, accepted, config=cfg)
    nodes = tree.accepted_nodes(accepted)
    for b, node in enumerate(nodes.tolist()):
        if node < 0:
            assert torch.equal(state[b], x.state[b].float())
        else:
            assert rel_rms(state[b], states[node]) <= 1e-6


@pytest.mark.parametrize(
    "max_depth, outer", [(1, True), (4, True), (5, False), (9, False), (16, False), (17, True), (64, True)]
)
def test_default_config_by_depth(max_depth, outer):
    """The outer form while paths are at most 4 nodes long, the dot form up to 16 (padded to 16 rows), the
    outer form again beyond (the dot form would spill); tiles divide the dims."""
    for dk, dv in ((128, 128), (16, 48), (32, 16)):
        cfg = kernel.default_commit_config(dk, dv, max_depth)
        assert cfg.outer is outer
        assert dk % cfg.bk == 0 and dv % cfg.bv == 0


def test_default_commit_of_shallow_trees_equals_serial_state(gen, monkeypatch):
    """Trees at most 4 deep take the outer form by default (the others, above, the dot form): the default
    is picked by the tree's own depth."""
    tree = forest([topk_parents(12, 3, 4), star_parents(5), [-1]], device=DEVICE)
    assert tree.max_depth == 4
    ((x, states, factors),) = verified_layers(tree, 1, 3, gen)
    state = x.state.float()
    accepted = torch.tensor([11, 3, 0], device=DEVICE)
    picked = []
    default = kernel.default_commit_config
    monkeypatch.setattr(kernel, "default_commit_config", lambda *a: picked.append(a) or default(*a))
    kernel.gdn_commit(state, factors, accepted)
    assert picked == [(32, 32, 4)] and default(*picked[0]).outer
    for b, node in enumerate(tree.accepted_nodes(accepted).tolist()):
        assert rel_rms(state[b], states[node]) <= 1e-6


@pytest.mark.parametrize("cfg", FORMS[1:], ids=["dot", "outer"])
@pytest.mark.parametrize("bf16_keys", [False, True], ids=["k-fp32", "k-bf16"])
def test_all_layers_one_launch_with_slot_pool(bf16_keys, cfg, gen):
    tree = forest(TREES, device=DEVICE)
    layers = verified_layers(tree, 3, tree.num_requests, gen)
    slots = torch.tensor([5, 2, 0, 6], device=DEVICE)
    pool = torch.randn(3, 7, 4, 32, 32, generator=gen).to(DEVICE)
    for i, (x, _, _) in enumerate(layers):
        pool[i, slots] = x.state.float()
    before = pool.clone()
    stacked = ops.stack_factors([f for _, _, f in layers])
    if bf16_keys:
        stacked = ops.GDNTreeFactors(tree, stacked.k.bfloat16(), stacked.u, stacked.log_decay)
    accepted = torch.tensor([12, -1, 19, 3], device=DEVICE)
    kernel.gdn_commit(pool, stacked, accepted, state_indices=slots, config=cfg)
    nodes = tree.accepted_nodes(accepted).tolist()
    for i, (_, states, _) in enumerate(layers):
        for b, node in enumerate(nodes):
            if node < 0:
                assert torch.equal(pool[i, slots[b]], before[i, slots[b]])
            else:
                # bf16 keys: the verify saw the same rounded keys in serving; here only the commit's
                # own arithmetic is tested against fp32 keys, so allow the key rounding.
                assert rel_rms(pool[i, slots[b]], states[node]) <= (1e-2 if bf16_keys else 1e-6)
        untouched = [s for s in range(7) if s not in slots.tolist()]
        assert torch.equal(pool[i, untouched], before[i, untouched])


@pytest.mark.parametrize("cfg", FORMS, ids=["default", "dot", "outer"])
def test_an_unchecked_leaf_past_its_request_commits_nothing(cfg, gen):
    """The kernel's own guard (the checked op refuses such leaves first): a leaf one past its request's
    last node leaves that request's state bit for bit, and reads no other request's nodes."""
    tree = forest([topk_parents(10, 3, 4), chain_parents(5)], device=DEVICE)
    ((x, _, factors),) = verified_layers(tree, 1, 2, gen)
    state = x.state.float().contiguous()
    before = state.clone()
    kernel.gdn_commit(state, factors, torch.tensor([10, 5], device=DEVICE), config=cfg)
    assert torch.equal(state, before)


def test_depth_at_maximum_and_beyond(gen):
    tree = forest([chain_parents(MAX_DEPTH), [-1]], device=DEVICE)
    ((x, states, factors),) = verified_layers(tree, 1, 2, gen, 1, 1, 16, 16)
    state = x.state.float()
    kernel.gdn_commit(state, factors, torch.tensor([MAX_DEPTH - 1, 0], device=DEVICE))
    assert rel_rms(state[0], states[MAX_DEPTH - 1]) <= 1e-5
    assert rel_rms(state[1], states[MAX_DEPTH]) <= 1e-6
    deep = forest([chain_parents(MAX_DEPTH + 1)], device=DEVICE, max_depth=MAX_DEPTH + 1)
    f = ops.GDNTreeFactors(deep, *(torch.zeros(MAX_DEPTH + 1, *s, device=DEVICE) for s in ((1, 16), (1, 16))),
                           torch.zeros(MAX_DEPTH + 1, 1, device=DEVICE))  # fmt: skip
    with pytest.raises(ValueError, match=f"depth {MAX_DEPTH + 1} exceeds"):
        kernel.gdn_commit(torch.zeros(1, 1, 16, 16, device=DEVICE), f, torch.tensor([0], device=DEVICE))


def test_rejects_mismatched_shapes(gen):
    tree = forest([[-1, 0]], device=DEVICE)
    ((x, _, factors),) = verified_layers(tree, 1, 1, gen, 1, 1, 16, 16)
    with pytest.raises(ValueError, match="float32"):
        kernel.gdn_commit(x.state, factors, torch.tensor([1], device=DEVICE))
    with pytest.raises(ValueError, match=r"accepted_leaf must be an integer tensor \[B=1\]"):
        kernel.gdn_commit(x.state.float(), factors, torch.tensor([1, 0], device=DEVICE))
    with pytest.raises(ValueError, match="must be contiguous"):
        kernel.gdn_commit(x.state.float().transpose(-1, -2), factors, torch.tensor([1], device=DEVICE))


@pytest.mark.parametrize("width", [4, 2])
@pytest.mark.parametrize("stacked", [False, True], ids=["one-layer", "stacked"])
def test_conv_state_commit(width, stacked, gen):
    tree = forest(TREES, device=DEVICE)
    layers, channels = (2 if stacked else 1), 300
    lead = (layers,) if stacked else ()
    x = torch.randn(*lead, tree.num_nodes, channels, generator=gen).to(DEVICE, torch.bfloat16)
    pool = torch.randn(*lead, 6, channels, width - 1, generator=gen).to(DEVICE, torch.bfloat16)
    slots = torch.tensor([3, 0, 5, 1], device=DEVICE)
    accepted = torch.tensor([25, -1, 2, 5], device=DEVICE)
    expected = pool.clone()
    for layer_state, layer_x in zip(
        expected.view(-1, *pool.shape[-3:]), x.view(-1, *x.shape[-2:]), strict=True
    ):
        conv_tree.conv_state_commit(layer_state, layer_x, tree, accepted, state_indices=slots)
    kernel.conv_state_commit(pool, x, tree, accepted, state_indices=slots)
    assert torch.equal(pool, expected)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_conv_state_commit_of_prompt_chains_without_a_paths_table(impl, gen):
    """A prefill's chains (no paths table past 64 tokens) leave each slot the last ``W - 1`` inputs up to
    the accepted node, oldest first, topped up from the old state where the prompt is shorter."""
    tree = TreeBatch.chains([100, 2, 70], device=DEVICE)
    assert not tree.has_paths
    x = torch.randn(tree.num_nodes, 50, generator=gen).to(DEVICE, torch.bfloat16)
    pool = torch.randn(5, 50, 3, generator=gen).to(DEVICE, torch.bfloat16)
    slots, accepted = torch.tensor([4, 0, 2], device=DEVICE), torch.tensor([99, 1, 40], device=DEVICE)
    expected = pool.clone()
    expected[4], expected[2] = x[97:100].T, x[102 + 38 : 102 + 41].T
    expected[0] = torch.cat([pool[0][:, 2:], x[100:102].T], dim=1)
    run = kernel.conv_state_commit if impl == "kernel" else conv_tree.conv_state_commit
    run(pool, x, tree, accepted, state_indices=slots)
    assert torch.equal(pool, expected)


def test_conv_state_commit_rejects_mismatch():
    tree = forest([[-1, 0]], device=DEVICE)
    with pytest.raises(ValueError, match=r"expected x \[\(L,\) N, C\]"):
        kernel.conv_state_commit(
            torch.zeros(1, 8, 3, device=DEVICE), torch.zeros(3, 8, device=DEVICE), tree,
            torch.tensor([0], device=DEVICE),
        )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, kernel.COMMIT_CONFIGS[0]], ids=str)
@pytest.mark.parametrize("key_dtype", [torch.float32, torch.bfloat16], ids=["k-fp32", "k-bf16"])
def test_real_size_all_layers(key_dtype, cfg, gen):
    """Qwen3.5-9B: 24 GDN layers, 16 requests, one launch."""
    tree = forest([topk_parents(64, 4, 8)] * 16, device=DEVICE)
    n, layers = tree.num_nodes, 24
    k = torch.nn.functional.normalize(torch.randn(layers, n, 16, 128, device=DEVICE), dim=-1).to(key_dtype)
    u = torch.randn(layers, n, 32, 128, device=DEVICE)
    log_p = gdn_tree.path_log_decay(-torch.rand(n, 32, device=DEVICE) * 0.1, tree)[None].repeat(layers, 1, 1)
    state = torch.randn(layers, 16, 32, 128, 128, device=DEVICE)
    accepted = torch.randint(-1, 64, (16,), generator=gen).to(DEVICE)
    expected = state.double()
    for i in range(layers):
        gdn_tree.factored_commit(expected[i], k[i].double(), u[i].double(), log_p[i].double(), tree, accepted)
    kernel.gdn_commit(state, ops.GDNTreeFactors(tree, k, u, log_p), accepted, config=cfg)
    assert rel_rms(state, expected) <= 1e-5
