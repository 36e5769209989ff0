"""The target verify as CUDA graphs: one captured :meth:`Qwen35Model.verify` per forest shape.

A verify of a small model is a few hundred kernels of a few microseconds each; launched from Python
the step's verify phase is the host's time (benchmarks/results/profile_step_h200.json: 9-10 ms of host
work for the embedded model at batch 8 and 32), replayed as a graph it costs the GPU's. The forward
queues no device sync: the only value check on its path, the slot indices' range, is skipped while a
graph captures (:func:`trtllm_bole.ops`), and the executor builds the slots itself.

A graph is kept per ``(gdn_scheme, requests, nodes, largest request)``: the shapes of every tensor of
the forward. Everything else is copied into the graph's static inputs before a replay: the tokens,
the slots, the context lengths, the block tables (padded to ``table_width`` blocks, the widest a
request can need; the padding is masked by the context lengths like any block beyond a request's own)
and the forest's metadata, its paths padded to ``max_depth`` columns (``-1``, as for any path shorter
than the deepest). A deeper ``max_depth`` than the forest's own changes no value: the kernels read a
node's path up to its depth, and the closed form's extra squarings multiply by ``I + G^(2^j)`` with
``G^(2^j)`` exactly zero (Lemma 3). Forests are captured on first sight, at most ``max_graphs`` of them
(later shapes run eagerly), or ahead of traffic by :meth:`VerifyGraphs.capture` (the executor's
``capture_graphs``: every batch size with full trees). The outputs (logits, hidden states and the
pending commit) are the graph's: the executor reads and commits them before the next verify.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from trtllm_bole.models.cache import PendingCommit, StepContext
from trtllm_bole.models.model import Qwen35Model
from trtllm_bole.spec.graphs import CacheGraphs
from trtllm_bole.tree import TreeBatch

_TREE_FIELDS = ("parents", "cu_seqlens", "depth", "request", "global_parents", "dfs_order", "subtree_size")


@dataclass(slots=True)
class _Captured:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # static inputs
    ctx: StepContext
    outputs: tuple[torch.Tensor, torch.Tensor, PendingCommit]  # logits, hidden, pending: refilled by replays


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
    return replace(tree, paths=paths, max_depth=max_depth)


class VerifyGraphs(CacheGraphs[Qwen35Model]):
    """``model.verify`` replayed from CUDA graphs, for forests up to ``max_depth`` deep and block tables
    up to ``table_width`` blocks."""

    def __init__(self, model: Qwen35Model, *, max_depth: int, table_width: int, max_graphs: int = 96) -> None:
        super().__init__(model)
        self.max_depth, self.table_width, self.max_graphs = max_depth, table_width, max_graphs

    @property
    def model(self) -> Qwen35Model:
        return self.owner

    def __call__(
        self, tokens: torch.Tensor, ctx: StepContext, gdn_scheme: str
    ) -> tuple[torch.Tensor, torch.Tensor, PendingCommit]:
        """``model.verify(tokens, ctx, gdn_scheme=gdn_scheme)``, replayed (or run eagerly once
        ``max_graphs`` shapes are captured). The outputs are valid until the next call."""
        tree = ctx.tree
        if tree.max_depth > self.max_depth or ctx.block_tables.shape[1] > self.table_width:
            raise ValueError(
                f"a forest {tree.max_depth} deep with block tables of {ctx.block_tables.shape[1]} blocks "
                f"exceeds the captured {self.max_depth} and {self.table_width}"
            )
        self._follow_cache()
        key = (gdn_scheme, tree.num_requests, tree.num_nodes, tree.max_nodes)
        captured = self._graphs.get(key)
        if captured is None and len(self._graphs) >= self.max_graphs:
            return self.model.verify(tokens, ctx, gdn_scheme=gdn_scheme)
        captured = captured or self._capture_forest(key, tokens.device)
        _load(captured, tokens, ctx)
        captured.graph.replay()
        return captured.outputs

    def capture(self, shapes, gdn_scheme: str) -> list[tuple]:
        """Capture the graphs of these ``(requests, nodes, largest request)`` shapes now, so that traffic
        meets none; returns the keys captured by this call."""
        self._follow_cache()
        device = self.model.device
        new = [(gdn_scheme, *shape) for shape in shapes if (gdn_scheme, *shape) not in self._graphs]
        for key in new:
            self._capture_forest(key, device)
        return new

    def _capture_forest(self, key: tuple, device: torch.device) -> _Captured:
        gdn_scheme, batch, num_nodes, max_nodes = key
        tree = placeholder_forest(batch, num_nodes, max_nodes, self.max_depth).to(device)
        tree = replace(tree, **{f: getattr(tree, f).clone() for f in (*_TREE_FIELDS, "paths")})
        slots = torch.arange(batch, device=device)  # distinct slots: the warm-up run checks them
        tables = torch.zeros(batch, self.table_width, dtype=torch.int32, device=device)
        ctx = StepContext(slots, tables, torch.zeros(batch, dtype=torch.long, device=device), tree)
        tokens = torch.zeros(num_nodes, dtype=torch.long, device=device)
        graph, outputs = self._capture(lambda: self.model.verify(tokens, ctx, gdn_scheme=gdn_scheme))
        self._graphs[key] = _Captured(graph, tokens, ctx, outputs)
        return self._graphs[key]


def _load(captured: _Captured, tokens: torch.Tensor, ctx: StepContext) -> None:
    """Copy a step's inputs into a graph's static ones."""
    static, tree = captured.ctx, ctx.tree
    captured.tokens.copy_(tokens)
    static.slots.copy_(ctx.slots)
    static.context_lens.copy_(ctx.context_lens)
    static.block_tables.zero_()
    static.block_tables[:, : ctx.block_tables.shape[1]].copy_(ctx.block_tables)
    for name in _TREE_FIELDS:
        getattr(static.tree, name).copy_(getattr(tree, name))
    static.tree.paths.fill_(-1)
    static.tree.paths[:, : tree.max_depth].copy_(tree.paths)


__all__ = ["VerifyGraphs", "pad_depth", "placeholder_forest"]
