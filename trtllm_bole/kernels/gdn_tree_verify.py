"""Closed-form Gated DeltaNet tree verification (BOLE.md §2): the public launcher and the blocked kernel.

:func:`gdn_tree_verify` runs one of two kernels, picked by the config's type: :class:`InverseConfig`
(the explicit ``(I + G)⁻¹`` path of :mod:`.gdn_tree_verify_inverse`) or :class:`VerifyConfig` (the
blocked kernel below, one launch; the TensorRT plugin's kernel). Left to the launcher (:func:`default_plan`),
fp32 q/k/v run the blocked kernel with exact fp32 dots (:func:`exact_config`) and 16-bit ones the serving
precisions with a config picked by shape (:func:`default_config`).

Blocked kernel: one program per (request, value head, value tile of ``BV`` channels); ragged batches
need no padding (each program loops over its own request's nodes). Nodes go in row blocks of ``BT``
(the packed order is topological, so a block's ancestors lie in it or in earlier blocks):

1. ``logP`` of every node (masked row sums of ``g`` over the ancestor set), written to the ``log_p``
   output and read back after a barrier;
2. per row block ``r``: ``Q_r S`` and ``K_r S`` with ``dk`` streamed in ``BK`` chunks,
   ``R_r = β(V_r - P_r K_r S)``; then ``R_r -= Σ_{c<r} G_rc U_c`` and ``O_r += Σ_{c<r} C_rc U_c``
   with ``U_c`` read back from the ``u`` output this program wrote (blocked forward substitution;
   column blocks holding no ancestor of the row block are skipped);
3. ``U_r = (I + G_rr)⁻¹ R_r``, the block's inverse by doubling (:func:`~._verify_tiles._unit_lower_inverse`:
   ``log2 BT - 1`` rounds of two ``[BT, BT]`` products on bounded entries; BOLE.md's Neumann series, or its
   squared form ``(I - G)(I + G²)(I + G⁴)…`` that this kernel ran until 2026-12-04, loses fp32 exactness
   on long chains of similar keys); then ``O_r = P_r Q_r S + Σ_{c≤r} C_rc U_c``.

Ancestor masks are never stored: "j is an ancestor-or-self of i" is the pre-order interval test on two
1-D loads (``dfs_order``, ``subtree_size``), and log-ratios off the ancestor set are masked to ``-inf``
before ``exp``. Only ``o``, ``u`` and ``log_p`` are written. Where we deviate from BOLE.md's sketch:
``G`` and ``C`` are formed per program, i.e. once per (request, head) when ``BV = dv`` and once per value
tile otherwise (the benchmark measures both kinds of config); the state tile is re-read per row block
(from L2 after the first) rather than kept on chip, which keeps the tiles spill-free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from trtllm_bole.kernels._common import (
    H200_SMS,
    MAX_DEPTH,
    VerifyCall,
    check_contiguous,
    check_depth,
    check_device,
    check_gdn_operands,
    check_slot_count,
    gdn_shapes,
    num_sms,
    slot_indices,
    tile_dividing,
    tiles_head_dims,
)
from trtllm_bole.kernels._verify_tiles import (
    _UPCAST,
    _gram,
    _gram2,
    _is_ancestor,
    _operand,
    _rows,
    _state_product,
    _unit_lower_inverse,
)
from trtllm_bole.kernels.gdn_tree_verify_inverse import (
    INVERSE_CONFIGS,
    InverseConfig,
    bf16_refused,
    check_inverse_config,
    launch_inverse,
    loads_key_dim,
)
from trtllm_bole.kernels.norms import softplus
from trtllm_bole.tree import TreeBatch

PRECISIONS = ("ieee", "tf32", "bf16")
"""``ieee``: exact fp32 dots (fp32-exact mode); ``tf32``: tensor-core dots on fp32 operands;
``bf16``: as ``tf32`` but ``Q S`` and ``K S`` round the state tile to bf16 (serving: see
:func:`default_precision`)."""


@dataclass(frozen=True, slots=True)
class VerifyConfig:
    bt: int  # tree nodes per row block (power of two, >= 16)
    bk: int  # dk chunk streamed per step (divides dk)
    bv: int  # value channels per program (divides dv)
    num_warps: int = 4
    num_stages: int = 2
    fused: bool = True  # the block's K Kᵀ, Q Kᵀ from the S-dot loads (fewer loads, more registers)

    @property
    def lb(self) -> int:
        """Nodes per block of the logP pass (the kernel's ``LB``): 64 from 4 warps on, else 32."""
        return 64 if self.num_warps >= 4 else 32


CONFIGS = tuple(
    VerifyConfig(bt, bk, bv, w, s, fused)
    for bt, bk, bv, w, s, fused in (
        (16, 64, 16, 1, 2, True),
        (16, 64, 32, 2, 2, True),
        (16, 64, 64, 2, 2, True),
        (16, 64, 128, 4, 2, False),
        (32, 64, 16, 2, 2, True),
        (32, 64, 32, 4, 2, True),
        (32, 32, 64, 4, 2, True),
        (32, 32, 64, 4, 2, False),
        (32, 32, 128, 8, 2, False),
        (64, 32, 32, 4, 2, False),
        (64, 32, 64, 8, 2, False),
        (64, 32, 128, 8, 2, False),
    )
)
"""Candidates the benchmark sweeps (benchmarks/bench_gdn_verify.py records the winner per shape). On
sm_90 (ptxas of triton 3.9) the row blocks of 16 and 32 compile with no or few spilled bytes; those of
64 spill a few hundred bytes (the [64, 64] solve tiles) and are kept for the measurement to judge."""


@triton.jit
def _log_decay(
    dfs_req, size_req, g_req, lp_req, n_t, hv, a_exp_h, dt_bias_h, LB: tl.constexpr, RAW_GATES: tl.constexpr
):
    """``logP_i = Σ g_j`` over the ancestors-or-self ``j`` of every node, in blocks of ``LB`` nodes
    (independent of the row block: one pass for a tree of up to ``LB`` nodes), stored to ``log_p``."""
    o_l = tl.arange(0, LB)
    for r in range(0, tl.cdiv(n_t, LB)):
        rows = r * LB + o_l
        m_r = rows < n_t
        ord_r = tl.load(dfs_req + rows, mask=m_r, other=0).to(tl.int32)
        acc = tl.zeros([LB], dtype=tl.float32)
        for c in range(0, r + 1):
            cols = c * LB + o_l
            m_c = cols < n_t
            ord_c = tl.load(dfs_req + cols, mask=m_c, other=0).to(tl.int32)
            end_c = ord_c + tl.load(size_req + cols, mask=m_c, other=0).to(tl.int32)
            g_c = tl.load(g_req + cols * hv, mask=m_c, other=0.0).to(tl.float32)
            if RAW_GATES:  # g holds a: g = -exp(A_log) softplus(a + dt_bias)
                x = g_c + dt_bias_h
                g_c = tl.where(m_c, -a_exp_h * softplus(x), 0.0)
            anc = _is_ancestor(ord_r, ord_c, end_c, m_r, m_c)
            acc += tl.sum(tl.where(anc, g_c[None, :], 0.0), axis=1)
        tl.store(lp_req + rows * hv, acc, mask=m_r)


@triton.jit
def _verify_request(
    q, k, v, g, beta, state, slots, cu_seqlens, dfs_order, subtree_size, o, u, log_p, a_log, dt_bias,
    scale, hv, i_v, i_hv, i_b, i_slot,
    H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, USE_SLOTS: tl.constexpr, PREC: tl.constexpr, S_BF16: tl.constexpr,
    UPCAST: tl.constexpr, RAW_GATES: tl.constexpr, LB: tl.constexpr, FUSED: tl.constexpr,
):  # fmt: skip
    """Value tile ``i_v`` of value head ``i_hv`` of request ``i_b`` (state slot ``slots[i_slot]``): the
    blocked kernel's whole work for one program, steps 1-3 of the module's docstring."""
    i_h = i_hv // (hv // H)
    bos = tl.load(cu_seqlens + i_b).to(tl.int64)
    n_t = (tl.load(cu_seqlens + i_b + 1) - bos).to(tl.int32)
    slot = tl.load(slots + i_slot).to(tl.int64) if USE_SLOTS else i_slot.to(tl.int64)
    # Per-request bases (int64); everything below is a small int32 offset from them.
    q_req = q + (bos * H + i_h) * DK
    k_req = k + (bos * H + i_h) * DK
    v_req = v + (bos * hv + i_hv) * DV
    u_req = u + (bos * hv + i_hv) * DV
    o_req = o + (bos * hv + i_hv) * DV
    s_req = state + (slot * hv + i_hv) * (DK * DV)
    dfs_req = dfs_order + bos
    size_req = subtree_size + bos
    beta_req = beta + bos * hv + i_hv
    lp_req = log_p + bos * hv + i_hv
    a_exp_h = tl.exp(tl.load(a_log + i_hv).to(tl.float32)) if RAW_GATES else 1.0
    dt_bias_h = tl.load(dt_bias + i_hv).to(tl.float32) if RAW_GATES else 0.0
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)

    # 1. logP of every node (all value tiles of a head write the same bits), read back below.
    _log_decay(dfs_req, size_req, g + bos * hv + i_hv, lp_req, n_t, hv, a_exp_h, dt_bias_h, LB, RAW_GATES)
    tl.debug_barrier()

    # 2-3. Row blocks in topological order: blocked forward substitution for U, then O.
    for r in range(0, tl.cdiv(n_t, BT)):
        rows = r * BT + o_t
        m_r = rows < n_t
        ord_r = tl.load(dfs_req + rows, mask=m_r, other=0).to(tl.int32)
        end_r = ord_r + tl.load(size_req + rows, mask=m_r, other=0).to(tl.int32)
        lp_r = tl.load(lp_req + rows * hv, mask=m_r, other=0.0)
        b_r = tl.load(beta_req + rows * hv, mask=m_r, other=0.0).to(tl.float32)
        if RAW_GATES:  # beta holds b: beta = sigmoid(b)
            b_r = tl.where(m_r, 1.0 / (1.0 + tl.exp(-b_r)), 0.0)
        v_r = _rows(v_req, rows, m_r, hv * DV, o_v)
        qs = tl.zeros([BT, BV], dtype=tl.float32)
        ks = tl.zeros([BT, BV], dtype=tl.float32)
        kk = tl.zeros([BT, BT], dtype=tl.float32)
        qk = tl.zeros([BT, BT], dtype=tl.float32)
        for kc in range(0, DK, BK):
            q_c = _rows(q_req, rows, m_r, H * DK, kc + o_k)
            k_c = _rows(k_req, rows, m_r, H * DK, kc + o_k)
            s_c = tl.load(s_req + ((kc + o_k)[:, None] * DV + o_v[None, :]))
            qs = _state_product(q_c, s_c, qs, PREC, S_BF16, UPCAST)
            ks = _state_product(k_c, s_c, ks, PREC, S_BF16, UPCAST)
            if FUSED:  # the block's own K Kᵀ and Q Kᵀ from the same loads
                k_t = tl.trans(_operand(k_c, UPCAST))
                kk = tl.dot(_operand(k_c, UPCAST), k_t, kk, input_precision=PREC)
                qk = tl.dot(_operand(q_c, UPCAST), k_t, qk, input_precision=PREC)
        decay = tl.exp(lp_r)
        rhs = b_r[:, None] * (v_r.to(tl.float32) - decay[:, None] * ks)
        o_acc = decay[:, None] * qs

        for c in range(0, r):  # earlier blocks are full: no column mask needed
            cols = c * BT + o_t
            ord_c = tl.load(dfs_req + cols).to(tl.int32)
            end_c = ord_c + tl.load(size_req + cols).to(tl.int32)
            anc = _is_ancestor(ord_r, ord_c, end_c, m_r, o_t < BT)
            if tl.max(anc.to(tl.int32)) > 0:  # skip column blocks holding no ancestor of this block
                lp_c = tl.load(lp_req + cols * hv)
                ratio = tl.exp(tl.where(anc, lp_r[:, None] - lp_c[None, :], float("-inf")))
                u_c = tl.load(u_req + (cols[:, None] * (hv * DV) + o_v[None, :]))
                if FUSED:
                    kk_c, qk_c = _gram2(
                        q_req, k_req, rows, m_r, cols, o_t < BT, o_k, H * DK, DK, BT, BK, PREC, UPCAST
                    )
                    rhs -= tl.dot(b_r[:, None] * ratio * kk_c, u_c, input_precision=PREC)
                    o_acc = tl.dot(ratio * qk_c, u_c, o_acc, input_precision=PREC)
                else:  # one [BT, BT] product at a time: fewer live registers for large blocks
                    kk_c = _gram(
                        k_req, k_req, rows, m_r, cols, o_t < BT, o_k, H * DK, DK, BT, BK, PREC, UPCAST
                    )
                    rhs -= tl.dot(b_r[:, None] * ratio * kk_c, u_c, input_precision=PREC)
                    qk_c = _gram(
                        q_req, k_req, rows, m_r, cols, o_t < BT, o_k, H * DK, DK, BT, BK, PREC, UPCAST
                    )
                    o_acc = tl.dot(ratio * qk_c, u_c, o_acc, input_precision=PREC)

        anc = _is_ancestor(ord_r, ord_r, end_r, m_r, m_r)
        if not FUSED:
            kk = _gram(k_req, k_req, rows, m_r, rows, m_r, o_k, H * DK, DK, BT, BK, PREC, UPCAST)
        ratio = tl.exp(tl.where(anc, lp_r[:, None] - lp_r[None, :], float("-inf")))
        a = tl.where(anc & (o_t[:, None] != o_t[None, :]), -b_r[:, None] * ratio * kk, 0.0)  # -G_rr
        u_r = tl.dot(_unit_lower_inverse(a, BT, PREC), rhs, input_precision=PREC)
        out_offs = rows[:, None] * (hv * DV) + o_v[None, :]
        tl.store(u_req + out_offs, u_r, mask=m_r[:, None])
        if not FUSED:
            qk = _gram(q_req, k_req, rows, m_r, rows, m_r, o_k, H * DK, DK, BT, BK, PREC, UPCAST)
        ratio = tl.exp(tl.where(anc, lp_r[:, None] - lp_r[None, :], float("-inf")))
        o_acc = tl.dot(ratio * qk, u_r, o_acc, input_precision=PREC)
        tl.store(o_req + out_offs, (o_acc * scale).to(o.dtype.element_ty), mask=m_r[:, None])
        tl.debug_barrier()  # later row blocks read this block's U back


@triton.jit
def _gdn_tree_verify_kernel(
    q,
    k,
    v,
    g,
    beta,
    state,
    slots,
    cu_seqlens,
    dfs_order,
    subtree_size,
    o,
    u,
    log_p,
    a_log,
    dt_bias,
    scale,
    hv,
    H: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_SLOTS: tl.constexpr,
    PREC: tl.constexpr,
    S_BF16: tl.constexpr,
    UPCAST: tl.constexpr,
    RAW_GATES: tl.constexpr,
    LB: tl.constexpr = 32,  # nodes per block of the logP pass
    FUSED: tl.constexpr = False,  # see VerifyConfig.fused
):
    i_v, i_hv, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _verify_request(q, k, v, g, beta, state, slots, cu_seqlens, dfs_order, subtree_size, o, u, log_p, a_log,
                    dt_bias, scale, hv, i_v, i_hv, i_b, i_b, H, DK, DV, BT, BK, BV, USE_SLOTS,
                    PREC, S_BF16, UPCAST, RAW_GATES, LB, FUSED)  # fmt: skip


def blocked_launch(call: VerifyCall, cfg: VerifyConfig) -> tuple[tuple, tuple, dict]:
    """The blocked kernel's outputs ``(o, u, log_p)``, positional arguments and compile-time constants and
    launch options for ``call`` (the prefill's kernel, :mod:`.gdn_prefill`, takes the same)."""
    _, h, dk = call.q.shape
    hv, dv = call.v.shape[1:]
    tree = call.tree
    outputs = call.new_outputs()
    args = (
        call.q, call.k, call.v, call.g, call.beta, call.state, call.slots, tree.cu_seqlens, tree.dfs_order,
        tree.subtree_size, *outputs, *call.gate_params, call.scale, hv,
    )  # fmt: skip
    consts = dict(
        H=h, DK=dk, DV=dv, BT=cfg.bt, BK=cfg.bk, BV=cfg.bv, LB=cfg.lb,
        FUSED=cfg.fused, UPCAST=_UPCAST, **call.mode_consts(), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip
    return outputs, args, consts


def _launch(call: VerifyCall, cfg: VerifyConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The blocked kernel, one launch (grid ``(dv / bv, HV, B)``)."""
    outputs, args, consts = blocked_launch(call, cfg)
    grid = (call.v.shape[2] // cfg.bv, call.v.shape[1], call.tree.num_requests)
    _gdn_tree_verify_kernel[grid](*args, **consts)
    return outputs


def blocked_default_config(num_requests: int, hv: int, dk: int, dv: int) -> VerifyConfig:
    """The blocked kernel's config from the shape alone (the TensorRT plugin's kernel): row blocks of 16
    (few registers, checked with ptxas), value tiles narrow enough to give every SM a program at small
    batch and full width (G, C and the solve once per head) when the batch fills the GPU."""
    bv = tile_dividing(dv, 128)
    while bv > 32 and num_requests * hv * (dv // bv) < 512:
        bv //= 2
    bk = tile_dividing(dk, 64)
    return VerifyConfig(16, bk, bv, 1 if bv <= 16 else 2 if bv <= 64 else 4, 2, fused=bv <= 64)


def exact_config(dk: int, dv: int) -> VerifyConfig:
    """The fp32-exact mode's config (``ieee`` dots), whatever the tree and the batch: the blocked kernel in
    row blocks of 32, ``dk`` in chunks of 32, value tiles of 64. The fastest config at every fp32 point of
    benchmarks/results/verify_configs_h200.json (the embedded model's and Qwen3.5-9B's heads, trees and
    chains of 64, B = 1 … 32): 37-41 µs against the explicit inverse's 112-181 µs at the embedded model's
    heads, 51 against 1378 µs (B = 1) and 535 against 11 695 µs (B = 32) at 9B's. In ``ieee`` the explicit
    inverse's dense 64 × 64 products run on the FMA units instead of the tensor cores."""
    return VerifyConfig(32, tile_dividing(dk, 32), tile_dividing(dv, 64), 4, 2, fused=True)


def default_precision(q_dtype: torch.dtype, v_dtype: torch.dtype, cfg: VerifyConfig | InverseConfig) -> str:
    """The launcher's precision when none is given. fp32 q/k/v: ``ieee`` (the fp32-exact mode). 16-bit
    q/k/v (serving): ``bf16`` state products, as measured in benchmarks/results/gdn_verify_h200_focus.json:
    1.2x faster than ``tf32`` at Qwen3.5-9B, T = 64 (18.6 against 23.4 µs at B = 2, 71.5 against
    84.7 µs at B = 16) for the same error (worst relative RMS 2.3e-3; the inputs' rounding dominates).
    ``tf32`` where bf16 is refused (:func:`~.gdn_tree_verify_inverse.bf16_refused`) and for the
    inverse path's tiles of 32, where it measured faster (T = 32, B = 16: 40.3 against 46.5 µs)."""
    if q_dtype == torch.float32 and v_dtype == torch.float32:
        return "ieee"
    return "tf32" if isinstance(cfg, InverseConfig) and (bf16_refused(cfg) or cfg.bt == 32) else "bf16"


def default_config(
    num_nodes: int,
    num_requests: int,
    hv: int,
    dk: int,
    dv: int,
    num_sms: int = H200_SMS,
) -> VerifyConfig | InverseConfig:
    """The launcher's config from the shape alone (no device sync), by the H200 measurement of
    benchmarks/results/gdn_verify_h200_focus.json (CUDA-graph times, Qwen3.5-9B/27B heads, B = 1 … 32):

    - requests of 33 to 64 nodes (the average): the explicit-inverse path in one tile of 64. One launch
      (every value tile forms its pair's compact factors, 8 warps) while its value tiles fit one program
      per SM: tiles of 64 (9B, B = 1: 16.1 against 17.3 µs for two launches; B = 2; 27B, B = 1), else
      whole tiles of 128 (9B, B = 4: 20.4 against 21.4; 27B, B = 2: 19.6 against 20.3); else two
      launches: the factor kernel (compact path tiles, 8 warps) once per pair, then value tiles of 64
      at 4 warps (9B, B = 16: 49.0 against 62.2 µs for tiles of 128);
    - requests of 17 to 32 nodes: tiles of 32 in two launches;
    - two launches, where capping the value-tile kernel at 128 registers (four programs per SM instead of
      three) saves a wave of them: capped (9B, B = 8: 30.9 against 33.1 µs; B = 16: 49.0 against 51.1;
      27B, B = 32: 125.3 against 128.8); where it saves none, the few spilled bytes cost (27B, B = 8:
      41.4 against 38.8 µs);
    - smaller or larger trees: the blocked kernel (:func:`blocked_default_config`), faster there (T = 8,
      16: 30 µs against 36-39 µs; T = 128, 256: 1.3-1.5x at B = 16); so is a dk that is not a power of
      two (the explicit-inverse path loads whole rows of K)."""
    per_request = -(-num_nodes // max(num_requests, 1))
    pairs = num_requests * hv
    if per_request <= 16 or per_request > 64 or not loads_key_dim(dk):
        return blocked_default_config(num_requests, hv, dk, dv)
    if per_request <= 32:
        picked = (32, 64, 64, 4, 2, 2)
    elif pairs * (dv // tile_dividing(dv, 64)) <= num_sms:
        picked = (64, 128, 64, 8, 1, 8)
    elif pairs <= num_sms:
        picked = (64, 128, 128, 8, 1, 8)
    else:
        picked = (64, 64, 64, 4, 2, 8)
    cfg = InverseConfig(*picked)
    cfg = replace(cfg, bk=tile_dividing(dk, cfg.bk), bv=tile_dividing(dv, cfg.bv))
    tiles = pairs * (dv // cfg.bv)
    if cfg.launches == 2 and -(-tiles // (4 * num_sms)) < -(-tiles // (3 * num_sms)):
        cfg = replace(cfg, maxnreg=128)
    return cfg


def default_plan(
    num_nodes: int,
    num_requests: int,
    hv: int,
    dk: int,
    dv: int,
    q_dtype: torch.dtype,
    v_dtype: torch.dtype,
    *,
    precision: str | None = None,
    config: VerifyConfig | InverseConfig | None = None,
    num_sms: int = H200_SMS,
) -> tuple[VerifyConfig | InverseConfig, str]:
    """The launcher's ``(config, precision)`` for what the caller left out: in the fp32-exact mode (``ieee``
    asked for, or fp32 q/k/v and no precision) :func:`exact_config`, else the serving precisions' shape
    rule :func:`default_config`; then :func:`default_precision` for that config."""
    exact = precision == "ieee" or (precision is None and q_dtype == v_dtype == torch.float32)
    if config is None and exact:
        config = exact_config(dk, dv)
    elif config is None:
        config = default_config(num_nodes, num_requests, hv, dk, dv, num_sms)
    return config, precision or default_precision(q_dtype, v_dtype, config)


def gdn_tree_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    tree: TreeBatch,
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
    precision: str | None = None,
    config: VerifyConfig | InverseConfig | None = None,
    raw_gates: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Closed-form tree verification; the committed state is read, never written.

    Shapes (packed forest of B requests, N nodes):
        q, k ``[N, H, dk]`` and v ``[N, HV, dv]``: fp32, bf16 or fp16 (q scaled by ``scale`` if given);
        g, beta ``[N, HV]``; state ``[S, HV, dk, dv]`` fp32 (slots ``state_indices`` int ``[B]``, or S = B).
    Returns ``o [N, HV, dv]`` (v's dtype), ``u [N, HV, dv]`` fp32 and ``log_p [N, HV]`` fp32 (the path
    log-decay, ``reference.gdn_tree.path_log_decay``).

    ``precision``: ``"ieee"``, ``"tf32"`` or ``"bf16"`` (see :data:`PRECISIONS`); default
    :func:`default_precision` (``ieee`` for fp32 q/k/v, mostly ``bf16`` for 16-bit ones).
    ``config``: :class:`VerifyConfig` (the blocked kernel, one launch) or :class:`InverseConfig` (the
    explicit-inverse path, :mod:`.gdn_tree_verify_inverse`); default :func:`default_plan`. dk and dv
    must be multiples of 16.
    ``raw_gates=(A_log, dt_bias)`` (fp32 ``[HV]``): g and beta hold the raw gate inputs a and b, and the
    kernel applies Qwen3.5's gating on chip: ``g = -exp(A_log) softplus(a + dt_bias)``,
    ``beta = sigmoid(b)`` (the fused form SGLang's verify kernel uses).
    """
    call, cfg = checked_call(
        (q, k, v, g, beta), state, tree, tree.num_requests,
        scale=scale, state_indices=state_indices, precision=precision, config=config, raw_gates=raw_gates,
    )  # fmt: skip
    if isinstance(cfg, InverseConfig):
        return launch_inverse(call, cfg)
    return _launch(call, cfg)


def checked_call(
    operands: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    state: torch.Tensor,
    tree: TreeBatch,
    owners: int,
    *,
    scale: float | None,
    state_indices: torch.Tensor | None,
    precision: str | None,
    config: VerifyConfig | InverseConfig | None,
    raw_gates: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[VerifyCall, VerifyConfig | InverseConfig]:
    """:func:`gdn_tree_verify`'s checks and plan for ``operands = (q, k, v, g, beta)``: the call the
    launchers take and its config. ``owners`` is how many requests own a state slot (``state_indices``
    has one per owner): the tree's requests, or the prefill's prompts, each of which owns several of the
    tree's chains (:mod:`.gdn_prefill`)."""
    q, k, v, g, beta = operands
    n, _, dk, hv, dv = gdn_shapes(q, k, v)
    if n != tree.num_nodes:
        raise ValueError(f"q/k/v hold {n} nodes but the tree has {tree.num_nodes}")
    if not tiles_head_dims(dk, dv):
        raise ValueError(f"dk={dk} and dv={dv} must be multiples of 16 (tensor-core tile sides)")
    check_gdn_operands(q, k, v, g, beta, state)
    check_device(tree, state.device, q=q, k=k, v=v, g=g, beta=beta)
    check_contiguous(state=state)
    check_depth(tree, "gdn_tree_verify")
    check_slot_count(state.shape[0], owners, state_indices)
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if raw_gates is not None and any(
        t.shape != (hv,) or t.dtype != torch.float32 or t.device != state.device for t in raw_gates
    ):
        raise ValueError(
            f"raw_gates must be two float32 tensors [HV={hv}] (A_log, dt_bias) on {state.device}"
        )
    cfg, precision = default_plan(
        n, tree.num_requests, hv, dk, dv, q.dtype, v.dtype,
        precision=precision, config=config, num_sms=num_sms(state.device),
    )  # fmt: skip
    if dk % cfg.bk or dv % cfg.bv or min(cfg.bt, cfg.bk, cfg.bv) < 16 or cfg.bt & (cfg.bt - 1):
        raise ValueError(
            f"{cfg} does not tile dk={dk}, dv={dv} (sides >= 16 dividing dk and dv, bt a power of two)"
        )
    if isinstance(cfg, InverseConfig):
        if not loads_key_dim(dk):
            raise ValueError(
                f"{cfg} needs dk a power of two (the explicit-inverse path loads whole rows of K), got "
                f"dk={dk}; the blocked kernel (VerifyConfig) takes any multiple of 16"
            )
        check_inverse_config(cfg, precision)
    call = VerifyCall(
        *(t.contiguous() for t in (q, k, v, g, beta)), state,
        slot_indices(state_indices, owners, state.device), tree,
        None if raw_gates is None else tuple(t.contiguous() for t in raw_gates),  # read flat by head
        1.0 if scale is None else float(scale), state_indices is not None, precision,
    )  # fmt: skip
    return call, cfg


__all__ = [
    "CONFIGS",
    "INVERSE_CONFIGS",
    "MAX_DEPTH",
    "PRECISIONS",
    "InverseConfig",
    "VerifyConfig",
    "blocked_default_config",
    "blocked_launch",
    "checked_call",
    "default_config",
    "default_plan",
    "default_precision",
    "exact_config",
    "gdn_tree_verify",
]
