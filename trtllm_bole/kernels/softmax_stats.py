"""What a filtered softmax needs of each row of logits to give any one of its probabilities, in one read of
the row: its argmax and the normaliser ``Σ exp(x / t - max)`` over the logits its floor keeps
(:func:`trtllm_bole.reference.sampling.softmax_stats`).

Sampled acceptance reads one probability a node, each at its parent's row (BOLE.md §4); processing the
whole ``[N, V]`` rows for that (divide, mask, softmax) took seven passes over them and most of an
acceptance's time besides its floors at a real vocabulary. Here each row is split in spans of
:data:`SPAN` logits, one program a span (a row alone is too little work for an SM: a verify of one
request has 64 rows), which keeps for each lane its largest logit and where it first saw it, and an online
softmax of the kept logits (the largest kept ``x / t`` and the sum of ``exp`` below it, rescaled when it
grows: one ``exp`` a logit); a second launch, one program a row, merges the spans. ``x / t`` is rounded
as torch divides (``div_rn``), so the floor keeps exactly what the reference's mask keeps. The sums are
float32 in another order than the reference's, so normalisers agree to float32 rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
SPAN = 8 * BLOCK
"""Logits a program reads (a row of 151,936 is 19 spans)."""
NUM_WARPS = 4


@triton.jit
def _finite(top):
    """A running maximum to subtract, 0 while it is ``-inf`` (nothing kept yet, no mass to rescale): the
    ``exp`` of a kept value less it stays finite, and of ``-inf`` less it 0."""
    return tl.where(top > float("-inf"), top, 0.0)


@triton.jit
def _add(mass, top, s):
    """A lane's online softmax after ``s`` (``-inf``: not kept): ``mass`` is the sum of ``exp`` of its kept
    values less ``top``, their maximum. One ``exp`` a value: of ``s`` less the maximum if ``s`` is not
    above it, else of the old maximum less ``s``, which rescales the sum."""
    higher = s > top
    grown = tl.where(higher, s, top)
    e = tl.exp(tl.where(higher, top, s) - _finite(grown))
    return tl.where(higher, mass * e + 1.0, mass + e), grown


@triton.jit(do_not_specialize=["n", "row_stride", "spans"])
def _span_kernel(logits, temperature, floor, best, first, top, mass, n, row_stride, spans,
                 BLOCK: tl.constexpr, SPAN: tl.constexpr):  # fmt: skip
    """Span ``program_id(1)`` of row ``program_id(0)``: its largest logit and its first index, its largest
    kept ``x / t`` (``-inf`` if it keeps none) and the sum of ``exp(x / t - that)`` over its kept logits,
    into ``[N, spans]`` partials."""
    i_row = tl.program_id(0).to(tl.int64)
    span = tl.program_id(1)
    row = logits + i_row * row_stride
    t = tl.load(temperature + i_row).to(tl.float32)
    f = tl.load(floor + i_row)
    o = tl.arange(0, BLOCK)
    lane_best = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_first = tl.zeros([BLOCK], tl.int32)
    lane_top = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_mass = tl.zeros([BLOCK], tl.float32)
    for start in range(span * SPAN, tl.minimum(span * SPAN + SPAN, n), BLOCK):
        cols = start + o
        x = tl.load(row + cols, mask=cols < n, other=float("-inf")).to(tl.float32)
        higher = x > lane_best  # strictly: a lane keeps the first of equal logits
        lane_first = tl.where(higher, cols, lane_first)
        lane_best = tl.where(higher, x, lane_best)
        s = tl.math.div_rn(x, t)
        s = tl.where(s >= f, s, float("-inf"))
        lane_mass, lane_top = _add(lane_mass, lane_top, s)
    span_best = tl.max(lane_best, axis=0)
    span_top = tl.max(lane_top, axis=0)
    span_mass = tl.sum(lane_mass * tl.exp(lane_top - _finite(span_top)), axis=0)
    at = i_row * spans + span
    tl.store(best + at, span_best)
    tl.store(first + at, tl.min(tl.where(lane_best == span_best, lane_first, n), axis=0))
    tl.store(top + at, span_top)
    tl.store(mass + at, span_mass)


@triton.jit(do_not_specialize=["n", "spans"])
def _merge_kernel(best, first, top, mass, argmax, normaliser, n, spans, SPANS: tl.constexpr):
    """Row ``program_id(0)``'s argmax and normaliser from its spans' partials."""
    i_row = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, SPANS)
    inside = o < spans
    at = i_row * spans + o
    span_best = tl.load(best + at, mask=inside, other=float("-inf"))
    span_first = tl.load(first + at, mask=inside, other=n)
    span_top = tl.load(top + at, mask=inside, other=float("-inf"))
    span_mass = tl.load(mass + at, mask=inside, other=0.0)
    row_best = tl.max(span_best, axis=0)
    row_top = tl.max(span_top, axis=0)
    tl.store(argmax + i_row, tl.min(tl.where(span_best == row_best, span_first, n), axis=0).to(tl.int64))
    tl.store(normaliser + i_row, tl.sum(span_mass * tl.exp(span_top - _finite(row_top)), axis=0))


def softmax_stats(
    logits: torch.Tensor, temperature: torch.Tensor, floor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's argmax (int64 ``[N]``) and softmax normaliser over its kept logits (``[N]``, float32, or
    float64 storage for float64 logits: computed in float32), for logits ``[N, V]`` of any float dtype,
    ``temperature [N]`` (> 0) and ``floor [N]``."""
    # Rows at unit stride, the settings flat (as filter_floor reads them).
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    temperature, floor = temperature.contiguous(), floor.contiguous()
    rows, vocab = logits.shape
    device = logits.device
    argmax = torch.empty(rows, dtype=torch.long, device=device)
    normaliser = torch.empty(rows, dtype=torch.promote_types(logits.dtype, torch.float32), device=device)
    spans = max(1, triton.cdiv(vocab, SPAN))
    if rows:
        best, top, mass = (torch.empty((rows, spans), dtype=torch.float32, device=device) for _ in range(3))
        first = torch.empty((rows, spans), dtype=torch.int32, device=device)
        _span_kernel[(rows, spans)](
            logits, temperature, floor, best, first, top, mass, vocab, logits.stride(0), spans,
            BLOCK=BLOCK, SPAN=SPAN, num_warps=NUM_WARPS,
        )  # fmt: skip
        _merge_kernel[(rows,)](
            best, first, top, mass, argmax, normaliser, vocab, spans, SPANS=triton.next_power_of_2(spans),
            num_warps=1,
        )  # fmt: skip
    return argmax, normaliser
