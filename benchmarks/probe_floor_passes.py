"""Where the floor kernel's time goes: one pass over a verify's rows at a real vocabulary, one program a row
(as :mod:`trtllm_bole.kernels.filter_floor` runs it) against one program a span of a row.

    python benchmarks/probe_floor_passes.py --out DIR     # H200, about a minute

Rows of 151,936 logits (``randn * 2``, temperature 0.8), 64 and 2,048 of them (batch 1 and 32). Each pass
is the floor kernel's first window level (16 windows of 1 nat below the row's maximum): its counts, or
its counts and masses; beside it a pass that only sums ``exp`` (the traffic and the exponentials) and
the row maximum. The span passes count by ``tl.histogram`` or by one-hot sums, and sum the masses one-hot
in a ``[block, 16]`` or a ``[16, block]`` (``[digits, block]``) tile; they must give the row passes'
counts and masses (summed over spans), else nothing is timed. Writes
``<out>/probe_floor_passes_<device>.json``.
"""

from __future__ import annotations

import sys

import _bench_util as U
import torch
import triton
import triton.language as tl

from trtllm_bole import ops
from trtllm_bole.kernels.filter_floor import _histograms, _key_block, _row_max, _window_index


@triton.jit
def _row_pass(src, mx_ptr, inv_t, counts_out, mass_out, n, stride, MASS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    mx = tl.load(mx_ptr + r)
    counts, mass = _histograms(src + r * stride, n, inv_t, -2147483648, mx, 1.0, 0, 0, 0, 0, True, True, MASS,
                               BLOCK)  # fmt: skip
    o = tl.arange(0, 16)
    tl.store(counts_out + r * 16 + o, counts)
    tl.store(mass_out + r * 16 + o, mass)


@triton.jit
def _row_max_pass(src, out, n, stride, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    tl.store(out + r, _row_max(src + r * stride, n, BLOCK))


@triton.jit
def _span_pass(src, mx_ptr, inv_t, counts_out, mass_out, n, stride, spans, SPAN: tl.constexpr,
               MASS: tl.constexpr, ONEHOT_COUNTS: tl.constexpr, BLOCK: tl.constexpr,
               T: tl.constexpr):  # fmt: skip
    r = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    row = src + r * stride
    mx = tl.load(mx_ptr + r)
    digits = tl.arange(0, 16)
    counts = tl.zeros([16], tl.int32)
    hits = tl.zeros([16, BLOCK], tl.int32) if T else tl.zeros([BLOCK, 16], tl.int32)
    mass = tl.zeros([16, BLOCK], tl.float32) if T else tl.zeros([BLOCK, 16], tl.float32)
    for start in range(s * SPAN, tl.minimum(s * SPAN + SPAN, n), BLOCK):
        x, _, member = _key_block(row, start, n, BLOCK)
        index = _window_index(x, mx, inv_t, 1.0)
        member &= (index >> 4) == 0
        digit = 15 - (index & 15)
        if T:
            hit = (digit[None, :] == digits[:, None]) & member[None, :]
        else:
            hit = (digit[:, None] == digits[None, :]) & member[:, None]
        if ONEHOT_COUNTS:
            hits += hit.to(tl.int32)
        else:
            counts += tl.histogram(digit, 16, mask=member)
        if MASS:
            e = tl.exp((x - mx) * inv_t)
            if T:
                mass += tl.where(hit, e[None, :], 0.0)
            else:
                mass += tl.where(hit, e[:, None], 0.0)
    if ONEHOT_COUNTS:
        counts = tl.sum(hits, axis=1 if T else 0)
    at = (r * spans + s) * 16 + digits
    tl.store(counts_out + at, counts.to(tl.float32))
    tl.store(mass_out + at, tl.sum(mass, axis=1 if T else 0))


@triton.jit
def _span_exp(src, mx_ptr, inv_t, out, n, stride, spans, SPAN: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    mx = tl.load(mx_ptr + r)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(s * SPAN, tl.minimum(s * SPAN + SPAN, n), BLOCK):
        x, _, _ = _key_block(src + r * stride, start, n, BLOCK)
        acc += tl.exp((x - mx) * inv_t)
    tl.store(out + r * spans + s, tl.sum(acc, axis=0))


VOCAB, INV_T = 151936, 1 / 0.8
SPANS = ((8192, 512, 4, False), (8192, 512, 4, True), (8192, 1024, 4, True), (8192, 256, 4, True),
         (16384, 1024, 8, True))  # fmt: skip
"""(span, block, warps, masses as [16, block]) of the span passes."""


def point(rows: int, gen: torch.Generator, measure) -> dict | None:
    """The passes over ``rows`` rows, timed; ``None`` if a span pass disagrees with the row pass."""
    x = torch.randn(rows, VOCAB, device="cuda", generator=gen) * 2
    mx = x.amax(1)
    pt = {"rows": rows, "vocab": VOCAB, "row_bytes_total": x.numel() * 4}
    t = torch.full((rows,), 0.8, device="cuda")
    for setting, (k, p) in {"top-p 0.9": (0, 0.9), "top-k 50": (50, 1.0)}.items():
        kk, pp = torch.full((rows,), k, device="cuda"), torch.full((rows,), p, device="cuda")
        pt[f"kernel {setting}"] = measure(lambda kk=kk, pp=pp: ops.filter_floor(x, t, kk, pp))
    out_mx = torch.empty(rows, device="cuda")
    pt["row max, a program a row"] = measure(
        lambda: _row_max_pass[(rows,)](x, out_mx, VOCAB, VOCAB, BLOCK=512)
    )
    assert torch.equal(out_mx, mx)
    ref = {}
    for mass in (False, True):
        c, m = torch.empty(rows, 16, device="cuda"), torch.empty(rows, 16, device="cuda")
        name = "counts + masses" if mass else "counts"
        pt[f"{name}, a program a row"] = measure(
            lambda c=c, m=m, mass=mass: _row_pass[(rows,)](
                x, mx, INV_T, c, m, VOCAB, VOCAB, MASS=mass, BLOCK=512
            )
        )
        ref[mass] = (c.clone(), m.clone())
    for span, block, warps, tr in SPANS:
        spans = triton.cdiv(VOCAB, span)
        for mass in (False, True):
            for onehot in (False, True):
                c, m = (
                    torch.empty(rows, spans, 16, device="cuda"),
                    torch.empty(rows, spans, 16, device="cuda"),
                )
                grid = (rows, spans)
                consts = {"SPAN": span, "MASS": mass, "ONEHOT_COUNTS": onehot, "BLOCK": block, "T": tr}

                def run(c=c, m=m, grid=grid, spans=spans, consts=consts, warps=warps):
                    _span_pass[grid](x, mx, INV_T, c, m, VOCAB, VOCAB, spans, **consts, num_warps=warps)

                run()
                same = torch.equal(c.sum(1), ref[mass][0]) and (
                    not mass or torch.allclose(m.sum(1), ref[mass][1], rtol=1e-4)
                )
                name = f"{'counts + masses' if mass else 'counts'}{' (one-hot counts)' if onehot else ''}"
                name += " [digits, block]" if tr else ""
                if not same:
                    print(f"{name} span {span}: differs from the row pass", file=sys.stderr)
                    return None
                pt[f"{name}, span {span} block {block} warps {warps}"] = measure(run)
        if not tr:
            e = torch.empty(rows, spans, device="cuda")
            consts = {"SPAN": span, "BLOCK": block}
            pt[f"exp sum, span {span} block {block} warps {warps}"] = measure(
                lambda e=e, spans=spans, consts=consts, warps=warps: _span_exp[(rows, spans)](
                    x, mx, INV_T, e, VOCAB, VOCAB, spans, **consts, num_warps=warps
                )
            )
    for key, us in pt.items():
        if isinstance(us, float):
            print(f"{rows} rows  {key}: {us:.1f} us", flush=True)
    return pt


def main(argv: list[str] | None = None) -> int:
    start = U.probe_start(__doc__, "probe_floor_passes.py", argv)
    if start is None:
        return 2
    args, measure, gen = start
    points = [point(rows, gen, measure) for rows in (64, 2048)]
    if None in points:
        return 1
    data = {"meta": U.run_meta(), "points": points}
    path = U.write_result(args.out, U.result_name("probe_floor_passes"), data)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
