"""Drafting as CUDA graphs: one captured :func:`~trtllm_bole.spec.drafter.draft` per batch size.

A draft is eight small MTP passes with tree bookkeeping between them, a few hundred kernels of a few
microseconds each: launched one by one from Python it costs the host tens of milliseconds a step
(``benchmarks/results/profile_step_h200.json``), replayed as a graph it costs the GPU's time. Drafting
queues no device sync (``tests/models/test_tree_verify.py``), so the whole loop captures.

Every launch of a graph reads fixed addresses: the step's inputs are copied into static buffers of the
captured shape (the block tables padded with ``NO_BLOCK`` to the widest a request can need,
``table_width``: reads there are masked by the context lengths, writes dropped), and the MTP's KV cache
must be the one captured: graphs are kept per MTP head and configuration (:meth:`DraftGraphs.of`) and
dropped when the model's cache is reallocated (a model zeroes and keeps a cache that covers the sizes
asked, so executors that follow one another reuse them). A graph is kept per ``(batch size, kind)``
(:attr:`~trtllm_bole.spec.drafter.DraftSettings.kind`): a batch with a sampled request ranks its drafts
by each request's distribution (temperature; with top-k or top-p, a vocabulary sort per row; no
randomness), whose settings are copied in as inputs; an all-greedy batch skips all that. Each is
captured on its first draft, or ahead of traffic by :meth:`DraftGraphs.capture` (``LLM.warm_up`` and the
benchmarks' warm-ups capture every batch size they may serve). The graphs share one memory pool
(:mod:`.graphs`): each keeps its candidate pool, the temporaries are shared.

The tree selection that follows (:func:`~trtllm_bole.spec.drafter.select_tree`: ~70 small kernels,
~2 ms of host time a step launched one by one) replays from :class:`SelectGraphs`, for every batch,
greedy or sampled: one graph per pool shape and number of nodes kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from trtllm_bole.models.cache import NO_BLOCK, load_block_table
from trtllm_bole.models.mtp import MTPHead
from trtllm_bole.spec.drafter import CandidatePool, DraftSettings, draft, select_tree, selection_size
from trtllm_bole.spec.graphs import CacheGraphs
from trtllm_bole.tree import TreeBatch


@dataclass(slots=True)
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # pending, last_hidden, slots, tables, mtp_context_lens
    settings: DraftSettings  # static too: a sampled batch's are copied in
    pool: CandidatePool  # the captured outputs, refilled by every replay


class DraftGraphs(CacheGraphs[MTPHead]):
    """Drafts of ``mtp`` (``top_k``, ``depth``) replayed from one CUDA graph per batch size and kind of
    settings (keys ``(batch, kind)``)."""

    def __init__(self, mtp: MTPHead, *, top_k: int, depth: int, table_width: int) -> None:
        super().__init__(mtp)
        self.top_k, self.depth, self.table_width = top_k, depth, table_width

    @property
    def mtp(self) -> MTPHead:
        return self.owner

    def __call__(
        self,
        pending: torch.Tensor,
        last_hidden: torch.Tensor,
        slots: torch.Tensor,
        block_tables: torch.Tensor,
        mtp_context_lens: torch.Tensor,
        settings: DraftSettings,
    ) -> CandidatePool:
        """:func:`draft` of these inputs. The pool's tensors are the graph's: read them before the next
        call at this batch size."""
        if block_tables.shape[1] > self.table_width:
            raise ValueError(
                f"block tables of {block_tables.shape[1]} blocks exceed the captured {self.table_width}"
            )
        self._follow_cache()
        key = (pending.numel(), settings.kind)
        captured = self._graphs.get(key) or self._capture_batch(
            pending, last_hidden, slots, mtp_context_lens, settings
        )
        static_pending, static_hidden, static_slots, static_tables, static_lens = captured.inputs
        if not settings.all_greedy:
            for name in ("temperature", "top_k", "top_p"):
                getattr(captured.settings, name).copy_(getattr(settings, name))
        static_pending.copy_(pending)
        static_hidden.copy_(last_hidden)
        static_slots.copy_(slots)
        load_block_table(static_tables, block_tables)
        static_lens.copy_(mtp_context_lens)
        captured.graph.replay()
        return captured.pool

    def capture(self, batch_sizes: Iterable[int], kind: str = "greedy") -> list[int]:
        """Capture the graphs of these batch sizes of this :attr:`DraftSettings.kind` now (on placeholder
        inputs: a capture records kernels, not values), so that traffic meets none; returns the batch
        sizes captured by this call."""
        self._follow_cache()
        new = [b for b in batch_sizes if (b, kind) not in self._graphs]
        device, dtype = self.mtp.fc.device, self.mtp.fc.dtype
        temperature, top_p = float(kind != "greedy"), 0.5 if kind == "filtered" else 1.0
        for b in new:
            zeros = torch.zeros(b, dtype=torch.long, device=device)
            hidden = torch.zeros(b, self.mtp.config.hidden_size, dtype=dtype, device=device)
            settings = DraftSettings.of([temperature] * b, [0] * b, [top_p] * b, device)
            self._capture_batch(zeros, hidden, zeros, zeros, settings)
        return new

    def _capture_batch(
        self,
        pending: torch.Tensor,
        last_hidden: torch.Tensor,
        slots: torch.Tensor,
        mtp_context_lens: torch.Tensor,
        settings: DraftSettings,
    ) -> _Captured:
        b = pending.numel()
        tables = torch.full((b, self.table_width), NO_BLOCK, dtype=torch.int32, device=pending.device)
        inputs = (pending.clone(), last_hidden.clone(), slots.clone(), tables, mtp_context_lens.clone())
        settings = DraftSettings(
            *(t.clone() for t in (settings.temperature, settings.top_k, settings.top_p)), settings.kind
        )

        graph, pool = self._capture(
            lambda: draft(self.mtp, *inputs, settings, top_k=self.top_k, depth=self.depth)
        )
        key = (b, settings.kind)
        self._graphs[key] = _Captured(graph, inputs, settings, pool)
        return self._graphs[key]


_POOL_FIELDS = ("tokens", "parents", "request", "depth", "log_rho")


class SelectGraphs(CacheGraphs[MTPHead]):
    """:func:`select_tree` of ``mtp``'s drafts replayed from one CUDA graph per ``(requests, pool size, pool
    depth, root children, per-request cap, nodes kept, under a budget)``: at most ``max_graphs`` of them
    (later shapes run eagerly). Kept per MTP head (:meth:`of`), so the executors that follow one another
    share them, and dropped with its draft graphs when its cache is reallocated (selection itself reads
    no cache)."""

    def __init__(self, mtp: MTPHead, *, max_graphs: int = 256) -> None:
        super().__init__(mtp)
        self.max_graphs = max_graphs

    def __call__(
        self, pool: CandidatePool, num_requests: int, *, per_request: int, total: int | None = None
    ) -> tuple[torch.Tensor, TreeBatch, torch.Tensor]:
        """``select_tree(pool, num_requests, per_request=..., total=...)``; the outputs are the graph's:
        read them before the next call."""
        self._follow_cache()
        size, root_children = pool.tokens.numel(), pool.root_children
        num_kept, _ = selection_size(size, num_requests, per_request, total, root_children=root_children)
        key = (num_requests, size, pool.max_depth, root_children, per_request, num_kept, total is not None)
        captured = self._graphs.get(key)
        if captured is None and len(self._graphs) >= self.max_graphs:
            return select_tree(pool, num_requests, per_request=per_request, total=total)
        graph, static, outputs = captured or self._capture_select(key)
        for name in _POOL_FIELDS:
            getattr(static, name).copy_(getattr(pool, name))
        graph.replay()
        return outputs

    def capture(
        self, shapes: Iterable[tuple[int, int, int, int, int]], *, budget: bool = False
    ) -> list[tuple]:
        """Capture now, so that traffic meets none, the selections of full trees from pools of these
        ``(requests, pool size, pool depth, root children, per-request cap)``, under a budget that keeps
        them whole or (``budget=False``) none; returns the keys captured by this call."""
        self._follow_cache()
        keys = [
            (
                b,
                size,
                depth,
                children,
                cap,
                selection_size(size, b, cap, None, root_children=children)[0],
                budget,
            )
            for b, size, depth, children, cap in shapes
        ]
        new = [key for key in keys if key not in self._graphs]
        for key in new:
            self._capture_select(key)
        return new

    def _capture_select(self, key: tuple[int, int, int, int, int, int, bool]) -> tuple:
        num_requests, size, max_depth, root_children, per_request, num_kept, budget = key
        static = _placeholder_pool(
            num_requests, size // num_requests, max_depth, root_children, self.owner.fc.device
        )
        total = num_kept if budget else None  # selects what any budget keeping num_kept selects
        graph, outputs = self._capture(
            lambda: select_tree(static, num_requests, per_request=per_request, total=total)
        )
        self._graphs[key] = (graph, static, outputs)
        return self._graphs[key]


def _placeholder_pool(
    num_requests: int, per_request: int, max_depth: int, root_children: int, device: torch.device
) -> CandidatePool:
    """A valid pool of these sizes to capture a selection on (a capture records kernels, not values, but
    runs them first, and the host's count of the nodes kept must hold): each request's pending token,
    its ``root_children`` children, and the rest as children of the first of them."""
    n = num_requests * per_request
    request = torch.arange(num_requests, device=device).repeat_interleave(per_request)
    column = torch.arange(n, device=device) % per_request
    parents = torch.where(column == 0, -1, request * per_request + (column > root_children).long())
    depth = 1 + (column > 0).long() + (column > root_children).long()
    zeros = torch.zeros(n, dtype=torch.long, device=device)
    return CandidatePool(zeros, parents, request, depth, zeros.float(), max_depth, root_children)


__all__ = ["DraftGraphs", "SelectGraphs"]
