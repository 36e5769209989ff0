import pytest
import torch

from trtllm_bole.models.config import load_config
from trtllm_bole.models.loader import random_model
from trtllm_bole.spec.acceptance import greedy_accept
from trtllm_bole.spec.draft_graphs import SelectGraphs, _placeholder_pool
from trtllm_bole.spec.drafter import (
    CandidatePool,
    DraftSettings,
    _best_per_request,
    select_tree,
    selection_size,
)
from trtllm_bole.spec.tree_select import children_log_rho, compact_forest, rank_order, select_nodes
from trtllm_bole.testing import CUDA_HEADS, TINY_MTP_CONFIG, topk_parents
from trtllm_bole.tree import TreeBatch


def test_children_accumulate_log_rho_and_never_beat_their_parent():
    log_q = torch.tensor([[0.5, 0.3], [0.8, 1.0 + 1e-6]]).log()  # a probability rounded above 1
    log_rho = children_log_rho(torch.tensor([0.0, -1.0]), log_q)
    assert torch.allclose(log_rho.exp(), torch.tensor([[0.5, 0.3], [0.8 * 0.3679, 0.3679]]), atol=1e-4)
    assert float(log_rho[1, 1]) == -1.0


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_a_draft_row_of_nan_log_probabilities_ranks_last_and_keeps_the_tree_prefix_closed(kind):
    """An MTP row that overflowed (an infinite logit) gives NaN log-probabilities; its children's log ρ
    must read as -inf (never likelier than their parent), else they ranked first: a selection kept them
    without their parent, the compacted forest made each a second root child, and greedy acceptance
    took it unverified (a token plain greedy decoding never emits)."""
    settings = DraftSettings.of([0.0 if kind == "greedy" else 0.8], [0], [1.0], "cpu")
    logits = torch.tensor([[3.0, 2.0, 0.0, 0.0, 0.0], [float("inf"), 1.0, 0.0, -1.0, 2.0]])
    log_q, _ = settings.top_log_probs(logits, torch.tensor([0, 0]), 2)
    assert bool(log_q[1].isnan().all())  # what the MTP's overflowed row gives
    log_rho = children_log_rho(torch.tensor([0.0, -0.5]), log_q)
    # Pending token 0; its children 1 and 2; node 1's children 3 and 4 from the overflowed row.
    pool = CandidatePool(torch.tensor([10, 11, 12, 13, 14]), torch.tensor([-1, 0, 0, 1, 1]),
                         torch.zeros(5, dtype=torch.long), torch.tensor([1, 2, 2, 3, 3]),
                         torch.cat([torch.tensor([0.0, -5.0, -0.2]), log_rho[1]]), 3, 2)  # fmt: skip
    for total in (None, 3):
        tokens, tree, index = select_tree(pool, 1, per_request=2, total=total)
        assert sorted(index.tolist()) == [0, 1, 2]
        TreeBatch.build(tree.parents, tree.cu_seqlens)  # one root child: the pending token
        leaf, bonus = greedy_accept(tree, tokens, torch.tensor([12, 99, 7]))
        assert tokens[leaf].tolist() == [12] and bonus.tolist() == [7]  # plain greedy: 12, then 7
    assert log_rho[1].tolist() == [float("-inf")] * 2 and bool((log_rho[0] <= 0).all())


def test_rank_order_breaks_ties_by_depth_then_index():
    log_rho = torch.tensor([0.0, -1.0, 0.0, -1.0])
    depth = torch.tensor([2, 1, 1, 3])
    assert rank_order(log_rho, depth).tolist() == [2, 0, 1, 3]


def test_rank_order_ranks_each_row_of_a_grid():
    log_rho = torch.tensor([[0.0, -1.0, 0.0], [-2.0, -1.0, -1.0]])
    depth = torch.tensor([[2, 1, 1], [1, 3, 2]])
    assert rank_order(log_rho, depth).tolist() == [[2, 0, 1], [2, 1, 0]]


# Two requests. Request 0: nodes 0..4, request 1: nodes 5..7 (node 0 / 5 pending, log rho 0).
LOG_RHO = torch.tensor([0.0, -0.1, -0.5, -0.2, -0.3, 0.0, 0.0, -2.0])
DEPTH = torch.tensor([1, 2, 2, 3, 3, 1, 2, 3])
REQUEST = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
PARENTS = torch.tensor([-1, 0, 0, 1, 1, -1, 5, 6])
FLOOR = torch.tensor([1, 0, 0, 0, 0, 1, 0, 0], dtype=torch.bool)


def test_batch_budget_takes_highest_rho_across_the_batch():
    keep = select_nodes(LOG_RHO, DEPTH, REQUEST, 2, total=5, floor=FLOOR)
    # floor {0, 5}; then best by rho: 6 (0.0, depth 2), 1 (-0.1), 3 (-0.2)
    assert torch.nonzero(keep).flatten().tolist() == [0, 1, 3, 5, 6]


def test_per_request_cap_and_floor_beyond_capacity():
    keep = select_nodes(LOG_RHO, DEPTH, REQUEST, 2, per_request=2, floor=FLOOR)
    assert torch.nonzero(keep).flatten().tolist() == [0, 1, 5, 6]
    keep = select_nodes(LOG_RHO, DEPTH, REQUEST, 2, total=1, floor=FLOOR)
    assert torch.nonzero(keep).flatten().tolist() == [0, 5]  # the floor survives any budget


def test_selection_is_prefix_connected_on_random_trees():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        n = 40
        parents = torch.tensor([-1] + [int(torch.randint(i, (1,), generator=gen)) for i in range(1, n)])
        log_q = -torch.rand(n, generator=gen)
        log_q[0] = 0.0
        log_q[torch.rand(n, generator=gen) < 0.2] = 0.0  # ties with the parent happen (q = 1)
        tree = TreeBatch.build(parents, torch.tensor([0, n]))
        log_rho = log_q[tree.paths.clamp(min=0)].masked_fill(tree.paths < 0, 0.0).sum(1)
        total = int(torch.randint(1, n, (1,), generator=gen))
        keep = select_nodes(log_rho, tree.depth, tree.request, 1, total=total)
        kept_parents = parents[keep]
        assert bool(keep[kept_parents[kept_parents >= 0]].all())


def test_compact_forest_renumbers_parents_locally():
    keep = torch.tensor([1, 1, 0, 1, 0, 1, 1, 0], dtype=torch.bool)
    parents, cu, kept = compact_forest(PARENTS, REQUEST, 2, keep)
    assert parents.tolist() == [-1, 0, 1, -1, 0]
    assert cu.tolist() == [0, 3, 5]
    assert kept.tolist() == [0, 1, 3, 5, 6]
    TreeBatch.build(parents, cu)  # a valid forest


def test_compact_forest_with_a_known_count_matches():
    keep = torch.tensor([1, 1, 0, 1, 0, 1, 1, 0], dtype=torch.bool)
    expected = compact_forest(PARENTS, REQUEST, 2, keep)
    fast = compact_forest(PARENTS, REQUEST, 2, keep, num_kept=5, check=False)
    assert all(torch.equal(got, want) for got, want in zip(fast, expected, strict=True))
    with pytest.raises(ValueError, match="not prefix-closed"):
        compact_forest(PARENTS, REQUEST, 2, torch.tensor([1, 0, 0, 1, 0, 1, 1, 0], dtype=torch.bool))
    with pytest.raises(ValueError, match="keep holds 5 nodes, not num_kept=4"):
        compact_forest(PARENTS, REQUEST, 2, keep, num_kept=4)


def _draft_like_pool(
    num_requests: int, nodes: int, gen: torch.Generator, *, top_k: int = 4, depth: int = 8
) -> CandidatePool:
    """Every request a top-``top_k`` tree of ``nodes`` nodes (as drafting makes them: as many per request),
    log ρ falling along paths, interleaved across requests level by level like a draft's pool."""
    tree = TreeBatch.build(
        torch.tensor(topk_parents(nodes, top_k, depth) * num_requests),
        torch.arange(num_requests + 1) * nodes,
    )
    drop = -torch.rand(tree.num_nodes, generator=gen)
    log_rho = torch.where(tree.paths >= 0, drop[tree.paths.clamp(min=0)], 0.0).sum(1) - drop
    order = torch.argsort(tree.depth * tree.num_nodes + torch.arange(tree.num_nodes))  # level by level
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())
    parents = torch.where(tree.global_parents >= 0, position[tree.global_parents.clamp(min=0)], -1)
    root_children = int((tree.depth == 2).sum()) // num_requests
    return CandidatePool(
        torch.randint(100, (tree.num_nodes,), generator=gen)[order], parents[order], tree.request[order],
        tree.depth[order], log_rho[order], int(tree.max_depth), root_children,
    )  # fmt: skip


@pytest.mark.parametrize("total", [None, 2, 5, 17, 60, 500])
@pytest.mark.parametrize("per_request", [2, 4, 16, 100])
def test_select_tree_on_the_device_equals_the_checked_host_build(total, per_request, gen):
    """No sync, host-known sizes: the same nodes and forest as counting the kept nodes on the device,
    checking the selection and building the forest on the host (the paths padded to the pool's depth)."""
    pool = _draft_like_pool(3, 20, gen)
    tokens, tree, index = select_tree(pool, 3, per_request=per_request, total=total)
    grouped = torch.sort(pool.request, stable=True).indices
    position = torch.empty_like(grouped)
    position[grouped] = torch.arange(grouped.numel())
    parents = pool.parents[grouped]
    parents = torch.where(parents >= 0, position[parents.clamp(min=0)], -1)
    request, depth = pool.request[grouped], pool.depth[grouped]
    floor = depth <= 2 if total is not None else None  # the fairness floor is against a budget only
    keep = select_nodes(
        pool.log_rho[grouped], depth, request, 3, per_request=per_request + 1, total=total, floor=floor
    )
    local, cu_seqlens, kept = compact_forest(parents, request, 3, keep)  # counted and checked
    built = TreeBatch.build(local, cu_seqlens)
    assert torch.equal(index, grouped[kept]) and torch.equal(tokens, pool.tokens[grouped[kept]])
    assert tree.max_nodes >= built.max_nodes and tree.max_depth == pool.max_depth >= built.max_depth
    width = tree.paths.shape[1]
    assert torch.equal(
        tree.paths, torch.nn.functional.pad(built.paths, (0, width - built.max_depth), value=-1)
    )
    for name in ("parents", "cu_seqlens", "depth", "request", "global_parents", "dfs_order", "subtree_size"):
        assert torch.equal(getattr(tree, name), getattr(built, name)), name


def test_without_a_budget_each_request_keeps_its_best_drafts_not_its_floor():
    """No budget, no fairness floor: a cap of 3 drafts keeps the likeliest path (the first child, its
    child and grandchild), where the floor taken first kept 3 of the 4 children (mean accepted tokens of
    the embedded model at 4 drafts: 1.97 instead of 3.48). Under a budget the floor ranks first."""
    parents = torch.tensor([-1, 0, 0, 0, 0, 1, 5])
    depth = torch.tensor([1, 2, 2, 2, 2, 3, 4])
    log_rho = torch.tensor([0.0, -0.1, -3.0, -3.1, -3.2, -0.2, -0.3])
    pool = CandidatePool(torch.arange(7), parents, torch.zeros(7, dtype=torch.long), depth, log_rho, 4, 4)
    assert sorted(select_tree(pool, 1, per_request=3)[2].tolist()) == [0, 1, 5, 6]
    assert sorted(select_tree(pool, 1, per_request=3, total=4)[2].tolist()) == [0, 1, 2, 3]


def test_selection_size_counts_what_select_tree_keeps(gen):
    """Every request keeps its floor (its pending token and up to ``per_request`` of its children);
    ``total`` caps the rest. Keeping ``total`` equal to the count selects the same nodes as the ``total``
    that gave it (the selection graphs' key)."""
    pool = _draft_like_pool(3, 20, gen)
    assert pool.root_children == 4
    for per_request in (1, 2, 4, 16, 100):
        for total in (None, 1, 2, 5, 14, 15, 16, 17, 60, 500):
            num_kept, max_nodes = selection_size(60, 3, per_request, total, root_children=4)
            _, tree, index = select_tree(pool, 3, per_request=per_request, total=total)
            depth, request = pool.depth, pool.request
            keep = select_nodes(pool.log_rho, depth, request, 3, per_request=per_request + 1, total=total,
                                floor=depth <= 2 if total is not None else None)  # fmt: skip
            assert int(keep.sum()) == num_kept  # counted on the device, not by selection_size
            sizes = tree.cu_seqlens.diff()
            assert tree.num_nodes == num_kept and tree.max_nodes == max_nodes >= int(sizes.max())
            again = select_tree(pool, 3, per_request=per_request, total=None if total is None else num_kept)[
                2
            ]
            assert torch.equal(index, again), (per_request, total)


def test_the_fairness_floor_keeps_every_requests_first_draft_level(gen):
    """BOLE.md §5: under a budget smaller than the batch's best nodes, each request still verifies its
    pending token and its children; the budget left over goes to the highest ρ across the batch."""
    pool = _draft_like_pool(2, 20, gen)
    pool.log_rho[pool.request == 1] *= 100  # request 1's drafts all far less likely than request 0's
    for total, drafted in ((5, [4, 4]), (10, [4, 4]), (14, [8, 4]), (100, [19, 19])):
        _, tree, index = select_tree(pool, 2, per_request=63, total=total)
        assert (tree.cu_seqlens.diff() - 1).tolist() == drafted, total
        assert bool((pool.depth[index] <= 2).sum() == 10)  # both pending tokens and all their children


@pytest.mark.parametrize("seed", range(40))
def test_the_floor_and_the_budget_on_random_pools(seed):
    """Any batch, tree shape, cap and budget: the selection is a valid forest of the predicted size, every
    request keeps its pending token and its best children up to the cap, and no node left out (with its
    parent kept and room in its request) is likelier than a kept node outside the floor."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    num_requests, top_k, depth = draw(1, 5), draw(1, 5), draw(2, 6)
    pool = _draft_like_pool(num_requests, draw(depth, 30), gen, top_k=top_k, depth=depth)
    per_request, total = draw(1, pool.tokens.numel() // num_requests + 2), draw(1, pool.tokens.numel() + 3)
    num_kept, max_nodes = selection_size(
        pool.tokens.numel(), num_requests, per_request, total, root_children=pool.root_children
    )
    _, tree, index = select_tree(pool, num_requests, per_request=per_request, total=total)
    TreeBatch.build(tree.parents, tree.cu_seqlens)  # a valid forest (every kept parent kept)
    sizes = tree.cu_seqlens.diff()
    assert tree.num_nodes == num_kept and int(sizes.max()) <= max_nodes <= per_request + 1
    keep = torch.zeros(pool.tokens.numel(), dtype=torch.bool)
    keep[index] = True
    order = rank_order(pool.log_rho, pool.depth).tolist()
    in_floor = torch.zeros_like(keep)
    for r in range(num_requests):  # the pending token and its children, best first, up to the cap
        in_floor[[i for i in order if pool.request[i] == r and pool.depth[i] <= 2][: per_request + 1]] = True
    assert bool(keep[in_floor].all())
    room = sizes[pool.request] < per_request + 1
    parent_kept = (pool.parents < 0) | keep[pool.parents.clamp(min=0)]
    left_out = ~keep & room & parent_kept
    chosen = keep & ~in_floor
    if bool(left_out.any()) and bool(chosen.any()):
        assert float(pool.log_rho[left_out].max()) <= float(pool.log_rho[chosen].min())


@pytest.mark.parametrize(("requests", "per_request", "root_children", "cap"), [(1, 1, 0, 4), (3, 5, 4, 2),
                         (3, 37, 4, 63), (2, 37, 4, 10), (4, 9, 8, 3)])  # fmt: skip
def test_the_capture_placeholder_keeps_what_the_host_counts(requests, per_request, root_children, cap):
    """A selection graph is captured on a placeholder pool after two eager runs that use the host's count
    of the nodes kept: at every count a budget gives, the placeholder keeps exactly that many."""
    size = requests * per_request
    for total in (None, 1, requests * (1 + root_children), size // 2 + 1, size):
        num_kept, _ = selection_size(size, requests, cap, total, root_children=root_children)
        pool = _placeholder_pool(requests, per_request, 3, root_children, torch.device("cpu"))
        keep = select_nodes(pool.log_rho, pool.depth, pool.request, requests, per_request=cap + 1,
                            total=num_kept, floor=pool.depth <= 2)  # fmt: skip
        assert int(keep.sum()) == num_kept, total
        compact_forest(pool.parents, pool.request, requests, keep)  # prefix-closed


@pytest.mark.gpu
def test_selection_graphs_replay_select_tree_for_any_pool_values(gen):
    """One graph per (requests, pool size, depth, cap, nodes kept), captured on first sight or ahead of
    traffic on a placeholder pool; its replays select what the eager selection does, pool after pool."""
    config = load_config({**TINY_MTP_CONFIG, **CUDA_HEADS})  # heads the CUDA kernels tile
    mtp = random_model(config, seed=0, device="cuda").mtp  # the graphs hold it weakly
    graphs = SelectGraphs.of(mtp)
    assert graphs.capture([(3, 60, 8, 4, 16)]) == [(3, 60, 8, 4, 16, 51, False)]
    for round_, total in enumerate((None, 17, 500, 2, 17)):
        pool = _draft_like_pool(3, 20, gen)
        pool = CandidatePool(*(t.cuda() for t in (pool.tokens, pool.parents, pool.request, pool.depth,
                                                   pool.log_rho)), 8, 4)  # fmt: skip
        want = select_tree(pool, 3, per_request=16, total=total)
        got = graphs(pool, 3, per_request=16, total=total)
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]), round_
        for name in ("parents", "cu_seqlens", "depth", "request", "global_parents", "paths", "dfs_order"):
            assert torch.equal(getattr(got[1], name), getattr(want[1], name)), (round_, name)
    assert graphs.captured == [
        (3, 60, 8, 4, 16, 15, True), (3, 60, 8, 4, 16, 17, True), (3, 60, 8, 4, 16, 51, False),
        (3, 60, 8, 4, 16, 51, True),
    ]  # fmt: skip


def test_beam_keeps_the_best_of_each_request_grouped_and_best_first():
    # Two requests (pool nodes 0, 1), then six children each, interleaved across requests in the pool
    # and handed over grouped by request, each request's in creation order (as drafting does).
    request = torch.tensor([0, 1] + [0, 1] * 6)
    log_rho = torch.tensor([0.0, 0.0, -3, -1, -2, -6, -1, -2, -5, -3, -4, -4, -6, -5])
    parents, depth = torch.tensor([-1, -1] + [0, 1] * 6), torch.tensor([1, 1] + [2] * 12)
    pool = CandidatePool(torch.arange(14), parents, request, depth, log_rho)
    children = torch.tensor([2, 4, 6, 8, 10, 12, 3, 5, 7, 9, 11, 13])
    best = _best_per_request(pool, children, 2, 3)  # columns of each request's children
    assert best.tolist() == [[2, 1, 0], [0, 2, 3]]
    assert children.view(2, -1).gather(1, best).tolist() == [[6, 4, 2], [3, 7, 9]]
    with pytest.raises(ValueError, match="do not give 2 requests 7 each"):
        _best_per_request(pool, children, 2, 7)
