"""Timing of whole-model steps on synthetic batches: the measurements behind the budget (BOLE.md §5).

:class:`StepTimer` owns a cache sized for the largest step it will time and builds each step the way
the executor does — slots, block tables, ``kv_len`` committed tokens per request, random tokens — but
without drafting: a verify step is a forest of ``tokens`` nodes spread over ``batch`` requests, each
request a draft-like top-k tree (:func:`trtllm_bole.testing.topk_parents`), verified and then
committed along its spine; a decode step is one token per request, verified and committed. Only the
model's own work is timed (the forest and its metadata are built beforehand): CUDA events around
the step after warm-up, the median of the repeats (``time.perf_counter`` on CPU). Before each timed
step the GPU is held busy (:data:`HOST_HIDING_CYCLES`) while the host enqueues the step, so that the
events bracket the GPU's work alone: timed from an idle GPU they also bracketed the host's enqueueing,
and the embedded model's budgets followed its jitter (H100, batch 16, 256 positions: the decoding step
read 0.56-0.81 ms over five rounds from an idle GPU, 0.470-0.473 held busy;
benchmarks/results/h100_40a4caa/probe_calibration_timing.json).

On a GPU the forward is replayed from a CUDA graph (:class:`~trtllm_bole.spec.verify_graphs.VerifyGraphs`:
one graph per forest shape, captured by the warm-up), as the executor replays its steps (whose graphs,
:class:`~trtllm_bole.spec.verify_graphs.StepGraphs`, also hold the acceptance and the commit), and the
commit launches from Python without value checks (``check=False``: nothing waits for the device): a
budget is a ratio of step times, and a forward launched from Python times the host, not the GPU
(``cuda_graphs=False`` times it that way). Decode steps replay graphs of one-node forests, like the
executor's plain decoding.

The cache contents are whatever the previous steps left (zeros at first): timing does not depend
on them, and committed lengths never advance, so every repeat measures the same step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trtllm_bole.config import on_device
from trtllm_bole.models.cache import StepContext
from trtllm_bole.models.model import Qwen35Model
from trtllm_bole.spec.acceptance import deepest_per_request
from trtllm_bole.spec.budget import (
    DEFAULT_BATCH_BUCKETS,
    DEFAULT_CAPACITIES,
    DEFAULT_EPSILON,
    DEFAULT_KV_BUCKETS,
    BudgetTable,
    calibrate,
    check_epsilon,
    positive_ints,
)
from trtllm_bole.spec.verify_graphs import VerifyGraphs
from trtllm_bole.testing import topk_parents
from trtllm_bole.tree import TreeBatch

HOST_HIDING_CYCLES = 4_000_000
"""GPU clock cycles the timer keeps the GPU busy (``torch.cuda._sleep``) before each timed step's start
event: ~2 ms on an H100 or H200, longer than the host takes to enqueue a step's graph replay and its
commit's launches (~0.25 ms for the embedded model)."""


@dataclass(frozen=True, slots=True)
class TimingSettings:
    warmup: int = 2
    repeats: int = 5
    top_k: int = 4  # draft tree shape: children per node
    depth: int = 9  # and nodes on the longest root-to-leaf path (pending token + drafts)
    seed: int = 0

    def __post_init__(self) -> None:
        for name, least in (("warmup", 0), ("repeats", 1), ("top_k", 1), ("depth", 1)):
            if getattr(self, name) < least:
                raise ValueError(f"timing {name} must be at least {least}, got {getattr(self, name)}")


class StepTimer:
    """Seconds per full-model step of ``model`` for ``batch`` requests with ``kv_len`` committed tokens.

    ``max_batch``, ``max_kv_len`` and ``max_tokens`` (verify nodes across the batch) size the cache
    once; larger requests raise ``ValueError``.
    """

    def __init__(
        self,
        model: Qwen35Model,
        *,
        max_batch: int,
        max_kv_len: int,
        max_tokens: int,
        block_size: int = 16,
        settings: TimingSettings | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        for name, value in (("max_batch", max_batch), ("max_kv_len", max_kv_len), ("max_tokens", max_tokens)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.model = model
        self.settings = settings or TimingSettings()
        self.max_batch, self.max_kv_len, self.max_tokens = max_batch, max_kv_len, max_tokens
        self.blocks_per_request = -(-(max_kv_len + max_tokens) // block_size)
        self.cache = model.allocate_cache(max_batch, max_batch * self.blocks_per_request, block_size)
        self.generator = torch.Generator().manual_seed(self.settings.seed)
        self.cuda_graphs = cuda_graphs and model.device.type == "cuda"

    # ------------------------------------------------------------------------------------ #

    def verify(self, batch: int, kv_len: int, tokens: int, gdn_scheme: str = "bole") -> float:
        """One verify step of ``tokens`` tree nodes over ``batch`` requests, plus its commit."""
        self._check(batch, kv_len)
        if not batch <= tokens <= self.max_tokens:
            raise ValueError(
                f"tokens must lie in [batch={batch}, max_tokens={self.max_tokens}], got {tokens}"
            )
        sizes = [tokens // batch + (b < tokens % batch) for b in range(batch)]
        trees = [topk_parents(n, self.settings.top_k, self.settings.depth) for n in sizes]
        ctx = self._context(batch, kv_len, trees)
        input_ids = self._tokens(tokens)
        every = torch.ones(tokens, dtype=torch.bool, device=self.model.device)
        spine = deepest_per_request(ctx.tree, every) - ctx.tree.cu_seqlens[:-1]  # local: the spine's end
        return self._time(self._step(input_ids, ctx, gdn_scheme, spine, max_depth=self.settings.depth))

    def decode(self, batch: int, kv_len: int) -> float:
        """One plain decode step: one token per request, verified and committed."""
        self._check(batch, kv_len)
        ctx = self._context(batch, kv_len, [[-1]] * batch)
        leaf = torch.zeros(batch, dtype=torch.long, device=self.model.device)
        return self._time(self._step(self._tokens(batch), ctx, "bole", leaf, max_depth=1))

    # ------------------------------------------------------------------------------------ #

    def _check(self, batch: int, kv_len: int) -> None:
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"batch must lie in [1, {self.max_batch}], got {batch}")
        if not 0 <= kv_len <= self.max_kv_len:
            raise ValueError(f"kv_len must lie in [0, {self.max_kv_len}], got {kv_len}")

    def _context(self, batch: int, kv_len: int, trees: list[list[int]]) -> StepContext:
        device = self.model.device
        parents = torch.tensor([p for t in trees for p in t], dtype=torch.long, device=device)
        cu = torch.tensor([0, *[len(t) for t in trees]], device=device).cumsum(0)
        tree = TreeBatch.build(parents, cu)
        blocks = torch.arange(batch * self.blocks_per_request, dtype=torch.int32, device=device)
        tables = blocks.view(batch, self.blocks_per_request)
        slots = torch.arange(batch, device=device)
        context_lens = torch.full((batch,), kv_len, dtype=torch.long, device=device)
        return StepContext(slots, tables, context_lens, tree)

    def _step(
        self,
        input_ids: torch.Tensor,
        ctx: StepContext,
        gdn_scheme: str,
        leaf: torch.Tensor,
        *,
        max_depth: int,
    ) -> Callable[[], None]:
        """The forward of ``input_ids`` over ``ctx``, then the commit of each request's path to ``leaf``.
        On a GPU the forward replays the graph the executor would (paths padded to ``max_depth``: its
        tree depth, 1 for plain decoding)."""
        graphs = None
        if self.cuda_graphs:
            graphs = VerifyGraphs.of(self.model, max_depth=max_depth, table_width=self.blocks_per_request)

        def step() -> None:
            if graphs is None:
                _, _, pending = self.model.verify(input_ids, ctx, gdn_scheme=gdn_scheme)
            else:
                _, _, pending = graphs((input_ids,), ctx, gdn_scheme)
            pending.commit(leaf, check=False)  # as the executor commits: the timer built the values

        return step

    def _tokens(self, n: int) -> torch.Tensor:
        ids = torch.randint(self.model.config.vocab_size, (n,), generator=self.generator)
        return ids.to(self.model.device)

    @torch.no_grad()
    def _time(self, step: Callable[[], None]) -> float:
        s = self.settings
        for _ in range(s.warmup):
            step()
        if self.model.device.type == "cuda":
            times = []
            for _ in range(s.repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(HOST_HIDING_CYCLES)  # the step is queued before the GPU meets `start`
                start.record()
                step()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            return statistics.median(times)
        times = []
        for _ in range(s.repeats):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


@dataclass(frozen=True, slots=True)
class CalibrationSettings:
    epsilon: float = DEFAULT_EPSILON
    capacities: tuple[int, ...] = DEFAULT_CAPACITIES
    batch_buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS
    kv_buckets: tuple[int, ...] = DEFAULT_KV_BUCKETS
    timing: TimingSettings = TimingSettings()

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)  # before the build times anything
        if self.epsilon == float("inf"):  # fine at run time (BoleConfig), but the table is written as JSON
            raise ValueError(
                "epsilon must be finite to calibrate: the engine's config.json and budget.json would hold "
                "Infinity, which strict JSON readers refuse (a large value lets any verify fit as well)"
            )
        for name in ("capacities", "batch_buckets", "kv_buckets"):
            values = getattr(self, name)
            if not values or not positive_ints(values):
                raise ValueError(f"calibration {name} must be positive integers, got {values!r}")
            if len(set(values)) != len(values):  # a table with two entries of one bucket never loads
                raise ValueError(f"calibration {name} must not repeat a value, got {values!r}")

    def fitted(self, max_batch: int, max_seq_len: int, max_tokens: int) -> CalibrationSettings:
        """What an engine can meet: capacities up to ``max_tokens`` (a full batch of full trees), and batch
        and KV buckets up to ``max_batch`` and ``max_seq_len - 1``, each with the limit itself last where
        a value reaches past it (capacities of 8, 16, 32 and 64 in an engine of 41 tokens: 8, 16, 32, 41;
        a KV bucket of 1,024 in an engine of 1,024 positions: 1,023). A grid that stops short of a limit is
        kept as it is: the lookup serves larger batches and KV lengths from its largest bucket, and no
        budget exceeds its largest capacity."""

        def capped(values: tuple[int, ...], limit: int) -> tuple[int, ...]:
            below = tuple(v for v in sorted(values) if v < limit)
            return (*below, limit) if max(values) >= limit else below

        return CalibrationSettings(
            self.epsilon,
            capped(self.capacities, max_tokens),
            capped(self.batch_buckets, max_batch),
            capped(self.kv_buckets, max_seq_len - 1),
            self.timing,
        )


def device_name(device: torch.device) -> str:
    """What a budget table records as its device: the GPU's name, or ``cpu``."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


def calibrate_model(
    model: Qwen35Model,
    settings: CalibrationSettings,
    *,
    max_depth: int,
    per_request: int | None = None,
    progress: bool = True,
) -> BudgetTable:
    """The budget table of ``model`` on its device (BOLE.md §5); ``gpu_seconds`` is what it cost.
    ``per_request``: the most tree tokens a request verifies (no larger step is timed)."""
    s = settings
    with on_device(model.device):  # the timer's graphs, events and kernels on the model's GPU
        timer = StepTimer(
            model, max_batch=max(s.batch_buckets), max_kv_len=max(s.kv_buckets),
            max_tokens=max(max(s.capacities), max(s.batch_buckets)), settings=s.timing,
        )  # fmt: skip
        return calibrate(
            lambda b, kv, n: timer.verify(b, kv, n),
            timer.decode,
            device=device_name(model.device),
            max_depth=max_depth,
            epsilon=s.epsilon,
            capacities=s.capacities,
            batch_buckets=s.batch_buckets,
            kv_buckets=s.kv_buckets,
            per_request=per_request,
            model=model.config.architecture_id,
            progress=progress,
        )
