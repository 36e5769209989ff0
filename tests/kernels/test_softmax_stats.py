"""Each row's argmax and filtered softmax normaliser (:mod:`trtllm_bole.kernels.softmax_stats`) against the
torch reference: rows over one span and over several (a row's spans merged), ties for the maximum across
lanes and spans, floors that keep one logit, some or all, masked tokens, and the division rounded as
torch rounds it at the floor."""

import pytest
import torch

from tests.kernels.helpers import DEVICE
from trtllm_bole import ops
from trtllm_bole.kernels import softmax_stats as kernel
from trtllm_bole.reference import sampling


def check(x: torch.Tensor, temperature: torch.Tensor, floor: torch.Tensor) -> None:
    argmax, normaliser = kernel.softmax_stats(x, temperature, floor)
    want_argmax, want = sampling.softmax_stats(x, temperature, floor)
    assert torch.equal(argmax, want_argmax)
    torch.testing.assert_close(normaliser, want, rtol=2e-6, atol=0)


def rows(gen: torch.Generator, vocab: int) -> torch.Tensor:
    """Logits as a model's: random, integers with ties for the maximum, masked tokens, one flat row."""
    x = torch.randn(5, vocab, generator=gen) * 2.5
    x[1] = torch.randint(-3, 4, (vocab,), generator=gen).float()
    x[1, -1] = 5.0  # the maximum in the last span too: the first one wins
    x[1, 0] = 5.0
    x[2, 1::4] = float("-inf")
    x[3] = 1.0
    return x.to(DEVICE)


@pytest.mark.parametrize("vocab", [1, 37, kernel.BLOCK + 3, 2 * kernel.SPAN + 5])
def test_argmax_and_normaliser_are_the_references(vocab, gen, monkeypatch):
    x = rows(gen, vocab)
    temperature = torch.tensor([0.7, 1.0, 1.3, 0.5, 2.0], device=DEVICE)
    scaled = x / temperature[:, None]
    floors = [
        torch.full((5,), float("-inf"), device=DEVICE),  # keeps all
        scaled.amax(-1),  # keeps the maxima only
        scaled.quantile(0.6, dim=-1),  # keeps some: the floor is itself a kept x / t where it is one
        scaled[:, 0].contiguous(),
    ]
    for floor in floors:
        check(x, temperature, floor)
        check(x.to(torch.bfloat16), temperature, floor)


def test_spans_without_a_kept_logit_add_nothing(gen):
    x = torch.randn(2, 3 * kernel.SPAN, generator=gen).to(DEVICE)
    x[:, kernel.SPAN + 7] = 20.0  # only the middle span keeps anything
    check(x, torch.ones(2, device=DEVICE), torch.full((2,), 19.0, device=DEVICE))


def test_the_floor_compares_the_quotient_rounded_as_torch_rounds_it(gen):
    """``x / t`` for x just below and above a floor that is itself a quotient: the kernel keeps exactly what
    the reference's mask keeps (a quotient computed another way, ``x * (1 / t)``, would differ in the last
    bit for some of these)."""
    t = torch.tensor([0.7] * 4, device=DEVICE)
    base = (torch.randn(4, 1, generator=gen) * 3).view(torch.int32)
    x = (base + torch.arange(-300, 300, dtype=torch.int32)).view(torch.float32).to(DEVICE)  # neighbours
    floor = (x[:, 300] / t).contiguous()
    check(x, t, floor)
    assert not torch.equal(x * (1 / t[:, None]) >= floor[:, None], x / t[:, None] >= floor[:, None])


def test_settings_as_columns_of_a_table_and_transposed_logits_give_the_contiguous_stats(gen):
    """The launcher called directly with strided arguments (the op makes them contiguous): it read the
    settings flat, each row taking its neighbours' temperature and floor, and the logits at unit stride."""
    x = torch.randn(4, 50, generator=gen).to(DEVICE) * 3
    table = torch.tensor([[0.5, 0.0], [1.0, -1e9], [2.0, 1.0], [4.0, -1e9]], device=DEVICE)
    temperature, floor = table[:, 0], table[:, 1]
    assert not (temperature.is_contiguous() or floor.is_contiguous())
    found = kernel.softmax_stats(x.T.contiguous().T, temperature, floor)
    for got, want in zip(found, sampling.softmax_stats(x, temperature, floor), strict=True):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=0)


def test_the_operator_validates_and_dispatches(gen):
    x = torch.randn(3, 50, generator=gen).to(DEVICE)
    t, floor = torch.ones(3, device=DEVICE), torch.full((3,), float("-inf"), device=DEVICE)
    argmax, normaliser = ops.softmax_stats(x, t, floor)
    assert torch.equal(argmax, x.argmax(-1))
    torch.testing.assert_close(normaliser, (x - x.amax(-1, keepdim=True)).exp().sum(-1))
    with pytest.raises(ValueError, match="float logits"):
        ops.softmax_stats(x.long(), t, floor)
    with pytest.raises(ValueError, match="temperature and floor"):
        ops.softmax_stats(x, t[:2], floor)
