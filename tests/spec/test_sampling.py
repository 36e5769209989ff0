import pytest
import torch

from trtllm_bole.config import MAX_TEMPERATURE, MIN_TOP_P
from trtllm_bole.spec.sampling import process_logits


def row(logits, temperature=1.0, top_k=0, top_p=1.0):
    return process_logits(
        torch.tensor([logits]), torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p])
    )[0]


def test_plain_softmax_and_temperature():
    logits = [0.0, 1.0, 2.0]
    assert torch.allclose(row(logits), torch.tensor(logits).softmax(-1))
    assert torch.allclose(row(logits, temperature=0.5), (torch.tensor(logits) / 0.5).softmax(-1))


def test_greedy_is_one_hot():
    assert row([0.0, 3.0, 1.0], temperature=0.0).tolist() == [0.0, 1.0, 0.0]


def test_top_k_keeps_k_largest():
    p = row([0.0, 1.0, 2.0, 3.0], top_k=2)
    expected = torch.tensor([0.0, 0.0, 2.0, 3.0]).softmax(-1) * torch.tensor([0, 0, 1, 1])
    assert torch.allclose(p, expected / expected.sum())


def test_top_p_smallest_prefix_reaching_p():
    # probs 0.5, 0.3, 0.2: top_p = 0.6 keeps {0.5, 0.3}; top_p = 0.5 keeps {0.5} only.
    logits = torch.tensor([0.5, 0.3, 0.2]).log().tolist()
    assert torch.allclose(row(logits, top_p=0.6), torch.tensor([0.625, 0.375, 0.0]))
    assert torch.allclose(row(logits, top_p=0.5), torch.tensor([1.0, 0.0, 0.0]))


def test_the_bounds_of_top_p_and_temperature_hold_in_float32():
    """SamplingParams' bounds, as the settings' float32 tensors hold them: the smallest top_p keeps the
    most likely token alone (1e-46 read 0 and kept none: every draw was the last token id), and at the
    largest temperature top_k = 2 keeps the top two, equally likely (1e39 read inf and tied every logit)."""
    logits = [1.0, 3.0, 2.0, -1.0]
    assert row(logits, temperature=0.8, top_p=MIN_TOP_P).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert row(logits, temperature=MAX_TEMPERATURE, top_k=2).tolist() == [0.0, 0.5, 0.5, 0.0]


def test_top_p_one_keeps_the_whole_vocabulary():
    """In float32 the mass before the tail tokens rounds to 1: top_p = 1 must still keep them."""
    logits = torch.tensor([0.0, -30.0, -30.0])
    assert torch.equal(row(logits.tolist()), logits.softmax(-1))
    wide = torch.randn(151936, generator=torch.Generator().manual_seed(0)) * 5
    assert bool((row(wide.tolist()) > 0).all())


def test_top_p_applies_to_the_renormalised_top_k():
    # probs 0.4, 0.3, 0.2, 0.1 with top_k = 2: renormalised 4/7, 3/7, so top_p = 0.5 keeps one token.
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().tolist()
    assert torch.allclose(row(logits, top_k=2, top_p=0.5), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert torch.allclose(row(logits, top_k=2, top_p=0.6), torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))


def test_ties_at_the_boundary_are_all_kept():
    p = row([1.0, 1.0, 1.0, 0.0], top_k=2)
    assert torch.allclose(p, torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0]))


@pytest.mark.parametrize("top_k", [0, 100])
def test_top_k_disabled_or_larger_than_vocab(top_k):
    assert torch.allclose(row([0.0, 1.0], top_k=top_k), torch.tensor([0.0, 1.0]).softmax(-1))


def test_rows_are_independent():
    logits = torch.tensor([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    p = process_logits(logits, torch.tensor([0.0, 1.0]), torch.tensor([0, 1]), torch.tensor([1.0, 1.0]))
    assert p.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]


def test_unfiltered_rows_skip_the_sort_and_get_the_same_probabilities():
    """``filtered=False`` (no sampled row with top-k or top-p) is bit for bit the sorted path."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    settings = torch.tensor([0.0, 0.5, 1.0, 1.7, 0.0, 0.9]), torch.zeros(6, dtype=torch.long), torch.ones(6)
    assert torch.equal(process_logits(logits, *settings, filtered=False), process_logits(logits, *settings))


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "kind"),
    [([0.0, 0.0], [5, 0], [0.5, 1.0], "greedy"), ([0.0, 0.8], [5, 0], [0.5, 1.0], "sampled"),
     ([0.7, 0.8], [0, 0], [1.0, 0.9], "filtered"), ([0.7, 0.0], [3, 0], [1.0, 1.0], "filtered")],
)  # fmt: skip
def test_a_batch_s_kind_of_settings(temperature, top_k, top_p, kind):
    """Greedy requests' filters do not count: they sample nothing."""
    from trtllm_bole.spec.drafter import DraftSettings

    settings = DraftSettings.of(temperature, top_k, top_p, "cpu")
    assert settings.kind == kind and settings.all_greedy == (kind == "greedy")


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [([0.0, 1.0], [0, 2], [1.0, 1.0]), ([0.0, 0.7], [0, 0], [1.0, 0.6]), ([0.0, 1.3], [0, 0], [1.0, 1.0]),
     ([0.0, 0.0], [3, 0], [0.5, 1.0])],
)  # fmt: skip
def test_draft_ranking_follows_each_request_s_settings_in_a_mixed_batch(temperature, top_k, top_p):
    """Draft rows rank tokens as their own request samples them: a greedy request by the plain softmax
    (a one-hot would leave a chain), a sampled one through its filters (nothing outside its top-k or its
    nucleus: -inf). The k likeliest tokens and their log-probabilities are those of the whole rows
    processed (the tokens where those are finite; among dropped tokens the order is the logits')."""
    from trtllm_bole.spec.drafter import DraftSettings

    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 2
    settings = DraftSettings.of(temperature, top_k, top_p, "cpu")
    request = torch.tensor([0, 1, 1, 0])
    log_q, tokens = settings.top_log_probs(logits, request, 4)
    assert torch.equal(tokens, logits.topk(4, dim=-1).indices)
    for i, b in enumerate(request.tolist()):
        if temperature[b] == 0:
            want = logits[i].log_softmax(-1)
        else:
            want = row(logits[i].tolist(), temperature[b], top_k[b], top_p[b]).log()
        torch.testing.assert_close(log_q[i], want[tokens[i]], rtol=1e-5, atol=1e-6)
    if top_k[1] == 2:  # request 1's two rows keep two tokens each
        assert int(torch.isinf(log_q).sum()) == 4


@pytest.mark.parametrize("filtered", [True, False])
def test_processed_logits_read_what_process_logits_gives(filtered):
    """Values read a node at a time (from each row's floor, argmax and normaliser) are process_logits' of all
    rows at once to float32 rounding, greedy rows' one-hot exactly; totals are 1; whole rows bit for bit."""
    from trtllm_bole.spec.sampling import ProcessedLogits

    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(11, 40, generator=gen) * 3
    logits[0, 7] = logits[0, 3] = 9.0  # a greedy row's maximum tied: the first is its token
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3] * 3)[:11]
    top_k = torch.tensor([0, 5, 0, 12] * 3)[:11] if filtered else torch.zeros(11, dtype=torch.long)
    top_p = torch.tensor([1.0, 1.0, 0.8, 0.9] * 3)[:11] if filtered else torch.ones(11)
    whole = process_logits(logits, temperature, top_k, top_p)
    processed = ProcessedLogits.of(logits, temperature, top_k, top_p, filtered=filtered)
    rows = torch.cat([torch.zeros(40, dtype=torch.long), torch.randint(11, (60,), generator=gen)])
    columns = torch.cat([torch.arange(40), torch.randint(40, (60,), generator=gen)])
    values, mass = processed.at(rows, columns)
    torch.testing.assert_close(values, whole[rows, columns].double(), rtol=1e-6, atol=0)
    assert torch.equal(values[:40], whole[0].double()) and int((values[:40] == 1).sum()) == 1
    assert int((values == 0).sum()) == int((whole[rows, columns] == 0).sum())  # the same tokens filtered
    assert torch.equal(mass, torch.ones(100, dtype=torch.float64))
    assert torch.equal(processed.rows(rows[40:44]), whole[rows[40:44]])
