"""Tile helpers shared by the verify kernels (:mod:`.gdn_tree_verify`, :mod:`.gdn_tree_verify_inverse`)."""

from __future__ import annotations

import os

import triton
import triton.language as tl

_UPCAST = os.environ.get("TRITON_INTERPRET") == "1"
"""Triton's interpreter (3.9) multiplies the bit patterns of bf16 dot operands: upcast them there."""


@triton.jit
def _operand(x, UPCAST: tl.constexpr):
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _is_ancestor(ord_row, ord_col, end_col, m_row, m_col):
    """``[BT, BT]``: column node is an ancestor of (or is) the row node, within valid rows/columns."""
    inside = (ord_col[None, :] <= ord_row[:, None]) & (ord_row[:, None] < end_col[None, :])
    return inside & m_row[:, None] & m_col[None, :]


@triton.jit
def _rows(base, rows, m_rows, row_stride, cols):
    """``base[rows, cols]`` of a row-major matrix, zero on masked rows. ``base`` is a scalar pointer and
    the offsets int32, so no per-element 64-bit pointer stays live across the loops."""
    return tl.load(base + (rows[:, None] * row_stride + cols[None, :]), mask=m_rows[:, None], other=0.0)


@triton.jit
def _state_product(a, s, acc, PREC: tl.constexpr, S_BF16: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + a s`` for a state tile ``s`` (fp32): bf16 operands (``S_BF16``) or fp32 at ``PREC``."""
    if S_BF16:
        acc = tl.dot(_operand(a.to(tl.bfloat16), UPCAST), _operand(s.to(tl.bfloat16), UPCAST), acc)
    else:
        acc = tl.dot(a.to(tl.float32), s, acc, input_precision=PREC)
    return acc


@triton.jit
def _unit_lower_inverse(a, BT: tl.constexpr, PREC: tl.constexpr):
    """``(I - A)⁻¹`` of a strictly lower-triangular ``[BT, BT]`` tile ``A`` (``BT`` a power of two), by
    block doubling: with ``W`` the inverse of the diagonal blocks of size ``b``, the inverse on blocks of
    ``2b`` is ``W + W (A ∘ M_b) W``, where ``M_b`` keeps each odd block's rows against the block before it
    (``[P, 0; -C, Q]⁻¹ = [P⁻¹, 0; Q⁻¹ C P⁻¹, Q⁻¹]``). The first round needs no products (``W = I``), the
    ``log2 BT - 1`` others two each, on the bounded entries of exact inverses. The power series
    ``(I + A)(I + A²)(I + A⁴)…`` it replaces is the same polynomial, but ``A^m`` on a chain sums
    ``C(n - 1, m - 1)`` paths: on 32 nodes of near-identical keys with β near 1 its fp32 rounding reached
    the size of the result (tests/kernels/test_verify_stability.py). Only the entries below the diagonal
    are read (the callers' masks keep ``A`` as the math writes it)."""
    o_r = tl.arange(0, BT)[:, None]
    o_c = tl.arange(0, BT)[None, :]
    tl.static_assert(BT <= 128)
    w = tl.where(o_r == o_c, 1.0, 0.0)
    for s in range(0, 7):  # half-blocks of 1 … 64 nodes; a loop, not unrolled (one copy of the products)
        if (1 << s) < BT:
            blk_r = o_r >> s
            blk_c = o_c >> s
            cross = tl.where(((blk_r & 1) == 1) & (blk_c == blk_r - 1), a, 0.0)
            # W = I in the first round: W + W (A ∘ M_1) W = I + A ∘ M_1. Keep this branch inside the
            # loop: the same first round written before it (w = I + cross, the loop from s = 1) ran in
            # the interpreter, but triton 3.6 built a kernel that was wrong on the H200 (the 16-bit
            # prefill at Qwen3.5-9B heads off by 0.31, benchmarks/EXPERIMENTS.md).
            if s == 0:
                w += cross
            else:
                w += tl.dot(w, tl.dot(cross, w, input_precision=PREC), input_precision=PREC)
    return w


@triton.jit
def _gram(
    a_req,
    k_req,
    rows,
    m_rows,
    cols,
    m_cols,
    o_k,
    ROW_STRIDE: tl.constexpr,
    DK: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """``A_rows K_colsᵀ`` (``[BT, BT]`` fp32, A = K or Q), dk streamed in ``BK`` chunks."""
    acc = tl.zeros([BT, BT], dtype=tl.float32)
    for kc in range(0, DK, BK):
        a_c = _operand(_rows(a_req, rows, m_rows, ROW_STRIDE, kc + o_k), UPCAST)
        k_c = _operand(_rows(k_req, cols, m_cols, ROW_STRIDE, kc + o_k), UPCAST)
        acc = tl.dot(a_c, tl.trans(k_c), acc, input_precision=PREC)
    return acc


@triton.jit
def _gram2(
    q_req,
    k_req,
    rows,
    m_rows,
    cols,
    m_cols,
    o_k,
    ROW_STRIDE: tl.constexpr,
    DK: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """``K_rows K_colsᵀ`` and ``Q_rows K_colsᵀ`` in one pass over dk (small blocks: fewer loads)."""
    kk = tl.zeros([BT, BT], dtype=tl.float32)
    qk = tl.zeros([BT, BT], dtype=tl.float32)
    for kc in range(0, DK, BK):
        k_c = tl.trans(_operand(_rows(k_req, cols, m_cols, ROW_STRIDE, kc + o_k), UPCAST))
        kk = tl.dot(
            _operand(_rows(k_req, rows, m_rows, ROW_STRIDE, kc + o_k), UPCAST), k_c, kk, input_precision=PREC
        )
        qk = tl.dot(
            _operand(_rows(q_req, rows, m_rows, ROW_STRIDE, kc + o_k), UPCAST), k_c, qk, input_precision=PREC
        )
    return kk, qk
