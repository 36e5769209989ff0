"""Full attention of a forest of new tokens over a paged KV cache plus their ancestors, in one launch
(two where a long context is split across programs, then combined).

Node ``i`` of request ``b`` attends to the request's ``context_lens[b]`` committed positions (through its
block table) and to its ancestors in the forest and itself (the DFS interval test of
:class:`~trtllm_bole.tree.TreeBatch`). One program per (block of ``BM`` query rows, key/value head,
request), its rows the (node, query head) pairs of the heads that share that key/value head, streams
the committed keys, then the request's own nodes up to its last row's (parents precede children), in
blocks of ``BN`` with an online softmax (flash attention's), so nothing of size context x nodes is ever
materialised: the torch path (:mod:`trtllm_bole.reference.attention_tree`) gathers the whole block
table's window and builds a dense mask for every forward. fp32 inputs use IEEE dots (the fp32 serving
runs compare greedy outputs token for token); 16-bit inputs use 16-bit tensor-core dots with fp32
accumulation.
"""

from __future__ import annotations

from functools import cache

import torch
import triton
import triton.language as tl

from trtllm_bole.kernels._common import check_attention, num_sms, pow2_at_least
from trtllm_bole.kernels._verify_tiles import _UPCAST, _operand
from trtllm_bole.tree import TreeBatch


@triton.jit
def _softmax_step(q_t, k_ptrs, v_ptrs, cols, keep, m_i, l_i, acc, scale, d_mask, PREC: tl.constexpr,
                  UPCAST: tl.constexpr):  # fmt: skip
    """One block of keys (``cols``: the valid ones): scores under ``keep`` ``[BM, BN]``, the running max,
    sum and output updated."""
    k_t = tl.load(k_ptrs, mask=cols[:, None] & d_mask[None, :], other=0.0)
    s = tl.dot(_operand(q_t, UPCAST), tl.trans(_operand(k_t, UPCAST)), input_precision=PREC) * scale
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    v_t = tl.load(v_ptrs, mask=cols[:, None] & d_mask[None, :], other=0.0)
    pv = tl.dot(_operand(p.to(v_t.dtype), UPCAST), _operand(v_t, UPCAST), input_precision=PREC)
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + pv


@triton.jit(do_not_specialize=["table_width", "num_blocks", "splits", "n_total"])
def _tree_attention_kernel(
    q, k, v, k_cache, v_cache, o, part_m, part_l, part_o, block_tables, context_lens, cu_seqlens, dfs_order,
    subtree_size, scale, table_width, num_blocks, splits, n_total,
    HQ: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, PAGE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Program ``(i_m * splits + i_s, i_kv, i_b)``: split ``i_s`` of the request's committed positions
    (an equal share of them, in whole blocks of ``BN``) for its rows; split 0 also takes the forest's
    nodes. One split writes ``o``; several (``SPLIT``) write their running max, sum and unnormalised
    output to ``part_*`` for :func:`_combine_kernel`."""
    i_m, i_s = tl.program_id(0) // splits, tl.program_id(0) % splits
    i_kv, i_b = tl.program_id(1), tl.program_id(2)
    bos = tl.load(cu_seqlens + i_b).to(tl.int64)
    n_t = (tl.load(cu_seqlens + i_b + 1) - bos).to(tl.int32)
    if i_m * BM < n_t * (HQ // KVH):
        # Query rows are (node, query head of this key/value head's group) pairs, so that the group's
        # heads share every key and value the program loads.
        r = i_m * BM + tl.arange(0, BM)
        rows = r // (HQ // KVH)
        m_rows = rows < n_t
        o_d = tl.arange(0, BD)
        m_d = o_d < D
        heads = (bos + rows) * HQ + i_kv * (HQ // KVH) + r % (HQ // KVH)  # row of q/o as [N * HQ, D]
        q_t = tl.load(q + heads[:, None] * D + o_d[None, :], mask=m_rows[:, None] & m_d[None, :], other=0.0)
        ord_r = tl.load(dfs_order + bos + rows, mask=m_rows, other=0)
        m_i = tl.full([BM], -1.0e30, dtype=tl.float32)  # finite: a block of masked keys adds nothing
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BD], dtype=tl.float32)
        # The committed positions inside the table (as the torch path's window), through the block table;
        # an entry out of range reads a clamped block (the reference gathers the same).
        ctx = tl.load(context_lens + i_b)
        ctx = tl.maximum(tl.minimum(ctx, table_width * PAGE), 0).to(tl.int32)  # clamped both ways, then cast
        # Shares of the request's own length, not of the table's (which a CUDA graph sizes for the longest).
        chunk = tl.cdiv(tl.cdiv(ctx, splits), BN) * BN
        end = tl.minimum(ctx, (i_s + 1) * chunk)
        for start in range(i_s * chunk, end, BN):
            pos = start + tl.arange(0, BN)
            m_p = pos < end
            block = tl.load(block_tables + i_b * table_width + pos // PAGE, mask=m_p, other=0).to(tl.int64)
            block = tl.minimum(tl.maximum(block, 0), num_blocks - 1)
            kv_off = ((block * PAGE + pos % PAGE) * KVH + i_kv)[:, None] * D + o_d[None, :]
            keep = m_rows[:, None] & m_p[None, :]
            m_i, l_i, acc = _softmax_step(q_t, k_cache + kv_off, v_cache + kv_off, m_p, keep, m_i, l_i, acc,
                                          scale, m_d, PREC, UPCAST)  # fmt: skip
        if i_s == 0:  # the request's nodes: ancestors of the query node, and itself
            # Parents precede children, so no node past the block's last row is an ancestor of its rows.
            n_c = tl.minimum(n_t, (i_m * BM + BM - 1) // (HQ // KVH) + 1)
            for start in range(0, n_c, BN):
                cols = start + tl.arange(0, BN)
                m_c = cols < n_c
                ord_c = tl.load(dfs_order + bos + cols, mask=m_c, other=0)
                end_c = ord_c + tl.load(subtree_size + bos + cols, mask=m_c, other=0)
                keep = (ord_c[None, :] <= ord_r[:, None]) & (ord_r[:, None] < end_c[None, :])
                keep = keep & m_rows[:, None] & m_c[None, :]
                kv_off = ((bos + cols) * KVH + i_kv)[:, None] * D + o_d[None, :]
                m_i, l_i, acc = _softmax_step(q_t, k + kv_off, v + kv_off, m_c, keep, m_i, l_i, acc, scale,
                                              m_d, PREC, UPCAST)  # fmt: skip
        out_mask = m_rows[:, None] & m_d[None, :]
        if SPLIT:
            part = i_s * n_total * HQ + heads
            tl.store(part_m + part, m_i, mask=m_rows)
            tl.store(part_l + part, l_i, mask=m_rows)
            tl.store(part_o + part[:, None] * D + o_d[None, :], acc, mask=out_mask)
        else:
            out = acc / tl.where(m_rows, l_i, 1.0)[:, None]
            tl.store(o + heads[:, None] * D + o_d[None, :], out.to(o.dtype.element_ty), mask=out_mask)


@triton.jit
def _combine_kernel(o, part_m, part_l, part_o, rows_total, D: tl.constexpr, BD: tl.constexpr,
                    SP: tl.constexpr, splits):  # fmt: skip
    """Row ``(node, query head)`` of ``o`` from its splits' running maxima, sums and outputs."""
    row = tl.program_id(0)
    o_s = tl.arange(0, SP)
    m_s = o_s < splits
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m = tl.load(part_m + o_s * rows_total + row, mask=m_s, other=-1.0e30)
    weight = tl.where(m_s, tl.exp(m - tl.max(m, 0)), 0.0)
    l_sum = tl.sum(weight * tl.load(part_l + o_s * rows_total + row, mask=m_s, other=0.0), 0)
    part_rows = (o_s * rows_total + row)[:, None] * D + o_d[None, :]
    part = tl.load(part_o + part_rows, mask=m_s[:, None] & m_d[None, :], other=0.0)
    out = tl.sum(weight[:, None] * part, 0) / l_sum
    tl.store(o + row * D + o_d, out.to(o.dtype.element_ty), mask=m_d)


def tiles(dtype: torch.dtype, bd: int) -> tuple[int, int, int]:
    """Query rows and keys a block, and warps, for q's dtype and the padded head dim: fp32's IEEE dots run
    on the FMA units, with their operand tiles in registers (H200, the embedded model's heads, d = 64:
    blocks of 64 query rows halved the end-to-end tokens/s against 32), and from d = 256 (Qwen3.5's) in
    blocks of 32 keys (64 took 298 KB of shared memory, past an H200 SM's 227 KB); 16-bit dots run on the
    tensor cores, 64 query rows (two warpgroups at d = 256)."""
    if dtype == torch.float32:
        return 32, 64 if bd <= 128 else 32, 4
    return (64, 32, 8) if bd >= 256 else (64, 64, 4)


def min_chunk(bd: int) -> int:
    """Fewest of the table's positions a split is sized for, by padded head dim. At 256 and more
    (Qwen3.5's) 128, measured on the H200 (one 9B request over 1,024 positions: splits of 128 took
    30 µs, of 64 36, unsplit 98; ``tree_attention_h200_splits.json``). Below, 2,048, the bound from
    before that measurement: several programs share an SM there, which :func:`split_count`'s waves do
    not model, and the embedded model's contexts stay whole, as its end-to-end runs measured them."""
    return 128 if bd >= 256 else 2048


@cache
def split_count(programs: int, window: int, sms: int, least_chunk: int) -> int:
    """Splits of the committed positions for a launch of ``programs`` programs (one per block of query
    rows, key/value head and request), at most one per ``least_chunk`` of the table's ``window``
    positions (the context's bound the host knows: the lengths are on the device; each request's
    splits then share its own length).

    At Qwen3.5's head dim of 256 an SM runs one program at a time, so a launch takes as many waves as
    ``programs * splits / sms`` rounded up, each wave a split's share of the work: more splits are
    taken only where their waves per split beat the best fewer by 10%. Measured on the H200
    (``tree_attention_h200_splits.json``): one 9B request, 16 programs, takes 8 splits, 98 -> 30 µs
    at 1,024 positions; 27B batch 8, 192 programs in 1.5 waves, takes 2, 639 -> 502 µs at 4,096; 128
    or 256 programs stay whole, as a second wave of half-length splits measured slower. Cached: the
    executor calls it per layer with a few shapes."""
    cost = {
        s: -(-s * programs // sms) / s for s in range(1, min(window // least_chunk, 4 * sms // programs) + 1)
    }
    best = 1
    for s, waves in cost.items():
        if waves < 0.9 * cost[best]:
            best = s
    return best


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    tree: TreeBatch,
    scale: float,
    splits: int | None = None,
) -> torch.Tensor:
    """:func:`trtllm_bole.reference.attention_tree.tree_attention` in one launch (two where the committed
    positions are split across programs: ``splits``, default :func:`split_count`), no host sync (the
    arguments checked as :func:`trtllm_bole.ops.tree_attention` checks them)."""
    check_attention(q, k, v, k_cache, v_cache, block_tables, context_lens, tree)
    n, hq, d = q.shape
    kvh = k.shape[1]
    q, k, v = (t.contiguous() for t in (q, k, v))
    o = torch.empty_like(q)  # row-major, as the kernel writes it (q's own strides could be permuted)
    bd = pow2_at_least(max(d, 16))
    bm, bn, warps = tiles(q.dtype, bd)
    row_blocks = triton.cdiv(tree.max_nodes * (hq // kvh), bm)
    window = block_tables.shape[1] * k_cache.shape[1]
    programs = row_blocks * kvh * tree.num_requests
    splits = splits or split_count(programs, window, num_sms(q.device), min_chunk(bd))
    parts = [  # the splits' running maxima, sums and outputs; one split writes o alone (o stands in)
        torch.empty((splits, n, hq, *extra), dtype=torch.float32, device=q.device) if splits > 1 else o
        for extra in ((), (), (d,))
    ]
    _tree_attention_kernel[(row_blocks * splits, kvh, tree.num_requests)](
        q, k, v, k_cache, v_cache, o, *parts, block_tables.contiguous(),
        context_lens.contiguous(), tree.cu_seqlens, tree.dfs_order, tree.subtree_size, float(scale),
        block_tables.shape[1], k_cache.shape[0], splits, n,
        HQ=hq, KVH=kvh, D=d, BD=bd, PAGE=k_cache.shape[1], BM=bm, BN=bn,
        PREC="ieee" if q.dtype == torch.float32 else "tf32",  # (16-bit operands ignore it)
        UPCAST=_UPCAST, SPLIT=splits > 1, num_warps=warps,
    )  # fmt: skip
    if splits > 1:
        _combine_kernel[(n * hq,)](o, *parts, n * hq, D=d, BD=bd, SP=pow2_at_least(splits), splits=splits)
    return o
