import pytest
import torch

from trtllm_bole.spec.acceptance import (
    CDF_BLOCK,
    accept,
    draw_coins,
    greedy_accept,
    inverse_cdf,
    sample_accept,
    two_level_cdf,
)
from trtllm_bole.spec.sampling import ProcessedLogits, process_logits
from trtllm_bole.testing import forest

# Request 0:            Request 1:
#   0 (pending, tok 5)    0 (pending, tok 9)
#   ├─ 1 (tok 7)          └─ 1 (tok 3)
#   │  └─ 3 (tok 2)
#   └─ 2 (tok 8)
#      └─ 4 (tok 6)
TREES = [[-1, 0, 0, 1, 2], [-1, 0]]
TOKENS = torch.tensor([5, 7, 8, 2, 6, 9, 3])


def test_greedy_follows_the_matching_child_and_emits_the_bonus():
    tree = forest(TREES)
    # target argmax at each node: node0 -> 8 (matches child 2), node2 -> 6 (matches 4), node4 -> 1
    argmax = torch.tensor([8, 0, 6, 0, 1, 4, 0])
    leaf, bonus = greedy_accept(tree, TOKENS, argmax)
    assert leaf.tolist() == [4, 0]  # request 1: target wants 4, draft said 3 -> only pending
    assert bonus.tolist() == [1, 4]


def test_greedy_nothing_matches_keeps_pending_only():
    tree = forest(TREES)
    argmax = torch.tensor([0, 0, 0, 0, 0, 3, 11])
    leaf, bonus = greedy_accept(tree, TOKENS, argmax)
    assert leaf.tolist() == [0, 1] and bonus.tolist() == [0, 11]


def test_greedy_duplicate_sibling_tokens_take_the_first():
    tree = forest([[-1, 0, 0]])
    leaf, bonus = greedy_accept(tree, torch.tensor([1, 4, 4]), torch.tensor([4, 7, 9]))
    assert leaf.tolist() == [1] and bonus.tolist() == [7]


def test_greedy_ties_go_to_the_lowest_token_as_plain_greedy_decoding():
    """Exact ties at the maximum (bf16 logits over a real vocabulary have them): a verify takes the first
    maximal index, as ``argmax`` in plain decoding does, so a draft of a later tied token is rejected and
    the bonus is the first. Request 0 drafts the second tied token, request 1 the first."""
    tree = forest([[-1, 0], [-1, 0]])
    logits = torch.zeros(4, 6)
    logits[:, [2, 4]] = 1.0  # tokens 2 and 4 tie at every node
    leaf, bonus = accept(tree, torch.tensor([0, 4, 0, 2]), logits, None)
    assert leaf.tolist() == [0, 1] and bonus.tolist() == [2, 2]


def walk(parents: list[int], tokens: list[int], probs: torch.Tensor, coins: torch.Tensor) -> tuple[int, int]:
    """The textbook walk of one request, node by node in float64 (the oracle): from node 0, try each
    node's children in index order, child x passing when its coin is below the residual at x, which
    then loses x's mass; after the last rejected child, the bonus token by inverse CDF at the last coin."""
    node = 0
    while True:
        residual = probs[node].double().clone()
        for child in [c for c, parent in enumerate(parents) if parent == node]:
            if coins[child] < residual[tokens[child]]:
                node = child
                break
            residual[tokens[child]] = 0.0
            residual = residual / residual.sum() if residual.sum() > 0 else probs[node].double()
        else:
            cdf = residual.cumsum(0)
            return node, int((cdf > coins[-1] * cdf[-1]).nonzero()[0])


def random_forest(gen: torch.Generator, requests: int, vocab: int) -> tuple[list[list[int]], torch.Tensor]:
    trees, tokens = [], []
    for _ in range(requests):
        size = int(torch.randint(1, 12, (), generator=gen))
        trees.append([-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, size)])
        tokens += torch.randint(0, vocab, (size,), generator=gen).tolist()  # repeats among siblings too
    return trees, torch.tensor(tokens)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_sampled_acceptance_is_the_node_by_node_walk(device):
    """Random forests, distributions with zeros, coins and tokens that repeat among siblings: every
    request's leaf and bonus are those of the serial walk on the same coins."""
    gen = torch.Generator().manual_seed(3)
    vocab, cases = 5, 0
    for _ in range(40):
        trees, tokens = random_forest(gen, 6, vocab)
        tree = forest(trees)
        logits = torch.randn(tree.num_nodes, vocab, generator=gen) * 2
        probs = torch.where(torch.rand(logits.shape, generator=gen) < 0.2, 0.0, logits.softmax(-1))
        probs[:, 0] += 1e-3  # no row without mass
        probs = probs / probs.sum(-1, keepdim=True)
        coins = torch.rand(tree.num_requests, tree.max_nodes + 1, generator=gen)
        on_device = forest(trees, device=device), tokens.to(device), probs.to(device), coins.to(device)
        leaf, bonus = (t.cpu() for t in sample_accept(*on_device))
        for b, parents in enumerate(trees):
            lo = int(tree.cu_seqlens[b])
            size = len(parents)
            expected = walk(parents, tokens[lo : lo + size].tolist(), probs[lo : lo + size],
                            torch.cat([coins[b, :size], coins[b, -1:]]))  # fmt: skip
            assert (int(leaf[b]), int(bonus[b])) == expected
            cases += expected[0] > 0
    assert cases > 40  # drafts were accepted, not only rejected


def test_sampled_acceptance_on_logits_read_where_the_walk_reads_them():
    """The verify's logits read a node at a time and a leaf's row at a time (:class:`ProcessedLogits`)
    accept what their whole processed distributions accept."""
    gen = torch.Generator().manual_seed(5)
    trees, tokens = random_forest(gen, 8, 30)
    tree = forest(trees)
    logits = torch.randn(tree.num_nodes, 30, generator=gen) * 2
    drafts = tree.global_parents >= 0
    logits[tree.global_parents[drafts], tokens[drafts]] += 4  # drafts the target likes: some accepted
    settings = [
        torch.tensor([0.8, 1.0, 0.0, 1.3] * 2),
        torch.tensor([0, 4, 0, 0] * 2),
        torch.tensor([1.0, 1.0, 1.0, 0.9] * 2),
    ]
    rows = [t[tree.request] for t in settings]
    coins = torch.rand(8, tree.max_nodes + 1, generator=gen)
    whole = sample_accept(tree, tokens, process_logits(logits, *rows), coins)
    processed = sample_accept(tree, tokens, ProcessedLogits.of(logits, *rows), coins)
    assert all(torch.equal(a, b) for a, b in zip(whole, processed, strict=True))
    assert int((whole[0] > 0).sum()) >= 2  # drafts accepted


def test_a_token_repeated_among_siblings_is_tried_once():
    """Children x, x, y of p(x) = 0.4, p(y) = 0.3: x rejected once is gone; y's residual is 0.3 / 0.6."""
    tree = forest([[-1, 0, 0, 0]] * 2)
    tokens = torch.tensor([0, 1, 1, 2] * 2)
    probs = torch.tensor([0.3, 0.4, 0.3]).repeat(8, 1)
    coins = torch.tensor([[0.0, 0.9, 0.0, 0.49, 0.0], [0.0, 0.9, 0.0, 0.51, 0.0]])
    leaf, bonus = sample_accept(tree, tokens, probs, coins)
    assert leaf.tolist() == [3, 0] and bonus.tolist()[1] == 0  # the second: only token 0 is left


def test_sampling_with_one_hot_targets_equals_greedy():
    tree = forest(TREES)
    argmax = torch.tensor([8, 0, 6, 0, 1, 4, 0])
    probs = torch.nn.functional.one_hot(argmax, 12).float()
    coins = torch.rand(2, 6, generator=torch.Generator().manual_seed(1))
    leaf, bonus = sample_accept(tree, TOKENS, probs, coins)
    assert leaf.tolist() == [4, 0] and bonus.tolist() == [1, 4]


def test_sampled_acceptance_refuses_too_few_coins():
    with pytest.raises(ValueError, match=r"coins must be \[2, > 5\]"):
        sample_accept(forest(TREES), TOKENS, torch.full((7, 12), 1 / 12), torch.zeros(2, 5))


def test_a_request_s_coins_come_from_its_own_generator():
    def gens(*seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    alone = draw_coins(gens(7), 4, "cpu")
    batched = draw_coins(gens(1, 7, 2), 4, "cpu")
    assert torch.equal(batched[1], alone[0]) and not torch.equal(batched[0], batched[1])
    mixed = draw_coins([None, *gens(7), None], 4, "cpu")  # the unseeded two share one draw
    assert torch.equal(mixed[1], alone[0]) and not torch.equal(mixed[0], mixed[2])
    assert all(((c >= 0) & (c < 1)).all() for c in (batched, mixed))


def test_coins_are_fine_enough_for_a_token_of_tiny_probability():
    """Float32 coins are multiples of 2⁻²⁴: a draft of probability 1e-9 passed whenever its coin was 0 (60
    times too often), and a bonus token whose CDF interval held no multiple was never drawn. Float64 coins
    resolve both: a coin between the two tokens' CDF bounds picks the tiny one."""
    coins = draw_coins([torch.Generator().manual_seed(3), None], 500_000, "cpu")
    assert coins.dtype == torch.float64
    assert (coins * 2**24 != (coins * 2**24).floor()).any(dim=1).all()  # each row: not all multiples of 2⁻²⁴
    tiny = 1e-9
    weights = torch.tensor([[1 - tiny, tiny]], dtype=torch.float64)
    between = torch.tensor([1 - tiny / 2], dtype=torch.float64)  # no float32 lies there: it rounds to 1
    assert inverse_cdf(weights, between).item() == 1 and float(torch.tensor(1 - tiny / 2).float()) == 1.0


def chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def exact_first_token_distribution(p: torch.Tensor, candidates: list[int]) -> torch.Tensor:
    """What one step of the walk emits as the first new token, computed in closed form."""
    out = torch.zeros_like(p)
    residual, survive = p.clone(), 1.0
    for c in candidates:
        out[c] += survive * residual[c]
        survive *= 1 - residual[c]
        residual[c] = 0.0
        residual = residual / residual.sum()
    return out + survive * residual


@pytest.mark.parametrize("candidates", [[], [0], [2, 0], [3, 1, 2]])
def test_first_emitted_token_follows_target_for_any_candidates(candidates):
    p = torch.tensor([0.1, 0.4, 0.2, 0.3])
    # The oracle's own check (no project code): the walk's closed form emits p whatever the candidates.
    assert torch.allclose(exact_first_token_distribution(p, candidates), p, atol=1e-6)
    # And the implementation draws from it: 4000 requests of one tree, chi-square, false alarm ~1e-4.
    draws = 4000
    tree = forest([[-1] + [0] * len(candidates)] * draws)
    tokens = torch.tensor([0, *candidates]).repeat(draws)
    probs = torch.cat([p[None], torch.full((len(candidates), 4), 0.25)]).repeat(draws, 1)
    coins = torch.rand(draws, len(candidates) + 2, generator=torch.Generator().manual_seed(7))
    leaf, bonus = sample_accept(tree, tokens, probs, coins)
    first = torch.where(leaf > 0, tokens[leaf + tree.cu_seqlens[:-1]], bonus)
    assert chi_square(torch.bincount(first, minlength=4).float(), p * draws) < 21.1  # 3 dof, p = 1e-4


def test_three_emitted_tokens_follow_the_target_through_a_deep_tree():
    """Whole steps of sample_accept on a depth-4 tree (the pending token, then three levels of two
    candidates: the target's two most likely tokens, so deep drafts are accepted often), repeated
    until three tokens are out, for 6000 sequences at once: the three follow the target's joint
    distribution (chi-square over the 27 sequences of a 3-token vocabulary)."""
    vocab, draws = 3, 6000
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(vocab**4, vocab, generator=gen) * 0.6

    def p(prefix: tuple[int, ...]) -> torch.Tensor:  # the target: any function of the prefix
        key = sum((t + 1) * 4**i for i, t in enumerate(prefix)) % vocab**4
        return torch.softmax(logits[key], 0)

    parents = [-1, 0, 0, 1, 1, 2, 2, *[3, 3, 4, 4, 5, 5, 6, 6]]
    exact = torch.zeros(vocab, vocab, vocab)
    for a in range(vocab):
        for b in range(vocab):
            exact[a, b] = p(())[a] * p((a,))[b] * p((a, b))
    outs: list[list[int]] = [[] for _ in range(draws)]
    while unfinished := [out for out in outs if len(out) < 3]:
        tokens, probs, paths = [], [], []
        for out in unfinished:  # node 0: the pending token, its prefix the output so far
            request = [tuple(out)]
            for node in range(1, len(parents)):
                parent = request[parents[node]]
                rank = (node - 1) % 2  # first or second child: the most or second most likely token
                request.append((*parent, int(p(parent).argsort(descending=True)[rank])))
            tokens += [0] + [path[-1] for path in request[1:]]
            probs += [p(path) for path in request]
            paths.append(request)
        tree = forest([parents] * len(unfinished))
        coins = torch.rand(len(unfinished), len(parents) + 1, generator=gen)
        leaf, bonus = sample_accept(tree, torch.tensor(tokens), torch.stack(probs), coins)
        for out, request, node, token in zip(unfinished, paths, leaf.tolist(), bonus.tolist(), strict=True):
            out += [*request[node][len(out) :], token]
    counts = torch.zeros(vocab, vocab, vocab)
    for out in outs:
        counts[tuple(out[:3])] += 1
    expected = exact * draws
    assert expected.min() > 5 and chi_square(counts, expected) < 61.9  # 26 dof, p = 1e-4


@pytest.mark.parametrize("vocab", [1, 5, CDF_BLOCK, 3 * CDF_BLOCK + 17])
def test_inverse_cdf_is_the_first_index_past_the_coin(vocab):
    """The two-level scan picks what one scan of the whole row picks: rows with zero weights (whole blocks
    of them, the first and last weights), coins at 0 and just below 1; never a token of no weight."""
    gen = torch.Generator().manual_seed(vocab)
    weights = torch.rand(6, vocab, generator=gen, dtype=torch.float64)
    weights[weights < 0.3] = 0.0
    weights[:, -1] += 0.5  # every total positive
    weights[1, : vocab // 2] = 0.0
    weights[2, 1:] = 0.0
    weights[2, 0] = 1.0
    weights[3, -1] = 5.0
    for u in (
        torch.rand(6, generator=gen, dtype=torch.float64),
        torch.zeros(6),
        torch.full((6,), 1 - 2**-24),
    ):
        cdf = weights.cumsum(-1)
        want = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
        got = inverse_cdf(weights, u)
        assert torch.equal(got, want) and bool((weights[torch.arange(6), got] > 0).all())
        assert torch.equal(inverse_cdf(weights[3:4], u[3:4]), want[3:4])  # one row: one scan
        assert torch.equal(two_level_cdf(weights[3:4], u[3:4]), want[3:4])


def test_a_target_rounded_past_its_block_s_own_scan_takes_the_block_s_last_positive_weight():
    """The block sums (pairwise) and the block's own scan (in order) round differently: a coin whose target
    lands between them, past the scan's end, must still give a token of positive weight, the block's last."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        weights = torch.rand(2, CDF_BLOCK, generator=gen, dtype=torch.float64)
        weights *= torch.logspace(-8, 8, CDF_BLOCK, dtype=torch.float64)
        weights[:, -5:] = 0.0
        scanned, summed = weights.cumsum(-1)[:, -1], weights.sum(-1)
        u = scanned / summed
        u = torch.where(u * summed >= scanned, u, torch.nextafter(u, torch.tensor(2.0, dtype=torch.float64)))
        if bool((scanned < summed).all() & (u * summed >= scanned).all() & (u < 1).all()):
            break
    else:
        pytest.fail("no weights found whose block sum rounds above their scan")
    assert two_level_cdf(weights, u).tolist() == [CDF_BLOCK - 6] * 2
