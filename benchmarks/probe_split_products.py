"""The verify in three kernels, the state products beside the factor kernel, timed beside the kept pair.

    python benchmarks/probe_split_products.py --out DIR    # H200, about two minutes

In the kept two-kernel verify the value tiles need the factors (``W'``, ``C'``) before they can finish, so
the factor kernel runs first and nothing overlaps it: at 9B batch 16 it takes 16.8 µs alone, the value
tiles 36.2, both 49.4 (benchmarks/EXPERIMENTS.md, 2026-12-05). Here the value tile's state products
``K S`` and ``Q S`` (its two large products and all of its DRAM traffic) move into a kernel of their own,
which needs nothing from the factors, launched on a second stream while the factor kernel runs; a third
kernel then reads ``K S`` and ``Q S`` back (a ``[T, bv]`` fp32 pair a tile, mostly from the L2), gathers
the factors and forms ``X``, ``U = W' X`` and ``O`` as the kept value tile does (its own helpers). The
price is that round trip; the gain is whatever of the factor kernel the state products hide.

Variants: ``split`` (fp32 intermediates, two streams, the factor kernel launched first, the other two capped
at 128 registers), ``split_bf16`` (the intermediates in bf16: half the round trip, one more rounding),
``split_serial`` (the three kernels on one stream: what the overlap gives), ``split_uncapped`` (no register
cap), ``split_products_first`` (the state products launched before the factor kernel).
Each is first checked against the float64 serial recurrence (relative RMS of o and u under 1e-2; one that
fails is not timed); CUDA-graph replays, L2 flushed, inputs rotating, three interleaved rounds; then each
kernel alone. Writes ``<out>/probe_split_products_<device>.json``.
"""

from __future__ import annotations

import sys

import _bench_util as U
import torch
import triton
import triton.language as tl

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv
from trtllm_bole.kernels._inverse_factors import _factor_tile
from trtllm_bole.kernels._verify_tiles import _UPCAST, _is_ancestor, _rows
from trtllm_bole.kernels.gdn_tree_verify import default_plan
from trtllm_bole.kernels.gdn_tree_verify_inverse import _chunk_products, _tile_outputs
from trtllm_bole.testing import topk_parents

POINTS = (("qwen3.5-9b", 32, 8), ("qwen3.5-9b", 32, 16), ("qwen3.5-9b", 32, 32), ("qwen3.5-27b", 48, 16))
ROUNDS = 3
VARIANTS = ("split", "split_bf16", "split_serial", "split_uncapped", "split_products_first")


@triton.jit
def _state_products_kernel(q, k, state, slots, cu_seqlens, ks_out, qs_out, hv,
                           H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
                           BV: tl.constexpr, USE_SLOTS: tl.constexpr, PREC: tl.constexpr,
                           S_BF16: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """``K S`` and ``Q S`` of one value tile (grid ``(dv / BV, HV, B)``), stored ``[N, HV, DV]``."""
    i_v, i_hv, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    o_d = tl.arange(0, DK)
    slot = tl.load(slots + i_b).to(tl.int64) if USE_SLOTS else i_b.to(tl.int64)
    s_t = tl.load(state + (slot * hv + i_hv) * (DK * DV) + (o_d[:, None] * DV + o_v[None, :]))
    bos = tl.load(cu_seqlens + i_b).to(tl.int64)
    n_t = (tl.load(cu_seqlens + i_b + 1) - bos).to(tl.int32)
    if n_t <= BT:
        m_t = o_t < n_t
        i_h = i_hv // (hv // H)
        k_t = _rows(k + (bos * H + i_h) * DK, o_t, m_t, H * DK, o_d)
        q_t = _rows(q + (bos * H + i_h) * DK, o_t, m_t, H * DK, o_d)
        ks, qs = _chunk_products(k_t, q_t, s_t, PREC, S_BF16, UPCAST)
        out = (bos * hv + i_hv) * DV + (o_t[:, None] * (hv * DV) + o_v[None, :])
        tl.store(ks_out + out, ks.to(ks_out.dtype.element_ty), mask=m_t[:, None])
        tl.store(qs_out + out, qs.to(qs_out.dtype.element_ty), mask=m_t[:, None])


@triton.jit
def _split_outputs_kernel(v, cu_seqlens, dfs_order, subtree_size, depth, o, u, log_p, factors, ks_in, qs_in,
                          scale, hv, n_total, d, DV: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                          PREC: tl.constexpr):  # fmt: skip
    """The kept value tile's outputs from the stored state products and the factor kernel's factors."""
    i_v, i_hv, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos = tl.load(cu_seqlens + i_b).to(tl.int64)
    n_t = (tl.load(cu_seqlens + i_b + 1) - bos).to(tl.int32)
    if n_t <= BT:
        o_v = i_v * BV + tl.arange(0, BV)
        o_t = tl.arange(0, BT)
        m_t = o_t < n_t
        ord_t = tl.load(dfs_order + bos + o_t, mask=m_t, other=0).to(tl.int32)
        end_t = ord_t + tl.load(subtree_size + bos + o_t, mask=m_t, other=0).to(tl.int32)
        dep_t = tl.load(depth + bos + o_t, mask=m_t, other=1).to(tl.int32)
        base = (bos * hv + i_hv) * DV
        out = o_t[:, None] * (hv * DV) + o_v[None, :]
        ks = tl.load(ks_in + base + out, mask=m_t[:, None], other=0.0).to(tl.float32)
        qs = tl.load(qs_in + base + out, mask=m_t[:, None], other=0.0).to(tl.float32)
        v_t = _rows(v + base, o_t, m_t, hv * DV, o_v)
        lp = tl.load(log_p + (bos * hv + i_hv) + o_t * hv, mask=m_t, other=0.0)
        anc = _is_ancestor(ord_t, ord_t, end_t, m_t, m_t)
        w_req = factors + (i_hv * n_total + bos) * d
        w = _factor_tile(w_req, o_t, dep_t, d, anc, BT)
        c_t = _factor_tile(w_req + hv * n_total * d, o_t, dep_t, d, anc, BT)
        _tile_outputs(w, c_t, tl.exp(lp), v_t, ks, qs, u + base, o + base, o_t, m_t, o_v, hv, scale, DV, PREC)


class Split:
    """The three kernels on one verify's operands: ``prepare(call)`` allocates, ``launch(prepared)`` runs
    the factor kernel, the state products (on ``side`` when given, else in order) and the outputs."""

    def __init__(self, cfg: inv.InverseConfig, hv: int, batch: int, inter_dtype: torch.dtype,
                 side: torch.cuda.Stream | None, maxnreg: tuple[int | None, int | None] = (128, 128),
                 products_first: bool = False) -> None:  # fmt: skip
        self.cfg, self.hv, self.batch, self.inter_dtype = cfg, hv, batch, inter_dtype
        self.side, self.maxnreg, self.products_first = side, maxnreg, products_first
        self.resources: dict[str, tuple[int, int]] = {}  # kernel: (registers, spilled bytes)

    def _note(self, name: str, compiled) -> None:
        if compiled is not None and hasattr(compiled, "n_regs"):
            self.resources[name] = (compiled.n_regs, compiled.n_spills)

    def prepare(self, call):
        outputs, args, consts = inv.inverse_launch_args(call, self.cfg)
        n, dv = call.v.shape[0], call.v.shape[2]
        scratch = torch.empty((1, n, self.hv, 2 * self.cfg.bt), dtype=torch.float32, device=call.v.device)
        args = (*args[:16], scratch, *args[17:])  # the factor kernel's own scratch: u is being written
        consts = {**consts, "SW": 2 * self.cfg.bt}
        ks = torch.empty((n, self.hv, dv), dtype=self.inter_dtype, device=call.v.device)
        return outputs, args, consts, call, ks, torch.empty_like(ks)

    def factors(self, prepared) -> None:
        _, args, consts, _, _, _ = prepared
        kernel, grid, constexprs, options = inv.phase_launch(1, self.cfg, consts, self.hv, consts["DV"],
                                                             self.batch)  # fmt: skip
        kernel[grid](*args, **constexprs, **options)

    def products(self, prepared) -> None:
        _, _, consts, call, ks, qs = prepared
        cfg, grid = self.cfg, (consts["DV"] // self.cfg.bv, self.hv, self.batch)
        extra = {"maxnreg": self.maxnreg[0]} if self.maxnreg[0] else {}
        compiled = _state_products_kernel[grid](
            call.q, call.k, call.state, call.slots, call.tree.cu_seqlens, ks, qs, self.hv,
            H=consts["H"], DK=consts["DK"], DV=consts["DV"], BT=cfg.bt, BV=cfg.bv,
            USE_SLOTS=consts["USE_SLOTS"], PREC=consts["PREC"], S_BF16=consts["S_BF16"], UPCAST=_UPCAST,
            num_warps=cfg.num_warps, num_stages=1, **extra,
        )  # fmt: skip
        self._note("products", compiled)

    def outputs(self, prepared) -> None:
        (o, u, log_p), args, consts, call, ks, qs = prepared
        cfg, tree = self.cfg, call.tree
        grid = (consts["DV"] // cfg.bv, self.hv, self.batch)
        extra = {"maxnreg": self.maxnreg[1]} if self.maxnreg[1] else {}
        compiled = _split_outputs_kernel[grid](
            call.v, tree.cu_seqlens, tree.dfs_order, tree.subtree_size, tree.depth, o, u, log_p, args[15], ks,
            qs, call.scale, self.hv, call.v.shape[0], tree.max_depth, DV=consts["DV"], BT=cfg.bt, BV=cfg.bv,
            PREC=consts["PREC"], num_warps=cfg.num_warps, num_stages=1, **extra,
        )  # fmt: skip
        self._note("outputs", compiled)

    def launch(self, prepared) -> None:
        if self.side is None:
            self.factors(prepared)
            self.products(prepared)
        else:
            main = torch.cuda.current_stream()
            self.side.wait_stream(main)
            if not self.products_first:  # its programs resident before the products fill the SMs
                self.factors(prepared)
            with torch.cuda.stream(self.side):
                self.products(prepared)
            if self.products_first:
                self.factors(prepared)
            main.wait_stream(self.side)
        self.outputs(prepared)


def main(argv: list[str] | None = None) -> int:
    start = U.probe_start(__doc__, "probe_split_products.py", argv)
    if start is None:
        return 2
    args, measure, gen = start
    side = torch.cuda.Stream()
    rows, failed = [], False
    for model, hv, batch in POINTS:
        trees = [topk_parents(64, 4, 8)] * batch
        sets = U.rotations(
            lambda trees=trees, hv=hv: U.make_inputs(
                U.tree_of(trees, "cuda"), U.H, hv, U.DK, U.DV, torch.bfloat16, gen
            )
        )
        cfg, precision = default_plan(64 * batch, batch, hv, U.DK, U.DV, torch.bfloat16, torch.bfloat16)
        split_cfg = cfg if cfg.launches == 2 else inv.InverseConfig(64, 128, 64, 4, 2, 8, 128)
        exact = U.exact_outputs(sets[0])
        calls = [x.call(precision) for x in sets]
        schemes = {
            "split": Split(split_cfg, hv, batch, torch.float32, side),
            "split_bf16": Split(split_cfg, hv, batch, torch.bfloat16, side),
            "split_serial": Split(split_cfg, hv, batch, torch.float32, None),
            "split_uncapped": Split(split_cfg, hv, batch, torch.float32, side, (None, None)),
            "split_products_first": Split(split_cfg, hv, batch, torch.float32, side, products_first=True),
        }
        kept = [inv.inverse_launch_args(c, cfg) for c in calls]
        runs = {"kept": (kept, U.path_launcher(inv, cfg, hv, batch))}
        runs |= {name: ([s.prepare(c) for c in calls], s.launch) for name, s in schemes.items()}
        row = {"model": model, "hv": hv, "batch": batch, "config": f"{cfg} {precision}",
               "split_config": str(split_cfg), "alone_us": {}}  # fmt: skip
        rows.append(row)
        timed = U.checked_and_timed(runs, exact, row, measure, ROUNDS)
        failed |= len(timed) < len(runs)
        row["resources"] = {name: s.resources for name, s in schemes.items()}
        for name in ("split", "split_bf16", "split_uncapped"):
            if name in timed:
                s, prepared = schemes[name], runs[name][0]
                for part in ("factors", "products", "outputs"):
                    row["alone_us"][f"{name}.{part}"] = measure(U.Rotating(prepared, getattr(s, part)))
        print(f"{model} B={batch}: " + ", ".join(f"{n} {min(t):.1f}" for n, t in row["verify_us"].items())
              + f"; alone {row['alone_us']}")  # fmt: skip
    meta = U.run_meta(tree={"size": 64, "top_k": 4, "depth": 8}, variants=list(VARIANTS), rounds=ROUNDS)
    path = U.write_result(args.out, U.result_name("probe_split_products"), {"meta": meta, "rows": rows})
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
