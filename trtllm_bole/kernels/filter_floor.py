"""The top-k / top-p threshold of rows of logits without sorting them: a radix select per row.

The torch reference (:func:`trtllm_bole.reference.sampling.filter_floor`) sorts every row, which at a
real vocabulary is most of a sampled step's time (151,936 tokens, a verify's 2,048 rows: ~40 ms on the
H200, benchmarks/results/sampled_accept_h200.json). The threshold is one logit a row, and it can be
found digit by digit. A float32 maps to an int32 key in the same order (negative floats flip their
other 31 bits); one program reads its row once per 4-bit digit of the key, high digits first, counting
the row's keys under the digits chosen so far by their next digit:

- top-k: the k-th largest key, by counts (the digit where the count of keys at or above it reaches the
  rank still sought);
- top-p: among the top-k keys, the largest key at which the mass ``exp(x - max)`` at or above it
  reaches ``top_p`` of the top-k mass, by the mass of each digit (``tl.histogram`` counts, a one-hot
  sum weighs); that is the last token the sorted walk keeps (the mass before it is below ``top_p``).

Eight passes find a key; top-k and top-p together take seventeen (top-p needs the row's max and the
top-k floor first). The masses are float32 sums in another order than the reference's cumulative sum,
so a row whose mass before its boundary token is within rounding of ``top_p`` may keep one value more
or less than the reference; every other row gets the reference's floor bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

INT32_MIN = -2147483648
BLOCK = 1024
NUM_WARPS = 8


@triton.jit
def _ordered(bits):
    """int32 keys in the order of the float32s whose bits they are (applied to a key: the bits back)."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _key_block(row, start, n, BLOCK: tl.constexpr):
    offs = start + tl.arange(0, BLOCK)
    inside = offs < n
    x = tl.load(row + offs, mask=inside, other=float("-inf")) + 0.0  # -0.0 and 0.0 tie as in the sort
    return x, _ordered(x.to(tl.int32, bitcast=True)), inside


@triton.jit
def _row_max(row, n, BLOCK: tl.constexpr):
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        x, _, _ = _key_block(row, start, n, BLOCK)
        best = tl.maximum(best, x)
    return tl.max(best, axis=0)


@triton.jit
def _digit_histograms(row, n, least, prefix, known, shift, mx, MASS: tl.constexpr, BLOCK: tl.constexpr):
    """Of the keys ``>= least`` whose unsigned bits under ``known`` are ``prefix``: how many, and
    (``MASS``) their ``exp(x - mx)``, by the digit ``(key >> shift) & 15``."""
    counts = tl.zeros([16], tl.int32)
    mass = tl.zeros([BLOCK, 16], tl.float32)
    digits = tl.arange(0, 16)
    for start in range(0, n, BLOCK):
        x, key, inside = _key_block(row, start, n, BLOCK)
        unsigned = key ^ INT32_MIN
        match = inside & (key >= least) & ((unsigned & known) == prefix)
        digit = (unsigned >> shift) & 15
        counts += tl.histogram(digit, 16, mask=match)
        if MASS:  # noqa: SIM102 (a constexpr: resolved when the kernel compiles, the test below at run time)
            if tl.max(match.to(tl.int32), axis=0) > 0:  # past the high digits most blocks hold none
                weight = tl.where(match, tl.exp(x - mx), 0.0)
                mass += tl.where(digit[:, None] == digits[None, :], weight[:, None], 0.0)
    return counts, tl.sum(mass, axis=0)


@triton.jit
def _at_or_above(values):
    """``[16]``: the sum of ``values`` over the digits at or above each digit."""
    digits = tl.arange(0, 16)
    return tl.sum(tl.where(digits[None, :] >= digits[:, None], values[None, :], 0), axis=1)


@triton.jit
def _kth_digit(counts, rank):
    """The digit that holds the ``rank``-th largest of the counted keys, and its rank among that digit's."""
    digits = tl.arange(0, 16)
    digit = tl.max(tl.where(_at_or_above(counts) >= rank, digits, -1), axis=0)
    return digit, rank - tl.sum(tl.where(digits > digit, counts, 0), axis=0)


@triton.jit
def _nucleus_digit(counts, mass, above, target):
    """The highest digit at which the mass at or above it (``above``: the mass of the keys above the
    digits counted) reaches ``target``, else (rounding) the lowest digit holding keys; the mass above it."""
    digits = tl.arange(0, 16)
    reached = ((above + _at_or_above(mass)) >= target) & (counts > 0)
    lowest = tl.min(tl.where(counts > 0, digits, 16), axis=0)
    digit = tl.max(tl.where(reached, digits, -1), axis=0)
    digit = tl.where(digit >= 0, digit, lowest)
    return digit, above + tl.sum(tl.where(digits > digit, mass, 0.0), axis=0)


@triton.jit
def _filter_floor_kernel(scaled, top_k, top_p, floor, n, row_stride, BLOCK: tl.constexpr):
    request = tl.program_id(0).to(tl.int64)
    row = scaled + request * row_stride
    k = tl.load(top_k + request).to(tl.int32)
    p = tl.load(top_p + request).to(tl.float32)
    least = tl.full([], INT32_MIN, tl.int32)  # the top-k floor's key; every key while top-k keeps all
    if (k > 0) & (k < n):
        prefix = tl.zeros([], tl.int32)
        known = tl.zeros([], tl.int32)
        rank = k
        for i in range(8):
            shift = 28 - 4 * i
            counts, _ = _digit_histograms(row, n, INT32_MIN, prefix, known, shift, 0.0, False, BLOCK)
            digit, rank = _kth_digit(counts, rank)
            prefix |= digit << shift
            known |= 15 << shift
        least = prefix ^ INT32_MIN
    if p < 1:
        mx = _row_max(row, n, BLOCK)
        prefix = tl.zeros([], tl.int32)
        known = tl.zeros([], tl.int32)
        above = tl.zeros([], tl.float32)
        target = tl.zeros([], tl.float32)
        for i in range(8):
            shift = 28 - 4 * i
            counts, mass = _digit_histograms(row, n, least, prefix, known, shift, mx, True, BLOCK)
            if i == 0:
                target = p * tl.sum(mass, axis=0)
            digit, above = _nucleus_digit(counts, mass, above, target)
            prefix |= digit << shift
            known |= 15 << shift
        least = prefix ^ INT32_MIN
    value = _ordered(least).to(tl.float32, bitcast=True)
    filters = ((k > 0) & (k < n)) | (p < 1)
    tl.store(floor + request, tl.where(filters, value, float("-inf")))


def filter_floor(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The smallest logit that top-k and top-p keep in each row of ``scaled [N, V]`` (float32, unit
    stride along V); ``top_k``, ``top_p`` ``[N]``. Returns ``[N]`` float32, ``-inf`` where neither
    filters (the reference's contract)."""
    floor = torch.empty(scaled.shape[0], dtype=torch.float32, device=scaled.device)
    if scaled.shape[0]:
        _filter_floor_kernel[(scaled.shape[0],)](
            scaled, top_k, top_p, floor, scaled.shape[1], scaled.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS
        )
    return floor
