"""Phase 1 of the explicit-inverse verify (:mod:`.gdn_tree_verify_inverse`): the gates, the path
offsets and ratios, and the factors ``W'`` and ``C'`` once per (request, value head), compact
(:func:`_path_factors`: back substitution along each node's path) or dense and blocked
(:func:`_blocked_factors`: block-doubling inverses of ``[T, T]`` tiles); :func:`_factor_tile` gathers
them into dense tiles for phase 2."""

from __future__ import annotations

import triton
import triton.language as tl

from trtllm_bole.kernels._verify_tiles import (
    _gram,
    _is_ancestor,
    _operand,
    _rows,
    _unit_lower_inverse,
)
from trtllm_bole.kernels.norms import softplus


@triton.jit
def _gates(g_ptr, b_ptr, rows, m, hv, a_exp_h, dt_bias_h, RAW_GATES: tl.constexpr):
    """Per-node ``g`` and ``β`` (zero on masked rows); with raw gates, Qwen3.5's gating on chip:
    ``g = -exp(A_log) softplus(a + dt_bias)`` (:func:`~.norms.softplus`), ``β = sigmoid(b)``."""
    g = tl.load(g_ptr + rows * hv, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows * hv, mask=m, other=0.0).to(tl.float32)
    if RAW_GATES:
        x = g + dt_bias_h
        g = tl.where(m, -a_exp_h * softplus(x), 0.0)
        b = tl.where(m, 1.0 / (1.0 + tl.exp(-b)), 0.0)
    return g, b


@triton.jit
def _path_offsets(rows, dep_c, d):
    """Compact ``[node, depth]`` offsets of the ``(row node, column node)`` pairs of a tile."""
    return rows[:, None] * d + (dep_c - 1)[None, :]


@triton.jit
def _factor_tile(f_req, rows, dep_c, d, anc, BT: tl.constexpr):
    """``[rows, cols]`` of a compact ``[node, depth]`` factor as a dense tile, zero off ``anc``. Tiles of 64
    are gathered transposed: a warp's lanes then run along the column nodes, whose entries in one row
    node share 32 bytes, so a warp's load touches one sector instead of one per lane (H200, Qwen3.5-9B
    heads, B = 16: value-tile kernel 40.0 → 38.3 µs, benchmarks/results/profile_verify_h200.json). Tiles
    of 32 keep the row-major gather: transposed, their value-tile kernel took 255 registers instead of
    186 on sm_90 and ran 6 % slower."""
    if BT >= 64:
        offs_t = rows[None, :] * d + (dep_c - 1)[:, None]
        tile = tl.trans(tl.load(f_req + offs_t, mask=tl.trans(anc), other=0.0))
    else:
        tile = tl.load(f_req + _path_offsets(rows, dep_c, d), mask=anc, other=0.0)
    return tile


@triton.jit
def _log_decay(anc, g_t):
    """``logP``: the masked row sum of g over each node's ancestors-or-self, in registers."""
    return tl.sum(tl.where(anc, g_t[None, :], 0.0), axis=1)


@triton.jit
def _path_ratio(anc, lp_row, lp_col):
    """``exp(logP_i - logP_j)`` on ancestor pairs, zero elsewhere."""
    return tl.exp(tl.where(anc, lp_row[:, None] - lp_col[None, :], float("-inf")))


@triton.jit
def _w_prime(kk, lp, ord_t, end_t, m_t, b_t, BT: tl.constexpr, PREC: tl.constexpr):
    """``W' = W D_β`` for a tree of at most ``BT`` nodes, in registers, from ``K Kᵀ`` and ``logP``. The
    mask and the ratios are recomputed rather than kept (few ``[BT, BT]`` tiles live)."""
    o_t = tl.arange(0, BT)
    ratio = _path_ratio(_is_ancestor(ord_t, ord_t, end_t, m_t, m_t), lp, lp)
    a = tl.where(o_t[:, None] != o_t[None, :], -b_t[:, None] * ratio * kk, 0.0)
    return _unit_lower_inverse(a, BT, PREC) * b_t[None, :]


@triton.jit
def _blocked_factors(
    k_req, g_req, b_req, dfs_req, size_req, dep_req, lp_req, w_req,
    n_t, hv, d, a_exp_h, dt_bias_h,
    ROW_STRIDE: tl.constexpr, DK: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, RAW_GATES: tl.constexpr,
):  # fmt: skip
    """Phase 1 for a tree of more than ``BT`` nodes, by row blocks: ``logP`` and the compact ``W'`` of
    block row r are stored before a barrier; later rows read them back."""
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    off_diag = o_t[:, None] != o_t[None, :]
    full = o_t < BT
    for r in range(0, tl.cdiv(n_t, BT)):
        rows = r * BT + o_t
        m_r = rows < n_t
        ord_r = tl.load(dfs_req + rows, mask=m_r, other=0).to(tl.int32)
        end_r = ord_r + tl.load(size_req + rows, mask=m_r, other=0).to(tl.int32)
        dep_r = tl.load(dep_req + rows, mask=m_r, other=1).to(tl.int32)
        g_r, b_r = _gates(g_req, b_req, rows, m_r, hv, a_exp_h, dt_bias_h, RAW_GATES)
        lp_r = tl.zeros([BT], dtype=tl.float32)
        for c in range(0, r):
            cols = c * BT + o_t
            ord_c = tl.load(dfs_req + cols).to(tl.int32)
            end_c = ord_c + tl.load(size_req + cols).to(tl.int32)
            g_c, _ = _gates(g_req, b_req, cols, full, hv, a_exp_h, dt_bias_h, RAW_GATES)
            lp_r += _log_decay(_is_ancestor(ord_r, ord_c, end_c, m_r, full), g_c)
        anc_rr = _is_ancestor(ord_r, ord_r, end_r, m_r, m_r)
        lp_r += _log_decay(anc_rr, g_r)
        tl.store(lp_req + rows * hv, lp_r, mask=m_r)

        kk = _gram(k_req, k_req, rows, m_r, rows, m_r, o_k, ROW_STRIDE, DK, BT, BK, PREC, UPCAST)
        a_rr = tl.where(off_diag, -b_r[:, None] * _path_ratio(anc_rr, lp_r, lp_r) * kk, 0.0)
        w_rr = _unit_lower_inverse(a_rr, BT, PREC)
        tl.store(w_req + _path_offsets(rows, dep_r, d), w_rr * b_r[None, :], mask=anc_rr)
        for c in range(0, r):
            cols = c * BT + o_t
            ord_c = tl.load(dfs_req + cols).to(tl.int32)
            end_c = ord_c + tl.load(size_req + cols).to(tl.int32)
            anc_rc = _is_ancestor(ord_r, ord_c, end_c, m_r, full)
            if tl.max(anc_rc.to(tl.int32)) > 0:  # tiles without ancestor pairs are zero: never stored
                dep_c = tl.load(dep_req + cols).to(tl.int32)
                acc_w = tl.zeros([BT, BT], dtype=tl.float32)
                for mb in range(c, r):
                    mid = mb * BT + o_t
                    ord_m = tl.load(dfs_req + mid).to(tl.int32)
                    end_m = ord_m + tl.load(size_req + mid).to(tl.int32)
                    anc_rm = _is_ancestor(ord_r, ord_m, end_m, m_r, full)
                    if tl.max(anc_rm.to(tl.int32)) > 0:
                        ratio_rm = _path_ratio(anc_rm, lp_r, tl.load(lp_req + mid * hv))
                        kk_rm = _gram(
                            k_req, k_req, rows, m_r, mid, full, o_k, ROW_STRIDE, DK, BT, BK, PREC, UPCAST
                        )
                        anc_mc = _is_ancestor(ord_m, ord_c, end_c, full, full)
                        w_mc = _factor_tile(w_req, mid, dep_c, d, anc_mc, BT)
                        acc_w = tl.dot(b_r[:, None] * ratio_rm * kk_rm, w_mc, acc_w, input_precision=PREC)
                w_rc = -tl.dot(w_rr, acc_w, input_precision=PREC)
                tl.store(w_req + _path_offsets(rows, dep_c, d), w_rc, mask=anc_rc)
        tl.debug_barrier()  # later block rows read this row's logP and factors back


@triton.jit
def _path_factors(
    q, k, g, beta, paths, log_p, a_log, dt_bias, factors, scratch,
    bos, n_t, i_hv, hv, n_total, d, scale,
    H: tl.constexpr, DK: tl.constexpr, BT: tl.constexpr, DP: tl.constexpr, SW: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, RAW_GATES: tl.constexpr,
):  # fmt: skip
    """The compact factors of one (request, value head) of at most ``BT`` nodes: ``W'`` and ``C'`` into
    ``factors`` (``[2, HV, N, depth]``), ``logP`` into ``log_p``; ``Q Kᵀ`` and ``K Kᵀ`` go through
    ``scratch`` (``[N, HV, SW]``). Returns ``logP``."""
    i_h = i_hv // (hv // H)
    o_t = tl.arange(0, BT)
    o_e = tl.arange(0, DP)
    o_d = tl.arange(0, DK)
    m_t = o_t < n_t
    k_t = _operand(_rows(k + (bos * H + i_h) * DK, o_t, m_t, H * DK, o_d), UPCAST)
    q_t = _operand(_rows(q + (bos * H + i_h) * DK, o_t, m_t, H * DK, o_d), UPCAST)
    # The path alone says where it is (its columns past the node's depth hold -1, the node closes it), so
    # its load waits for nothing. With the depth read first, the depth, the path it masked and the gates
    # gathered at the path were three dependent round trips; two now take 0.5-3.1 % off the verify (an
    # H100, depth-8 trees, benchmarks/EXPERIMENTS.md, 2026-12-05). The solve below stays a loop to the
    # tree's depth: unrolled to the padded depth it was 2-4 % slower at the engine's depth 9.
    anc = tl.load(paths + (bos + o_t)[None, :] * d + o_e[:, None], mask=m_t[None, :] & (o_e[:, None] < d),
                  other=-1)  # fmt: skip
    on_path = anc >= 0
    anc = tl.where(on_path, anc - bos, 0).to(tl.int32)  # local node indices
    self_row = on_path & (anc == o_t[None, :])
    strict = on_path & ~self_row
    a_exp_h = tl.exp(tl.load(a_log + i_hv).to(tl.float32)) if RAW_GATES else 1.0
    dt_bias_h = tl.load(dt_bias + i_hv).to(tl.float32) if RAW_GATES else 0.0
    g_p, b_p = _gates(g + bos * hv + i_hv, beta + bos * hv + i_hv, anc, on_path, hv, a_exp_h, dt_bias_h,
                      RAW_GATES)  # fmt: skip
    lp = tl.sum(g_p, axis=0)
    tl.store(log_p + (bos * hv + i_hv) + o_t * hv, lp, mask=m_t)
    ratio = tl.exp(tl.where(on_path, lp[None, :] - tl.cumsum(g_p, axis=0), float("-inf")))
    sc_req = scratch + (bos * hv + i_hv) * SW
    dense = o_t[:, None] * (hv * SW) + o_t[None, :]
    tl.store(sc_req + dense, tl.dot(q_t, tl.trans(k_t), input_precision=PREC), mask=m_t[:, None])
    tl.store(sc_req + BT + dense, tl.dot(k_t, tl.trans(k_t), input_precision=PREC), mask=m_t[:, None])
    tl.debug_barrier()
    at_anc = sc_req + o_t[None, :] * (hv * SW) + anc  # [Q Kᵀ]_{i, anc}; + BT: [K Kᵀ]_{i, anc}
    w_req = factors + (i_hv * n_total + bos) * d
    offs = o_t[None, :] * d + o_e[:, None]
    qk_p = tl.load(at_anc, mask=on_path, other=0.0)
    tl.store(w_req + hv * n_total * d + offs, ratio * qk_p * scale, mask=on_path)  # C'
    b_own = tl.sum(tl.where(self_row, b_p, 0.0), axis=0)
    kk_p = tl.load(at_anc + BT, mask=strict, other=0.0)
    tl.store(w_req + offs, b_own[None, :] * ratio * kk_p, mask=strict)  # G, until the solve ends
    tl.debug_barrier()
    x = tl.where(self_row, 1.0, 0.0)  # x (I + M) = e_last, column by column from the deepest
    g_rows = w_req + anc * d
    for i in range(0, d - 1):
        col = d - 2 - i
        m_col = tl.load(g_rows + col, mask=on_path & (o_e[:, None] > col), other=0.0)
        x_col = -tl.sum(x * m_col, axis=0)
        x = tl.where((o_e[:, None] == col) & strict, x_col[None, :], x)
    tl.debug_barrier()  # every row of G read before W' overwrites it
    tl.store(w_req + offs, x * b_p, mask=on_path)
    return lp
