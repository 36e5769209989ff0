import pytest
import torch

from trtllm_bole.spec.acceptance import greedy_accept, residual_after_rejecting, sample_accept
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


def test_residual_removes_the_rejected_token():
    p = torch.tensor([0.5, 0.3, 0.2])
    assert torch.allclose(residual_after_rejecting(p, 0), torch.tensor([0.0, 0.6, 0.4]))


def test_sampling_with_one_hot_targets_equals_greedy():
    tree = forest(TREES)
    argmax = torch.tensor([8, 0, 6, 0, 1, 4, 0])
    probs = torch.nn.functional.one_hot(argmax, 12).float()
    leaf, bonus = sample_accept(tree, TOKENS, probs.__getitem__, [torch.Generator().manual_seed(1)] * 2)
    assert leaf.tolist() == [4, 0] and bonus.tolist() == [1, 4]


def exact_first_token_distribution(p: torch.Tensor, candidates: list[int]) -> torch.Tensor:
    """What one step of sample_accept emits as the first new token, computed in closed form."""
    out = torch.zeros_like(p)
    residual, survive = p.clone(), 1.0
    for c in candidates:
        out[c] += survive * residual[c]
        survive *= 1 - residual[c]
        residual = residual_after_rejecting(residual, c)
    return out + survive * residual


@pytest.mark.parametrize("candidates", [[], [0], [2, 0], [3, 1, 2]])
def test_first_emitted_token_follows_target_for_any_candidates(candidates):
    p = torch.tensor([0.1, 0.4, 0.2, 0.3])
    # Closed form: the emitted token is distributed exactly as p, whatever the candidates are.
    assert torch.allclose(exact_first_token_distribution(p, candidates), p, atol=1e-6)
    # And the implementation draws from it: chi-square over 4000 draws, false alarm ~1e-4.
    parents = [-1] + [0] * len(candidates)
    tree = forest([parents])
    tokens = torch.tensor([0, *candidates])
    probs = torch.cat([p[None], torch.full((len(candidates), 4), 0.25)])
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(4)
    draws = 4000
    for _ in range(draws):
        leaf, bonus = sample_accept(tree, tokens, probs.__getitem__, [gen])
        counts[int(tokens[int(leaf)]) if int(leaf) > 0 else int(bonus)] += 1
    expected = p * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 21.1  # chi-square, 3 degrees of freedom, p = 1e-4


def test_three_emitted_tokens_follow_the_target_through_a_deep_tree():
    """Whole steps of sample_accept on a depth-4 tree (the pending token, then three levels of two
    candidates: the target's two most likely tokens, so deep drafts are accepted often), repeated
    until three tokens are out: the three follow the target's joint distribution (chi-square over
    the 27 sequences of a 3-token vocabulary)."""
    vocab, draws = 3, 6000
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(vocab**4, vocab, generator=gen) * 0.6

    def p(prefix: tuple[int, ...]) -> torch.Tensor:  # the target: any function of the prefix
        key = sum((t + 1) * 4**i for i, t in enumerate(prefix)) % vocab**4
        return torch.softmax(logits[key], 0)

    parents = [-1, 0, 0, 1, 1, 2, 2, *[3, 3, 4, 4, 5, 5, 6, 6]]
    tree = forest([parents])
    exact = torch.zeros(vocab, vocab, vocab)
    for a in range(vocab):
        for b in range(vocab):
            exact[a, b] = p(())[a] * p((a,))[b] * p((a, b))
    counts = torch.zeros(vocab, vocab, vocab)
    for _ in range(draws):
        out: list[int] = []
        while len(out) < 3:
            tokens, paths = [0], [tuple(out)]  # node 0: the pending token, its prefix the output so far
            for node in range(1, len(parents)):
                parent = paths[parents[node]]
                rank = (node - 1) % 2  # first or second child: the most or second most likely token
                tokens.append(int(p(parent).argsort(descending=True)[rank]))
                paths.append((*parent, tokens[-1]))
            leaf, bonus = sample_accept(
                tree, torch.tensor(tokens), lambda node, paths=paths: p(paths[node]), [gen]
            )
            out += [*paths[int(leaf)][len(out) :], int(bonus)]
        counts[tuple(out[:3])] += 1
    expected = exact * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert expected.min() > 5 and chi2 < 61.9  # chi-square, 26 degrees of freedom, p = 1e-4
