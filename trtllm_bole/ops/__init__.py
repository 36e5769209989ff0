"""Bole's operators, the one way into the compute: each function validates its inputs (shapes, dtypes,
devices, and the values that index memory) and calls the ``bole::*`` operator of :mod:`.library`,
whose CPU implementation is the torch reference and whose CUDA implementation is the Triton kernels
(``trtllm_bole.kernels``), picked by PyTorch's dispatcher by the tensors' device. The kernels'
launchers check shapes again, with the same functions of :mod:`trtllm_bole.kernels._common`, for the
callers that launch them directly. The slot indices' values are not checked while a CUDA graph
captures: a capture records kernels, and the capturing caller, :mod:`trtllm_bole.spec.verify_graphs`,
owns the values it replays.

Shapes (packed forest of B requests and N nodes, see :mod:`trtllm_bole.tree`):

- q, k ``[N, H, dk]``; v ``[N, HV, dv]``; g (log decay, <= 0) and beta (0..1) ``[N, HV]``;
  ``HV`` a multiple of ``H`` (value head ``h`` reads key head ``h // (HV // H)``); the gates' values are
  the caller's (checking them would wait for the device): g > 0 grows the state instead of decaying
  it (finite, wrong), a NaN spreads to the outputs, and so does g = -inf (full forgetting, which the
  serial recurrence takes) or a path whose summed g leaves the float range: the closed forms take
  ``exp(logP_i - logP_j)``, and ``-inf - (-inf)`` is NaN. A clamp at -110 (``exp(g)`` is 0 in float32,
  2e-48 in float64) gives the serial recurrence's outputs for such a gate (tested);
- state ``[B, HV, dk, dv]`` (float32/float64), or a slot pool ``[S, HV, dk, dv]`` with
  ``state_indices`` int ``[B]``; a commit may also take every GDN layer at once, ``[L, S, HV, dk, dv]``
  with factors stacked by :func:`stack_factors`;
- the tree as ``parents`` int ``[N]`` (local index, -1 = child of the committed root) and
  ``cu_seqlens`` int ``[B + 1]``, or a prebuilt :class:`~trtllm_bole.tree.TreeBatch` in place of
  ``parents`` (then ``cu_seqlens`` is omitted), which saves rebuilding it for every layer.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Sequence

import torch

from trtllm_bole.kernels._common import (
    MAX_DEPTH,
    GDNTreeFactors,
    check_attention,
    check_commit_factors,
    check_conv_commit_shapes,
    check_conv_shapes,
    check_depth,
    check_device,
    check_floating,
    check_kv_shapes,
)
from trtllm_bole.ops import library
from trtllm_bole.ops.checks import (
    check_accepted_leaves,
    check_beside,
    check_gdn,
    check_kv_room,
    check_sequences,
    check_slots,
    check_state_dtype,
    differentiated,
    values_checkable,
)
from trtllm_bole.ops.library import tree_args
from trtllm_bole.reference import gdn_tree, norms, rope
from trtllm_bole.tree import PrefillChunks, TreeBatch

__all__ = [
    "GDNTreeFactors",
    "as_tree",
    "check_kv_room",
    "chunk_gated_delta_rule",
    "conv_state_commit",
    "filter_floor",
    "forest",
    "gated_rms_norm",
    "gdn_commit",
    "gdn_inputs",
    "gdn_prefill",
    "gdn_snapshot_commit",
    "gdn_tree_verify",
    "gdn_tree_verify_serial",
    "kv_commit",
    "rms_norm",
    "rms_norm_rope",
    "softmax_stats",
    "stack_factors",
    "tree_attention",
    "tree_conv1d",
]


def stack_factors(factors: list[GDNTreeFactors]) -> GDNTreeFactors:
    """Stack the factors of several GDN layers (same tree) for a one-launch commit of all layers."""
    if not factors:
        raise ValueError("stack_factors needs at least one GDNTreeFactors")
    tree = factors[0].tree
    if any(f.tree is not tree for f in factors) or any(f.num_layers is not None for f in factors):
        raise ValueError("stack_factors takes unstacked factors of one verify step (one shared TreeBatch)")
    return GDNTreeFactors(
        tree,
        torch.stack([f.k for f in factors]),
        torch.stack([f.u for f in factors]),
        torch.stack([f.log_decay for f in factors]),
    )


def as_tree(parents: torch.Tensor | TreeBatch, cu_seqlens: torch.Tensor | None = None) -> TreeBatch:
    if isinstance(parents, TreeBatch):
        if cu_seqlens is not None:
            raise ValueError("pass either a TreeBatch, or parents and cu_seqlens, not both")
        return parents
    if cu_seqlens is None:
        raise ValueError("cu_seqlens is required when parents is a tensor")
    return TreeBatch.build(parents, cu_seqlens)


def forest(
    parents: torch.Tensor, cu_seqlens: torch.Tensor, depth: torch.Tensor, *, max_depth: int, max_nodes: int
) -> TreeBatch:
    """:meth:`TreeBatch.on_device`'s forest (no device sync, no value checks: for forests the caller built,
    ``max_depth`` and ``max_nodes`` bounds): on CUDA its metadata in one Triton launch
    (:mod:`trtllm_bole.kernels.forest`, requests of up to 128 nodes) instead of ~65 small torch
    kernels; the torch derivation elsewhere."""
    derived = library.forest_metadata(parents, cu_seqlens, depth, max_depth, max_nodes)
    request, global_parents, paths, dfs_order, subtree_size = derived
    parents, cu_seqlens, depth = (t.long().contiguous() for t in (parents, cu_seqlens, depth))
    return TreeBatch(parents, cu_seqlens, depth, request, global_parents, paths, dfs_order, subtree_size,
                     max_depth, max_nodes)  # fmt: skip


# ----------------------------------------------------------------------------------------- #
# Norms                                                                                      #
# ----------------------------------------------------------------------------------------- #


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's zero-centred RMSNorm over the last dimension: ``x / rms(x) * (1 + w)`` in float32, in
    x's dtype. Training, which differentiates it, runs the torch reference on every device."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm weight must be [{x.shape[-1]}], got {list(weight.shape)}")
    check_beside("x", x, weight=weight)
    check_floating(x=x, weight=weight)  # an integer x came back truncated
    if differentiated(x, weight):
        return norms.rms_norm(x, weight, eps)
    return library.rms_norm(x, weight, eps)


def rms_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """The attention's q/k: :func:`rms_norm` of every head of ``x [N, heads, head_dim]``, then rotate-half
    RoPE on its leading ``rotary_dim`` channels at each token's ``cos``/``sin`` ``[N, rotary_dim / 2]``
    (x's dtype; :func:`trtllm_bole.reference.rope.cos_sin`). Training, which differentiates it, runs
    the torch reference on every device."""
    if x.dim() != 3 or weight.shape != x.shape[-1:]:
        raise ValueError(
            f"rms_norm_rope takes x [N, heads, head_dim] and weight [head_dim], got {list(x.shape)} and "
            f"{list(weight.shape)}"
        )
    check_floating(x=x, weight=weight)
    half = cos.shape[-1] if cos.dim() == 2 else 0
    if cos.shape != sin.shape or cos.shape != (x.shape[0], half) or not 0 < 2 * half <= x.shape[-1]:
        raise ValueError(
            f"cos and sin must be [N={x.shape[0]}, rotary_dim / 2] with rotary_dim <= head_dim="
            f"{x.shape[-1]}, got {list(cos.shape)} and {list(sin.shape)}"
        )
    if cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise ValueError(f"cos and sin must be in x's dtype {x.dtype}, got {cos.dtype} and {sin.dtype}")
    check_beside("x", x, weight=weight, cos=cos, sin=sin)
    if differentiated(x, weight):
        return rope.rms_norm_rope(x, weight, eps, cos, sin)
    return library.rms_norm_rope(x, weight, eps, cos, sin)


def gdn_inputs(
    qk: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The GDN recurrence's inputs (:func:`trtllm_bole.reference.norms.gdn_inputs`): from the conv's q|k
    columns ``qk [..., 2 key_dim]`` and the gate inputs ``a``, ``b`` ``[..., HV]``, the L2-normalised q and
    k ``[..., heads, dk]`` (qk's dtype), ``g`` (float32) and ``beta`` (b's dtype) ``[..., HV]``.
    Training, which differentiates them, runs the torch reference on every device."""
    hv = a_log.shape[0] if a_log.dim() == 1 else 0
    if heads < 1 or qk.shape[-1] % (2 * heads) or not hv:
        raise ValueError(
            f"gdn_inputs takes qk [..., 2 * heads * dk] and A_log [HV], got qk {list(qk.shape)} for {heads} "
            f"heads and A_log {list(a_log.shape)}"
        )
    lead = qk.shape[:-1]
    for name, t in (("a", a), ("b", b), ("dt_bias", dt_bias)):
        want = (hv,) if name == "dt_bias" else (*lead, hv)
        if t.shape != want:
            raise ValueError(f"gdn_inputs: {name} must be {list(want)}, got {list(t.shape)}")
    check_beside("qk", qk, a=a, b=b, a_log=a_log, dt_bias=dt_bias)
    check_floating(qk=qk, a=a, b=b, a_log=a_log, dt_bias=dt_bias)  # an integer qk gave q and k of zeros
    if differentiated(qk, a, b, a_log, dt_bias):
        return norms.gdn_inputs(qk, a, b, a_log, dt_bias, heads)
    flat = (t.reshape(-1, t.shape[-1]) for t in (qk, a, b))
    out = library.gdn_inputs(*flat, a_log, dt_bias, heads)
    return tuple(t.view(*lead, *t.shape[1:]) for t in out)  # no leading dims: unflatten would refuse


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The GDN output norm (:func:`trtllm_bole.reference.norms.gated_rms_norm`) of ``x [..., heads, n]``
    gated by ``gate`` of its shape, ``weight [n]``: x's dtype. Training, which differentiates it, runs the
    torch reference on every device."""
    if x.dim() < 2 or gate.shape != x.shape or weight.shape != x.shape[-1:]:
        raise ValueError(
            f"gated_rms_norm takes x [..., heads, n], a gate of its shape and weight [n], got "
            f"{list(x.shape)}, {list(gate.shape)} and {list(weight.shape)}"
        )
    check_beside("x", x, gate=gate, weight=weight)
    check_floating(x=x, gate=gate, weight=weight)
    if differentiated(x, gate, weight):
        return norms.gated_rms_norm(x, gate, weight, eps)
    rows = x.shape[-2:]
    return library.gated_rms_norm(x.reshape(-1, *rows), gate.reshape(-1, *rows), weight, eps).view(x.shape)


# ----------------------------------------------------------------------------------------- #
# Sampling filters                                                                           #
# ----------------------------------------------------------------------------------------- #


def filter_floor(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """The smallest logit that top-k and top-p keep in each row of ``logits [N, V] / temperature``, with
    per-row ``temperature`` (> 0), ``top_k`` (int, ``<= 0`` or ``>= V``: off) and ``top_p`` (``>= 1``: off)
    ``[N]``: ``[N]`` float32 (float64 for float64 logits), ``-inf`` where neither filters
    (:func:`trtllm_bole.reference.sampling.filter_floor`). On CUDA a radix select per row
    (:mod:`trtllm_bole.kernels.filter_floor`) instead of a sort of every row, and no ``[N, V]`` temporary."""
    if logits.dim() != 2 or not logits.is_floating_point() or not logits.shape[1]:
        raise ValueError(
            f"filter_floor takes float logits [N, V >= 1], got {logits.dtype} {list(logits.shape)}"
        )
    rows = logits.shape[:1]
    if any(t.shape != rows for t in (temperature, top_k, top_p)) or top_k.is_floating_point():
        raise ValueError(
            f"filter_floor takes temperature, integer top_k and top_p [{rows[0]}], got "
            f"{[list(t.shape) for t in (temperature, top_k, top_p)]} and top_k {top_k.dtype}"
        )
    check_beside("logits", logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return library.filter_floor(logits.contiguous(), temperature, top_k, top_p)


def softmax_stats(
    logits: torch.Tensor, temperature: torch.Tensor, floor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the softmax of each row of ``logits [N, V] / temperature [N]`` (> 0) over its logits at or above
    ``floor [N]`` (:func:`filter_floor`'s; ``-inf`` keeps all) needs to give any one probability: the row's
    argmax (int64 ``[N]``, the first of equal maxima) and its normaliser ``Σ exp(x / t - max)`` over the
    kept ``x / t`` (``[N]``), so that ``p(x) = exp(x / t - max) / normaliser``
    (:func:`trtllm_bole.reference.sampling.softmax_stats`). On CUDA one read of the rows
    (:mod:`trtllm_bole.kernels.softmax_stats`), no ``[N, V]`` temporary."""
    if logits.dim() != 2 or not logits.is_floating_point() or logits.shape[1] == 0:
        raise ValueError(
            f"softmax_stats takes float logits [N, V > 0], got {logits.dtype} {list(logits.shape)}"
        )
    rows = logits.shape[:1]
    if any(t.shape != rows or not t.is_floating_point() for t in (temperature, floor)):
        raise ValueError(
            f"softmax_stats takes float temperature and floor [{rows[0]}], got "
            f"{[(list(t.shape), t.dtype) for t in (temperature, floor)]}"
        )
    check_beside("logits", logits, temperature=temperature, floor=floor)
    return library.softmax_stats(logits.contiguous(), temperature.contiguous(), floor.contiguous())


# ----------------------------------------------------------------------------------------- #
# Gated DeltaNet                                                                             #
# ----------------------------------------------------------------------------------------- #


def gdn_tree_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    parents: torch.Tensor | TreeBatch,
    cu_seqlens: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, GDNTreeFactors]:
    """Closed-form tree verification (BOLE.md §2). Returns ``o [N, HV, dv]`` and the factors.

    The committed state is read, never written. ``scale`` multiplies q when given.
    """
    tree = as_tree(parents, cu_seqlens)
    check_depth(tree, "gdn_tree_verify")  # the closed form's exactness is tested to this depth, on any device
    check_gdn(q, k, v, g, beta, state, tree.num_nodes, tree.num_requests, state_indices)
    check_device(tree, state.device)
    o, u, log_p = library.gdn_tree_verify(
        q, k, v, g, beta, state, *tree_args(tree), scale=scale, state_indices=state_indices
    )
    return o, GDNTreeFactors(tree, k, u, log_p)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole sequences ``[B, L, ...]`` through the recurrence, functionally and differentiably (the
    model's training forward): the torch reference on every device (autograd could not differentiate a
    ``bole::`` operator), chunks of 64 in closed form. Returns ``o [B, L, HV, dv]`` and the final state
    ``[B, HV, dk, dv]``."""
    check_sequences(q, k, v, g, beta, initial_state)
    return gdn_tree.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, scale=scale)


def gdn_commit(
    state: torch.Tensor,
    factors: GDNTreeFactors,
    accepted_leaf: torch.Tensor,
    *,
    state_indices: torch.Tensor | None = None,
    check: bool = True,
) -> None:
    """Factored commit ``S_new = P_a S_pre + (D_a K_a)^T U_a`` in place (BOLE.md §3).

    ``accepted_leaf`` int ``[B]``: local index of each request's deepest accepted node, -1 = nothing
    accepted (that state stays bit-identical). With stacked factors, ``state`` is ``[L, S, HV, dk, dv]``
    and all layers commit in one launch on CUDA. ``check=False`` (every commit below takes it): the
    caller built the slot indices' values itself, and nothing waits for the device.
    """
    tree = factors.tree
    check_depth(tree, "gdn_commit")
    check_state_dtype(state)
    check_commit_factors(state, factors)
    check_slots(state.shape[-4], tree.num_requests, state_indices, state.device, values=check)
    check_device(tree, state.device, k=factors.k, u=factors.u, log_decay=factors.log_decay)
    check_accepted_leaves(accepted_leaf, tree, state.device, values=check)
    library.gdn_commit(
        state,
        factors.k,
        factors.u,
        factors.log_decay,
        *tree_args(tree),
        accepted_leaf,
        state_indices=state_indices,
    )


def gdn_tree_verify_serial(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    parents: torch.Tensor | TreeBatch,
    cu_seqlens: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Today's scheme (SGLang's tree path, vLLM/TRT-LLM's chain path): node-by-node recurrence that
    writes a full state snapshot per node. Returns ``o`` and ``snapshots [N, HV, dk, dv]``."""
    tree = as_tree(parents, cu_seqlens)
    check_gdn(q, k, v, g, beta, state, tree.num_nodes, tree.num_requests, state_indices)
    check_device(tree, state.device)
    return library.gdn_tree_verify_serial(
        q, k, v, g, beta, state, *tree_args(tree), scale=scale, state_indices=state_indices
    )


def gdn_snapshot_commit(
    state: torch.Tensor,
    snapshots: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    *,
    state_indices: torch.Tensor | None = None,
    check: bool = True,
) -> None:
    """Copy each request's accepted snapshot into its state slot (the serial schemes' commit)."""
    check_state_dtype(state)
    if snapshots.dtype != state.dtype:
        raise ValueError(f"snapshots must be {state.dtype} like the state, got {snapshots.dtype}")
    check_slots(state.shape[0], tree.num_requests, state_indices, state.device, values=check)
    check_device(tree, state.device, snapshots=snapshots)
    check_accepted_leaves(accepted_leaf, tree, state.device, values=check)
    if snapshots.shape[0] != tree.num_nodes or snapshots.shape[1:] != state.shape[1:]:
        raise ValueError(
            f"snapshots must be [N={tree.num_nodes}, {', '.join(map(str, state.shape[1:]))}], "
            f"got {tuple(snapshots.shape)}"
        )
    library.gdn_snapshot_commit(
        state, snapshots, *tree_args(tree), accepted_leaf, state_indices=state_indices
    )


def gdn_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor | Sequence[int] | PrefillChunks,
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
    chunk_size: int = 64,
    check: bool = True,
) -> torch.Tensor:
    """Whole prompts (one chain per request) through the recurrence; ``state`` updated in place.

    Chunks of ``chunk_size`` tokens (1 to 64, the kernels' depth, on every device): each is a chain,
    verified in closed form and committed whole (on CUDA in one launch: each program walks its prompt's
    chunks, :mod:`trtllm_bole.kernels.gdn_prefill`). ``cu_seqlens``: the prompts' bounds ``[B + 1]``, a
    tensor (copied to the host: the chunks are made there) or host ints; or the chunks made already
    (:class:`~trtllm_bole.tree.PrefillChunks`, on the tensors' device: a model's prefill makes them once
    for all its GDN layers, and a CUDA graph replays them with new values; ``chunk_size`` is theirs).
    ``check=False``: the slot indices' values go unchecked, so with host bounds nothing waits for the
    device."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not 1 <= chunk_size <= MAX_DEPTH:
        raise ValueError(
            f"chunk_size must be an integer in [1, {MAX_DEPTH}] (the kernels' depth), got {chunk_size!r}"
        )
    if isinstance(cu_seqlens, PrefillChunks):
        chunks = cu_seqlens
        check_device(chunks.tree, v.device, first=chunks.first)
        num_nodes, num_prompts = chunks.tree.num_nodes, chunks.first.numel() - 1
    else:
        bounds = _host_bounds(cu_seqlens)
        if len(bounds) < 2:
            raise ValueError(
                f"gdn_prefill needs at least one prompt (cu_seqlens [B + 1], B >= 1), got {bounds}"
            )
        if bounds[0] != 0 or any(b <= a for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"cu_seqlens must start at 0 and increase strictly, got {bounds}")
        num_nodes, num_prompts = bounds[-1], len(bounds) - 1
        lengths = [b - a for a, b in itertools.pairwise(bounds)]
        chunks = PrefillChunks.of(lengths, chunk_size, v.device)
    check_gdn(q, k, v, g, beta, state, num_nodes, num_prompts, state_indices, values=check)
    return library.gdn_prefill(
        q,
        k,
        v,
        g,
        beta,
        state,
        *tree_args(chunks.tree),
        chunks.first,
        scale=scale,
        state_indices=state_indices,
    )


def _host_bounds(cu_seqlens: torch.Tensor | Sequence[int]) -> list[int]:
    if not isinstance(cu_seqlens, torch.Tensor):
        if not all(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in cu_seqlens):
            raise ValueError(f"cu_seqlens must hold integers, got {list(cu_seqlens)}")
        return [int(b) for b in cu_seqlens]
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
        raise ValueError(
            f"cu_seqlens must be an integer tensor [B + 1], got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}"
        )
    return cu_seqlens.tolist()


# ----------------------------------------------------------------------------------------- #
# Short causal conv                                                                          #
# ----------------------------------------------------------------------------------------- #


def tree_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    parents: torch.Tensor | TreeBatch,
    cu_seqlens: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    state_indices: torch.Tensor | None = None,
    check: bool = True,
) -> torch.Tensor:
    """Tree-aware depthwise causal conv1d (+ SiLU) over ``x [N, C]`` (BOLE.md §4).

    weight ``[C, W]``; conv_state ``[S, C, W - 1]``, the committed last inputs (oldest first), read-only.
    ``check=False``: the slot indices' values go unchecked (nothing waits for the device).
    """
    tree = as_tree(parents, cu_seqlens)
    check_conv_shapes(x, weight, conv_state, bias, activation, tree)
    check_device(tree, x.device, weight=weight, conv_state=conv_state, bias=bias)
    check_slots(
        conv_state.shape[0], tree.num_requests, state_indices, x.device, values=check, what="conv_state"
    )
    return library.tree_conv1d(
        x, weight, conv_state, *tree_args(tree), bias=bias, activation=activation, state_indices=state_indices
    )


def conv_state_commit(
    conv_state: torch.Tensor,
    x: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    *,
    state_indices: torch.Tensor | None = None,
    check: bool = True,
) -> None:
    """New conv state = the last ``W - 1`` inputs along each accepted path, in place.

    ``conv_state [S, C, W - 1]`` with ``x [N, C]``, or every layer at once: ``[L, S, C, W - 1]`` with
    ``x [L, N, C]``.
    """
    check_conv_commit_shapes(conv_state, x, tree)
    check_slots(
        conv_state.shape[-3],
        tree.num_requests,
        state_indices,
        conv_state.device,
        values=check,
        what="conv_state",
    )
    check_device(tree, conv_state.device, x=x)
    check_accepted_leaves(accepted_leaf, tree, conv_state.device, values=check)
    library.conv_state_commit(conv_state, x, *tree_args(tree), accepted_leaf, state_indices=state_indices)


# ----------------------------------------------------------------------------------------- #
# Paged KV cache                                                                             #
# ----------------------------------------------------------------------------------------- #


def kv_commit(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    new_k: torch.Tensor,
    new_v: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    check: bool = True,
) -> None:
    """KV compaction: each request's accepted path goes to positions ``context_len .. context_len +
    depth - 1`` of its block table, in place; nodes off the path are dropped, ``accepted_leaf == -1``
    writes nothing.

    Caches ``[L, num_blocks, block_size, KVH, d]`` and new entries ``[L, N, KVH, d]`` (every layer in
    one launch on CUDA); ``block_tables`` int ``[B, max_blocks]``. ``check=False``: the caller built the
    leaves, tables and lengths itself (the executor: blocks for ``context_len`` + the tree's depth are
    allocated before its verify), and nothing waits for the device.
    """
    check_kv_shapes(k_cache, v_cache, new_k, new_v, tree, block_tables, context_lens)
    check_device(tree, k_cache.device, v_cache=v_cache, new_k=new_k, new_v=new_v, block_tables=block_tables,
                 context_lens=context_lens)  # fmt: skip
    # Shape, dtype and device here; their range, with the positions they write, by check_kv_room.
    check_accepted_leaves(accepted_leaf, tree, k_cache.device, values=False)
    if check and values_checkable(accepted_leaf):
        check_kv_room(k_cache, tree, accepted_leaf, block_tables, context_lens)
    library.kv_commit(
        k_cache, v_cache, new_k, new_v, *tree_args(tree), accepted_leaf, block_tables, context_lens
    )


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    tree: TreeBatch,
    *,
    scale: float,
) -> torch.Tensor:
    """Full attention of a forest's nodes: node ``i`` of request ``b`` attends to the request's
    ``context_lens[b]`` committed positions of the paged cache and to its ancestors and itself
    (:mod:`trtllm_bole.reference.attention_tree`; on CUDA one Triton launch,
    :mod:`trtllm_bole.kernels.tree_attention`). Returns ``[N, Hq, d]`` in q's dtype.

    q ``[N, Hq, d]``, k and v ``[N, KVH, d]`` (every node's, ``Hq`` a multiple of ``KVH``: query head
    ``h`` reads key/value head ``h // (Hq / KVH)``), one layer's caches ``[num_blocks, block_size, KVH,
    d]`` (contiguous), all of one dtype (:data:`~trtllm_bole.kernels._common.ATTENTION_DTYPES`, or
    float64 on the CPU); ``block_tables`` int ``[B, max_blocks]``, ``context_lens`` int ``[B]``. Their
    values are the caller's (checking them would wait for the device): positions past the table are not
    attended to, a negative length attends to none, and a position on a negative entry reads block 0.
    """
    check_attention(q, k, v, k_cache, v_cache, block_tables, context_lens, tree)
    return library.tree_attention(
        q, k, v, k_cache, v_cache, block_tables, context_lens, *tree_args(tree), float(scale)
    )
