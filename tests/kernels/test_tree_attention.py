"""Tree attention over the paged cache: the Triton kernel against the torch path in float64, the torch
path against attention written node by node, and the checks of ``ops.tree_attention``."""

import pytest
import torch

from tests.kernels.helpers import DEVICE, rel_rms
from trtllm_bole import ops
from trtllm_bole.kernels.tree_attention import tree_attention
from trtllm_bole.reference import attention_tree
from trtllm_bole.testing import chain_parents, forest, topk_parents

PAGE = 4


def case(gen, dtype=torch.float32, hq=4, kvh=2, d=16, lens=(5, 0, 13, 30), trees=None, num_blocks=48):
    """A top-4 tree, a single node, a chain and a top-2 tree, scattered blocks, context lengths that are
    not multiples of the page (and one empty)."""
    trees = trees or [topk_parents(12, 4, 4), [-1], chain_parents(9), topk_parents(20, 2, 6)]
    tree = forest(trees, device=DEVICE)
    n, b = tree.num_nodes, tree.num_requests

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)

    q, k, v = randn(n, hq, d), randn(n, kvh, d), randn(n, kvh, d)
    k_cache, v_cache = randn(num_blocks, PAGE, kvh, d), randn(num_blocks, PAGE, kvh, d)
    width = -(-max(lens) // PAGE) + 1
    tables = torch.randperm(num_blocks, generator=gen)[: b * width].view(b, width).int().to(DEVICE)
    return q, k, v, k_cache, v_cache, tables, torch.tensor(lens, device=DEVICE), tree


def float64_reference(q, k, v, k_cache, v_cache, tables, lens, tree):
    args = [t.double() for t in (q, k, v, k_cache, v_cache)]
    return attention_tree.tree_attention(*args, tables, lens, tree, q.shape[-1] ** -0.5)


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"]
)
@pytest.mark.parametrize(("hq", "kvh", "d"), [(4, 2, 16), (6, 2, 64), (2, 1, 40), (2, 1, 256)])
def test_matches_the_float64_torch_path(dtype, tol, hq, kvh, d, gen, nan_outputs):
    """Grouped heads, a head dim that is not a power of two, Qwen3.5's 256 (whose fp32 tiles once took
    more shared memory than an H200 SM has: tests/hopper_compile.py); every row written (outputs
    NaN-poisoned)."""
    args = case(gen, dtype, hq, kvh, d)
    out = tree_attention(*args, d**-0.5)
    assert out.dtype == dtype and out.shape == args[0].shape
    assert rel_rms(out, float64_reference(*args)) < tol


def test_requests_larger_than_a_block_of_nodes_and_long_contexts(gen, nan_outputs):
    """More nodes than one program's block of queries and one block of keys, and a context of several
    key blocks: every block boundary inside a request."""
    trees = [topk_parents(100, 4, 8), chain_parents(40), topk_parents(70, 3, 6)]
    args = case(gen, trees=trees, lens=(150, 3, 64), num_blocks=128)
    assert rel_rms(tree_attention(*args, 16**-0.5), float64_reference(*args)) < 1e-5


@pytest.mark.parametrize("splits", [2, 3])
def test_contexts_split_across_programs_combine_to_the_same_attention(splits, gen, nan_outputs):
    """Each split streams its share of the committed positions (a request's context may end in any
    split, or be empty), split 0 also the forest's nodes; the second launch combines them."""
    trees = [topk_parents(100, 4, 8), chain_parents(40), topk_parents(70, 3, 6), [-1]]
    args = case(gen, trees=trees, lens=(150, 3, 64, 0), num_blocks=180)
    out = tree_attention(*args, 16**-0.5, splits=splits)
    assert rel_rms(out, float64_reference(*args)) < 1e-5


def test_split_count_takes_splits_where_they_cut_the_waves():
    from trtllm_bole.kernels.tree_attention import min_chunk, split_count

    c = min_chunk(256)
    assert c == 128 and min_chunk(64) == 2048  # smaller heads: contexts of 2,048 per split at least
    assert split_count(16, 128 * c, 132, c) == 8  # one request: 128 programs, one wave
    assert split_count(24, 128 * c, 132, c) == 5
    assert split_count(16, 4 * c, 132, c) == 4  # at most one split per min_chunk positions
    assert split_count(192, 128 * c, 132, c) == 2  # 1.5 waves whole, 3 waves of halves
    assert split_count(128, 128 * c, 132, c) == 1  # a batch that fills the SMs once runs whole
    assert split_count(256, 128 * c, 132, c) == 1  # two full waves: splitting gains nothing
    assert split_count(16, c - 1, 132, c) == 1
    assert split_count(16, 1024, 132, min_chunk(64)) == 1


def test_the_torch_path_is_attention_written_node_by_node(gen):
    """Each node: softmax over its request's committed positions (read through the block table) and its
    path in the forest, in float64."""
    q, k, v, k_cache, v_cache, tables, lens, tree = case(gen, torch.float64)
    out = attention_tree.tree_attention(q, k, v, k_cache, v_cache, tables, lens, tree, 16**-0.5)
    group = q.shape[1] // k.shape[1]
    for i in range(tree.num_nodes):
        b = int(tree.request[i])
        rows = [int(tables[b, p // PAGE]) * PAGE + p % PAGE for p in range(int(lens[b]))]
        path = tree.path(i).tolist()
        keys = torch.cat([k_cache.flatten(0, 1)[rows], k[path]])
        values = torch.cat([v_cache.flatten(0, 1)[rows], v[path]])
        for h in range(q.shape[1]):
            weights = torch.softmax(keys[:, h // group] @ q[i, h] * 16**-0.5, 0)
            torch.testing.assert_close(out[i, h], weights @ values[:, h // group])


def test_positions_past_the_table_are_left_out_and_negative_entries_read_block_0(gen):
    """Unchecked values (the op does not sync to check them) give what the torch path gives, never a read
    outside the cache: a context longer than the table (even past 2³¹) is cut at the table, a NO_BLOCK
    entry reads block 0."""
    q, k, v, k_cache, v_cache, tables, _, tree = case(gen)
    tables[2, 1] = -1
    # Request 3's table holds 9 pages; requests 0's and 1's int64 lengths would wrap to 5 if cast to int32
    # first; request 1's negative length attends to no committed position.
    lens = torch.tensor([2**32 + 5, -(2**32) + 5, 13, 10 * PAGE], device=DEVICE)
    args = (q, k, v, k_cache, v_cache, tables, lens, tree)
    assert rel_rms(tree_attention(*args, 16**-0.5), float64_reference(*args)) < 1e-5


def test_a_permuted_query_view_is_written_row_major(gen):
    """q with permuted strides (dense storage of ``[Hq, N, d]`` seen as ``[N, Hq, d]``): the output was
    once allocated with q's strides and written as if row-major."""
    q, *rest = case(gen)
    permuted = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert torch.equal(permuted, q) and not permuted.is_contiguous()
    for splits in (1, 2):
        out = tree_attention(permuted, *rest, 16**-0.5, splits=splits)
        assert rel_rms(out, float64_reference(q, *rest)) < 1e-5


@pytest.mark.parametrize("attend", [ops.tree_attention, tree_attention], ids=["op", "kernel"])
def test_arguments_are_checked_by_name(attend, gen):
    """By the op and by the kernel's launcher, with the same checks: unchecked, the launcher read caches
    laid out ``[block_size, num_blocks, ...]`` (transposed views) as row-major ones (error 1.68)."""
    q, k, v, k_cache, v_cache, tables, lens, tree = case(gen)
    for bad, match in [
        ({"q": q[:-1]}, r"q must be \[N=42, Hq, d\]"),
        ({"k": k[:, :1].expand(-1, 3, -1)}, r"Hq=4 a multiple of KVH"),
        ({"k": k[:, :0], "v": v[:, :0]}, r"multiple of KVH, got \(42, 0, 16\)"),  # was ZeroDivisionError
        ({"v": v[..., :8]}, r"k and v must both be \[N=42, KVH, d=16\]"),
        ({"k_cache": k_cache[..., :8]}, r"k_cache and v_cache must both be \[num_blocks, block_size, KVH=2"),
        ({"v_cache": v_cache.half()}, r"must share one dtype of"),
        (
            {"k_cache": k_cache.transpose(0, 1), "v_cache": v_cache.transpose(0, 1)},
            r"caches must be contiguous",
        ),
        ({"k_cache": k_cache[:0], "v_cache": v_cache[:0]}, r"at least one block"),
        ({"block_tables": tables[:2]}, r"block_tables must be an integer tensor \[B=4"),
        ({"context_lens": lens.float()}, r"context_lens must be an integer tensor \[B=4\]"),
    ]:
        call = {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "block_tables": tables,
                "context_lens": lens} | bad  # fmt: skip
        with pytest.raises(ValueError, match=match):
            attend(**call, tree=tree, scale=0.25)
    fp8 = [t.to(torch.float8_e4m3fn) for t in (q, k, v, k_cache, v_cache)]
    with pytest.raises(ValueError, match=r"must share one dtype of"):
        attend(*fp8, tables, lens, tree, scale=0.25)


def test_op_dispatches_and_takes_float64_on_the_cpu_only(gen):
    q, k, v, k_cache, v_cache, tables, lens, tree = case(gen)
    out = ops.tree_attention(q, k, v, k_cache, v_cache, tables, lens, tree, scale=0.25)
    assert rel_rms(out, float64_reference(q, k, v, k_cache, v_cache, tables, lens, tree)) < 1e-5
    if DEVICE == "cuda":  # float64 has the CPU's torch path only
        with pytest.raises(ValueError, match=r"float64 on the CPU's torch path only"):
            ops.tree_attention(
                *(t.double() for t in (q, k, v, k_cache, v_cache)), tables, lens, tree, scale=0.25
            )
    else:
        out = ops.tree_attention(
            *(t.double() for t in (q, k, v, k_cache, v_cache)), tables, lens, tree, scale=0.25
        )
        assert out.dtype == torch.float64


@pytest.mark.gpu
@pytest.mark.parametrize(("hq", "kvh"), [(16, 4), (24, 4)], ids=["9b", "27b"])
@pytest.mark.parametrize("lens", [(1000, 517, 3, 1203), (9000,)], ids=["batch4", "batch1-split"])
def test_qwen35_attention_sizes_on_the_gpu(hq, kvh, lens, gen, nan_outputs):
    """Qwen3.5-9B/27B full-attention heads (head dim 256), 64-node trees over contexts of ~1,000 tokens,
    and one request over 9,000 (its context split across programs)."""
    trees = [topk_parents(64, 4, 8)] * len(lens)
    args = case(gen, torch.bfloat16, hq, kvh, 256, lens=lens, trees=trees, num_blocks=2400)
    assert rel_rms(tree_attention(*args, 256**-0.5), float64_reference(*args)) < 2e-2
