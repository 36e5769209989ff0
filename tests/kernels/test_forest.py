"""The forest-metadata kernel against the host build, and the dispatch of ``ops.forest``."""

import dataclasses

import pytest
import torch

from tests.kernels.helpers import DEVICE
from trtllm_bole import ops
from trtllm_bole.kernels.forest import MAX_NODES, forest_metadata
from trtllm_bole.testing import chain_parents, forest, random_parents, star_parents, topk_parents
from trtllm_bole.tree import TreeBatch

FIELDS = ("request", "global_parents", "paths", "dfs_order", "subtree_size")


def derived(tree: TreeBatch, max_depth: int, max_nodes: int) -> dict[str, torch.Tensor]:
    on = [getattr(tree, f).to(DEVICE) for f in ("parents", "cu_seqlens", "depth")]
    out = forest_metadata(*on, max_depth=max_depth, max_nodes=max_nodes)
    return {name: t.cpu() for name, t in zip(FIELDS, out, strict=True)}


def test_strided_parents_and_depths_give_the_same_forest():
    """Columns of a wider buffer: the kernel once read them flat and followed the neighbouring column's
    values as parents (wrong paths, reads out of bounds)."""
    built = forest([topk_parents(29, 4, 8), chain_parents(5)])
    buffer = torch.full((built.num_nodes, 2), 99, dtype=torch.long)
    parents, depth = buffer.clone(), buffer.clone()
    parents[:, 0], depth[:, 0] = built.parents, built.depth
    views = [t.to(DEVICE)[:, 0] for t in (parents, depth)]
    assert not any(t.is_contiguous() for t in views)
    out = forest_metadata(views[0], built.cu_seqlens.to(DEVICE), views[1], max_depth=built.max_depth,
                          max_nodes=built.max_nodes)  # fmt: skip
    for name, t in zip(FIELDS, out, strict=True):
        assert torch.equal(t.cpu(), getattr(built, name)), name
    tree = ops.forest(views[0], built.cu_seqlens.to(DEVICE), views[1], max_depth=built.max_depth,
                      max_nodes=built.max_nodes)  # fmt: skip
    assert all(getattr(tree, name).is_contiguous() for name in ("parents", "cu_seqlens", "depth", *FIELDS))


@pytest.mark.parametrize(
    "trees",
    [
        [[-1]],
        [topk_parents(29, 4, 8), [-1], [-1, 0, 1, 1, 0, 4]],  # a draft level's sizes, one lone root
        [topk_parents(63, 4, 8), chain_parents(3), star_parents(2), [-1, -1, 0, 1, 2, 0, -1, 6]],
        [chain_parents(40), [-1, 0]],
        [topk_parents(64, 4, 9)] * 3,
        [topk_parents(100, 3, 12)],
    ],
)
def test_equals_the_host_build(trees):
    built = forest(trees)
    got = derived(built, built.max_depth, built.max_nodes)
    for name in FIELDS:
        assert torch.equal(got[name], getattr(built, name)), name


def test_takes_upper_bounds_and_random_forests(gen):
    """Bounds for the depth and the largest request give the same order and sizes, paths -1 padded."""
    built = forest([topk_parents(40, 4, 7), chain_parents(5)])
    got = derived(built, 9, 64)
    assert torch.equal(got["paths"], torch.nn.functional.pad(built.paths, (0, 9 - built.max_depth), value=-1))
    for name in ("request", "global_parents", "dfs_order", "subtree_size"):
        assert torch.equal(got[name], getattr(built, name)), name
    for _ in range(6):
        trees = [random_parents(int(torch.randint(1, 40, (1,), generator=gen)), 9, gen) for _ in range(3)]
        built = forest(trees)
        got = derived(built, built.max_depth, built.max_nodes)
        for name in FIELDS:
            assert torch.equal(got[name], getattr(built, name)), name


def test_refuses_requests_larger_than_a_program_and_ops_falls_back():
    built = forest([chain_parents(3)])
    with pytest.raises(ValueError, match="up to 128 nodes"):
        forest_metadata(built.parents, built.cu_seqlens, built.depth, max_depth=3, max_nodes=MAX_NODES + 1)
    big = forest([topk_parents(200, 4, 9)])  # ops.forest derives it with torch, on any device
    on = [getattr(big, f).to(DEVICE) for f in ("parents", "cu_seqlens", "depth")]
    tree = ops.forest(*on, max_depth=big.max_depth, max_nodes=big.max_nodes)
    assert torch.equal(tree.dfs_order.cpu(), big.dfs_order)


@pytest.mark.gpu
def test_ops_forest_on_cuda_is_the_host_build():
    built = forest([topk_parents(64, 4, 9), chain_parents(9), [-1]])
    on = [getattr(built, f).cuda() for f in ("parents", "cu_seqlens", "depth")]
    tree = ops.forest(*on, max_depth=built.max_depth, max_nodes=built.max_nodes)
    for f in dataclasses.fields(TreeBatch):
        a, b = getattr(tree, f.name), getattr(built, f.name)
        assert torch.equal(a.cpu(), b) if isinstance(a, torch.Tensor) else a == b, f.name
