"""Prefills as CUDA graphs: the target's prefill and the MTP head's rows of the same prompts.

A small model's prefill is bound by the host: the embedded model's forward is ~160 launches, ~11.5 ms
of host time on the H200 against ~2.4 ms of GPU work
(benchmarks/results/probe_prefill_host_h200_host_chains.txt), and a step that admits requests waits
for it. Replayed from a graph it costs the GPU's time and a few
copies.

Prompts come in every length, so a graph is kept per ``(chains, tokens)``: the prefill's chains followed
by one padding chain that fills the tokens up to a power of two (:func:`padded_tokens`), on a scratch
state slot of its own, zeroed by the graph before each forward, with no blocks in its table (its K/V
writes are dropped) and no committed tokens (:meth:`~trtllm_bole.models.cache.PrefillBatch.padded`).
Every operator keeps a chain's rows, slot and blocks to itself, so the padding chain changes no value of
the others' outputs or caches (tests/spec/test_prefill_graphs.py checks it on the CPU, eagerly); only
the matmuls' row count changes with the padding, as it changes with how prompts are grouped. The
forest's shapes are then the key's: its chains declared as deep as the tokens (the attention sizes its
launch by that bound and masks the rest) and the GDN layers' chunks at a fixed capacity, the extra
chunks empty (:func:`~trtllm_bole.tree.chunk_capacity`). Before a replay the chains' context, made on
the host and moved as for an eager prefill, is copied into the graph's static one.

Graphs are captured on first sight, at most ``max_graphs`` of them and up to ``max_tokens`` tokens;
other prefills run eagerly (at a real model's size a long prefill is GPU work, which a graph does not
shorten). The outputs are the graph's, valid until its next replay: the executor copies what it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch

from trtllm_bole.models.cache import PREFILL_CHUNK, PrefillBatch, StepContext
from trtllm_bole.models.model import Qwen35Model
from trtllm_bole.models.mtp import MTPHead
from trtllm_bole.spec.graphs import CacheGraphs
from trtllm_bole.tree import chunk_capacity

Owner = TypeVar("Owner")

MIN_TOKENS = 16
"""The fewest tokens a prefill graph is captured for."""


def padded_tokens(num_tokens: int) -> int:
    """The tokens of the graph that serves a prefill of ``num_tokens``: a power of two with room for a
    padding chain of at least one token, so that at most ~log2(max_tokens) sizes are ever captured."""
    return max(MIN_TOKENS, 1 << num_tokens.bit_length())


@dataclass(slots=True)
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # static per-node inputs [tokens, ...]
    ctx: StepContext
    outputs: tuple[torch.Tensor, torch.Tensor]  # per-node [tokens, ...] and per-chain [chains, ...]

    def load(self, inputs: tuple[torch.Tensor, ...], ctx: StepContext) -> None:
        """Copy a prefill's inputs (its real rows; the padding rows keep earlier values) and its padded
        context into the static ones."""
        for buffer, value in zip(self.inputs, inputs, strict=True):
            buffer[: value.shape[0]].copy_(value)
        for static, value in zip(_context_tensors(self.ctx), _context_tensors(ctx), strict=True):
            static.copy_(value)


def _context_tensors(ctx: StepContext) -> list[torch.Tensor]:
    """Every tensor of a prefill's context, in one order (their shapes are the graph key's)."""
    chunks = ctx.plan.chunks
    return [ctx.slots, ctx.block_tables, ctx.context_lens, *ctx.tree.tensors(), ctx.plan.ends,
            *chunks.tree.tensors(), chunks.first]  # fmt: skip


class PrefillGraphs(CacheGraphs[Owner]):
    """A prefill forward (``_forward(inputs, ctx)``: per-node input tensors and a prefill's step context,
    returning per-node and per-chain outputs) replayed from CUDA graphs of padded shapes, for block tables
    up to ``table_width`` blocks; the padding chain lives in state slot ``scratch_slot``."""

    def __init__(
        self,
        owner: Owner,
        *,
        table_width: int,
        scratch_slot: int,
        max_tokens: int = 4096,
        max_graphs: int = 64,
    ) -> None:
        super().__init__(owner)
        self.table_width, self.scratch_slot = table_width, scratch_slot
        self.max_tokens, self.max_graphs = max_tokens, max_graphs

    def _forward(
        self, inputs: tuple[torch.Tensor, ...], ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _placeholders(self, num_nodes: int) -> tuple[torch.Tensor, ...]:
        """Per-node inputs of the captured shape (their values do not matter)."""
        raise NotImplementedError

    @property
    def _device(self) -> torch.device:
        return next(self.owner.parameters()).device

    def __call__(
        self, inputs: tuple[torch.Tensor, ...], batch: PrefillBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_forward`` of ``batch``'s chains: per-node outputs ``[N, ...]`` and per-chain ones ``[B, ...]``,
        replayed (or run eagerly past ``max_tokens`` or ``max_graphs``), valid until the next call."""
        num_tokens, num_chains = sum(batch.lengths), len(batch.lengths)
        tokens = padded_tokens(num_tokens)
        key = (num_chains + 1, tokens)
        self._follow_cache()
        if tokens > self.max_tokens or (key not in self._graphs and len(self._graphs) >= self.max_graphs):
            return self._forward(inputs, batch.context(self._device))
        captured = self._graphs.get(key) or self._capture_prefill(key)
        padded = batch.padded(tokens, self.scratch_slot, self.table_width)
        captured.load(inputs, self._padded_context(padded))
        captured.graph.replay()
        per_node, per_chain = captured.outputs
        return per_node[:num_tokens], per_chain[:num_chains]

    def _padded_context(self, batch: PrefillBatch) -> StepContext:
        tokens = sum(batch.lengths)
        capacity = chunk_capacity(len(batch.lengths), tokens, PREFILL_CHUNK)
        return batch.context(self._device, max_depth=tokens, chunk_capacity=capacity)

    def _capture_prefill(self, key: tuple[int, int]) -> _Captured:
        """Captured on chains of one token and the padding chain, every one on the scratch slot with no
        blocks: the warm-up runs write nothing of a live request's."""
        chains, tokens = key
        ones = chains - 1
        no_blocks = torch.zeros((ones, 0), dtype=torch.int32)
        placeholder = PrefillBatch((1,) * ones, (self.scratch_slot,) * ones, no_blocks, (0,) * ones)
        ctx = self._padded_context(placeholder.padded(tokens, self.scratch_slot, self.table_width))
        inputs = self._placeholders(tokens)
        graph, outputs = self._capture(lambda: self._forward(inputs, ctx))
        self._graphs[key] = _Captured(graph, inputs, ctx, outputs)
        return self._graphs[key]


class TargetPrefillGraphs(PrefillGraphs[Qwen35Model]):
    """The target's ``prefill(input_ids, ctx)``: inputs ``(input_ids,)``; returns ``(hidden, logits)``.
    The scratch slot's GDN and conv state are zeroed first, so that the padding chain's state never
    grows from replay to replay."""

    def _forward(
        self, inputs: tuple[torch.Tensor, ...], ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cache = self.owner.cache
        cache.gdn_state[:, self.scratch_slot].zero_()
        cache.conv_state[:, self.scratch_slot].zero_()
        return self.owner.prefill(*inputs, ctx, check=False)

    def _placeholders(self, num_nodes: int) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(num_nodes, dtype=torch.long, device=self.owner.device),)


class MTPPrefillGraphs(PrefillGraphs[MTPHead]):
    """The MTP head's ``prefill(hidden, token_ids, ctx)``: inputs ``(hidden, token_ids)``; returns
    ``(mtp_hidden, logits)``."""

    def _forward(
        self, inputs: tuple[torch.Tensor, ...], ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.owner.prefill(*inputs, ctx, check=False)

    def _placeholders(self, num_nodes: int) -> tuple[torch.Tensor, ...]:
        fc = self.owner.fc
        hidden = torch.zeros(num_nodes, self.owner.config.hidden_size, dtype=fc.dtype, device=fc.device)
        return hidden, torch.zeros(num_nodes, dtype=torch.long, device=fc.device)


__all__ = ["MTPPrefillGraphs", "PrefillGraphs", "TargetPrefillGraphs", "padded_tokens"]
