"""Closed-form tree verification with an explicit ``(I + G)⁻¹`` (BOLE.md §2): no serial chain per tile.

Rewriting Lemma 2 and Theorem 1 with ``W = (I + G)⁻¹`` and ``X = V - D_P K S_pre``:

    U = W' X,    O = scale (D_P Q S_pre) + C' U,    W' = W D_β,    C' = scale C.

``W'`` and ``C'`` depend on the tree, Q, K and the gates only (not on the state or the value channel),
and are nonzero only where column node j is an ancestor of (or is) row node i: the ancestor relation is
transitive, so every power of G keeps G's pattern. A row therefore holds at most ``d`` (tree depth)
nonzeros, which we store compactly as ``[HV, N, d]`` indexed by the column node's depth: 2·d floats per
node and head (64 B at depth 8) instead of a dense ``[T, T]`` tile.

- Phase 1 (:mod:`._inverse_factors`), once per (request, value head). Trees of at most ``BT`` nodes
  (:func:`_path_factors`, in the factor kernel of two launches and in every program of one): on
  compact ``[depth, node]`` tiles read off
  ``tree.paths``, never on dense ``[T, T]`` ones: ``logP`` and its ratios are prefix sums along each node's
  path, ``Q Kᵀ`` and ``K Kᵀ`` are gathered at the ancestors, and row i of W is the last row of the inverse
  of i's own path matrix, by back substitution over the depth. Against the dense form (below; 255 registers,
  ~4,300 SASS instructions a warp, two programs per SM) it takes 96 registers and ~1,200 instructions at
  depth 8 (benchmarks/kernel_resources.py, triton 3.6): on the H200 the factor kernel went from 31.6 to 17.0
  µs at B = 16 (9B heads, T = 64), the verify from 67.4 to 53.3 µs. Trees deeper than
  :data:`COMPACT_MAX_DEPTH` (its back substitution is ``depth - 1`` dependent steps: prefill chains of 64
  ran 4x slower on it) and trees larger than the tile keep the dense form: ancestor masks from the pre-order
  interval test; ``logP`` as a masked row sum of g; ``K Kᵀ``; ``G``; ``W = (I + G)⁻¹`` by block doubling
  (:func:`~._verify_tiles._unit_lower_inverse`, ``log2 BT - 1`` rounds of two products) on the tensor cores.
  Trees larger than the tile ``BT`` are blocked:
  ``W'_rc = -W_rr Σ_{c≤m<r} G_rm W'_mc`` with the earlier block rows read back (their ``C'`` is formed in
  phase 2, block by block).
- Phase 2, one program per (request, value head, value tile): ``Q S`` and ``K S`` over dk (one load of
  each state chunk for both), X, ``U = W' X``, ``O`` from ``C' U``; ``W'`` and ``C'`` gathered into
  dense tiles (:func:`_factor_tile`), optionally under a register cap (``InverseConfig.maxnreg``: four
  programs per SM instead of three, the launcher's default where that saves a wave of them). For trees
  larger than ``BT``, X goes through the ``u`` output, row blocks of U are finished last-first (``U_r``
  only needs ``X_c``, c ≤ r), then O.

O from ``C' U`` rather than from ``(C' W') X`` saves phase 1 a ``[T, T]`` product (H200, Qwen3.5-9B
heads, T = 64: 3-7 % of the verify at B = 1 … 32).

Both phases are latency-bound (benchmarks/profile_verify.py: at batch 1 the compact phase-1 kernel alone
takes 10-11 µs, the dense one took 16; the value-tile kernel 11-13 µs, a state copy 5 µs), so a
single-tile program issues every load
before its first use: the state tile first (one chunk, ``BK = dk``), then the tree, the gates and the
rows of K, Q and V, each loaded once (one round trip after the request's offsets instead of one per use).

``launches=2`` runs the phases as two kernels (phase 1 once per head; the factors make one round trip
through L2); ``launches=1`` runs both in every program of one launch, phase 1 repeated per value tile:
on compact path tiles up to :data:`COMPACT_MAX_DEPTH` (:func:`_compact_one_launch_kernel`, each tile
with its own slice of factors and scratch; the state tile's loads go out before the factors' chain),
dense beyond (the factors stay in registers; ``C'`` is formed after the state products, which leaves
fewer tiles live next to the inverse). One launch wins while its programs fit one per SM (small
batches, :func:`~trtllm_bole.kernels.gdn_tree_verify.default_config`); the benchmark measures both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trtllm_bole.kernels._common import VerifyCall, pow2_at_least
from trtllm_bole.kernels._inverse_factors import (
    _blocked_factors,
    _factor_tile,
    _gates,
    _log_decay,
    _path_factors,
    _path_offsets,
    _path_ratio,
    _w_prime,
)
from trtllm_bole.kernels._verify_tiles import (
    _UPCAST,
    _gram,
    _is_ancestor,
    _operand,
    _rows,
    _state_product,
)


@dataclass(frozen=True, slots=True)
class InverseConfig:
    bt: int  # tree nodes per tile (power of two >= 16); larger trees are blocked
    bk: int  # dk chunk (bk == dk: one chunk; one launch then loads the state tile before the phase-1 math)
    bv: int  # value channels per phase-2 program (divides dv)
    num_warps: int = 4  # phase 2 (and the one-launch kernel)
    launches: int = 2  # 2: phase 1 kernel + phase 2 kernel; 1: both phases in every program
    warps1: int = 4  # phase-1 kernel (launches=2)
    maxnreg: int | None = None  # register cap of the (single-tile) value-tile kernel; None: the compiler's


INVERSE_CONFIGS = tuple(
    InverseConfig(*fields)
    for fields in (
        (64, 128, 32, 8, 1, 8),
        (64, 64, 32, 4, 1, 4),
        (64, 128, 64, 8, 1, 8),
        (64, 64, 64, 8, 1, 8),
        (64, 64, 128, 8, 1, 8),
        (64, 128, 128, 8, 1, 8),
        (64, 128, 32, 4, 2, 8),
        (64, 64, 32, 4, 2, 4),
        (64, 64, 64, 4, 2, 4),
        (64, 64, 64, 4, 2, 8),
        (64, 64, 64, 4, 2, 8, 128),
        (64, 128, 128, 8, 2, 4),
        (32, 128, 32, 4, 1, 4),
        (32, 64, 64, 4, 2, 2),
        (32, 64, 64, 4, 2, 2, 128),
        (16, 128, 32, 2, 1, 2),
    )
)
"""Candidates the benchmark sweeps next to :data:`~trtllm_bole.kernels.gdn_tree_verify.CONFIGS`. On the
H200 (triton 3.6; benchmarks/results/profile_verify_h200.json) the compact phase-1 kernel takes 96
registers at 4 warps and 54 at 8 (depth 8), the dense one (the one-launch kernel's) took 255 with 24
bytes spilled at 4 warps; the value-tile kernel takes 107-200 without spills. Capped at 128 registers
(``maxnreg``), the 4-warp value-tile kernels spill 40-64 bytes and fit four programs per SM instead of
three; the cap leaves the blocked value-tile kernel alone (capped, its tiles of 64 ran 10-13 % slower:
9B, B = 16, T = 128 and 256, tf32, 448 against 397 µs and 1182 against 1072). The blocked variants
(trees over ``bt`` nodes) spill up to ~2 KB; the fp32-exact variants (FMA dots) spill more. Two configs
failed the H200 check (triton 3.6) and were dropped: ``(64, 128, 16, 8, 1, 8)`` and
``(16, 64, 64, 2, 2, 1)`` (one phase-1 warp, blocked trees)."""


def bf16_refused(cfg: InverseConfig) -> bool:
    """Whether ``cfg`` computes wrong outputs with bf16 state products on the H200 (triton 3.6, sm_90; the
    float64 check of benchmarks/bench_gdn_verify.py, NaN or 70 % error in O): one launch with value
    tiles of at most 32, measured on the dense one-launch kernel (which still serves deep and blocked
    trees; the refusal is by config, whatever the tree). Every other config passed that check in both
    serving precisions."""
    return cfg.launches == 1 and cfg.bv <= 32


def check_inverse_config(cfg: InverseConfig, precision: str) -> None:
    """Refuses the combination of :func:`bf16_refused`."""
    if precision == "bf16" and bf16_refused(cfg):
        raise ValueError(
            f"{cfg} with precision='bf16' is refused: one launch with value tiles <= 32 and bf16 state "
            "products miscompiles on sm_90 (triton 3.6; wrong O in the H200 check). Use precision='tf32', "
            "bv >= 64 or launches=2"
        )


@triton.jit
def _state_dot(a_req, s_req, rows, m, o_v, acc, ROW_STRIDE: tl.constexpr, DK: tl.constexpr,
               DV: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, S_BF16: tl.constexpr,
               UPCAST: tl.constexpr):  # fmt: skip
    """``acc + A_rows S[:, o_v]`` (A = Q or K), dk streamed in ``BK`` chunks."""
    o_k = tl.arange(0, BK)
    for kc in range(0, DK, BK):
        a_c = _rows(a_req, rows, m, ROW_STRIDE, kc + o_k)
        s_c = tl.load(s_req + ((kc + o_k)[:, None] * DV + o_v[None, :]))
        acc = _state_product(a_c, s_c, acc, PREC, S_BF16, UPCAST)
    return acc


@triton.jit
def _state_dots(k_req, q_req, s_req, rows, m, o_v, ROW_STRIDE: tl.constexpr, DK: tl.constexpr,
                DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                S_BF16: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """``K_rows S[:, o_v]`` and ``Q_rows S[:, o_v]`` from one load of each ``BK`` chunk of the state. The
    chunk loop is unrolled, so that every chunk's loads can be issued before the first product (H200,
    Qwen3.5 heads, T = 64, two launches: 1.5-5 % faster at B = 16-32 than the rolled loop, which
    software pipelining over 2-3 stages did not beat)."""
    o_k = tl.arange(0, BK)
    ks = tl.zeros([BT, BV], dtype=tl.float32)
    qs = tl.zeros([BT, BV], dtype=tl.float32)
    for kc in tl.static_range(0, DK, BK):
        s_c = tl.load(s_req + ((kc + o_k)[:, None] * DV + o_v[None, :]))
        ks = _state_product(_rows(k_req, rows, m, ROW_STRIDE, kc + o_k), s_c, ks, PREC, S_BF16, UPCAST)
        qs = _state_product(_rows(q_req, rows, m, ROW_STRIDE, kc + o_k), s_c, qs, PREC, S_BF16, UPCAST)
    return ks, qs


@triton.jit
def _chunk_products(k_t, q_t, s_t, PREC: tl.constexpr, S_BF16: tl.constexpr, UPCAST: tl.constexpr):
    """``K S`` and ``Q S`` of a state tile loaded whole (``BK == dk``)."""
    acc = tl.zeros([k_t.shape[0], s_t.shape[1]], dtype=tl.float32)
    ks = _state_product(k_t, s_t, acc, PREC, S_BF16, UPCAST)
    return ks, _state_product(q_t, s_t, acc, PREC, S_BF16, UPCAST)


@triton.jit
def _tile_outputs(w, c_t, decay, v_t, ks, qs, u_req, o_req, rows, m, o_v, hv, scale, DV: tl.constexpr,
                  PREC: tl.constexpr):  # fmt: skip
    """A value tile's outputs from its factors, decays ``D_P`` and state products: ``X = V - D_P K S``,
    ``U = W' X``, ``O = scale D_P Q S + C' U``."""
    x = v_t.to(tl.float32) - decay[:, None] * ks
    out = rows[:, None] * (hv * DV) + o_v[None, :]
    u_t = tl.dot(w, x, input_precision=PREC)
    tl.store(u_req + out, u_t, mask=m[:, None])
    o_out = tl.dot(c_t, u_t, scale * decay[:, None] * qs, input_precision=PREC)
    tl.store(o_req + out, o_out.to(o_req.dtype.element_ty), mask=m[:, None])


@triton.jit
def _column_block(dfs_req, size_req, ord_r, m_r, c, n_t, BT: tl.constexpr):
    """Nodes of column block ``c``, their mask, and the ancestor pairs of the row block's nodes."""
    cols = c * BT + tl.arange(0, BT)
    m_c = cols < n_t
    ord_c = tl.load(dfs_req + cols, mask=m_c, other=0).to(tl.int32)
    end_c = ord_c + tl.load(size_req + cols, mask=m_c, other=0).to(tl.int32)
    return cols, m_c, _is_ancestor(ord_r, ord_c, end_c, m_r, m_c)


@triton.jit
def _blocked_apply(
    q_req, k_req, v_req, s_req, u_req, o_req, dfs_req, size_req, dep_req, lp_req, w_req,
    n_t, hv, d, scale, o_v,
    H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PREC: tl.constexpr, S_BF16: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Phase 2 for a tree of more than ``BT`` nodes, through the ``u`` output: X of every row block, then
    U of the row blocks last-first (``U_r = Σ_{c≤r} W'_rc X_c``: a block's X is read before it is
    overwritten), then O (``O_r = scale (D_P Q_r S + Σ_{c≤r} C_rc U_c)``). Column blocks without
    ancestor pairs add nothing and are not read."""
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    n_b = tl.cdiv(n_t, BT)
    for r in range(0, n_b):
        rows = r * BT + o_t
        m_r = rows < n_t
        ks = _state_dot(k_req, s_req, rows, m_r, o_v, tl.zeros([BT, BV], dtype=tl.float32), H * DK, DK, DV,
                        BK, PREC, S_BF16, UPCAST)  # fmt: skip
        decay = tl.exp(tl.load(lp_req + rows * hv, mask=m_r, other=0.0))
        x = _rows(v_req, rows, m_r, hv * DV, o_v).to(tl.float32) - decay[:, None] * ks
        tl.store(u_req + (rows[:, None] * (hv * DV) + o_v[None, :]), x, mask=m_r[:, None])
    tl.debug_barrier()
    for i in range(0, n_b):
        r = n_b - 1 - i
        rows = r * BT + o_t
        m_r = rows < n_t
        ord_r = tl.load(dfs_req + rows, mask=m_r, other=0).to(tl.int32)
        acc_u = tl.zeros([BT, BV], dtype=tl.float32)
        for c in range(0, r + 1):
            cols, m_c, anc = _column_block(dfs_req, size_req, ord_r, m_r, c, n_t, BT)
            if tl.max(anc.to(tl.int32)) > 0:
                dep_c = tl.load(dep_req + cols, mask=m_c, other=1).to(tl.int32)
                w_rc = _factor_tile(w_req, rows, dep_c, d, anc, BT)
                acc_u = tl.dot(w_rc, _rows(u_req, cols, m_c, hv * DV, o_v), acc_u, input_precision=PREC)
        tl.debug_barrier()  # every thread has read X_r before U_r overwrites it
        tl.store(u_req + (rows[:, None] * (hv * DV) + o_v[None, :]), acc_u, mask=m_r[:, None])
    tl.debug_barrier()  # every U_c is in place before O reads them
    for r in range(0, n_b):
        rows = r * BT + o_t
        m_r = rows < n_t
        ord_r = tl.load(dfs_req + rows, mask=m_r, other=0).to(tl.int32)
        lp_r = tl.load(lp_req + rows * hv, mask=m_r, other=0.0)
        acc_o = _state_dot(q_req, s_req, rows, m_r, o_v, tl.zeros([BT, BV], dtype=tl.float32), H * DK, DK, DV,
                           BK, PREC, S_BF16, UPCAST) * tl.exp(lp_r)[:, None]  # fmt: skip
        for c in range(0, r + 1):
            cols, m_c, anc = _column_block(dfs_req, size_req, ord_r, m_r, c, n_t, BT)
            if tl.max(anc.to(tl.int32)) > 0:
                qk = _gram(q_req, k_req, rows, m_r, cols, m_c, o_k, H * DK, DK, BT, BK, PREC, UPCAST)
                c_rc = _path_ratio(anc, lp_r, tl.load(lp_req + cols * hv, mask=m_c, other=0.0)) * qk
                acc_o = tl.dot(c_rc, _rows(u_req, cols, m_c, hv * DV, o_v), acc_o, input_precision=PREC)
        out = rows[:, None] * (hv * DV) + o_v[None, :]
        tl.store(o_req + out, (acc_o * scale).to(o_req.dtype.element_ty), mask=m_r[:, None])


@triton.jit(do_not_specialize=["d", "n_total"])
def _gdn_tree_verify_inverse_kernel(
    q, k, v, g, beta, state, slots, cu_seqlens, dfs_order, subtree_size, depth, paths,
    o, u, log_p, factors, scratch, a_log, dt_bias,
    scale, hv, n_total, d,
    H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PHASE: tl.constexpr, USE_SLOTS: tl.constexpr, PREC: tl.constexpr,
    S_BF16: tl.constexpr, UPCAST: tl.constexpr, RAW_GATES: tl.constexpr, BLOCKED: tl.constexpr,
):  # fmt: skip
    """``PHASE`` 1: factors only (grid ``(1, HV, B)``; dense tiles: for blocked trees and deep ones, the
    others have :func:`_path_factors_kernel`); 2: outputs from stored factors; 3: both. ``BLOCKED``: serve
    only the requests of more than ``BT`` nodes (else only the others): the blocked code needs more
    registers, and the allocation is per kernel. ``paths`` and ``scratch`` are the compact factor
    kernel's (unused here)."""
    i_v, i_hv, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (hv // H)
    bos = tl.load(cu_seqlens + i_b).to(tl.int64)
    n_t = (tl.load(cu_seqlens + i_b + 1) - bos).to(tl.int32)
    q_req = q + (bos * H + i_h) * DK
    k_req = k + (bos * H + i_h) * DK
    dfs_req = dfs_order + bos
    size_req = subtree_size + bos
    dep_req = depth + bos
    g_req = g + bos * hv + i_hv
    b_req = beta + bos * hv + i_hv
    lp_req = log_p + bos * hv + i_hv
    w_req = factors + (i_hv * n_total + bos) * d  # [2, HV, N, d]: W', then C' (trees of one tile)
    c_req = w_req + hv * n_total * d
    a_exp_h = tl.exp(tl.load(a_log + i_hv).to(tl.float32)) if RAW_GATES else 1.0
    dt_bias_h = tl.load(dt_bias + i_hv).to(tl.float32) if RAW_GATES else 0.0
    o_v = i_v * BV + tl.arange(0, BV)
    if PHASE != 1:
        slot = tl.load(slots + i_b).to(tl.int64) if USE_SLOTS else i_b.to(tl.int64)
        s_req = state + (slot * hv + i_hv) * (DK * DV)
        v_req = v + (bos * hv + i_hv) * DV
        u_req = u + (bos * hv + i_hv) * DV
        o_req = o + (bos * hv + i_hv) * DV

    if BLOCKED:
        if n_t > BT:
            if PHASE != 2:
                _blocked_factors(k_req, g_req, b_req, dfs_req, size_req, dep_req, lp_req, w_req, n_t, hv, d,
                                 a_exp_h, dt_bias_h, H * DK, DK, BT, BK, PREC,
                                 UPCAST, RAW_GATES)  # fmt: skip
            if PHASE != 1:
                _blocked_apply(q_req, k_req, v_req, s_req, u_req, o_req, dfs_req, size_req, dep_req, lp_req,
                               w_req, n_t, hv, d, scale, o_v, H, DK, DV, BT, BK, BV, PREC, S_BF16,
                               UPCAST)  # fmt: skip
    elif n_t <= BT:
        # Every load is issued before the first use (one round trip after the request's offsets): the
        # state tile first when it is one chunk (BK == DK), then the tree, the gates, K, Q and V.
        o_t = tl.arange(0, BT)
        o_d = tl.arange(0, DK)
        m_t = o_t < n_t
        if PHASE != 1 and BK == DK:
            s_t = tl.load(s_req + (o_d[:, None] * DV + o_v[None, :]))
        ord_t = tl.load(dfs_req + o_t, mask=m_t, other=0).to(tl.int32)
        end_t = ord_t + tl.load(size_req + o_t, mask=m_t, other=0).to(tl.int32)
        if PHASE != 3:
            dep_t = tl.load(dep_req + o_t, mask=m_t, other=1).to(tl.int32)
        if PHASE != 2:
            g_t, b_t = _gates(g_req, b_req, o_t, m_t, hv, a_exp_h, dt_bias_h, RAW_GATES)
        if PHASE != 2 or BK == DK:
            k_t = _rows(k_req, o_t, m_t, H * DK, o_d)
            q_t = _rows(q_req, o_t, m_t, H * DK, o_d)
        if PHASE != 1:
            v_t = _rows(v_req, o_t, m_t, hv * DV, o_v)
        if PHASE != 2:
            k_op = _operand(k_t, UPCAST)
            lp = _log_decay(_is_ancestor(ord_t, ord_t, end_t, m_t, m_t), g_t)
            tl.store(lp_req + o_t * hv, lp, mask=m_t)
            if PHASE == 1:  # C' before the inverse: Q and Q Kᵀ are dead while it runs
                offs = _path_offsets(o_t, dep_t, d)
                anc = _is_ancestor(ord_t, ord_t, end_t, m_t, m_t)
                qk = tl.dot(_operand(q_t, UPCAST), tl.trans(k_op), input_precision=PREC)
                tl.store(c_req + offs, _path_ratio(anc, lp, lp) * qk * scale, mask=anc)
            kk = tl.dot(k_op, tl.trans(k_op), input_precision=PREC)
            w = _w_prime(kk, lp, ord_t, end_t, m_t, b_t, BT, PREC)
            if PHASE == 1:
                tl.store(w_req + offs, w, mask=_is_ancestor(ord_t, ord_t, end_t, m_t, m_t))
        else:
            anc = _is_ancestor(ord_t, ord_t, end_t, m_t, m_t)
            lp = tl.load(lp_req + o_t * hv, mask=m_t, other=0.0)
            w = _factor_tile(w_req, o_t, dep_t, d, anc, BT)
            c_t = _factor_tile(c_req, o_t, dep_t, d, anc, BT)
        if PHASE != 1:
            decay = tl.exp(lp)
            if BK == DK:
                ks, qs = _chunk_products(k_t, q_t, s_t, PREC, S_BF16, UPCAST)
            else:
                ks, qs = _state_dots(k_req, q_req, s_req, o_t, m_t, o_v, H * DK, DK, DV, BT, BK, BV, PREC,
                                     S_BF16, UPCAST)  # fmt: skip
            if PHASE == 3:  # C' formed after the state products: fewer tiles live than next to the inverse
                qk = tl.dot(_operand(q_t, UPCAST), tl.trans(k_op), input_precision=PREC)
                c_t = _path_ratio(_is_ancestor(ord_t, ord_t, end_t, m_t, m_t), lp, lp) * qk * scale
            _tile_outputs(w, c_t, decay, v_t, ks, qs, u_req, o_req, o_t, m_t, o_v, hv, scale, DV, PREC)


@triton.jit(do_not_specialize=["d", "n_total"])
def _path_factors_kernel(
    q, k, v, g, beta, state, slots, cu_seqlens, dfs_order, subtree_size, depth, paths,
    o, u, log_p, factors, scratch, a_log, dt_bias,
    scale, hv, n_total, d,
    H: tl.constexpr, DK: tl.constexpr, BT: tl.constexpr, DP: tl.constexpr, SW: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, RAW_GATES: tl.constexpr,
):  # fmt: skip
    """Phase 1 of the two-launch path for trees of at most ``BT`` nodes (grid ``(HV, B)``; the arguments
    are the value-tile kernel's, most unused): ``logP``, ``C'`` and ``W'`` on compact path tiles
    ``[DP, BT]`` (row ``e``: each node's ancestor at depth ``e + 1``, from ``paths``), never on dense
    ``[BT, BT]`` ones. ``logP`` is the path's sum of g, ``exp(logP_i - logP_anc)`` a prefix sum away;
    ``Q Kᵀ`` and ``K Kᵀ`` are the two tensor-core products, which go through ``scratch`` (this head's
    rows, ``SW`` wide: the ``u`` output, which phase 2 overwrites, when ``dv >= 2 BT``) and come back
    gathered at the ancestors; ``W = (I + G)⁻¹`` is solved per node along its own path: row ``i`` of W
    is the last row of ``(I + M)⁻¹`` for the path matrix ``M[a, b] = G[p_a, p_b]``, by back
    substitution over the depth (``d - 1`` steps), reading the ancestors' rows of G back from the
    ``W'`` output, which holds G until the solve ends."""
    i_hv, i_b = tl.program_id(0), tl.program_id(1)
    bos = tl.load(cu_seqlens + i_b).to(tl.int64)
    n_t = (tl.load(cu_seqlens + i_b + 1) - bos).to(tl.int32)
    if n_t <= BT:
        _path_factors(q, k, g, beta, paths, log_p, a_log, dt_bias, factors, scratch,
                      bos, n_t, i_hv, hv, n_total, d, scale, H, DK, BT, DP, SW, PREC, UPCAST,
                      RAW_GATES)  # fmt: skip


@triton.jit(do_not_specialize=["d", "n_total"])
def _compact_one_launch_kernel(
    q, k, v, g, beta, state, slots, cu_seqlens, dfs_order, subtree_size, depth, paths,
    o, u, log_p, factors, scratch, a_log, dt_bias,
    scale, hv, n_total, d,
    H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DP: tl.constexpr, SW: tl.constexpr, USE_SLOTS: tl.constexpr, PREC: tl.constexpr,
    S_BF16: tl.constexpr, UPCAST: tl.constexpr, RAW_GATES: tl.constexpr,
):  # fmt: skip
    """One launch for trees of at most ``BT`` nodes and depth at most :data:`COMPACT_MAX_DEPTH` (grid
    ``(dv / BV, HV, B)``): every value tile forms its pair's compact factors (:func:`_path_factors`) into
    its own slice of ``factors`` and ``scratch`` (``[dv / BV, …]``; the tiles of a pair store the same
    ``logP``), then its outputs. A state tile loaded whole (``BK == dk``) is requested before anything
    else, so its loads overlap the factors' chain (H200, Qwen3.5-9B heads, T = 64, B = 1: 16.2 against
    17.3 µs for the two launches)."""
    i_v, i_hv, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    o_d = tl.arange(0, DK)
    slot = tl.load(slots + i_b).to(tl.int64) if USE_SLOTS else i_b.to(tl.int64)
    s_req = state + (slot * hv + i_hv) * (DK * DV)
    if BK == DK:
        s_t = tl.load(s_req + (o_d[:, None] * DV + o_v[None, :]))
    bos = tl.load(cu_seqlens + i_b).to(tl.int64)
    n_t = (tl.load(cu_seqlens + i_b + 1) - bos).to(tl.int32)
    if n_t <= BT:
        m_t = o_t < n_t
        i_h = i_hv // (hv // H)
        q_req = q + (bos * H + i_h) * DK
        k_req = k + (bos * H + i_h) * DK
        v_t = _rows(v + (bos * hv + i_hv) * DV, o_t, m_t, hv * DV, o_v)
        tile_factors = factors + i_v * (2 * hv * n_total * d)
        lp = _path_factors(q, k, g, beta, paths, log_p, a_log, dt_bias, tile_factors,
                           scratch + i_v * (n_total * hv * SW), bos, n_t, i_hv, hv, n_total, d, scale,
                           H, DK, BT, DP, SW, PREC, UPCAST, RAW_GATES)  # fmt: skip
        w_req = tile_factors + (i_hv * n_total + bos) * d
        c_req = w_req + hv * n_total * d
        tl.debug_barrier()  # every thread's W' stored before the tiles gather it
        ord_t = tl.load(dfs_order + bos + o_t, mask=m_t, other=0).to(tl.int32)
        end_t = ord_t + tl.load(subtree_size + bos + o_t, mask=m_t, other=0).to(tl.int32)
        dep_t = tl.load(depth + bos + o_t, mask=m_t, other=1).to(tl.int32)
        anc = _is_ancestor(ord_t, ord_t, end_t, m_t, m_t)
        w = _factor_tile(w_req, o_t, dep_t, d, anc, BT)
        c_t = _factor_tile(c_req, o_t, dep_t, d, anc, BT)
        decay = tl.exp(lp)
        if BK == DK:
            k_t = _rows(k_req, o_t, m_t, H * DK, o_d)
            ks, qs = _chunk_products(k_t, _rows(q_req, o_t, m_t, H * DK, o_d), s_t, PREC, S_BF16, UPCAST)
        else:
            ks, qs = _state_dots(k_req, q_req, s_req, o_t, m_t, o_v, H * DK, DK, DV, BT, BK, BV, PREC, S_BF16,
                                 UPCAST)  # fmt: skip
        u_req = u + (bos * hv + i_hv) * DV
        o_req = o + (bos * hv + i_hv) * DV
        _tile_outputs(w, c_t, decay, v_t, ks, qs, u_req, o_req, o_t, m_t, o_v, hv, scale, DV, PREC)


PHASE1_CONSTS = {"BV": 16, "USE_SLOTS": False, "S_BF16": False}
"""The dense factor kernel's overrides of :func:`inverse_launch_args`' constants: one phase-1 kernel
serves every value tile and precision (it touches neither the state nor V)."""

COMPACT_MAX_DEPTH = 16
"""Deepest tree (rounded up to a power of two) whose factors :func:`_path_factors_kernel` forms: its tiles
are ``[depth, BT]`` and its back substitution takes ``depth - 1`` dependent steps, so deeper trees (the
prefill's chains of up to 64) take the dense factor kernel's block-doubling inverse."""


def loads_key_dim(dk: int) -> bool:
    """Whether the explicit-inverse path can serve key dim ``dk``: it loads whole rows of K
    (``tl.arange(0, dk)``), so ``dk`` must be a power of two; the blocked kernel takes any multiple of 16."""
    return dk & (dk - 1) == 0


def compact_factors(max_depth: int) -> bool:
    """Whether the factors of trees ``max_depth`` deep (rounded up to a power of two, at most
    :data:`COMPACT_MAX_DEPTH`) are formed on compact path tiles (:func:`_path_factors`: the factor
    kernel of two launches, every program of one launch)."""
    return pow2_at_least(max_depth) <= COMPACT_MAX_DEPTH


def inverse_launch_args(
    call: VerifyCall, cfg: InverseConfig
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], tuple, dict]:
    """Allocates the outputs ``(o, u, log_p)`` and the compact factors ``[tiles, 2, HV, N, depth]``; returns
    the outputs, the kernels' positional arguments (one list for every kernel of the path) and the
    compile-time constants (each kernel takes those it declares, :func:`phase_launch`). Two launches:
    one slice of factors (``tiles = 1``), and the factor kernel's scratch is ``u`` when its rows hold
    ``Q Kᵀ`` and ``K Kᵀ`` side by side (``dv >= 2 bt``), else its own buffer ``[N, HV, 2 bt]``. One launch
    with compact factors: a slice of both per value tile (``tiles = dv / bv``; u is an output there)."""
    n, h, dk = call.q.shape
    hv, dv = call.v.shape[1:]
    tree, device = call.tree, call.v.device
    o, u, log_p = call.new_outputs()
    d = tree.max_depth
    per_tile = cfg.launches == 1 and compact_factors(d)
    tiles = dv // cfg.bv if per_tile else 1
    factors = torch.empty((tiles, 2, hv, n, d), dtype=torch.float32, device=device)
    scratch = u
    if compact_factors(d) and (per_tile or dv < 2 * cfg.bt):
        scratch = torch.empty((tiles, n, hv, 2 * cfg.bt), dtype=torch.float32, device=device)
    args = (
        call.q, call.k, call.v, call.g, call.beta, call.state, call.slots, tree.cu_seqlens, tree.dfs_order,
        tree.subtree_size, tree.depth, tree.paths, o, u, log_p, factors, scratch,
        *call.gate_params, call.scale, hv, n, d,
    )  # fmt: skip
    consts = dict(
        H=h, DK=dk, DV=dv, BT=cfg.bt, BK=cfg.bk, BV=cfg.bv, UPCAST=_UPCAST, DP=pow2_at_least(d),
        SW=scratch.shape[-1], **call.mode_consts(),
    )  # fmt: skip
    return (o, u, log_p), args, consts


def phase_launch(
    phase: int, cfg: InverseConfig, consts: dict, hv: int, dv: int, batch: int, blocked: bool = False
) -> tuple[triton.runtime.JITFunction, tuple[int, ...], dict, dict]:
    """The kernel, grid, compile-time constants (those of :func:`inverse_launch_args`' ``consts`` it
    declares) and launch options (warps, stages, the value-tile kernel's register cap) of one kernel of
    the path: phase 1 once per (request, value head), phases 2 and 3 per value tile too (phases 1 and 3
    on compact path tiles up to :data:`COMPACT_MAX_DEPTH`, else dense); ``blocked``: the variant for
    requests of more than ``bt`` nodes."""
    options = {"num_stages": 1}
    if phase == 1 and not blocked and compact_factors(consts["DP"]):
        kernel, grid, extra, options["num_warps"] = _path_factors_kernel, (hv, batch), {}, cfg.warps1
    elif phase == 3 and not blocked and compact_factors(consts["DP"]):
        kernel, grid, extra = _compact_one_launch_kernel, (dv // cfg.bv, hv, batch), {}
        options["num_warps"] = cfg.num_warps
    else:
        kernel, extra = _gdn_tree_verify_inverse_kernel, {"PHASE": phase, "BLOCKED": blocked}
        if phase == 1:
            grid, extra, options["num_warps"] = (1, hv, batch), {**extra, **PHASE1_CONSTS}, cfg.warps1
        else:
            grid, options["num_warps"] = (dv // cfg.bv, hv, batch), cfg.num_warps
        if phase == 2 and cfg.maxnreg and not blocked:
            options["maxnreg"] = cfg.maxnreg
    declared = {name: value for name, value in consts.items() if name in kernel.arg_names}
    return kernel, grid, {**declared, **extra}, options


def phases(cfg: InverseConfig) -> tuple[int, ...]:
    """The kernels ``cfg`` runs: the factor and value-tile kernels, or the one-launch kernel."""
    return (1, 2) if cfg.launches == 2 else (3,)


def launch_inverse(call: VerifyCall, cfg: InverseConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launches with no host sync (the tree metadata stays on the device; ``tree.max_depth`` and
    ``tree.max_nodes`` are host ints). Requests of more than ``bt`` nodes go to a second, blocked variant,
    launched only when the largest request (``tree.max_nodes``) exceeds the tile."""
    outputs, args, consts = inverse_launch_args(call, cfg)
    hv, dv, batch = call.v.shape[1], call.v.shape[2], call.tree.num_requests
    for blocked in (False, True) if call.tree.max_nodes > cfg.bt else (False,):
        for phase in phases(cfg):
            kernel, grid, constexprs, options = phase_launch(phase, cfg, consts, hv, dv, batch, blocked)
            kernel[grid](*args, **constexprs, **options)
    return outputs


__all__ = [
    "INVERSE_CONFIGS",
    "InverseConfig",
    "bf16_refused",
    "check_inverse_config",
    "compact_factors",
    "launch_inverse",
    "loads_key_dim",
    "phase_launch",
    "phases",
]
