"""Serving state of a Qwen3.5 model: slot pools, the per-step context, and pending commits.

- GDN recurrent state and short-conv state live in pools indexed by *request slot*
  (``StepContext.slots``); full-attention K/V live in a paged cache addressed by block tables.
- A verify leaves every cache untouched and returns a :class:`PendingCommit`; committing the accepted
  path writes GDN state (one factored launch for all layers), conv state (one launch) and the
  accepted K/V (one indexed copy for all layers). Rejected nodes are simply dropped.

Ownership: the executor owns slot and block allocation and advances ``context_lens`` after a commit
(by the accepted depth); blocks for ``context_len + max tree depth`` must be allocated before verify.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trtllm_bole import ops
from trtllm_bole.models.config import Qwen35Config
from trtllm_bole.transfer import device_tensor, to_device
from trtllm_bole.tree import MAX_TREE_DEPTH, PrefillChunks, TreeBatch

PREFILL_CHUNK = MAX_TREE_DEPTH
"""Tokens a prompt's GDN prefill takes at a time: chains as long as the kernels take."""

NO_BLOCK = -1
"""A block table's entry past a request's own blocks (tables are as wide as the batch's widest): reads
there are masked by ``context_lens``, and a KV commit refuses (``check=True``) or drops (``check=False``)
a write there, so a stray write never lands in another request's blocks."""


def block_table(blocks: Sequence[Sequence[int]]) -> torch.Tensor:
    """int32 ``[B, widest]`` (host): each request's blocks, then :data:`NO_BLOCK`."""
    table = torch.full((len(blocks), max(map(len, blocks), default=0)), NO_BLOCK, dtype=torch.int32)
    for row, own in zip(table, blocks, strict=True):
        row[: len(own)] = torch.tensor(own, dtype=torch.int32)
    return table


def load_block_table(static: torch.Tensor, table: torch.Tensor) -> None:
    """Copy ``table`` into a CUDA graph's wider ``static`` table, :data:`NO_BLOCK` past its columns."""
    static.fill_(NO_BLOCK)
    static[:, : table.shape[1]].copy_(table)


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    """What a prefill's layers read beyond its forest of chains: each chain's last node (the leaf its
    layers commit their caches to as they run) and the GDN layers' chunks."""

    ends: torch.Tensor  # int64 [B]: local index of each chain's last node
    chunks: PrefillChunks

    @classmethod
    def of(
        cls, lengths: Sequence[int], device: torch.device | str, *, chunk_capacity: int | None = None
    ) -> PrefillPlan:
        """The plan of chains ``lengths`` long, made on the host (``chunk_capacity``: see
        :meth:`PrefillChunks.of`)."""
        chunks = PrefillChunks.of(lengths, PREFILL_CHUNK, device, capacity=chunk_capacity)
        return cls(device_tensor([n - 1 for n in lengths], device), chunks)


@dataclass(frozen=True, slots=True)
class PrefillBatch:
    """A prefill's chains on the host, as the executor makes them: each one's length, state slot, block
    table row (int32 ``[B, widest]``, :data:`NO_BLOCK` past its blocks) and committed tokens."""

    lengths: tuple[int, ...]
    slots: tuple[int, ...]
    tables: torch.Tensor
    starts: tuple[int, ...]

    def context(
        self, device: torch.device | str, *, max_depth: int | None = None, chunk_capacity: int | None = None
    ) -> StepContext:
        """The chains' step context on ``device`` with its :class:`PrefillPlan` (each part moved in one
        copy, nothing waits for the device); ``max_depth`` and ``chunk_capacity``: bounds to declare
        instead of the chains' own (:meth:`TreeBatch.chains`, :meth:`PrefillChunks.of`)."""
        tree = TreeBatch.chains(list(self.lengths), device, max_depth=max_depth, paths=False)
        plan = PrefillPlan.of(self.lengths, device, chunk_capacity=chunk_capacity)
        slots, starts = device_tensor(self.slots, device), device_tensor(self.starts, device)
        return StepContext(slots, to_device(self.tables, device), starts, tree, self.lengths, plan)

    def padded(self, tokens: int, slot: int, table_width: int) -> PrefillBatch:
        """One more chain after these, filling the tokens up to ``tokens``: on ``slot``, with no blocks
        (its K/V writes are dropped) and no committed tokens, so that it reads and writes nothing of the
        others'; the tables widened to ``table_width`` blocks."""
        pad = tokens - sum(self.lengths)
        if pad <= 0 or self.tables.shape[1] > table_width:
            raise ValueError(
                f"{sum(self.lengths)} tokens and tables {self.tables.shape[1]} blocks wide do not pad to "
                f"{tokens} tokens (one or more for the padding chain) and {table_width} blocks"
            )
        tables = torch.full((len(self.lengths) + 1, table_width), NO_BLOCK, dtype=torch.int32)
        tables[:-1, : self.tables.shape[1]] = self.tables
        return PrefillBatch((*self.lengths, pad), (*self.slots, slot), tables, (*self.starts, 0))


@dataclass(frozen=True, slots=True)
class StepContext:
    """What one model step works on (built by the executor).

    ``slots`` int ``[B]``: state slot of each request; ``block_tables`` int32 ``[B, max_blocks]``
    (:data:`NO_BLOCK` past a request's own blocks);
    ``context_lens`` int ``[B]``: tokens already committed to the caches; ``tree``: the new tokens as
    a packed forest (prefill = one chain per request, decode = one node per request);
    ``chain_lengths``: the chains' lengths on the host, set by :meth:`chains` (a prefill makes its
    :class:`PrefillPlan` from them instead of from the device); ``plan``: a prefill's plan made already
    (a CUDA graph's, whose tensors keep their addresses).
    """

    slots: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    tree: TreeBatch
    chain_lengths: tuple[int, ...] | None = None
    plan: PrefillPlan | None = None

    def __post_init__(self) -> None:
        b = self.tree.num_requests
        lengths = self.chain_lengths
        if lengths is not None and (len(lengths) != b or sum(lengths) != self.tree.num_nodes):
            raise ValueError(
                f"chain_lengths {list(lengths)} must give each of the tree's {b} requests its length, "
                f"{self.tree.num_nodes} nodes in all"
            )
        for name, t, dims in (
            ("slots", self.slots, 1),
            ("context_lens", self.context_lens, 1),
            ("block_tables", self.block_tables, 2),
        ):
            if not isinstance(t, torch.Tensor) or t.dtype.is_floating_point or t.dim() != dims:
                raise ValueError(f"{name} must be an integer tensor with {dims} dims, got {t!r}")
            if t.shape[0] != b:
                raise ValueError(f"{name} has {t.shape[0]} rows but the tree has {b} requests")
            if t.device != self.tree.parents.device:
                raise ValueError(f"{name} is on {t.device} but the tree is on {self.tree.parents.device}")

    def prefill_plan(self) -> PrefillPlan:
        """A prefill's plan: the context's own, else made from :attr:`chain_lengths` (nothing waits for the
        device)."""
        if self.plan is not None:
            return self.plan
        if self.chain_lengths is None:
            raise ValueError("prefill takes one chain per request: build its context with StepContext.chains")
        return PrefillPlan.of(self.chain_lengths, self.slots.device)

    @classmethod
    def chains(
        cls,
        lengths: list[int],
        slots: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
    ) -> StepContext:
        """One chain of ``lengths[b]`` new tokens per request (a prompt's, or a chain draft)."""
        tree = TreeBatch.chains(lengths, device=slots.device)
        return cls(slots, block_tables, context_lens, tree, tuple(lengths))

    @classmethod
    def single_tokens(
        cls, slots: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor
    ) -> StepContext:
        """One new token per request (plain decode)."""
        return cls.chains([1] * slots.shape[0], slots, block_tables, context_lens)


@dataclass(slots=True)
class ModelCache:
    """Slot pools and paged KV of one model (and of its MTP layer when present)."""

    gdn_state: torch.Tensor  # float32 [L_gdn, S, HV, dk, dv]
    conv_state: torch.Tensor  # model dtype [L_gdn, S, C, W - 1]: last inputs, oldest first
    k_cache: torch.Tensor  # model dtype [L_attn, num_blocks, block_size, KVH, head_dim]
    v_cache: torch.Tensor
    mtp_k_cache: torch.Tensor | None  # [1, num_blocks, block_size, KVH, head_dim], same block tables
    mtp_v_cache: torch.Tensor | None

    @classmethod
    def allocate(
        cls,
        config: Qwen35Config,
        num_slots: int,
        num_blocks: int,
        block_size: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        mtp: bool,
    ) -> ModelCache:
        for name, value in (("num_slots", num_slots), ("num_blocks", num_blocks), ("block_size", block_size)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        c = config
        gdn = (c.num_gdn_layers, num_slots)
        kv = (num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        shapes = {
            "gdn_state": ((*gdn, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim),
                          torch.float32),
            "conv_state": ((*gdn, c.conv_dim, c.linear_conv_kernel_dim - 1), dtype),
            "k_cache": ((c.num_attn_layers, *kv), dtype),
            "v_cache": ((c.num_attn_layers, *kv), dtype),
            **({"mtp_k_cache": ((1, *kv), dtype), "mtp_v_cache": ((1, *kv), dtype)} if mtp else {}),
        }  # fmt: skip
        try:
            tensors = {
                name: torch.zeros(shape, dtype=dt, device=device) for name, (shape, dt) in shapes.items()
            }
        except RuntimeError as e:  # torch.OutOfMemoryError on CUDA, "can't allocate memory" on the CPU
            size = sum(math.prod(shape) * dt.itemsize for shape, dt in shapes.values())
            raise ValueError(
                f"the cache ({num_slots} state slots, {num_blocks} KV blocks of {block_size} tokens) needs "
                f"{size / 2**30:.1f} GiB, which {device} could not allocate: lower max_batch_size, "
                "max_seq_len or kv_cache_tokens"
            ) from e
        return cls(**{"mtp_k_cache": None, "mtp_v_cache": None, **tensors})

    def zero_(self) -> None:
        """Every pool and cache back to zeros, in place (the addresses stay)."""
        for t in (
            self.gdn_state,
            self.conv_state,
            self.k_cache,
            self.v_cache,
            self.mtp_k_cache,
            self.mtp_v_cache,
        ):
            if t is not None:
                t.zero_()

    @property
    def num_slots(self) -> int:
        return self.gdn_state.shape[1]

    @property
    def block_size(self) -> int:
        return self.k_cache.shape[2]

    @property
    def num_blocks(self) -> int:
        return self.k_cache.shape[1]

    def reset_slots(self, slots: torch.Tensor) -> None:
        """Zero the GDN and conv state of newly admitted requests (KV needs no reset: it is masked)."""
        slots = torch.as_tensor(slots, device=self.gdn_state.device).long()
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= self.num_slots):
            raise ValueError(f"slots must lie in [0, {self.num_slots}), got {slots.tolist()}")
        self.gdn_state[:, slots] = 0
        self.conv_state[:, slots] = 0


@dataclass(frozen=True, slots=True)
class PendingCommit:
    """What a verify produced and a commit needs, with the caches it commits into.

    ``new_k``/``new_v`` ``[L_attn, N, KVH, d]``; ``conv_inputs [L_gdn, N, C]``; GDN either stacked
    factors (``gdn_scheme="bole"``), per-layer snapshots ``[N, HV, dk, dv]`` (``"serial"``). A prefill
    leaves nothing: its layers write every cache as they run (``ForwardState.is_prefill``).
    """

    ctx: StepContext
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    new_k: torch.Tensor | None
    new_v: torch.Tensor | None
    gdn_state: torch.Tensor | None = None
    conv_state: torch.Tensor | None = None
    conv_inputs: torch.Tensor | None = None
    gdn_factors: ops.GDNTreeFactors | None = None
    gdn_snapshots: tuple[torch.Tensor, ...] | None = None

    def commit(self, accepted_leaf: torch.Tensor, *, check: bool = True) -> None:
        """Make each request's path to ``accepted_leaf[b]`` (local index, -1 = nothing) the new state.
        ``check=False``: the caller built the leaves, slots, block tables and lengths (the executor), so
        their values go unchecked and nothing waits for the device."""
        ctx = self.ctx
        accepted_leaf = torch.as_tensor(accepted_leaf, device=ctx.slots.device).long()
        slots = ctx.slots
        if self.new_k is not None:  # first: its checks refuse a path past the blocks before any state moves
            ops.kv_commit(
                self.k_cache, self.v_cache, self.new_k, self.new_v, ctx.tree, accepted_leaf,
                ctx.block_tables, ctx.context_lens, check=check,
            )  # fmt: skip
        if self.gdn_factors is not None:
            ops.gdn_commit(self.gdn_state, self.gdn_factors, accepted_leaf, state_indices=slots, check=check)
        if self.gdn_snapshots is not None:
            for state, snapshots in zip(self.gdn_state, self.gdn_snapshots, strict=True):
                ops.gdn_snapshot_commit(
                    state, snapshots, ctx.tree, accepted_leaf, state_indices=slots, check=check
                )
        if self.conv_inputs is not None:
            ops.conv_state_commit(
                self.conv_state, self.conv_inputs, ctx.tree, accepted_leaf, state_indices=slots, check=check
            )
