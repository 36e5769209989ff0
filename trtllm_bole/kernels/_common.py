"""Checks shared by the kernel launchers (the argument checks also by :mod:`trtllm_bole.ops`). Nothing
here synchronises with the device: launchers stay cheap enough to be timed and captured in CUDA graphs
(value checks live in :mod:`trtllm_bole.ops`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from trtllm_bole.tree import MAX_TREE_DEPTH, TreeBatch

MAX_DEPTH = MAX_TREE_DEPTH
"""Deepest tree (root-to-node nodes) the kernels accept (:func:`check_depth`), the deepest whose paths a
:class:`TreeBatch` holds, and the chunked prefill's largest chunk. Deeper trees raise ValueError; long
chains such as prompts go through the chunked prefill instead."""

INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def tiles_head_dims(*dims: int) -> bool:
    """Whether the GDN kernels can tile these head dims (key and value): multiples of 16, the tensor
    cores' tile side (the verify, commit and prefill kernels, their plugins, a model on CUDA)."""
    return all(d % 16 == 0 for d in dims)


@dataclass(frozen=True, slots=True)
class GDNTreeFactors:
    """What the factored commit needs from a verify (BOLE.md §3): per node ``(logP_i, k_i, u_i)``.

    ``log_decay [(L,) N, HV]`` and ``u [(L,) N, HV, dv]`` in the state's dtype; ``k [(L,) N, H, dk]`` as
    given to the verify. A leading layer dimension ``L`` is present after :func:`stack_factors`.
    """

    tree: TreeBatch
    k: torch.Tensor
    u: torch.Tensor
    log_decay: torch.Tensor

    @property
    def num_layers(self) -> int | None:
        return self.u.shape[0] if self.u.dim() == 4 else None


def check_depth(tree: TreeBatch, what: str) -> None:
    if tree.max_depth > MAX_DEPTH:
        raise ValueError(
            f"{what}: tree depth {tree.max_depth} exceeds the kernels' compiled maximum depth "
            f"{MAX_DEPTH}; draft shallower trees (or split long chains into prefill chunks)"
        )


def check_device(tree: TreeBatch, device: torch.device, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device} but the data is on {device}")
    if tree.parents.device != device:
        raise ValueError(f"the tree is on {tree.parents.device} but the data is on {device}")


H200_SMS = 132
"""Streaming multiprocessors of the H200 (and H100 SXM): the launchers' wave counts off CUDA."""


@cache
def num_sms(device: torch.device) -> int:
    """The device's SM count (a host-side query, no sync); the H200's off CUDA (the interpreter)."""
    if device.type != "cuda":
        return H200_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_contiguous(**tensors: torch.Tensor) -> None:
    """States and caches must be contiguous: the kernels index them flat (and a commit updating a copy
    would leave them as they were)."""
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernels index it flat), strides {t.stride()}")


def gdn_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    """``(N, H, dk, HV, dv)`` of q, k ``[N, H, dk]`` and v ``[N, HV, dv]``, HV a multiple of H."""
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[0] != q.shape[0]:
        raise ValueError(
            f"q, k must be [N, H, dk] and v [N, HV, dv] with the same N, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    n, h, dk = q.shape
    hv, dv = v.shape[1:]
    if h == 0 or hv % h:
        raise ValueError(f"value heads HV={hv} must be a multiple of key heads H={h}, at least one")
    return n, h, dk, hv, dv


def _names(dtypes: tuple[torch.dtype, ...]) -> str:
    names = [str(d).removeprefix("torch.") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_gdn_operands(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    state_dtypes: tuple[torch.dtype, ...] = (torch.float32,),
    input_dtypes: tuple[torch.dtype, ...] = INPUT_DTYPES,
) -> None:
    """g, beta ``[N, HV]``; state ``[S, HV, dk, dv]`` of ``state_dtypes``; q, k, v, g, beta of
    ``input_dtypes``, q and k of one (after :func:`gdn_shapes`)."""
    n, hv, dv = v.shape
    dk = q.shape[2]
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (n, hv):
            raise ValueError(f"{name} must be [N={n}, HV={hv}], got {tuple(t.shape)}")
    if state.dim() != 4 or state.shape[1:] != (hv, dk, dv) or state.dtype not in state_dtypes:
        raise ValueError(
            f"state must be {_names(state_dtypes)} [S, HV={hv}, dk={dk}, dv={dv}], got {state.dtype} "
            f"{tuple(state.shape)}"
        )
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.dtype not in input_dtypes:
            raise ValueError(f"{name} must be {_names(input_dtypes)}, got {t.dtype}")
    if k.dtype != q.dtype:
        raise ValueError(f"q and k must share a dtype, got {q.dtype} and {k.dtype}")


def check_conv_shapes(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    tree: TreeBatch,
) -> None:
    """x ``[N, C]``, weight ``[C, W >= 2]``, conv_state ``[S, C, W - 1]``, bias ``[C]`` or None, all
    floating point; activation ``"silu"`` or None."""
    if x.dim() != 2 or x.shape[0] != tree.num_nodes:
        raise ValueError(f"x must be [N={tree.num_nodes}, C], got {tuple(x.shape)}")
    c = x.shape[1]
    if weight.dim() != 2 or weight.shape[0] != c or weight.shape[1] < 2:
        raise ValueError(f"weight must be [C={c}, W>=2], got {tuple(weight.shape)}")
    if conv_state.dim() != 3 or conv_state.shape[1:] != (c, weight.shape[1] - 1):
        raise ValueError(
            f"conv_state must be [S, C={c}, W-1={weight.shape[1] - 1}], got {tuple(conv_state.shape)}"
        )
    if bias is not None and bias.shape != (c,):
        raise ValueError(f"bias must be [C={c}], got {tuple(bias.shape)}")
    if activation not in ("silu", None):
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    check_floating(x=x, weight=weight, conv_state=conv_state, bias=bias)


def check_floating(**tensors: torch.Tensor | None) -> None:
    """Each tensor given (None skipped) of a floating-point dtype: an integer state or cache would truncate
    what is written into it."""
    for name, t in tensors.items():
        if t is not None and not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")


def check_conv_commit_shapes(conv_state: torch.Tensor, x: torch.Tensor, tree: TreeBatch) -> None:
    """conv_state ``[S, C, W - 1]`` with x ``[N, C]``, or every layer at once: ``[L, S, C, W - 1]`` with
    ``[L, N, C]``."""
    if x.dim() not in (2, 3) or conv_state.dim() != x.dim() + 1:
        raise ValueError(
            f"conv_state [(L,) S, C, W-1] and x [(L,) N, C] expected, got {tuple(conv_state.shape)} "
            f"and {tuple(x.shape)}"
        )
    if x.shape[-2:] != (tree.num_nodes, conv_state.shape[-2]) or conv_state.shape[:-3] != x.shape[:-2]:
        raise ValueError(
            f"x {tuple(x.shape)} does not match conv_state {tuple(conv_state.shape)} and "
            f"{tree.num_nodes} tree nodes: expected x [(L,) N, C]"
        )
    check_floating(conv_state=conv_state, x=x)


def check_commit_factors(state: torch.Tensor, factors: GDNTreeFactors) -> None:
    """state ``[L, S, HV, dk, dv]`` with stacked factors (k ``[L, N, H, dk]``, u ``[L, N, HV, dv]``,
    log_decay ``[L, N, HV]``), or ``[S, HV, dk, dv]`` with unstacked ones; HV a multiple of H."""
    stacked = factors.num_layers is not None
    if state.dim() != (5 if stacked else 4):
        raise ValueError(
            f"state must be {'[L, S, HV, dk, dv] for stacked' if stacked else '[S, HV, dk, dv] for'} "
            f"factors, got shape {tuple(state.shape)}"
        )
    if stacked and state.shape[0] != factors.num_layers:
        raise ValueError(f"state holds {state.shape[0]} layers but the factors {factors.num_layers}")
    hv, dk, dv = state.shape[-3:]
    lead, n, h = state.shape[:-4], factors.tree.num_nodes, factors.k.shape[-2]
    expected = {"k": (*lead, n, h, dk), "u": (*lead, n, hv, dv), "log_decay": (*lead, n, hv)}
    for name in expected:
        t = getattr(factors, name)
        if t.shape != expected[name]:
            raise ValueError(
                f"factors.{name} must be {list(expected[name])} (from state {tuple(state.shape)} and "
                f"{n} tree nodes), got {list(t.shape)}"
            )
    if h == 0 or hv % h:
        raise ValueError(f"value heads HV={hv} must be a multiple of key heads H={h}, at least one")
    if {factors.u.dtype, factors.log_decay.dtype} != {state.dtype} or not factors.k.dtype.is_floating_point:
        raise ValueError(
            f"factors.u and factors.log_decay must be in the state's dtype ({state.dtype}) and factors.k "
            f"floating point, got u {factors.u.dtype}, log_decay {factors.log_decay.dtype}, "
            f"k {factors.k.dtype}"
        )


def check_leaves(accepted_leaf: torch.Tensor, tree: TreeBatch, device: torch.device) -> torch.Tensor:
    """``accepted_leaf`` int ``[B]`` on ``device`` (each request's deepest accepted node, local index,
    -1 = nothing accepted), contiguous; its values are checked by the ops that may sync."""
    if (
        not isinstance(accepted_leaf, torch.Tensor)
        or accepted_leaf.shape != (tree.num_requests,)
        or accepted_leaf.dtype.is_floating_point
        or accepted_leaf.dtype == torch.bool
    ):
        got = (
            f"{accepted_leaf.dtype} {tuple(accepted_leaf.shape)}"
            if isinstance(accepted_leaf, torch.Tensor)
            else (type(accepted_leaf).__name__)
        )
        raise ValueError(
            f"accepted_leaf must be an integer tensor [B={tree.num_requests}] (local index, -1 = nothing "
            f"accepted), got {got}"
        )
    if accepted_leaf.device != device:
        raise ValueError(f"accepted_leaf is on {accepted_leaf.device} but the data is on {device}")
    return accepted_leaf.contiguous()


def check_kv_shapes(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    new_k: torch.Tensor,
    new_v: torch.Tensor,
    tree: TreeBatch,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    """Caches ``[L, num_blocks, block_size, KVH, d]`` (both alike), new entries ``[L, N, KVH, d]``,
    ``block_tables`` int ``[B, max_blocks]``, ``context_lens`` int ``[B]``."""
    if k_cache.dim() != 5 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must both be [L, num_blocks, block_size, KVH, d], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    layers, *_, kvh, d = k_cache.shape
    for name, t in (("new_k", new_k), ("new_v", new_v)):
        if t.shape != (layers, tree.num_nodes, kvh, d):
            raise ValueError(
                f"{name} must be [L={layers}, N={tree.num_nodes}, KVH={kvh}, d={d}], got {tuple(t.shape)}"
            )
    check_floating(k_cache=k_cache, v_cache=v_cache, new_k=new_k, new_v=new_v)
    check_block_tables(block_tables, context_lens, tree.num_requests)


ATTENTION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""What the tree-attention kernel takes (fp32 with IEEE dots, 16-bit on the tensor cores); the CPU's torch
path also takes float64."""


def check_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    tree: TreeBatch,
) -> None:
    """Tree attention's arguments (:func:`trtllm_bole.ops.tree_attention` says what each is)."""
    n, hq, d = q.shape if q.dim() == 3 else (None, None, None)
    if n != tree.num_nodes:
        raise ValueError(f"q must be [N={tree.num_nodes}, Hq, d] (one row per node), got {tuple(q.shape)}")
    if (
        k.dim() != 3
        or v.shape != k.shape
        or k.shape[0] != n
        or k.shape[2] != d
        or not k.shape[1]
        or hq % k.shape[1]
    ):
        raise ValueError(
            f"k and v must both be [N={n}, KVH, d={d}] with Hq={hq} a multiple of KVH, got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(
            f"k_cache and v_cache must both be [num_blocks, block_size, KVH={k.shape[1]}, d={d}], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    dtypes = {t.dtype for t in (q, k, v, k_cache, v_cache)}
    allowed = ATTENTION_DTYPES if q.is_cuda else (*ATTENTION_DTYPES, torch.float64)
    if len(dtypes) != 1 or q.dtype not in allowed:
        raise ValueError(
            f"q, k, v and the caches must share one dtype of {[str(t) for t in allowed]} on {q.device.type} "
            f"(float64 on the CPU's torch path only), got {sorted(map(str, dtypes))}"
        )
    if 0 in k_cache.shape[:2] or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(
            f"the caches must be contiguous with at least one block of at least one row, got "
            f"{tuple(k_cache.shape)} (a copy of a layer's cache would be made for every call)"
        )
    check_block_tables(block_tables, context_lens, tree.num_requests)
    check_device(tree, q.device, k=k, v=v, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                 context_lens=context_lens)  # fmt: skip


def check_block_tables(block_tables: torch.Tensor, context_lens: torch.Tensor, num_requests: int) -> None:
    """``block_tables`` int ``[B, max_blocks]`` and ``context_lens`` int ``[B]``."""
    b = num_requests
    for name, t, rank in (("block_tables", block_tables, 2), ("context_lens", context_lens, 1)):
        if t.dim() != rank or t.shape[0] != b or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(
                f"{name} must be an integer tensor [B={b}{', max_blocks' if rank == 2 else ''}], got "
                f"{t.dtype} {tuple(t.shape)}"
            )


def check_state_indices(state_indices: torch.Tensor, num_requests: int, device: torch.device) -> None:
    if (
        state_indices.shape != (num_requests,)
        or state_indices.dtype.is_floating_point
        or state_indices.dtype == torch.bool
    ):
        raise ValueError(
            f"state_indices must be an integer tensor [B={num_requests}], got "
            f"{state_indices.dtype} {tuple(state_indices.shape)}"
        )
    if state_indices.device != device:
        raise ValueError(f"state_indices is on {state_indices.device} but the state is on {device}")


def check_slot_count(
    num_slots: int, num_requests: int, state_indices: torch.Tensor | None, what: str = "state"
) -> None:
    """Without ``state_indices`` request b owns slot b: ``what`` must hold exactly one slot a request."""
    if state_indices is None and num_slots != num_requests:
        raise ValueError(
            f"{what} holds {num_slots} slots but the tree has {num_requests} requests; pass "
            "state_indices to address a slot pool"
        )


def slot_indices(state_indices: torch.Tensor | None, num_requests: int, device: torch.device) -> torch.Tensor:
    """``state_indices`` as a contiguous int64 tensor, or a dummy when requests own slots 0..B-1."""
    if state_indices is None:
        return torch.empty(1, dtype=torch.int64, device=device)
    check_state_indices(state_indices, num_requests, device)
    return state_indices.to(torch.int64).contiguous()


@dataclass(frozen=True, slots=True)
class VerifyCall:
    """One verify's operands as the launchers of :mod:`.gdn_tree_verify` and :mod:`.gdn_tree_verify_inverse`
    take them, after :func:`~trtllm_bole.kernels.gdn_tree_verify.gdn_tree_verify`'s checks: q, k
    ``[N, H, dk]``, v ``[N, HV, dv]``, g and beta ``[N, HV]`` (contiguous; the raw gate inputs a and b
    when ``raw_gates = (A_log, dt_bias)``), the fp32 state pool, the slot of each request
    (:func:`slot_indices`; read only when ``use_slots``), the forest, the output scale and the
    precision of the state products."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    state: torch.Tensor
    slots: torch.Tensor
    tree: TreeBatch
    raw_gates: tuple[torch.Tensor, torch.Tensor] | None
    scale: float
    use_slots: bool
    precision: str

    @property
    def gate_params(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A_log, dt_bias)``, or g twice as never-read placeholders when the gates come applied."""
        return self.raw_gates or (self.g, self.g)

    def mode_consts(self) -> dict:
        """The compile-time flags both verify kernels take from the call: slots, dot precision, bf16 state
        products, gating on chip."""
        return dict(
            USE_SLOTS=self.use_slots,
            PREC="ieee" if self.precision == "ieee" else "tf32",
            S_BF16=self.precision == "bf16",
            RAW_GATES=self.raw_gates is not None,
        )

    def new_outputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Empty ``o`` (v's dtype), ``u`` (fp32, v's shape) and ``logP`` (fp32 ``[N, HV]``)."""
        v = self.v
        u = torch.empty(v.shape, dtype=torch.float32, device=v.device)
        o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        return o, u, torch.empty(v.shape[:2], dtype=torch.float32, device=v.device)


def pow2_at_least(n: int, floor: int = 1) -> int:
    p = floor
    while p < n:
        p *= 2
    return p


def tile_dividing(d: int, cap: int) -> int:
    """The largest power-of-two tile side in [16, cap] that divides ``d`` (a multiple of 16)."""
    t = cap
    while d % t:
        t //= 2
    return t
