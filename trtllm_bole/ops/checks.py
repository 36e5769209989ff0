"""The operators' input checks that go beyond one kernel launcher's (:mod:`trtllm_bole.kernels._common`):
the reference's dtypes, devices against the state's, and the values that index memory (slot indices,
accepted leaves), which cost device syncs, skipped while a CUDA graph captures or torch compiles."""

from __future__ import annotations

import weakref

import torch

from trtllm_bole.kernels._common import (
    check_gdn_operands,
    check_leaves,
    check_slot_count,
    check_state_indices,
    gdn_shapes,
)
from trtllm_bole.reference import kv_cache
from trtllm_bole.tree import TreeBatch


def check_beside(name: str, tensor: torch.Tensor, **others: torch.Tensor) -> None:
    """``others`` on ``tensor``'s device (else the dispatcher would run one device's implementation on
    the other's memory)."""
    for other, t in others.items():
        if t.device != tensor.device:
            raise ValueError(f"{other} is on {t.device} but {name} is on {tensor.device}")


def check_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    n: int,
    num_requests: int,
    state_indices: torch.Tensor | None,
    *,
    values: bool = True,
) -> None:
    if gdn_shapes(q, k, v)[0] != n:
        raise ValueError(f"q/k/v must have N={n} rows (the tree's nodes), got {q.shape[0]}")
    check_gdn_operands(q, k, v, g, beta, state, state_dtypes=STATE_DTYPES, input_dtypes=FLOAT_DTYPES)
    check_beside("state", state, q=q, k=k, v=v, g=g, beta=beta)
    check_slots(state.shape[0], num_requests, state_indices, state.device, values=values)


def check_sequences(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
) -> None:
    """Whole sequences: q, k ``[B, L, H, dk]``, v ``[B, L, HV, dv]``, g, beta ``[B, L, HV]``, L >= 1, and
    initial_state ``[B, HV, dk, dv]``; every row as :func:`check_gdn` takes a tree's nodes."""
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"q, k must be [B, L, H, dk] and v [B, L, HV, dv] with the same B, L, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    batch, length, hv = v.shape[:3]
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (batch, length, hv):
            raise ValueError(f"{name} must be [B={batch}, L={length}, HV={hv}], got {tuple(t.shape)}")
    if length == 0:
        raise ValueError("the sequences hold no tokens (L = 0): nothing to run")
    rows = [t.flatten(0, 1) for t in (q, k, v, g, beta)]
    gdn_shapes(*rows[:3])
    check_gdn_operands(*rows, initial_state, state_dtypes=STATE_DTYPES, input_dtypes=FLOAT_DTYPES)
    if initial_state.shape[0] != batch:
        raise ValueError(
            f"initial_state must be [B={batch}, HV, dk, dv] (one per sequence), got "
            f"{tuple(initial_state.shape)}"
        )
    check_beside("initial_state", initial_state, q=q, k=k, v=v, g=g, beta=beta)


def differentiated(*tensors: torch.Tensor) -> bool:
    """Whether autograd records an op on these: the operators have no backward, so training runs the
    reference instead."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


STATE_DTYPES = (torch.float32, torch.float64)  # float64: the reference's exact runs, on the CPU
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_state_dtype(state: torch.Tensor) -> None:
    if state.dtype not in STATE_DTYPES:
        raise ValueError(f"state must be float32 or float64, got {state.dtype}")


def check_accepted_leaves(
    accepted_leaf: torch.Tensor, tree: TreeBatch, device: torch.device, *, values: bool
) -> None:
    """Shape, dtype and device always; unless ``values=False``, each leaf inside its request (a sync)."""
    check_leaves(accepted_leaf, tree, device)
    if values and values_checkable(accepted_leaf):
        tree.accepted_nodes(accepted_leaf)  # raises on a leaf outside [-1, request size)


def values_checkable(t: torch.Tensor) -> bool:
    """False while a CUDA graph captures or torch compiles: a graph records kernels, not values, and the
    capturing (compiling) caller owns the values it replays."""
    return not (torch.compiler.is_compiling() or (t.is_cuda and torch.cuda.is_current_stream_capturing()))


_slots_passed: tuple[weakref.ref, int, int] | None = None
"""``(state_indices, its version counter, num_slots)`` of the last slot indices whose values passed
:func:`check_slots`. Every GDN layer of a step checks the same tensor, and checking its values costs
three device syncs; an unmodified tensor (same version) against as many slots or more passes again. Writes
that bypass torch's version counter (through ``.data`` or ``.numpy()``) go unseen: change slot indices with
tensor operations (the executor's ``copy_``)."""


def _passed_before(state_indices: torch.Tensor, version: int | None, num_slots: int) -> bool:
    if _slots_passed is None:
        return False
    tensor, passed_version, passed_slots = _slots_passed
    return tensor() is state_indices and passed_version == version and passed_slots <= num_slots


def check_slots(
    num_slots: int,
    num_requests: int,
    state_indices: torch.Tensor | None,
    device: torch.device,
    *,
    values: bool = True,
    what: str = "state",
) -> None:
    """Shapes and devices always; the indices' values (three device syncs) unless ``values=False``."""
    global _slots_passed
    check_slot_count(num_slots, num_requests, state_indices, what)
    if state_indices is None:
        return
    check_state_indices(state_indices, num_requests, device)
    if not values:
        return
    if not values_checkable(state_indices):
        return
    version = None if state_indices.is_inference() else state_indices._version
    if _passed_before(state_indices, version, num_slots):
        return
    if int(state_indices.min()) < 0 or int(state_indices.max()) >= num_slots:
        raise ValueError(f"state_indices must lie in [0, {num_slots}), got {state_indices.tolist()}")
    if torch.unique(state_indices).numel() != num_requests:
        raise ValueError(f"state_indices must name distinct slots, got {state_indices.tolist()}")
    if version is not None:
        _slots_passed = (weakref.ref(state_indices), version, num_slots)


def check_kv_room(
    k_cache: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    """Every position the accepted paths would be written to lies inside its request's allocated blocks
    (the leaves in range; a device sync). :func:`kv_commit` checks it; a caller that must refuse before
    any state moves (a prefill, whose GDN layers update their state as they run) calls it first."""
    num_blocks, block_size = k_cache.shape[1], k_cache.shape[2]
    tree.accepted_nodes(accepted_leaf)  # raises on a leaf outside [-1, request size)
    if bool((context_lens < 0).any()):
        raise ValueError(f"context_lens must not be negative, got {context_lens.tolist()}")
    keep, pos, column, blocks = kv_cache.accepted_positions(
        tree, accepted_leaf, context_lens, block_tables, block_size
    )
    overflow = keep & (column >= block_tables.shape[1])
    if bool(overflow.any()):
        b = int(tree.request[torch.nonzero(overflow)[0]])
        raise ValueError(
            f"request {b}: the accepted path reaches position {int(pos[keep & (tree.request == b)].max())} "
            f"but its block table holds {block_tables.shape[1] * block_size} positions; allocate blocks for "
            f"context_len + max tree depth before verify"
        )
    unallocated = keep & ((blocks < 0) | (blocks >= num_blocks))
    if bool(unallocated.any()):
        b = int(tree.request[torch.nonzero(unallocated)[0]])
        raise ValueError(
            f"request {b}: its block table points outside the cache's {num_blocks} blocks where the "
            f"accepted path is written: {block_tables[b].tolist()}"
        )
