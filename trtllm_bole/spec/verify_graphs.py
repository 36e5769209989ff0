"""Forests as CUDA graphs: the target's verify and the MTP's follow-up, one captured forward per shape.

A verify of a small model is a few hundred kernels of a few microseconds each; launched from Python
the step's verify phase is the host's time (benchmarks/results/profile_step_h200.json: 9-10 ms of host
work for the embedded model at batch 8 and 32), replayed as a graph it costs the GPU's. The forwards
queue no device sync: the only value check on their path, the slot indices' range, is skipped while a
graph captures (:func:`trtllm_bole.ops`), and the executor builds the slots itself.
:class:`VerifyGraphs` replays :meth:`Qwen35Model.verify` (the budget's calibration times it);
:class:`StepGraphs` a batch's verify with its acceptance, greedy or sampled, and commit;
:class:`MTPGraphs` the MTP head's verify over the accepted paths, which the executor pads to chains of
one length so that its shape is the batch's.

A graph is kept per ``(variant, requests, nodes, largest request)`` (the variant: the target's GDN
scheme, and for a step whether it samples): the shapes of every tensor of the forward. Everything else
is copied into the graph's static inputs before a replay: the per-node inputs (tokens, and the MTP's
hidden rows), a sampled step's settings and coins, the slots, the context lengths, the block tables
(padded with ``NO_BLOCK`` to ``table_width`` blocks, the widest a request can need: reads there are
masked by the context lengths, writes dropped) and the forest's metadata, its paths padded to
``max_depth`` columns (``-1``, as for any path shorter than the deepest). A deeper ``max_depth`` than
the forest's own changes no value: the kernels read a node's path up to its depth (the closed form's
solve never depended on it). Forests are
captured on first sight, at most ``max_graphs`` of them (later shapes run eagerly), or ahead of traffic
by :meth:`ForestGraphs.capture` (the executor's ``capture_graphs``: every batch size with full trees and
full chains). The outputs are the graph's, valid until its next replay: a verify's logits, hidden states
and pending commit, which the executor reads and commits before then; a step's hidden states, accepted
leaves and bonus tokens (its commit is inside the graph).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from trtllm_bole.models.cache import NO_BLOCK, StepContext, load_block_table
from trtllm_bole.models.model import Qwen35Model
from trtllm_bole.models.mtp import MTPHead
from trtllm_bole.spec.acceptance import Sampling, accept
from trtllm_bole.spec.graphs import CacheGraphs
from trtllm_bole.tree import TreeBatch

Owner = TypeVar("Owner")
_TREE_FIELDS = ("parents", "cu_seqlens", "depth", "request", "global_parents", "dfs_order", "subtree_size")


@dataclass(slots=True)
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # static inputs
    ctx: StepContext
    outputs: Any  # the captured call's outputs, refilled by every replay


def placeholder_forest(num_requests: int, num_nodes: int, max_nodes: int, max_depth: int) -> TreeBatch:
    """A valid host forest of these sizes to capture a verify on (a capture records kernels, not values):
    request 0 holds ``max_nodes`` nodes, the others share the rest; each request is a chain as deep as
    ``max_depth`` allows, with its remaining nodes children of the root. Its paths are ``max_depth``
    wide."""
    if not num_requests + max_nodes - 1 <= num_nodes <= num_requests * max_nodes:
        raise ValueError(f"{num_requests} requests of at most {max_nodes} nodes cannot hold {num_nodes}")
    rest, others = num_nodes - max_nodes, max(num_requests - 1, 1)
    sizes = [max_nodes] + [rest // others + (i < rest % others) for i in range(num_requests - 1)]
    parents = []
    for size in sizes:
        chain = min(size, max_depth)
        parents += [i - 1 for i in range(chain)] + [-1] * (size - chain)
    cu_seqlens = torch.tensor([0, *sizes]).cumsum(0)
    return pad_depth(TreeBatch.build(torch.tensor(parents), cu_seqlens), max_depth)


def pad_depth(tree: TreeBatch, max_depth: int) -> TreeBatch:
    """The same forest with its paths ``max_depth`` wide (``-1`` padded) and ``max_depth`` to match."""
    if tree.max_depth > max_depth:
        raise ValueError(f"the forest is {tree.max_depth} deep, more than the {max_depth} asked")
    paths = torch.nn.functional.pad(tree.paths, (0, max_depth - tree.max_depth), value=-1)
    return replace(tree, path_table=paths, max_depth=max_depth)


class ForestGraphs(CacheGraphs[Owner]):
    """A forward over a forest (``_forward(inputs, ctx, variant)``: per-node input tensors, a step context
    and a hashable variant) replayed from CUDA graphs, for forests up to ``max_depth`` deep and block
    tables up to ``table_width`` blocks."""

    def __init__(self, owner: Owner, *, max_depth: int, table_width: int, max_graphs: int = 96) -> None:
        super().__init__(owner)
        self.max_depth, self.table_width, self.max_graphs = max_depth, table_width, max_graphs

    def _forward(self, inputs: tuple[torch.Tensor, ...], ctx: StepContext, variant: Hashable) -> Any:
        raise NotImplementedError

    def _placeholders(self, batch: int, num_nodes: int, variant: Hashable) -> tuple[torch.Tensor, ...]:
        """Inputs of the captured shape (their values do not matter)."""
        raise NotImplementedError

    def __call__(self, inputs: tuple[torch.Tensor, ...], ctx: StepContext, variant: Hashable) -> Any:
        """``_forward(inputs, ctx, variant)``, replayed (or run eagerly once ``max_graphs`` shapes are
        captured). The outputs are valid until the next call."""
        tree = ctx.tree
        if tree.max_depth > self.max_depth or ctx.block_tables.shape[1] > self.table_width:
            raise ValueError(
                f"a forest {tree.max_depth} deep with block tables of {ctx.block_tables.shape[1]} blocks "
                f"exceeds the captured {self.max_depth} and {self.table_width}"
            )
        self._follow_cache()
        key = (variant, tree.num_requests, tree.num_nodes, tree.max_nodes)
        captured = self._graphs.get(key)
        if captured is None and len(self._graphs) >= self.max_graphs:
            return self._forward(inputs, ctx, variant)
        captured = captured or self._capture_forest(key, tree.parents.device)
        _load(captured, inputs, ctx)
        captured.graph.replay()
        return captured.outputs

    def capture(self, shapes: Iterable[tuple[int, int, int]], variant: Hashable) -> list[tuple]:
        """Capture the graphs of these ``(requests, nodes, largest request)`` shapes now, so that traffic
        meets none; returns the keys captured by this call."""
        self._follow_cache()
        new = [(variant, *shape) for shape in shapes if (variant, *shape) not in self._graphs]
        device = next(self.owner.parameters()).device
        for key in new:
            self._capture_forest(key, device)
        return new

    def _capture_forest(self, key: tuple, device: torch.device) -> _Captured:
        variant, batch, num_nodes, max_nodes = key
        tree = placeholder_forest(batch, num_nodes, max_nodes, self.max_depth).to(device)
        tree = replace(tree, **{f: getattr(tree, f).clone() for f in (*_TREE_FIELDS, "path_table")})
        slots = torch.arange(batch, device=device)  # distinct slots: the warm-up run checks them
        tables = torch.full((batch, self.table_width), NO_BLOCK, dtype=torch.int32, device=device)
        ctx = StepContext(slots, tables, torch.zeros(batch, dtype=torch.long, device=device), tree)
        inputs = self._placeholders(batch, num_nodes, variant)
        graph, outputs = self._capture(lambda: self._forward(inputs, ctx, variant))
        self._graphs[key] = _Captured(graph, inputs, ctx, outputs)
        return self._graphs[key]


class VerifyGraphs(ForestGraphs[Qwen35Model]):
    """The target's ``verify(tokens, ctx, gdn_scheme=...)``: inputs ``(tokens,)``, the variant is the
    GDN scheme."""

    def _forward(self, inputs: tuple[torch.Tensor, ...], ctx: StepContext, variant: Hashable) -> Any:
        return self.owner.verify(*inputs, ctx, gdn_scheme=variant)

    def _placeholders(self, batch: int, num_nodes: int, variant: Hashable) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(num_nodes, dtype=torch.long, device=self.owner.device),)


class StepGraphs(ForestGraphs[Qwen35Model]):
    """A batch's verify, acceptance and commit in one graph: ``verify(tokens, ctx, gdn_scheme=...)``,
    :func:`~trtllm_bole.spec.acceptance.accept` on its logits, and the commit of each request's accepted
    path, which are ~100 more small kernels a step to launch from the host (~150 sampled). The variant is
    ``(gdn_scheme, kind)``, the kind of the batch's settings
    (:attr:`~trtllm_bole.spec.drafter.DraftSettings.kind`); inputs ``(tokens, armed)``, sampled
    ``(tokens, armed, *sampling)`` with a :class:`~trtllm_bole.spec.acceptance.Sampling` of ``coins`` coins
    a request; returns ``(hidden, leaf, bonus)``.

    A capture runs the forward twice before it records it, on placeholder inputs whose slots
    (``0 .. B-1``) may be live requests': there ``armed`` is false and every leaf becomes -1, which
    commits nothing (the placeholder tables hold no blocks, so no K/V is written either); callers pass
    it true."""

    def __init__(
        self, owner: Qwen35Model, *, max_depth: int, table_width: int, coins: int, max_graphs: int = 96
    ) -> None:
        super().__init__(owner, max_depth=max_depth, table_width=table_width, max_graphs=max_graphs)
        self.coins = coins

    def _forward(self, inputs: tuple[torch.Tensor, ...], ctx: StepContext, variant: Hashable) -> Any:
        (tokens, armed, *sampling), (scheme, kind) = inputs, variant
        logits, hidden, pending = self.owner.verify(tokens, ctx, gdn_scheme=scheme)
        sampling = Sampling(*sampling) if kind != "greedy" else None
        leaf, bonus = accept(ctx.tree, tokens, logits, sampling, filtered=kind == "filtered")
        pending.commit(torch.where(armed, leaf, -1), check=False)
        return hidden, leaf, bonus

    def _placeholders(self, batch: int, num_nodes: int, variant: Hashable) -> tuple[torch.Tensor, ...]:
        device = self.owner.device
        tokens = torch.zeros(num_nodes, dtype=torch.long, device=device)
        armed = torch.zeros((), dtype=torch.bool, device=device)
        if variant[1] == "greedy":
            return tokens, armed
        temperature, top_p = torch.ones(batch, device=device), torch.ones(batch, device=device)
        top_k, coins = (
            torch.zeros(batch, dtype=torch.long, device=device),
            torch.zeros(batch, self.coins, dtype=torch.float64, device=device),  # as draw_coins draws them
        )
        return tokens, armed, *Sampling(temperature, top_k, top_p, coins)  # each its own buffer


class MTPGraphs(ForestGraphs[MTPHead]):
    """The MTP head's ``verify(hidden, token_ids, ctx)`` (the executor's follow-up over the accepted paths,
    padded to chains of one length): inputs ``(hidden, token_ids)``; one variant."""

    def _forward(self, inputs: tuple[torch.Tensor, ...], ctx: StepContext, variant: Hashable) -> Any:
        return self.owner.verify(*inputs, ctx)

    def _placeholders(self, batch: int, num_nodes: int, variant: Hashable) -> tuple[torch.Tensor, ...]:
        fc = self.owner.fc
        hidden = torch.zeros(num_nodes, self.owner.config.hidden_size, dtype=fc.dtype, device=fc.device)
        return hidden, torch.zeros(num_nodes, dtype=torch.long, device=fc.device)


def _load(captured: _Captured, inputs: tuple[torch.Tensor, ...], ctx: StepContext) -> None:
    """Copy a step's inputs into a graph's static ones."""
    static, tree = captured.ctx, ctx.tree
    for buffer, value in zip(captured.inputs, inputs, strict=True):
        buffer.copy_(value)
    static.slots.copy_(ctx.slots)
    static.context_lens.copy_(ctx.context_lens)
    load_block_table(static.block_tables, ctx.block_tables)
    for name in _TREE_FIELDS:
        getattr(static.tree, name).copy_(getattr(tree, name))
    static.tree.paths.fill_(-1)
    static.tree.paths[:, : tree.max_depth].copy_(tree.paths)


__all__ = ["ForestGraphs", "MTPGraphs", "StepGraphs", "VerifyGraphs", "pad_depth", "placeholder_forest"]
