"""The ``bole::*`` operators in PyTorch's dispatcher. Each has a CPU implementation (the torch reference,
:mod:`trtllm_bole.reference`), a CUDA one (the Triton kernels, :mod:`trtllm_bole.kernels`, imported at
the first call) and a fake that gives its outputs' shapes and dtypes without computing them, so that an
operator is one opaque node under ``torch.compile`` and runs on meta tensors. The dispatcher picks the
implementation by the tensors' device: this is the one place where CPU and GPU part.

The operators take validated inputs (:mod:`trtllm_bole.ops` validates, then calls them) and a
:class:`~trtllm_bole.tree.TreeBatch` as its tensors and its two host ints (``Tensor[] tree, int
max_depth, int max_nodes``). They are defined with :class:`torch.library.Library` rather than the
``torch.library.custom_op`` decorator: the same schemas and fakes without the decorator's autograd and
aliasing wrappers around every call, which the eager paths (prefill calls operators layer by layer)
would pay; what the dispatch costs on the H200 is measured by benchmarks/op_dispatch.py. None has an
autograd formula: the training forward calls the reference itself (:func:`trtllm_bole.ops.rms_norm`,
:func:`trtllm_bole.ops.chunk_gated_delta_rule`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from trtllm_bole.kernels._common import GDNTreeFactors
from trtllm_bole.reference import attention_tree, conv_tree, gdn_tree, kv_cache, norms, rope, sampling
from trtllm_bole.tree import PrefillChunks, TreeBatch

_LIB = torch.library.Library("bole", "DEF")

_TREE = "Tensor[] tree, int max_depth, int max_nodes"
_QKV = "Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta"


def tree_args(tree: TreeBatch) -> tuple[list[Tensor], int, int]:
    """A forest as an operator's ``tree, max_depth, max_nodes`` arguments."""
    return tree.tensors(), tree.max_depth, tree.max_nodes


IMPLEMENTATIONS: dict[str, dict[str, Callable]] = {}
"""``{operator name: {"CPU": fn, "CUDA": fn}}``: what the dispatcher runs for each device, callable with the
operator's own arguments (benchmarks/op_dispatch.py and ab_executor.py time the dispatch by calling
these directly)."""


def _define(schema: str, *, cpu: Callable, cuda: Callable, fake: Callable, tree_at: int | None = None) -> Any:
    """Defines ``bole::<schema>`` and returns its overload; ``tree_at``: the position of the forest's
    tensors, which ``cpu`` and ``cuda`` receive as one :class:`TreeBatch` there (the fake as they come)."""
    name = schema[: schema.index("(")]
    _LIB.define(schema)
    impls = {
        key: fn if tree_at is None else _taking_forest(fn, tree_at)
        for key, fn in (("CPU", cpu), ("CUDA", cuda))
    }
    for key, fn in impls.items():
        _LIB.impl(name, fn, key)
    torch.library.register_fake(f"bole::{name}", fake, lib=_LIB)
    IMPLEMENTATIONS[name] = impls
    return getattr(torch.ops.bole, name).default


def _taking_forest(fn: Callable, at: int) -> Callable:
    def impl(*args: Any, **kwargs: Any) -> Any:
        forest = TreeBatch(*args[at], args[at + 1], args[at + 2])
        return fn(*args[:at], forest, *args[at + 3 :], **kwargs)

    return impl


def _kernel(module: str, name: str) -> Callable:
    """``trtllm_bole.kernels.<module>.<name>``, imported at its first call (only where a GPU runs it)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(f"trtllm_bole.kernels.{module}"), name)(*args, **kwargs)

    return run


def _nothing(*args: Any, **kwargs: Any) -> None:
    """The fake of an in-place operator."""


# ----------------------------------------------------------------------------------------- #
# Norms, sampling filters and forests                                                       #
# ----------------------------------------------------------------------------------------- #


def _row_major(reference: Callable) -> Callable:
    """``reference`` with row-major outputs whatever its inputs' layout, as the kernel's (and the fake's)
    are."""

    def run(*args: Any, **kwargs: Any) -> Any:
        out = reference(*args, **kwargs)
        return tuple(t.contiguous() for t in out) if isinstance(out, tuple) else out.contiguous()

    return run


rms_norm = _define(
    "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    cpu=_row_major(norms.rms_norm),
    cuda=_kernel("norms", "rms_norm"),
    fake=lambda x, weight, eps: x.new_empty(x.shape),
)


rms_norm_rope = _define(
    "rms_norm_rope(Tensor x, Tensor weight, float eps, Tensor cos, Tensor sin) -> Tensor",
    cpu=_row_major(rope.rms_norm_rope),
    cuda=_kernel("norms", "rms_norm_rope"),
    fake=lambda x, weight, eps, cos, sin: x.new_empty(x.shape),
)


def _gdn_inputs_fake(
    qk: Tensor, a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, heads: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    q = qk.new_empty((qk.shape[0], heads, qk.shape[1] // (2 * heads)))
    return q, torch.empty_like(q), a.new_empty(a.shape, dtype=torch.float32), b.new_empty(b.shape)


gdn_inputs = _define(
    "gdn_inputs(Tensor qk, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, int heads) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
    cpu=_row_major(norms.gdn_inputs),
    cuda=_kernel("norms", "gdn_inputs"),
    fake=_gdn_inputs_fake,
)


gated_rms_norm = _define(
    "gated_rms_norm(Tensor x, Tensor gate, Tensor weight, float eps) -> Tensor",
    cpu=_row_major(norms.gated_rms_norm),
    cuda=_kernel("norms", "gated_rms_norm"),
    fake=lambda x, gate, weight, eps: x.new_empty(x.shape),
)


filter_floor = _define(
    "filter_floor(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p) -> Tensor",
    cpu=sampling.filter_floor,
    cuda=_kernel("filter_floor", "filter_floor"),
    fake=lambda logits, temperature, top_k, top_p: logits.new_empty(
        logits.shape[:1], dtype=torch.promote_types(logits.dtype, torch.float32)
    ),
)


def _softmax_stats_fake(logits: Tensor, temperature: Tensor, floor: Tensor) -> tuple[Tensor, Tensor]:
    rows = logits.shape[:1]
    dtype = torch.promote_types(logits.dtype, torch.float32)
    return logits.new_empty(rows, dtype=torch.long), logits.new_empty(rows, dtype=dtype)


softmax_stats = _define(
    "softmax_stats(Tensor logits, Tensor temperature, Tensor floor) -> (Tensor, Tensor)",
    cpu=sampling.softmax_stats,
    cuda=_kernel("softmax_stats", "softmax_stats"),
    fake=_softmax_stats_fake,
)


def _forest_metadata_torch(
    parents: Tensor, cu_seqlens: Tensor, depth: Tensor, max_depth: int, max_nodes: int
) -> tuple:
    """``(request, global_parents, paths, dfs_order, subtree_size)``: torch's derivation, on any device."""
    t = TreeBatch.on_device(parents, cu_seqlens, depth, max_depth=max_depth, max_nodes=max_nodes)
    return t.request, t.global_parents, t.paths, t.dfs_order, t.subtree_size


def _forest_metadata_cuda(
    parents: Tensor, cu_seqlens: Tensor, depth: Tensor, max_depth: int, max_nodes: int
) -> tuple:
    """One Triton launch for requests of up to ``MAX_NODES`` nodes (~65 small torch kernels otherwise)."""
    from trtllm_bole.kernels import forest as kernel

    if max_nodes > kernel.MAX_NODES:
        return _forest_metadata_torch(parents, cu_seqlens, depth, max_depth, max_nodes)
    return kernel.forest_metadata(parents, cu_seqlens, depth, max_depth=max_depth, max_nodes=max_nodes)


def _forest_metadata_fake(
    parents: Tensor, cu_seqlens: Tensor, depth: Tensor, max_depth: int, max_nodes: int
) -> tuple:
    n = parents.shape[0]
    request, global_parents, dfs_order, subtree_size = (
        parents.new_empty(n, dtype=torch.long) for _ in range(4)
    )
    return (
        request,
        global_parents,
        parents.new_empty((n, max_depth), dtype=torch.long),
        dfs_order,
        subtree_size,
    )


forest_metadata = _define(
    "forest_metadata(Tensor parents, Tensor cu_seqlens, Tensor depth, int max_depth, int max_nodes) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    cpu=_forest_metadata_torch,
    cuda=_forest_metadata_cuda,
    fake=_forest_metadata_fake,
)

# ----------------------------------------------------------------------------------------- #
# Gated DeltaNet                                                                             #
# ----------------------------------------------------------------------------------------- #


def _verify_reference(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                      tree: TreeBatch, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The closed form, its factors in the state's dtype (the reference computes in float64 or float32)."""
    o, u, log_p = gdn_tree.closed_form_tree_verify(q, k, v, g, beta, state, tree, **kwargs)
    return o, u.to(state.dtype), log_p.to(state.dtype)


def _verify_fake(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, *args: Any,
                 **kwargs: Any) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """``o`` in v's dtype, the factors ``u`` and ``logP`` in the state's (float32 on CUDA)."""
    return (
        v.new_empty(v.shape),
        v.new_empty(v.shape, dtype=state.dtype),
        v.new_empty(v.shape[:2], dtype=state.dtype),
    )


gdn_tree_verify = _define(
    f"gdn_tree_verify({_QKV}, Tensor state, {_TREE}, *, float? scale=None, Tensor? state_indices=None) "
    "-> (Tensor, Tensor, Tensor)",
    cpu=_verify_reference,
    cuda=_kernel("gdn_tree_verify", "gdn_tree_verify"),
    fake=_verify_fake,
    tree_at=6,
)


def _serial_reference(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                      tree: TreeBatch, **kwargs: Any) -> tuple[Tensor, Tensor]:  # fmt: skip
    o, snapshots = gdn_tree.serial_tree_recurrence(q, k, v, g, beta, state, tree, **kwargs)
    return o, snapshots.to(state.dtype)


def _serial_fake(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, *args: Any,
                 **kwargs: Any) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``o`` in v's dtype and one state snapshot per node ``[N, HV, dk, dv]`` in the state's."""
    return v.new_empty(v.shape), state.new_empty((v.shape[0], *state.shape[1:]))


gdn_tree_verify_serial = _define(
    f"gdn_tree_verify_serial({_QKV}, Tensor state, {_TREE}, *, float? scale=None, "
    "Tensor? state_indices=None) -> (Tensor, Tensor)",
    cpu=_serial_reference,
    cuda=_kernel("baselines.tree_serial", "gdn_tree_verify_serial"),
    fake=_serial_fake,
    tree_at=6,
)


def _commit_reference(state: Tensor, k: Tensor, u: Tensor, log_decay: Tensor, tree: TreeBatch,
                      accepted_leaf: Tensor, state_indices: Tensor | None = None) -> None:  # fmt: skip
    """Layer by layer when the factors are stacked (``state [L, S, HV, dk, dv]``)."""
    layers = zip(state, k, u, log_decay, strict=True) if state.dim() == 5 else [(state, k, u, log_decay)]
    for layer in layers:
        gdn_tree.factored_commit(*layer, tree, accepted_leaf, state_indices=state_indices)


def _commit_cuda(state: Tensor, k: Tensor, u: Tensor, log_decay: Tensor, tree: TreeBatch,
                 accepted_leaf: Tensor, state_indices: Tensor | None = None) -> None:  # fmt: skip
    """Every layer of a stacked commit in one launch."""
    from trtllm_bole.kernels import gdn_commit as kernel

    factors = GDNTreeFactors(tree, k, u, log_decay)
    kernel.gdn_commit(state, factors, accepted_leaf, state_indices=state_indices)


gdn_commit = _define(
    f"gdn_commit(Tensor(a!) state, Tensor k, Tensor u, Tensor log_decay, {_TREE}, Tensor accepted_leaf, "
    "*, Tensor? state_indices=None) -> ()",
    cpu=_commit_reference,
    cuda=_commit_cuda,
    fake=_nothing,
    tree_at=4,
)

gdn_snapshot_commit = _define(
    f"gdn_snapshot_commit(Tensor(a!) state, Tensor snapshots, {_TREE}, Tensor accepted_leaf, "
    "*, Tensor? state_indices=None) -> ()",
    cpu=gdn_tree.snapshot_commit,
    cuda=_kernel("baselines.tree_serial", "gdn_snapshot_commit"),
    fake=_nothing,
    tree_at=2,
)


def _prefill_reference(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                       chunks: TreeBatch, first: Tensor, **kwargs: Any) -> Tensor:  # fmt: skip
    """The prompts' bounds from their chunks (the first node of each prompt's first chunk), each prompt
    chunked again by the reference, into chunks of the same size."""
    bounds = chunks.cu_seqlens[first]
    return gdn_tree.chunked_prefill(q, k, v, g, beta, state, bounds, chunk_size=chunks.max_depth, **kwargs)


def _prefill_cuda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                  chunks: TreeBatch, first: Tensor, **kwargs: Any) -> Tensor:  # fmt: skip
    from trtllm_bole.kernels import gdn_prefill as kernel

    return kernel.gdn_prefill(q, k, v, g, beta, state, PrefillChunks(chunks, first), **kwargs)


gdn_prefill = _define(
    f"gdn_prefill({_QKV}, Tensor(a!) state, {_TREE}, Tensor first, *, float? scale=None, "
    "Tensor? state_indices=None) -> Tensor",
    cpu=_prefill_reference,
    cuda=_prefill_cuda,
    fake=lambda q, k, v, *args, **kwargs: v.new_empty(v.shape),
    tree_at=6,
)

# ----------------------------------------------------------------------------------------- #
# Short causal conv and the paged KV cache                                                   #
# ----------------------------------------------------------------------------------------- #

tree_conv1d = _define(
    f"tree_conv1d(Tensor x, Tensor weight, Tensor conv_state, {_TREE}, *, Tensor? bias=None, "
    'str? activation="silu", Tensor? state_indices=None) -> Tensor',
    cpu=conv_tree.tree_conv1d,
    cuda=_kernel("tree_conv1d", "tree_conv1d"),
    fake=lambda x, *args, **kwargs: x.new_empty(x.shape),
    tree_at=3,
)


def _conv_commit_reference(conv_state: Tensor, x: Tensor, tree: TreeBatch, accepted_leaf: Tensor,
                           state_indices: Tensor | None = None) -> None:  # fmt: skip
    """Layer by layer when ``x`` holds every layer (``[L, N, C]``)."""
    for layer_state, layer_x in zip(conv_state, x, strict=True) if x.dim() == 3 else [(conv_state, x)]:
        conv_tree.conv_state_commit(layer_state, layer_x, tree, accepted_leaf, state_indices=state_indices)


conv_state_commit = _define(
    f"conv_state_commit(Tensor(a!) conv_state, Tensor x, {_TREE}, Tensor accepted_leaf, "
    "*, Tensor? state_indices=None) -> ()",
    cpu=_conv_commit_reference,
    cuda=_kernel("gdn_commit", "conv_state_commit"),
    fake=_nothing,
    tree_at=2,
)

kv_commit = _define(
    f"kv_commit(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor new_k, Tensor new_v, {_TREE}, "
    "Tensor accepted_leaf, Tensor block_tables, Tensor context_lens) -> ()",
    cpu=kv_cache.write_accepted_kv,
    cuda=_kernel("kv_commit", "kv_commit"),
    fake=_nothing,
    tree_at=4,
)

tree_attention = _define(
    f"tree_attention(Tensor q, Tensor k, Tensor v, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
    f"Tensor context_lens, {_TREE}, float scale) -> Tensor",
    cpu=attention_tree.tree_attention,
    cuda=_kernel("tree_attention", "tree_attention"),
    fake=lambda q, *args: q.new_empty(q.shape),
    tree_at=7,
)
