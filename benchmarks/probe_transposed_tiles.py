"""The value-tile kernel transposed: the state tile as the tensor cores' register operand.

    python benchmarks/probe_transposed_tiles.py --out DIR    # H200, about a minute

The kept value-tile kernel computes ``K S``, ``Q S``, ``U = W' X`` and ``O = C' U`` with every operand of
the four products in shared memory (benchmarks/results/probe_value_bytes_h200.json: its four programs
per SM keep the shared-memory pipe 85 % busy). Transposed, ``(K S)ᵀ = Sᵀ Kᵀ``, ``Uᵀ = Xᵀ W'ᵀ`` and
``Oᵀ = Uᵀ C'ᵀ``: the left operands (the state tile, X, U) are values the program computes, which
Triton keeps in registers on sm_90 (wgmma's A from registers), and only K, Q, W' and C' go through
shared memory. This probe times that kernel, on factors formed once by the kept factor kernel, beside
the kept value-tile kernel, each first checked against the float64 serial recurrence (relative RMS of
o and u under 1e-2; a variant that fails is not timed). CUDA-graph replays, L2 flushed, inputs
rotating, two rounds. Writes ``<out>/probe_transposed_tiles_<device>.json``.
"""

from __future__ import annotations

import sys

import _bench_util as U
import torch
import triton
import triton.language as tl

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv
from trtllm_bole.kernels._verify_tiles import _UPCAST, _is_ancestor, _operand, _rows
from trtllm_bole.testing import topk_parents

CONFIG = inv.InverseConfig(64, 64, 64, 4, 2, 8, 128)
POINTS = (("qwen3.5-9b", 32, 4), ("qwen3.5-9b", 32, 8), ("qwen3.5-9b", 32, 16), ("qwen3.5-9b", 32, 32),
          ("qwen3.5-27b", 48, 16))  # fmt: skip
ROUNDS = 2
VARIANTS = {  # name: (BV, warps, register cap, bf16 T x T products)
    "t64": (64, 4, None, False),
    "t64_r168": (64, 4, 168, False),
    "t64_r128": (64, 4, 128, False),
    "t64_bf16": (64, 4, None, True),
    "t64_bf16_r168": (64, 4, 168, True),
    "t128": (128, 8, None, False),
    "t128_bf16": (128, 8, None, True),
}


@triton.jit(do_not_specialize=["d", "n_total"])
def _value_tiles_t_kernel(
    q, k, v, g, beta, state, slots, cu_seqlens, dfs_order, subtree_size, depth, paths,
    o, u, log_p, factors, scratch, a_log, dt_bias,
    scale, hv, n_total, d,
    H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
    BV: tl.constexpr, USE_SLOTS: tl.constexpr, PREC: tl.constexpr, X_BF16: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    i_v, i_hv, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (hv // H)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    o_d = tl.arange(0, DK)
    slot = tl.load(slots + i_b).to(tl.int64) if USE_SLOTS else i_b.to(tl.int64)
    s_req = state + (slot * hv + i_hv) * (DK * DV)
    s_t = tl.trans(tl.load(s_req + (o_d[:, None] * DV + o_v[None, :])).to(tl.bfloat16))  # [BV, DK]
    s_t = _operand(s_t, UPCAST)
    bos = tl.load(cu_seqlens + i_b).to(tl.int64)
    n_t = (tl.load(cu_seqlens + i_b + 1) - bos).to(tl.int32)
    if n_t <= BT:
        m_t = o_t < n_t
        ord_t = tl.load(dfs_order + bos + o_t, mask=m_t, other=0).to(tl.int32)
        end_t = ord_t + tl.load(subtree_size + bos + o_t, mask=m_t, other=0).to(tl.int32)
        dep_t = tl.load(depth + bos + o_t, mask=m_t, other=1).to(tl.int32)
        k_t = _rows(k + (bos * H + i_h) * DK, o_t, m_t, H * DK, o_d)
        q_t = _rows(q + (bos * H + i_h) * DK, o_t, m_t, H * DK, o_d)
        out = o_t[None, :] * (hv * DV) + o_v[:, None]  # [BV, BT]: value channel, node
        v_t = tl.load(v + (bos * hv + i_hv) * DV + out, mask=m_t[None, :], other=0.0)
        lp = tl.load(log_p + (bos + o_t) * hv + i_hv, mask=m_t, other=0.0)
        anc_t = tl.trans(_is_ancestor(ord_t, ord_t, end_t, m_t, m_t))
        w_req = factors + (i_hv * n_total + bos) * d
        offs_t = o_t[None, :] * d + (dep_t - 1)[:, None]
        w_t = tl.load(w_req + offs_t, mask=anc_t, other=0.0)  # [j, i] = W'[i, j]
        c_t = tl.load(w_req + hv * n_total * d + offs_t, mask=anc_t, other=0.0)
        decay = tl.exp(lp)
        ks = tl.dot(s_t, tl.trans(_operand(k_t, UPCAST)))  # (K S)ᵀ
        qs = tl.dot(s_t, tl.trans(_operand(q_t, UPCAST)))
        x = v_t.to(tl.float32) - ks * decay[None, :]
        if X_BF16:
            u_t = tl.dot(_operand(x.to(tl.bfloat16), UPCAST), _operand(w_t.to(tl.bfloat16), UPCAST))
        else:
            u_t = tl.dot(x, w_t, input_precision=PREC)
        tl.store(u + (bos * hv + i_hv) * DV + out, u_t, mask=m_t[None, :])
        acc = scale * decay[None, :] * qs
        if X_BF16:
            o_t_ = tl.dot(_operand(u_t.to(tl.bfloat16), UPCAST), _operand(c_t.to(tl.bfloat16), UPCAST), acc)
        else:
            o_t_ = tl.dot(u_t, c_t, acc, input_precision=PREC)
        tl.store(o + (bos * hv + i_hv) * DV + out, o_t_.to(o.dtype.element_ty), mask=m_t[None, :])


def launch_transposed(kernel_args: tuple, consts: dict, name: str, hv: int, batch: int) -> None:
    """The transposed value-tile kernel of variant ``name`` on the arguments and constants of
    ``inv.inverse_launch_args`` (whose factor kernel has run)."""
    bv, warps, cap, x_bf16 = VARIANTS[name]
    options = {"num_warps": warps, "num_stages": 1, **({"maxnreg": cap} if cap else {})}
    _value_tiles_t_kernel[(consts["DV"] // bv, hv, batch)](
        *kernel_args, H=consts["H"], DK=consts["DK"], DV=consts["DV"], BT=consts["BT"], BV=bv,
        USE_SLOTS=consts["USE_SLOTS"], PREC=consts["PREC"], X_BF16=x_bf16, UPCAST=_UPCAST, **options,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    start = U.probe_start(__doc__, "probe_transposed_tiles.py", argv)
    if start is None:
        return 2
    args, measure, gen = start
    rows = []
    for model, hv, batch in POINTS:
        trees = [topk_parents(64, 4, 8)] * batch
        sets = U.rotations(
            lambda trees=trees, hv=hv: U.make_inputs(
                U.tree_of(trees, "cuda"), U.H, hv, U.DK, U.DV, torch.bfloat16, gen
            )
        )
        prepared = [inv.inverse_launch_args(x.call("bf16"), CONFIG) for x in sets]

        def launch(p, phase, hv=hv, batch=batch):
            _, kernel_args, consts = p
            kernel, grid, constexprs, options = inv.phase_launch(phase, CONFIG, consts, hv, U.DV, batch)
            kernel[grid](*kernel_args, **constexprs, **options)

        values = {"kept": lambda p: launch(p, 2)}
        for name in VARIANTS:
            values[name] = lambda p, n=name, hv=hv, batch=batch: launch_transposed(p[1], p[2], n, hv, batch)
        exact = U.exact_outputs(sets[0])
        row = {"model": model, "hv": hv, "batch": batch, "rel_rms": {}, "value_us": {}, "verify_us": {}}
        rows.append(row)
        timed = []
        for name, fn in values.items():
            for p in prepared:
                launch(p, 1)
            outputs = prepared[0][0]
            outputs[0].fill_(float("nan"))
            outputs[1].fill_(float("nan"))
            fn(prepared[0])
            errors = [U.rel_rms(outputs[0], exact[0]), U.rel_rms(outputs[1], exact[2])]
            row["rel_rms"][name] = errors
            if U.passes(errors, 1e-2):
                timed.append(name)
            else:
                print(f"{model} B={batch} {name}: failed its check (o {errors[0]:.2e}, u {errors[1]:.2e})")
        for _ in range(ROUNDS):
            for name in timed:
                fn = values[name]
                row["value_us"].setdefault(name, []).append(measure(U.Rotating(prepared, fn)))
                both = U.Rotating(prepared, lambda p, fn=fn: (launch(p, 1), fn(p)))
                row["verify_us"].setdefault(name, []).append(measure(both))
        print(
            f"{model} B={batch}: "
            + ", ".join(f"{n} {min(row['value_us'][n]):.1f}/{min(row['verify_us'][n]):.1f}" for n in timed)
        )
    meta = U.run_meta(config=str(CONFIG), tree={"size": 64, "top_k": 4, "depth": 8}, variants=VARIANTS)
    path = U.write_result(args.out, U.result_name("probe_transposed_tiles"), {"meta": meta, "rows": rows})
    print(f"wrote {path}")
    return 1 if any(not U.passes(e, 1e-2) for row in rows for e in row["rel_rms"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
