"""The paged KV commit kernel against the torch reference, and the value checks of ``ops.kv_commit``."""

import pytest
import torch

from tests.kernels.helpers import DEVICE
from trtllm_bole import ops
from trtllm_bole.kernels.kv_commit import kv_commit
from trtllm_bole.models.cache import NO_BLOCK
from trtllm_bole.reference.kv_cache import write_accepted_kv
from trtllm_bole.testing import chain_parents, forest, topk_parents
from trtllm_bole.tree import TreeBatch

PAGE = 4


def case(gen, dtype=torch.float32, layers=3, kvh=2, d=24, num_blocks=24):
    """Three requests (a top-4 tree, a chain, a single node), scattered blocks, several layers."""
    tree = forest([topk_parents(20, 4, 6), chain_parents(7), [-1]], device=DEVICE)
    k_cache = torch.randn(layers, num_blocks, PAGE, kvh, d, generator=gen).to(DEVICE, dtype)
    v_cache = torch.randn(layers, num_blocks, PAGE, kvh, d, generator=gen).to(DEVICE, dtype)
    new_k = torch.randn(layers, tree.num_nodes, kvh, d, generator=gen).to(DEVICE, dtype)  # the model's dtype
    new_v = torch.randn(layers, tree.num_nodes, kvh, d, generator=gen).to(DEVICE, dtype)
    tables = torch.randperm(num_blocks, generator=gen)[:18].view(3, 6).int().to(DEVICE)
    context_lens = torch.tensor([5, 9, 0], device=DEVICE)
    return tree, k_cache, v_cache, new_k, new_v, tables, context_lens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("leaves", [[13, 6, 0], [-1, 3, -1], [0, -1, 0]])
def test_matches_reference(leaves, dtype, gen):
    tree, k_cache, v_cache, new_k, new_v, tables, lens = case(gen, dtype)
    leaf = torch.tensor(leaves, device=DEVICE)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_accepted_kv(k_ref, v_ref, new_k, new_v, tree, leaf, tables, lens)
    kv_commit(k_cache, v_cache, new_k, new_v, tree, leaf, tables, lens)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)  # copies: bit for bit


def test_strided_tables_lengths_and_leaves_write_where_contiguous_ones_do(gen):
    """Views of wider buffers (a preallocated table's first columns, every other entry of a buffer): the
    kernel once indexed them as contiguous and wrote into blocks outside both requests' tables."""
    tree, k_cache, v_cache, new_k, new_v, tables, lens = case(gen)
    leaf = torch.tensor([13, 6, 0], device=DEVICE)
    wide = torch.full((3, 9), NO_BLOCK, dtype=tables.dtype, device=DEVICE)
    wide[:, :6] = tables
    views = wide[:, :6], torch.stack([lens, lens], 1)[:, 0], torch.stack([leaf, leaf], 1)[:, 0]
    assert not any(t.is_contiguous() for t in views)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kv_commit(k_ref, v_ref, new_k, new_v, tree, leaf, tables, lens)
    kv_commit(k_cache, v_cache, new_k, new_v, tree, views[2], views[0], views[1])
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_reference_writes_the_path_at_the_context_positions(gen):
    tree, k_cache, v_cache, new_k, new_v, tables, lens = case(gen)
    before = k_cache.clone()
    leaf = torch.tensor([13, -1, -1], device=DEVICE)
    ops.kv_commit(k_cache, v_cache, new_k, new_v, tree, leaf, tables, lens)
    path = tree.path(13)  # request 0 starts at node 0
    for j, node in enumerate(path.tolist()):
        pos = 5 + j
        block = int(tables[0, pos // PAGE])
        assert torch.equal(k_cache[:, block, pos % PAGE], new_k[:, node]), j
    written = (k_cache != before).any(dim=(0, 3, 4)).sum()
    assert int(written) == path.numel()  # nothing else moved


@pytest.mark.parametrize("commit", [kv_commit, write_accepted_kv], ids=["kernel", "reference"])
def test_prompt_chains_without_a_paths_table_write_their_tokens_in_order(commit, gen):
    """A prefill's chains (no paths table past 64 tokens): token j of a prompt accepted up to its leaf
    goes to position ``context_len + j``, the rest of the prompt and every other row stay."""
    tree = TreeBatch.chains([90, 5, 70], device=DEVICE)
    assert not tree.has_paths
    layers, kvh, d, blocks = 2, 2, 8, 96
    k_cache = torch.randn(layers, blocks, PAGE, kvh, d, generator=gen).to(DEVICE)
    v_cache = torch.randn(layers, blocks, PAGE, kvh, d, generator=gen).to(DEVICE)
    new_k, new_v = (torch.randn(layers, tree.num_nodes, kvh, d, generator=gen).to(DEVICE) for _ in range(2))
    tables = torch.randperm(blocks, generator=gen)[:90].view(3, 30).int().to(DEVICE)
    lens, leaf = torch.tensor([3, 0, 10], device=DEVICE), torch.tensor([89, -1, 59], device=DEVICE)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    for b, start, accepted in ((0, 0, 90), (2, 95, 60)):
        for j in range(accepted):
            pos = int(lens[b]) + j
            row = (int(tables[b, pos // PAGE]), pos % PAGE)
            k_want[:, row[0], row[1]], v_want[:, row[0], row[1]] = new_k[:, start + j], new_v[:, start + j]
    commit(k_cache, v_cache, new_k, new_v, tree, leaf, tables, lens)
    assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)


def test_value_checks(gen):
    tree, k_cache, v_cache, new_k, new_v, tables, lens = case(gen)
    args = (k_cache, v_cache, new_k, new_v, tree)
    chain_leaf = torch.tensor([0, 6, 0], device=DEVICE)  # request 1: its 7-node chain, positions 9-15
    with pytest.raises(ValueError, match="accepted_leaf 20 is outside"):
        ops.kv_commit(*args, torch.tensor([20, 0, 0], device=DEVICE), tables, lens)
    with pytest.raises(ValueError, match="block table holds 24 positions"):
        ops.kv_commit(*args, chain_leaf, tables, torch.tensor([5, 20, 0], device=DEVICE))
    bad = tables.clone()
    bad[1, 2] = -1  # positions 8-11
    with pytest.raises(ValueError, match="points outside the cache's 24 blocks"):
        ops.kv_commit(*args, chain_leaf, bad, lens)
    with pytest.raises(ValueError, match=r"context_lens must not be negative"):
        ops.kv_commit(*args, chain_leaf, tables, torch.tensor([5, -1, 0], device=DEVICE))


@pytest.mark.parametrize("commit", [ops.kv_commit, kv_commit], ids=["op", "kernel"])
def test_shape_checks(commit, gen):
    """Refused by name, by the op (before either device's implementation) and by the kernel's launcher:
    unchecked, a narrower entry or a smaller v_cache wrote into the neighbouring rows or buffer."""
    tree, k_cache, v_cache, new_k, new_v, tables, lens = case(gen)
    leaf = torch.tensor([0, 6, 0], device=DEVICE)
    for args, match in [
        ((k_cache, v_cache, new_k[:2], new_v[:2], tables, lens), r"new_k must be \[L=3, N=28, KVH=2, d=24\]"),
        (
            (k_cache, v_cache, new_k, new_v[..., :4], tables, lens),
            r"new_v must be \[L=3, N=28, KVH=2, d=24\]",
        ),
        ((k_cache, v_cache[:, :2], new_k, new_v, tables, lens), r"k_cache and v_cache must both be"),
        ((k_cache, v_cache, new_k, new_v, tables[:1], lens), r"block_tables must be an integer tensor \[B=3"),
        (
            (k_cache, v_cache, new_k, new_v, tables, lens[:1]),
            r"context_lens must be an integer tensor \[B=3\]",
        ),
        ((k_cache, v_cache, new_k, new_v, tables, lens.float()), r"context_lens must be an integer tensor"),
    ]:
        cache_k, cache_v, k, v, t, n = args
        with pytest.raises(ValueError, match=match):
            commit(cache_k, cache_v, k, v, tree, leaf, t, n)
    with pytest.raises(ValueError, match=r"accepted_leaf must be an integer tensor \[B=3\]"):
        commit(k_cache, v_cache, new_k, new_v, tree, leaf.float(), tables, lens)


@pytest.mark.parametrize("commit", [kv_commit, write_accepted_kv], ids=["kernel", "reference"])
def test_unchecked_writes_outside_a_request_s_blocks_are_dropped(commit, gen):
    """An unchecked caller's stray write (past a request's own blocks: a ``NO_BLOCK`` entry, or past the
    table) lands nowhere, least of all in another request's blocks."""
    tree, k_cache, v_cache, new_k, new_v, tables, _ = case(gen)
    tables[1, 2:] = NO_BLOCK  # request 1 owns positions 0-7 (its table padded, as the executor pads)
    lens = torch.tensor([21, 5, 0], device=DEVICE)
    leaf = torch.tensor([13, 6, 0], device=DEVICE)  # paths at positions 21-25 (table: 0-23), 5-11, 0
    k_before, v_before = k_cache.clone(), v_cache.clone()
    commit(k_cache, v_cache, new_k, new_v, tree, leaf, tables, lens)
    changed = (k_cache != k_before).any(dim=(0, 3, 4)) | (v_cache != v_before).any(dim=(0, 3, 4))
    written = {(int(block), int(row)) for block, row in torch.nonzero(changed)}
    inside = {  # (block, row) of each position inside its request's own blocks
        (int(tables[b, p // PAGE]), p % PAGE)
        for b, positions in ((0, (21, 22, 23)), (1, (5, 6, 7)), (2, (0,)))
        for p in positions
    }
    assert written == inside


@pytest.mark.parametrize("commit", [kv_commit, write_accepted_kv], ids=["kernel", "reference"])
@pytest.mark.parametrize("shift", [-2, -40], ids=["one-block-before", "past-the-table-before"])
def test_unchecked_negative_context_lengths_write_only_their_own_positions(commit, shift, gen):
    """A negative context length (refused by the checked op) puts the path's first nodes before
    position 0: both drop them rather than writing the block before the request's first one (the
    reference once wrapped them around to the table's last columns, or raised an IndexError)."""
    tree, k_cache, v_cache, new_k, new_v, tables, _ = case(gen)
    lens = torch.tensor([shift, 9, 0], device=DEVICE)
    leaf = torch.tensor([13, -1, -1], device=DEVICE)
    depth = int(tree.depth[13])
    k_before = k_cache.clone()
    commit(k_cache, v_cache, new_k, new_v, tree, leaf, tables, lens)
    written = {
        (int(block), int(row)) for block, row in torch.nonzero((k_cache != k_before).any(dim=(0, 3, 4)))
    }
    assert written == {(int(tables[0, p // PAGE]), p % PAGE) for p in range(depth + shift)}


def test_the_op_writes_a_strided_cache_in_place(gen):
    """Caches stored head-major ``[L, blocks, KVH, block_size, d]`` and handed over as a transposed view:
    the op on the CPU (the reference) once wrote a flattened copy of them and left them untouched; the
    kernel refuses them (it is written in place)."""
    tree, k_cache, v_cache, new_k, new_v, tables, lens = case(gen)
    leaf = torch.tensor([13, 6, 0], device=DEVICE)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    write_accepted_kv(k_want, v_want, new_k, new_v, tree, leaf, tables, lens)
    k_view, v_view = (t.transpose(2, 3).contiguous().transpose(2, 3) for t in (k_cache, v_cache))
    assert not k_view.is_contiguous()
    if k_view.is_cuda:
        with pytest.raises(ValueError, match="k_cache must be contiguous"):
            ops.kv_commit(k_view, v_view, new_k, new_v, tree, leaf, tables, lens)
    else:
        ops.kv_commit(k_view, v_view, new_k, new_v, tree, leaf, tables, lens)
        assert torch.equal(k_view, k_want) and torch.equal(v_view, v_want)


@pytest.mark.parametrize("commit", [kv_commit, write_accepted_kv], ids=["kernel", "reference"])
def test_unchecked_block_ids_past_the_cache_are_dropped(commit, gen):
    """A corrupt table (block ids past the cache, refused by the checked op) writes nothing anywhere."""
    tree, k_cache, v_cache, new_k, new_v, tables, lens = case(gen)
    tables[0, :] = k_cache.shape[1] + 1
    k_before, v_before = k_cache.clone(), v_cache.clone()
    commit(k_cache, v_cache, new_k, new_v, tree, torch.tensor([13, -1, -1], device=DEVICE), tables, lens)
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)


@pytest.mark.parametrize(
    "commit", [ops.kv_commit, kv_commit, write_accepted_kv], ids=["op", "kernel", "reference"]
)
def test_empty_block_tables_with_nothing_accepted_write_nothing(commit, gen):
    """Tables of no columns yet: the CPU's path indexed the empty table (an IndexError, checked or not)
    where the kernel wrote nothing."""
    tree, k_cache, v_cache, new_k, new_v, _, lens = case(gen)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    empty = torch.zeros(3, 0, dtype=torch.long, device=DEVICE)
    commit(k_cache, v_cache, new_k, new_v, tree, torch.full((3,), -1, device=DEVICE), empty, lens)
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)
