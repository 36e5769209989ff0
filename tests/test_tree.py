import dataclasses
import itertools

import pytest
import torch

from trtllm_bole.testing import chain_parents, forest, random_parents, star_parents, topk_parents
from trtllm_bole.tree import MAX_TREE_DEPTH, TreeBatch


def brute_force_ancestors(parents: list[int]) -> list[set[int]]:
    out = []
    for i in range(len(parents)):
        anc, j = {i}, parents[i]
        while j >= 0:
            anc.add(j)
            j = parents[j]
        out.append(anc)
    return out


@pytest.mark.parametrize(
    "trees",
    [
        [[-1]],
        [chain_parents(7)],
        [star_parents(9)],
        [topk_parents(63, 4, 8), chain_parents(3), star_parents(2)],
        [[-1, -1, 0, 1, 2, 0, -1, 6]],
    ],
)
def test_metadata_matches_brute_force(trees):
    tree = forest(trees)
    offset = 0
    for b, parents in enumerate(trees):
        anc = brute_force_ancestors(parents)
        mask = tree.ancestor_mask(b)
        for i in range(len(parents)):
            assert int(tree.depth[offset + i]) == len(anc[i])
            assert int(tree.request[offset + i]) == b
            assert {int(x) - offset for x in tree.path(offset + i)} == anc[i]
            path = tree.path(offset + i).tolist()
            assert path[-1] == offset + i and all(
                parents[c - offset] == p - offset for p, c in itertools.pairwise(path)
            )
            for j in range(len(parents)):
                assert bool(mask[i, j]) == (j in anc[i])
        offset += len(parents)
    whole = tree.ancestor_mask()
    assert not whole[tree.request[:, None] != tree.request[None, :]].any()  # requests never relate


def test_chains_helper():
    tree = TreeBatch.chains([3, 1])
    assert tree.parents.tolist() == [-1, 0, 1, -1]
    assert tree.depth.tolist() == [1, 2, 3, 1]
    assert tree.max_depth == 3


@pytest.mark.parametrize("paths", [True, False])
@pytest.mark.parametrize("lengths", [[1], [3, 1], [5, 70, 1, 2], [64] * 3])
def test_chains_closed_form_equals_build(lengths, paths):
    """Every field as build() derives it, but the paths table where the chains carry none: a prompt's
    chain deeper than any tree, or chains made without one (the prefill's)."""
    fast = TreeBatch.chains(lengths, paths=paths)
    parents = torch.cat([torch.arange(n) - 1 for n in lengths])
    built = TreeBatch.build(parents, torch.tensor([0, *lengths]).cumsum(0), max_supported_depth=max(lengths))
    for f in dataclasses.fields(TreeBatch):
        a, b = getattr(fast, f.name), getattr(built, f.name)
        if f.name == "path_table" and (max(lengths) > MAX_TREE_DEPTH or not paths):
            assert a.shape == (b.shape[0], 0) and not fast.has_paths and built.has_paths
            continue
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, f.name


def test_a_long_chain_carries_no_paths_table_and_refuses_to_read_one():
    """A prompt's chain deeper than the trees the kernels verify keeps no [N, depth] table (8 prompts of
    4,096 tokens would take 1 GiB); reading ``paths`` says why instead of handing back an empty one."""
    long, short = TreeBatch.chains([4096] * 8), TreeBatch.chains([MAX_TREE_DEPTH] * 8)
    assert long.path_table.numel() == 0 and not long.has_paths
    assert short.has_paths and short.paths.shape == (8 * MAX_TREE_DEPTH, MAX_TREE_DEPTH)
    with pytest.raises(ValueError, match="carries no paths table"):
        _ = long.paths
    with pytest.raises(ValueError, match="carries no paths table"):
        long.path(5)
    rebuilt = TreeBatch(*long.tensors(), long.max_depth, long.max_nodes)  # as an operator receives it
    assert not rebuilt.has_paths and torch.equal(rebuilt.global_parents, long.global_parents)


def test_chains_carry_a_depth_bound():
    """A bound wider than the longest chain pads the paths with -1; one below it is refused."""
    bounded, exact = TreeBatch.chains([3, 1], max_depth=8), TreeBatch.chains([3, 1])
    assert (bounded.max_depth, bounded.max_nodes) == (8, 8)
    assert torch.equal(bounded.paths[:, :3], exact.paths) and bool((bounded.paths[:, 3:] == -1).all())
    assert torch.equal(bounded.dfs_order, exact.dfs_order) and torch.equal(bounded.depth, exact.depth)
    with pytest.raises(ValueError, match="below the longest chain"):
        TreeBatch.chains([3, 1], max_depth=2)


@pytest.mark.parametrize("lengths", [[], [3, 0], [-1]])
def test_chains_refuse_empty_requests(lengths):
    with pytest.raises(ValueError, match="positive length"):
        TreeBatch.chains(lengths)


def test_to_moves_every_tensor_in_one_packed_copy():
    tree = forest([topk_parents(21, 4, 4), chain_parents(3)])
    assert tree.to("cpu") is tree
    moved = tree.to("meta")
    names = [f.name for f in dataclasses.fields(tree) if isinstance(getattr(tree, f.name), torch.Tensor)]
    assert len(names) == 8
    for name in names:
        before, after = getattr(tree, name), getattr(moved, name)
        assert after.device.type == "meta" and after.shape == before.shape and after.dtype == torch.long
    assert (moved.max_depth, moved.max_nodes) == (tree.max_depth, tree.max_nodes) == (4, 21)
    # One buffer holds them all, each view starting on a 128-byte boundary.
    storage = moved.parents.untyped_storage().nbytes()
    assert storage == 8 * sum(-(-getattr(tree, name).numel() // 16) * 16 for name in names)
    assert all(getattr(moved, name).storage_offset() % 16 == 0 for name in names)


@pytest.mark.parametrize(
    ("parents", "cu", "match"),
    [
        ([-1, 1], [0, 2], "request 0, node 1: parent 1"),
        ([-1, 0, -1, 5], [0, 2, 4], "request 1, node 1: parent 5"),
        ([-1, -2], [0, 2], "request 0, node 1: parent -2"),
        ([-1, -1], [0, 2, 2], "request 1: offsets not increasing"),
        ([-1, -1], [0, 1], "ends at 1 but parents holds 2"),
        ([-1], [1, 1], "must start at 0"),
        ([], [0], "empty batch"),
    ],
)
def test_invalid_forests_name_request_node_and_rule(parents, cu, match):
    with pytest.raises(ValueError, match=match):
        TreeBatch.build(torch.tensor(parents, dtype=torch.long), torch.tensor(cu))


def test_too_deep_is_refused_with_the_limit():
    """The first node past the limit is named; the tree's depth is not (the sweeps stop at the limit:
    a chain of 6 once read "depth 5")."""
    with pytest.raises(
        ValueError, match=r"request 0, node 4: the tree is deeper than the supported maximum depth 4"
    ):
        TreeBatch.build(torch.arange(6) - 1, torch.tensor([0, 6]), max_supported_depth=4)


def test_wrong_types_and_shapes():
    with pytest.raises(ValueError, match="integer"):
        TreeBatch.build(torch.tensor([-1.0]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="1-D"):
        TreeBatch.build(torch.tensor([[-1]]), torch.tensor([0, 1]))


def test_accepted_nodes_range_checked():
    tree = forest([chain_parents(3), star_parents(2)])
    assert tree.accepted_nodes(torch.tensor([2, -1])).tolist() == [2, -1]
    assert tree.accepted_nodes(torch.tensor([0, 1])).tolist() == [0, 4]
    with pytest.raises(ValueError, match=r"request 1: accepted_leaf 2 is outside \[-1, 2\)"):
        tree.accepted_nodes(torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="shape"):
        tree.accepted_nodes(torch.tensor([0]))


def test_random_trees_respect_depth(gen):
    for _ in range(20):
        parents = random_parents(40, 5, gen)
        tree = forest([parents])
        assert tree.max_depth <= 5


@pytest.mark.parametrize(
    "trees",
    [
        [[-1]],
        [topk_parents(33, 4, 9), topk_parents(33, 4, 9)],
        [topk_parents(63, 4, 8), chain_parents(3), star_parents(2), [-1, -1, 0, 1, 2, 0, -1, 6]],
        [chain_parents(40), [-1, 0]],  # 6 bits x 40 levels: four 62-bit words, the request folded in
        [chain_parents(40), [-1], [-1], [-1], [-1, 0]],  # 3 request bits: no room, a sort by request
        [topk_parents(64, 4, 9)] * 3,  # 7 bits x 9 levels: two words
    ],
)
def test_on_device_equals_build(trees):
    """The device-side derivation (no host copy) gives exactly what the host build gives."""
    built = forest(trees)
    fast = TreeBatch.on_device(
        built.parents, built.cu_seqlens, built.depth, max_depth=built.max_depth, max_nodes=built.max_nodes
    )
    for f in dataclasses.fields(TreeBatch):
        a, b = getattr(fast, f.name), getattr(built, f.name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, f.name


def test_on_device_takes_upper_bounds():
    """Bounds for the depth and the largest request give the same order and sizes, paths padded."""
    built = forest([topk_parents(40, 4, 7), chain_parents(5)])
    fast = TreeBatch.on_device(built.parents, built.cu_seqlens, built.depth, max_depth=9, max_nodes=64)
    assert (fast.max_depth, fast.max_nodes) == (9, 64)
    assert torch.equal(fast.paths, torch.nn.functional.pad(built.paths, (0, 9 - built.max_depth), value=-1))
    for name in ("dfs_order", "subtree_size", "global_parents", "request", "depth"):
        assert torch.equal(getattr(fast, name), getattr(built, name)), name


def test_on_device_random_forests(gen):
    for _ in range(20):
        trees = [random_parents(int(torch.randint(1, 40, (1,), generator=gen)), 9, gen) for _ in range(3)]
        built = forest(trees)
        fast = TreeBatch.on_device(
            built.parents, built.cu_seqlens, built.depth, max_depth=built.max_depth, max_nodes=built.max_nodes
        )
        assert torch.equal(fast.dfs_order, built.dfs_order) and torch.equal(fast.paths, built.paths)
        assert torch.equal(fast.subtree_size, built.subtree_size)
