"""The top-k / top-p floor found by radix select (:mod:`trtllm_bole.kernels.filter_floor`) against the
sorting reference, and against the float64 definition where float32 rounding could decide the row
(:func:`trtllm_bole.testing.floor_agreement`). Rows of at most ``cap`` logits are searched whole; the
small caps here send these small rows through the windows, their copies and the whole-row search of a
window that ties keep wide, as a real vocabulary's rows go."""

import pytest
import torch

from tests.kernels.helpers import DEVICE
from trtllm_bole import ops
from trtllm_bole.kernels.filter_floor import BLOCK, CAP, NUM_WARPS, SHAPES, filter_floor, launch_shape
from trtllm_bole.reference import sampling
from trtllm_bole.testing import floor_agreement, floors_agree


def ones(n: int) -> torch.Tensor:
    """Temperature 1 for n rows."""
    return torch.ones(n, device=DEVICE)


def check(
    x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, cap: int = CAP, temperature=None
) -> None:
    temperature = ones(x.shape[0]) if temperature is None else temperature
    found = filter_floor(x, temperature, top_k, top_p, cap=cap)
    agreement = floor_agreement(found, x, temperature, top_k, top_p)
    assert floors_agree(agreement) and agreement["decided"] > 0, agreement


def rows(gen: torch.Generator, n: int, vocab: int) -> torch.Tensor:
    """Logits as a model's, ties among integers, -0.0 beside 0.0, masked tokens, one flat row."""
    x = torch.randn(n, vocab, generator=gen) * 2.5
    x[1] = torch.randint(-3, 4, (vocab,), generator=gen).float()
    x[2, ::3] = -0.0
    x[2, 1::3] = 0.0
    x[3, ::4] = float("-inf")
    x[4] = 1.0
    return x.to(DEVICE)


@pytest.mark.parametrize(
    "vocab, cap", [(1, CAP), (2, CAP), (37, CAP), (BLOCK + 3, CAP), (37, 4), (BLOCK + 3, 16)]
)
def test_top_k_alone_is_the_kth_largest_with_its_ties(vocab, cap, gen):
    x = rows(gen, 6, vocab)
    # ±2**32 + 5 would be read as 5 (int32): off, as any k <= 0 or >= vocab
    for k in sorted({1, 2, 5, vocab - 1, vocab, vocab + 4, 2**32 + 5, -(2**32) + 5}):
        top_k = torch.full((6,), k, device=DEVICE)
        found = filter_floor(x, ones(6), top_k, ones(6), cap=cap)
        assert torch.equal(found, sampling.filter_floor(x, ones(6), top_k, ones(6)))
        if 0 < k < vocab:
            kept = (x >= found[:, None]).sum(-1)
            assert (kept >= k).all() and (kept[0] == k or vocab < 3)


@pytest.mark.parametrize("vocab, cap", [(37, CAP), (300, CAP), (BLOCK + 3, CAP), (300, 8), (BLOCK + 3, 32)])
def test_top_p_with_and_without_top_k(vocab, cap, gen):
    x = rows(gen, 6, vocab)
    top_p = torch.tensor([1e-7, 0.3, 0.9, 0.999, 0.6, 0.95], device=DEVICE)
    for k in (0, 1, 7, vocab - 1):
        for shift in (0, 3):
            check(x, torch.full((6,), k, device=DEVICE), top_p.roll(shift), cap)


@pytest.mark.parametrize("cap, shape", [(CAP, None), (16, None), (16, SHAPES[0])])
def test_random_settings_per_row(cap, shape, gen):
    """Every row its own top-k (off, 1 .. V) and top-p (off, or anywhere in (0, 1)); also in the wide
    blocks of a program alone on its SM (rows of 2,600: blocks full, part-full and empty)."""
    vocab = 257 if shape is None else 2600
    x = rows(gen, 24, vocab)
    top_k = torch.randint(-1, vocab + 3, (24,), generator=gen)
    top_p = torch.rand(24, generator=gen).clamp_min(1e-3)
    top_p[::5] = 1.0
    top_k[::5] = torch.tensor([0, vocab, -1, vocab + 143, 0])
    top_k, top_p = top_k.to(DEVICE), top_p.to(DEVICE)
    found = filter_floor(x, ones(24), top_k, top_p, cap=cap, shape=shape)
    agreement = floor_agreement(found, x, ones(24), top_k, top_p)
    assert floors_agree(agreement) and agreement["decided"] > 0, agreement
    off = ((top_k <= 0) | (top_k >= vocab)) & (top_p >= 1)
    assert off.any() and (found[off] == float("-inf")).all()


def test_programs_that_share_their_sm_with_fewer_read_wider_blocks():
    assert launch_shape(0, 132) == launch_shape(4, 132) == launch_shape(132, 132) == (2048, 16)
    assert launch_shape(133, 132) == launch_shape(264, 132) == (1024, 8)
    assert launch_shape(265, 132) == launch_shape(2048, 132) == launch_shape(4, 0) == (BLOCK, NUM_WARPS)


def test_the_boundary_token_stays_and_the_next_goes(gen):
    """top_p halfway into a token's mass keeps it (the mass before it is below top_p); halfway into the
    next token's keeps the next; a whole-row tie keeps the whole row."""
    x = torch.tensor([[3.0, 2.0, 1.0, 0.0, 0.0, -1.0], [0.5] * 6], device=DEVICE)
    probs = x[0].softmax(-1)
    cumulative = probs.cumsum(-1)
    for i in range(4):
        p = float(cumulative[i] - probs[i] / 2)
        found = filter_floor(
            x, ones(2), torch.zeros(2, dtype=torch.long, device=DEVICE), torch.full((2,), p, device=DEVICE)
        )
        assert found[0] == x[0, i] and found[1] == 0.5


@pytest.mark.parametrize("cap", [CAP, 16])
def test_bf16_logits_at_their_temperatures(cap, gen):
    """The kernel divides the logits it finds by each row's temperature in float32 as torch does (rounded
    to nearest), so its floors are the scaled logits the reference keeps."""
    x = (torch.randn(8, 300, generator=gen) * 3).to(DEVICE, torch.bfloat16)
    temperature = torch.tensor([0.7, 1.0, 1.3, 0.3, 2.0, 0.9, 0.51, 1.7], device=DEVICE)
    top_k = torch.tensor([0, 20, 0, 5, 100, 0, 299, 1], device=DEVICE)
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.8, 0.95, 0.2, 0.99, 1.0], device=DEVICE)
    check(x, top_k, top_p, cap, temperature)
    found = filter_floor(x, temperature, top_k, top_p, cap=cap)
    kept = x.float() / temperature[:, None] >= found[:, None]
    assert (kept.sum(-1) >= 1).all()


def tied_by_division(start: float, t: float) -> tuple[float, float]:
    """Two neighbouring float32s at or below ``start`` whose quotients by ``t`` round to one value."""
    a = torch.tensor(start)
    while True:
        below = torch.nextafter(a, torch.tensor(-float("inf")))
        if a / t == below / t:
            return a.item(), below.item()
        a = below


@pytest.mark.parametrize("cap", [CAP, 16, 32])
def test_top_p_after_top_k_takes_the_logits_the_division_ties_with_the_top_k_floor(cap):
    """The kernel searches the logits undivided; 20 logits just below the 4th largest divide to the same
    value at t = 0.6, so the reference's top-k keeps them, and their mass moves top-p's floor. Top-p
    searches the row after top-k searched it whole (``CAP``) or in a window of 21 ties (16), and the
    24 keys top-k copied out (32)."""
    t = 0.6
    floor, below = tied_by_division(1.5, t)
    x = torch.full((1, 64), -30.0)
    x[0, :4] = torch.tensor([2.0, 1.9, 1.8, floor])
    x[0, 4:24] = below
    args = (torch.full((1,), t), torch.tensor([4]), torch.tensor([0.15]))
    expected = sampling.filter_floor(x, *args)
    untied = sampling.filter_floor(torch.where(x == below, -30.0, x), *args)
    assert expected.item() == torch.tensor(1.9) / t and untied != expected
    found = filter_floor(x.to(DEVICE), *(arg.to(DEVICE) for arg in args), cap=cap)
    assert torch.equal(found.cpu(), expected)


def test_a_window_that_ties_keep_wide_is_searched_whole(gen):
    """No window of ``max - x`` is narrower than a run of equal logits: past the last level the search
    reads the whole row, in its window."""
    x = torch.randn(4, 300, generator=gen) - 3
    x[:, :200] = 2.0  # 200 ties at the top: every window down to 1/256 nat holds them all
    x[1, :100] = 3.0
    x = x.to(DEVICE)
    top_k = torch.tensor([150, 0, 100, 0], device=DEVICE)
    top_p = torch.tensor([1.0, 0.5, 0.5, 0.99], device=DEVICE)
    found = filter_floor(x, ones(4), top_k, top_p, cap=8)
    assert torch.equal(found, sampling.filter_floor(x, ones(4), top_k, top_p))
    assert found.tolist() == [2.0, 3.0, 2.0, 2.0]


def test_settings_as_columns_of_a_table_and_transposed_logits_give_the_contiguous_floors(gen):
    """Per-row settings as columns of one table and logits laid out ``[V, N]``: the kernel once read the
    settings flat, each row taking its neighbours' temperature and top-p (finite floors where a row
    filters nothing, ``-inf`` where it filters)."""
    x = torch.randn(4, 37, generator=gen).to(DEVICE)
    table = torch.tensor([[1.0, 2, 0.9], [0.5, 5, 1.0], [2.0, 0, 0.5], [1.0, 3, 0.7]], device=DEVICE)
    temperature, top_k, top_p = table[:, 0], table[:, 1].long(), table[:, 2]
    assert not (temperature.is_contiguous() or top_p.is_contiguous())
    found = filter_floor(x.T.contiguous().T, temperature, top_k, top_p)
    assert torch.equal(found, filter_floor(x, temperature.contiguous(), top_k, top_p.contiguous()))
    assert torch.equal(found, sampling.filter_floor(x, temperature, top_k, top_p))


def test_a_top_p_of_zero_or_below_keeps_the_likeliest_token_on_every_device(gen):
    """A row keeps at least one token: the kernel kept the likeliest where the reference (the CPU's op)
    kept none (floor +inf, then a softmax over nothing)."""
    x = rows(gen, 5, 37)
    t = torch.tensor([0.5, 1.0, 2.0, 1.0, 0.7], device=DEVICE)
    top_k = torch.tensor([0, 5, 0, 3, 0], device=DEVICE)
    top_p = torch.tensor([0.0, -0.5, 0.0, 0.0, -1.0], device=DEVICE)
    likeliest = (x / t[:, None]).amax(-1)
    assert torch.equal(sampling.filter_floor(x, t, top_k, top_p), likeliest)
    assert torch.equal(filter_floor(x, t, top_k, top_p), likeliest)
    assert torch.equal(ops.filter_floor(x, t, top_k, top_p), likeliest)


def test_the_op_checks_its_inputs():
    x = torch.zeros(3, 8)
    t, k = torch.ones(3), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="float logits"):
        ops.filter_floor(x.long(), t, k, t)
    with pytest.raises(ValueError, match=r"float logits \[N, V >= 1\], got torch.float32 \[3, 0\]"):
        ops.filter_floor(x[:, :0], t, k, t)  # an IndexError on the CPU, a garbage floor on CUDA
    with pytest.raises(ValueError, match="integer top_k and top_p"):
        ops.filter_floor(x, t, k[:2], t)
    with pytest.raises(ValueError, match=r"top_k torch\.float32"):
        ops.filter_floor(x, t, t, t)


@pytest.mark.gpu
def test_a_real_vocabulary_on_the_gpu(gen):
    """Qwen3's 151,936 tokens, a verify's rows with a request's settings, through the operator (the
    kernel on CUDA)."""
    x = (torch.randn(64, 151936, generator=gen) * 3).to(DEVICE)
    x[:, :5000] += 4  # a broad nucleus
    top_k = torch.tensor([0, 50, 1, 20000] * 16, device=DEVICE)
    top_p = torch.tensor([0.9, 0.95, 1.0, 0.5, 0.99, 1.0, 0.8, 0.3] * 8, device=DEVICE)
    check(x, top_k, top_p)
    assert torch.equal(ops.filter_floor(x, ones(64), top_k, top_p), filter_floor(x, ones(64), top_k, top_p))
