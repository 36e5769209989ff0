"""Qwen3.5's multi-token-prediction (MTP) module: the built-in drafter.

Published layout (``mtp.*`` next to the main weights): ``pre_fc_norm_embedding`` and
``pre_fc_norm_hidden`` (zero-centred RMSNorms), ``fc`` (2h -> h), one full-attention decoder layer
``layers.0`` with the target's layer structure, and a final ``norm``; embeddings and lm_head are the
target's.

Conventions, as served by vLLM (``vllm/model_executor/models/qwen3_5_mtp.py``,
``Qwen3_5MultiTokenPredictor.forward``) and SGLang (``python/sglang/srt/models/qwen3_5_mtp.py``):

- the fc input is ``cat([norm_e(embed(token)), norm_h(hidden)])``: embedding first;
- ``hidden`` is the target's *final-normed* hidden state (vLLM's ``Qwen3NextModel.forward`` returns
  ``norm(hidden, residual)``, and that is what its proposer hands to the MTP), or, for a deeper draft
  step, the MTP's own output after ``mtp.norm``;
- row ``p`` pairs the hidden state at position ``p`` with the token at position ``p + 1`` and runs
  at RoPE position ``p`` (vLLM's EAGLE proposer shifts the input ids left by one and keeps the
  target positions: ``vllm/v1/spec_decode/eagle.py``). Its KV entry is written at position ``p`` of
  the MTP's own paged cache, which shares the target's block tables.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_bole import ops
from trtllm_bole.models.cache import ModelCache, PendingCommit, StepContext
from trtllm_bole.models.config import FULL_ATTENTION, Qwen35Config
from trtllm_bole.models.layers import DecoderLayer, EmptyInitModule, ForwardState, SequenceState
from trtllm_bole.tree import TreeBatch


class MTPHead(EmptyInitModule):
    def __init__(
        self,
        config: Qwen35Config,
        embed_tokens: nn.Parameter,
        lm_head: nn.Parameter,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        super().__init__(dtype, device)
        h = config.hidden_size
        self.config = config
        self.eps = config.rms_norm_eps
        self.fc = self._param(h, 2 * h)
        self.pre_fc_norm_embedding = self._param(h)
        self.pre_fc_norm_hidden = self._param(h)
        self.norm = self._param(h)
        self.layer = DecoderLayer(config, FULL_ATTENTION, 0, dtype=dtype, device=device)
        # Shared with the target model (the same Parameter objects, not copies).
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.cache: ModelCache | None = None  # set by Qwen35Model.allocate_cache

    def _fuse(self, hidden: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        embedded = F.embedding(token_ids, self.embed_tokens)
        embedded = ops.rms_norm(embedded, self.pre_fc_norm_embedding, self.eps)
        hidden = ops.rms_norm(hidden, self.pre_fc_norm_hidden, self.eps)
        return F.linear(torch.cat([embedded, hidden], dim=-1), self.fc)

    def _forward_tree(
        self,
        hidden: torch.Tensor,
        token_ids: torch.Tensor,
        ctx: StepContext,
        past: PendingCommit | None = None,
        check_growth: bool = True,
    ) -> tuple[torch.Tensor, PendingCommit]:
        if self.cache is None or self.cache.mtp_k_cache is None:
            raise ValueError("no MTP cache: call Qwen35Model.allocate_cache first")
        rows, past_k, past_v = (None, None, None) if past is None else _grown_from(past, ctx, check_growth)
        n = ctx.tree.num_nodes if rows is None else rows.numel()
        if token_ids.shape != (n,) or hidden.shape != (n, self.config.hidden_size):
            raise ValueError(
                f"MTP takes hidden [{n}, {self.config.hidden_size}] and token_ids [{n}] (one row per "
                f"{'new ' if past is not None else ''}node), got {tuple(hidden.shape)} and "
                f"{tuple(token_ids.shape)}"
            )
        fs = ForwardState.build(
            ctx, self.config, self.fc.dtype, self.cache.mtp_k_cache, self.cache.mtp_v_cache,
            rows=rows, past_k=past_k, past_v=past_v,
        )  # fmt: skip
        x = self.layer(self._fuse(hidden, token_ids), fs)
        return ops.rms_norm(x, self.norm, self.eps), fs.pending()

    @torch.no_grad()
    def verify(
        self,
        hidden: torch.Tensor,
        token_ids: torch.Tensor,
        ctx: StepContext,
        *,
        past: PendingCommit | None = None,
        check_growth: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, PendingCommit]:
        """Draft over a forest of new rows on top of the MTP's committed KV; the cache is untouched.

        Row ``i`` pairs ``hidden[i]`` (the state that predicted ``token_ids[i]``: the target's hidden,
        or the MTP output of the row's parent) with ``token_ids[i]``; ``ctx.context_lens`` counts the
        MTP's committed rows. Returns ``(mtp_hidden [N, h], logits [N, V], pending)``.

        Growing a tree depth by depth: pass the previous pass's pending as ``past`` and, as
        ``ctx.tree``, the grown forest (each request's earlier nodes first and unchanged, new nodes
        appended); ``hidden``/``token_ids`` then hold the new nodes only, in packed order, and so do
        the outputs. The returned pending covers the whole forest. ``check_growth=False`` skips the
        check that it does (a device sync), for a caller that grew the forest from past's itself.
        """
        mtp_hidden, pending = self._forward_tree(hidden, token_ids, ctx, past, check_growth)
        return mtp_hidden, F.linear(mtp_hidden, self.lm_head), pending

    @torch.no_grad()
    def commit(self, pending: PendingCommit, accepted_leaf: torch.Tensor, *, check: bool = True) -> None:
        """Write the K/V of each request's path to ``accepted_leaf[b]`` into the MTP cache
        (``check=False``: see :meth:`PendingCommit.commit`)."""
        pending.commit(accepted_leaf, check=check)

    @torch.no_grad()
    def prefill(
        self, hidden: torch.Tensor, token_ids: torch.Tensor, ctx: StepContext, *, check: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chains of rows (``ctx`` from :meth:`StepContext.chains`: a prompt's) written straight into the
        MTP cache; ``check=False``: see :meth:`PendingCommit.commit`.

        Returns ``(mtp_hidden [N, h], logits [B, V])`` at each chain's last row.
        """
        leaves = ctx.prefill_plan().ends
        mtp_hidden, pending = self._forward_tree(hidden, token_ids, ctx)
        pending.commit(leaves, check=check)
        return mtp_hidden, F.linear(mtp_hidden[ctx.tree.cu_seqlens[1:] - 1], self.lm_head)

    def forward_sequences(
        self, hidden: torch.Tensor, next_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cache-less and differentiable, for next-next-token training: ``hidden [B, L, h]`` of the
        target at positions ``0 .. L - 1`` and ``next_ids [B, L]``, the tokens at positions
        ``1 .. L`` (the target's input ids shifted left by one). Returns ``(mtp_hidden, logits)``;
        ``logits[:, p]`` predicts the token at position ``p + 2``, and ``mtp_hidden`` can be fed back
        as ``hidden`` for a further step, the way a deeper draft uses it."""
        if next_ids.shape != hidden.shape[:2]:
            raise ValueError(
                f"next_ids {tuple(next_ids.shape)} must match hidden's [B, L] {tuple(hidden.shape[:2])}"
            )
        state = SequenceState.build(hidden.shape[1], self.config, self.fc.dtype, hidden.device)
        x = ops.rms_norm(self.layer(self._fuse(hidden, next_ids), state), self.norm, self.eps)
        return x, F.linear(x, self.lm_head)


def _grown_from(
    past: PendingCommit, ctx: StepContext, check: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The new nodes of a grown forest, and the earlier nodes' K/V placed at their new indices.

    ``check``: that the forest extends the past one (one device sync); the placement itself is gathers
    and a stable sort, where boolean-mask indexing would wait for the device at every use, or a padding
    where every request grows alike (:func:`_grown_alike`)."""
    old, tree = past.ctx.tree, ctx.tree
    mismatch = old.num_requests != tree.num_requests or old.num_nodes > tree.num_nodes
    if mismatch or (check and not _extends(past, ctx)):
        raise ValueError(
            "past must come from the same step (slots, context_lens) and ctx.tree must extend its forest: "
            "each request keeps its earlier nodes first, with the same parents, and appends new ones"
        )
    if _alike(old, tree):
        return _grown_alike(past, tree.num_requests, old.max_nodes, tree.max_nodes)
    earlier, source = _earlier_nodes(old, tree)
    keep = earlier[None, :, None, None]
    placed = [torch.where(keep, kv[:, source], 0) for kv in (past.new_k, past.new_v)]
    # The new nodes in packed order: a stable sort puts the not-earlier ones first.
    rows = torch.sort(earlier.to(torch.uint8), stable=True).indices[: tree.num_nodes - old.num_nodes]
    return rows, *placed


def _earlier_nodes(old: TreeBatch, tree: TreeBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of the grown forest's nodes the old forest had (bool ``[N]``), and their old indices."""
    old_lens = old.cu_seqlens[1:] - old.cu_seqlens[:-1]
    local = torch.arange(tree.num_nodes, device=tree.parents.device) - tree.cu_seqlens[:-1][tree.request]
    earlier = local < old_lens[tree.request]
    return earlier, (old.cu_seqlens[:-1][tree.request] + local).clamp(max=old.num_nodes - 1)


def _extends(past: PendingCommit, ctx: StepContext) -> bool:
    """Whether ``ctx`` is past's step and its forest keeps each request's old nodes first, with the same
    parents (one device sync)."""
    old, tree = past.ctx.tree, ctx.tree
    earlier, source = _earlier_nodes(old, tree)
    return not bool(
        (old.cu_seqlens[1:] - old.cu_seqlens[:-1] > tree.cu_seqlens[1:] - tree.cu_seqlens[:-1]).any()
        | (earlier & (tree.parents != old.parents[source])).any()
        | (past.ctx.context_lens != ctx.context_lens).any()
        | (past.ctx.slots != ctx.slots).any()
    )


def _alike(old: TreeBatch, tree: TreeBatch) -> bool:
    """Whether every request has as many nodes as the largest, before and after (host ints)."""
    b = tree.num_requests
    return old.num_nodes == b * old.max_nodes and tree.num_nodes == b * tree.max_nodes


def _grown_alike(
    past: PendingCommit, num_requests: int, old_nodes: int, new_nodes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_grown_from` where every request has ``old_nodes`` nodes before and ``new_nodes`` after
    (host ints; so the drafter's forests grow): the placement is a padding of each request's rows, three
    kernels instead of ~16 a draft level."""
    added = new_nodes - old_nodes
    rows = torch.arange(num_requests * new_nodes, device=past.new_k.device).view(num_requests, new_nodes)
    placed = [
        F.pad(kv.unflatten(1, (num_requests, old_nodes)), (0, 0, 0, 0, 0, added)).flatten(1, 2)
        for kv in (past.new_k, past.new_v)
    ]
    return rows[:, old_nodes:].flatten(), *placed
