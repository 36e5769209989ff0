"""The speculative executor: continuous batching over one model, in any of the four modes.

One :meth:`Executor.step`:

1. admit waiting requests (free slot + KV blocks for their whole life) and prefill, as chains, the
   next pieces of the prompts not yet in the caches, at most ``max_prefill_tokens`` a step (a longer
   prompt, or a larger admission, goes on over the next steps while the running requests decode);
   a request whose prompt is then whole emits its first token (it becomes its *pending* token), and
   the MTP cache follows each piece;
2. for every running request: draft a tree from its pending token (MTP, EAGLE-2 style; none in
   ``ar``), keep the best nodes (per-request cap; the batch-shared budget in ``bole``), verify the
   whole forest in one target forward (GDN in closed form for ``bole``/``ar``, node by node with
   per-node state snapshots for ``tree-serial``/``chain``), accept (greedy or lossless sampling),
   commit the accepted path (GDN, conv, KV), re-run the MTP over the accepted path so its cache
   follows the target's, and emit the accepted drafts plus the bonus token.

Drafting, the target's verify and the acceptance queue no device sync: on a GPU a batch replays its
draft as a CUDA graph per batch size, greedy or sampled (:mod:`trtllm_bole.spec.draft_graphs`), its tree
selection as a graph per pool shape (:class:`~trtllm_bole.spec.draft_graphs.SelectGraphs`), its verify,
acceptance (greedy, or sampled on coins drawn from each request's generator) and commit as a graph per
forest shape (:class:`~trtllm_bole.spec.verify_graphs.StepGraphs`), and the prefills of the target and
the MTP head as graphs of padded shapes (:mod:`trtllm_bole.spec.prefill_graphs`, whose padding chain
takes one more state slot than ``max_batch_size``); ``cuda_graphs=False`` launches them all from Python.
A step waits for the device once, for the copy of what it accepted; the MTP follow-up is queued behind
that copy first, so the GPU runs it while the host books the step. The running requests' work (2) is
queued before the prefill (1), so that the GPU works through it while the host prepares and queues the
prefill; the step's outcome is read after the prefill. A step and a capture run with the model's GPU as
the current device (:func:`~trtllm_bole.config.on_device`), whichever thread calls them. Each phase of
a step is a profiler range (``bole.prefill``, ``bole.draft``, ``bole.verify``, ...; see
``benchmarks/profile_step.py``), free when no profiler runs.
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trtllm_bole.config import BoleConfig, SamplingParams, on_device
from trtllm_bole.models.cache import PrefillBatch, StepContext, block_table
from trtllm_bole.models.model import Qwen35Model
from trtllm_bole.spec.acceptance import Sampling, accept, draw_coins
from trtllm_bole.spec.budget import BudgetTable
from trtllm_bole.spec.draft_graphs import DraftGraphs, SelectGraphs
from trtllm_bole.spec.drafter import DraftSettings, draft, select_tree
from trtllm_bole.spec.prefill_graphs import MTPPrefillGraphs, TargetPrefillGraphs
from trtllm_bole.spec.sampling import request_generator
from trtllm_bole.spec.scheduler import (
    MAX_PREFILL_TOKENS,
    MIN_SEQ_LEN,
    BlockManager,
    Request,
    Scheduler,
    SlotPool,
    check_limits,
    kv_tokens,
    prefill_rounds,
)
from trtllm_bole.spec.verify_graphs import MTPGraphs, StepGraphs
from trtllm_bole.text import output_text, stops_never_met
from trtllm_bole.transfer import HostCopy, device_tensor, to_device
from trtllm_bole.tree import TreeBatch


def phase(name: str) -> torch.profiler.record_function:
    """A step phase as a profiler range (``bole.<name>``)."""
    return torch.profiler.record_function(f"bole.{name}")


@dataclass(slots=True)
class RequestRuntime:
    pending: int  # emitted, not yet seen by the target
    last_hidden: torch.Tensor  # [h]: the target's hidden state at the last committed position
    generator: torch.Generator | None
    max_new: int  # max_tokens, capped by the context limit


@dataclass(frozen=True, slots=True)
class Launched:
    """A speculative step queued on the device (:meth:`Executor._speculate`), to be booked once its
    outcome is on the host (:meth:`Executor._book`)."""

    requests: list[Request]
    outcome: QueuedOutcome
    next_hidden: torch.Tensor  # [B, h]: each request's hidden state at its accepted leaf


@dataclass(slots=True)
class StepEvent:
    """What one request emitted in one step (``finished`` on its last event)."""

    request: Request
    token_ids: list[int]
    finished: bool


@dataclass(slots=True)
class StepOutcome:
    """What a verify step accepted, per request, on the host (one device-to-host copy per step)."""

    accepted: list[list[int]]  # accepted draft tokens, root child first
    drafted: list[int]  # draft tokens the request's tree held (its nodes minus the pending one)
    bonus: list[int]  # the token sampled after the accepted path


@dataclass(frozen=True, slots=True)
class QueuedOutcome:
    """A :class:`StepOutcome` on its way to the host."""

    values: HostCopy
    num_requests: int
    width: int  # path tokens per request

    @classmethod
    def of(cls, tree: TreeBatch, tokens: torch.Tensor, leaf_global: torch.Tensor, bonus: torch.Tensor):
        """The outcome's copy to the host, queued behind the step's kernels (``leaf_global``: each
        request's accepted leaf, packed; the pending token's node if none); nothing waits yet."""
        path_tokens = tokens[tree.paths[leaf_global].clamp(min=0)]  # [B, D], -1-padded paths clamped
        drafted = tree.cu_seqlens[1:] - tree.cu_seqlens[:-1] - 1
        values = torch.cat([tree.depth[leaf_global], drafted, bonus, path_tokens.flatten()])
        return cls(HostCopy(values), tree.num_requests, path_tokens.shape[1])

    def wait(self) -> StepOutcome:
        host, b, width = self.values.tolist(), self.num_requests, self.width
        rows = [host[3 * b + i * width : 3 * b + (i + 1) * width] for i in range(b)]
        depth = host[:b]
        return StepOutcome(
            [row[1 : depth[i]] for i, row in enumerate(rows)], host[b : 2 * b], host[2 * b : 3 * b]
        )


def token_id(t: Any) -> int:
    """``t`` as a token id: an integer of any integer type (numpy's, a 0-d tensor's). 1.0 and booleans
    (which ``operator.index`` reads as 0 or 1) raise TypeError."""
    if isinstance(t, bool):
        raise TypeError(f"a token id is an integer, got {t!r}")
    return operator.index(t)


def _is_token_id(t: Any, vocab: int) -> bool:
    """:func:`token_id` in ``[0, vocab)``."""
    try:
        return 0 <= token_id(t) < vocab
    except TypeError:
        return False


def outside_vocabulary(ids: Sequence[Any], vocab: int) -> list:
    """The entries of ``ids`` that are not token ids in ``[0, vocab)``: the executor's refusal, and the
    server's and the command line's before they submit."""
    return [t for t in ids if not _is_token_id(t, vocab)]


def no_mtp_error(mode: str, why: str) -> ValueError:
    """A speculative ``mode`` refused for want of an MTP module to draft with (``why`` there is none)."""
    return ValueError(
        f"mode {mode!r} drafts with the checkpoint's MTP module, and {why}; use mode 'ar' (plain decoding) "
        "or a checkpoint with one"
    )


class Executor:
    def __init__(
        self,
        model: Qwen35Model,
        bole: BoleConfig,
        *,
        max_batch_size: int = 8,
        max_seq_len: int = 1024,
        num_blocks: int | None = None,
        block_size: int = 16,
        budget: BudgetTable | None = None,
        eos_token_ids: Sequence[int] = (),
        decode_text: Callable[[list[int]], str] | None = None,
        special_texts: Collection[str] = (),
        cuda_graphs: bool = True,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS,
    ) -> None:
        if bole.speculates and model.mtp is None:
            raise no_mtp_error(bole.mode, "this model has none loaded")
        check_limits(max_batch_size=(max_batch_size, 1), max_seq_len=(max_seq_len, MIN_SEQ_LEN),
                     block_size=(block_size, 1), max_prefill_tokens=(max_prefill_tokens, 1))  # fmt: skip
        model.config.check_seq_len(max_seq_len)
        self.model = model
        self.bole = bole
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.budget = budget
        self.eos_token_ids = frozenset(eos_token_ids)  # end a request unless it ignores EOS
        self.decode_text = decode_text
        self.special_texts = frozenset(special_texts)  # texts decode_text skips: no stop string can hold one
        tree_tokens = bole.max_depth + 1 if bole.speculates else 1
        request_blocks = -(-kv_tokens(max_seq_len, tree_tokens) // block_size)
        if num_blocks is None:
            num_blocks = max_batch_size * request_blocks
        graphs = cuda_graphs and model.device.type == "cuda"
        # With graphs, one more state slot than requests: a prefill graph's padding chain (prefill_graphs).
        self.cache = model.allocate_cache(max_batch_size + graphs, num_blocks, block_size)
        self._allocation = model.cache_allocations  # a later executor on this model takes the cache over
        self._stepping = threading.Lock()  # held by the step under way: a second thread's is refused
        self.scheduler = Scheduler(
            BlockManager(num_blocks, block_size),
            SlotPool(max_batch_size),
            max_seq_len=max_seq_len,
            tree_tokens=tree_tokens,
        )
        if self.scheduler.request_limit < 2:  # a prompt token and the one its prefill emits
            raise ValueError(
                f"a KV cache of {num_blocks} blocks of {block_size} tokens serves no request: each needs "
                f"2 tokens or more and room past them for the {tree_tokens} a step may keep (the pending "
                f"token{' and a path of drafts' if bole.speculates else ''}); give it at least "
                f"{-(-(2 + tree_tokens) // block_size) * block_size} tokens"
            )
        self._next_id = 0
        # CUDA graphs (cuda_graphs=False: everything launched from Python): drafts, tree selections, a
        # batch's verify with its acceptance and commit, the prefills of the target and of the MTP head.
        table_width = request_blocks
        self.draft_graphs = (
            DraftGraphs.of(model.mtp, top_k=bole.branching, depth=bole.max_depth, table_width=table_width)
            if graphs and bole.speculates
            else None
        )
        self.select_graphs = SelectGraphs.of(model.mtp) if graphs and bole.speculates else None
        # A sampled step's coins a request: one a node of the largest tree (its drafts and pending token)
        # and the bonus token's, the same count every step (a seeded request's draws are its own).
        self._coins_per_step = (bole.draft_tokens + 1 if bole.speculates else 1) + 1
        self.step_graphs = (
            StepGraphs.of(model, max_depth=tree_tokens, table_width=table_width, coins=self._coins_per_step)
            if graphs
            else None
        )
        self._armed = torch.ones((), dtype=torch.bool, device=model.device)  # step_graphs commit
        self.mtp_graphs = (
            MTPGraphs.of(model.mtp, max_depth=tree_tokens, table_width=table_width)
            if graphs and bole.speculates
            else None
        )
        prefill = {"table_width": table_width, "scratch_slot": max_batch_size}
        self.prefill_graphs = TargetPrefillGraphs.of(model, **prefill) if graphs else None
        self.mtp_prefill_graphs = (
            MTPPrefillGraphs.of(model.mtp, **prefill) if graphs and bole.speculates else None
        )
        self._chains: dict[int, TreeBatch] = {}  # the MTP follow-up's forest per batch size

    # ------------------------------------------------------------------------------------ #
    # Requests                                                                              #
    # ------------------------------------------------------------------------------------ #

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        """Queue a request; one that can never fit is finished at once with an error. The request keeps a
        copy of ``params``: a caller that changes its object later changes nothing here, where a larger
        max_tokens would outgrow the KV blocks reserved for it. The copy is validated again: assignments
        are, but a list changed in place is not (``stop.append("")`` stopped every request at once)."""
        self._check_held()
        params = SamplingParams.model_validate(params.model_dump())
        if params.stop and self.decode_text is None:
            raise ValueError("stop strings need a tokenizer; this model has none (use stop_token_ids)")
        if unmet := stops_never_met(params.stop, self.special_texts):
            raise ValueError(
                f"stop strings {unmet[:3]} hold a special token, which decoded text never does (it is "
                "skipped): pass its id in stop_token_ids"
            )
        vocab = self.model.config.vocab_size
        if outside := outside_vocabulary(params.stop_token_ids, vocab):
            raise ValueError(
                f"stop_token_ids {outside[:5]} are outside the vocabulary [0, {vocab}): never met"
            )
        bad = outside_vocabulary(prompt_ids, vocab)
        ids = list(prompt_ids) if bad else [token_id(t) for t in prompt_ids]
        request = Request(self._next_id, ids, params)
        self._next_id += 1
        if bad:
            request.finish_reason = "error"
            request.error = f"token ids {bad[:5]} are not integers in [0, {vocab})"
            request.state = request.state.FINISHED
            return request
        self.scheduler.add(request)
        return request

    def abort(self, request: Request) -> None:
        """Stop a request now; its slot and blocks return to the pools at once."""
        self.scheduler.finish(request, "abort")

    @property
    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    # ------------------------------------------------------------------------------------ #
    # The step                                                                              #
    # ------------------------------------------------------------------------------------ #

    @torch.no_grad()
    def step(self) -> list[StepEvent]:
        self._check_held()
        if self.model.cache_allocations != self._allocation:
            raise RuntimeError(
                "this executor's model has given its cache to a later executor (which zeroed it): its "
                "requests' states are gone. Run one executor per model at a time"
            )
        if not self._stepping.acquire(blocking=False):
            raise RuntimeError(
                "this executor is already stepping on another thread: one thread at a time steps it (an "
                "LLM's calls share its lock; a ServingEngine's thread is the only one to step what it serves)"
            )
        try:
            with on_device(self.model.device):
                return self._step()
        finally:
            self._stepping.release()

    def _step(self) -> list[StepEvent]:
        admitted = self.scheduler.admit(self.max_batch_size)
        if admitted:
            self.cache.reset_slots([r.slot for r in admitted])
        prefilling = [r for r in self.scheduler.running if r.runtime is None]  # no first token yet
        running = [r for r in self.scheduler.running if r.runtime is not None]
        launched = self._speculate(running) if running else None  # the GPU's while the host prefills
        events: list[StepEvent] = []
        if prefilling:
            with phase("prefill"):
                events += self._prefill(prefilling)
        if launched is not None:
            events += self._book(launched)
        return events

    def _prefill(self, requests: list[Request]) -> list[StepEvent]:
        """One prefill forward of at most ``max_prefill_tokens`` tokens: the next pieces of the prompts not
        yet in the caches, in admission order (the first of
        :func:`~trtllm_bole.spec.scheduler.prefill_rounds`), each on top of its prompt's earlier pieces.
        What is left waits for the next step, while the running requests decode in between; a request
        whose prompt is now whole gets its first token from its last position."""
        device = self.model.device
        rest = [len(r.prompt_ids) - r.context_len for r in requests]
        pieces = [
            (i, requests[i].context_len + start, requests[i].context_len + stop)
            for i, start, stop in prefill_rounds(rest, self.max_prefill_tokens)[0]
        ]
        hidden, logits = self._prefill_round(requests, pieces)
        ends = itertools.accumulate(stop - start for _, start, stop in pieces)  # each piece's end in hidden
        whole, last_logits = [], []
        for k, ((i, _, stop), end) in enumerate(zip(pieces, ends, strict=True)):
            r = requests[i]
            r.context_len = stop
            r.stats.prefills += 1
            if stop < len(r.prompt_ids):
                continue
            seed = r.params.seed
            generator = None if seed is None else request_generator(seed, device)
            room = self.scheduler.request_limit - len(r.prompt_ids)
            last = hidden[end - 1].clone()  # a copy: a replayed prefill's hidden is reused
            r.runtime = RequestRuntime(-1, last, generator, min(r.params.max_tokens, room))
            whole.append(r)
            last_logits.append(logits[k])
        if not whole:
            return []
        first = self._sample(torch.stack(last_logits), whole)
        events = []
        for r, token in zip(whole, first, strict=True):
            r.runtime.pending = token
            events.append(self._emit(r, [token]))
        return events

    def _prefill_round(
        self, requests: list[Request], pieces: list[tuple[int, int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One prefill forward of prompt pieces ``(request, start, stop)`` over the tokens before ``start``;
        with a drafter, the MTP head's rows of the same pieces after it. Returns the target's hidden
        states ``[tokens, h]`` and its logits at each piece's last token."""
        device = self.model.device
        owners = [requests[i] for i, _, _ in pieces]
        ids = device_tensor([t for r, (_, start, stop) in zip(owners, pieces, strict=True)
                             for t in r.prompt_ids[start:stop]], device)  # fmt: skip
        batch = self._prefill_batch(owners, [(start, stop) for _, start, stop in pieces])
        if self.prefill_graphs is not None:
            hidden, logits = self.prefill_graphs((ids,), batch)
        else:
            hidden, logits = self.model.prefill(ids, batch.context(device), check=False)
        if self.bole.speculates:
            self._mtp_prefill(owners, pieces, hidden)
        return hidden, logits

    def _mtp_prefill(
        self, owners: list[Request], pieces: list[tuple[int, int, int]], hidden: torch.Tensor
    ) -> None:
        """MTP rows ``(hidden_p, token_{p+1})`` for the positions ``p`` of each piece below its prompt's
        last (none for a prompt of one token), on top of the rows of its earlier pieces."""
        rows, tokens, chosen, spans, offset = [], [], [], [], 0
        for r, (_, start, stop) in zip(owners, pieces, strict=True):
            top = min(stop, len(r.prompt_ids) - 1)
            if top > start:
                rows.append(torch.arange(offset, offset + top - start))
                tokens += r.prompt_ids[start + 1 : top + 1]
                chosen.append(r)
                spans.append((start, top))
            offset += stop - start
        if not rows:
            return
        device = hidden.device
        inputs = (hidden[to_device(torch.cat(rows), device)], device_tensor(tokens, device))
        batch = self._prefill_batch(chosen, spans)
        if self.mtp_prefill_graphs is not None:
            self.mtp_prefill_graphs(inputs, batch)
        else:
            self.model.mtp.prefill(*inputs, batch.context(device), check=False)

    @staticmethod
    def _prefill_batch(requests: list[Request], spans: list[tuple[int, int]]) -> PrefillBatch:
        """Chains of the positions ``start .. stop - 1`` of each request, on the host."""
        return PrefillBatch(
            tuple(stop - start for start, stop in spans),
            tuple(r.slot for r in requests),
            block_table([r.blocks for r in requests]),
            tuple(start for start, _ in spans),
        )

    def _speculate(self, requests: list[Request]) -> Launched:
        """Queue the running requests' step on the device, up to the copy of its outcome; nothing waits."""
        model, bole, device = self.model, self.bole, self.model.device
        slots, tables = self._slots_and_tables(requests)
        context_lens = device_tensor([r.context_len for r in requests], device)
        pending = device_tensor([r.runtime.pending for r in requests], device)
        settings = self._settings(requests) if bole.speculates else None  # drafting and acceptance
        if bole.speculates:
            with phase("draft"):
                last_hidden = torch.stack([r.runtime.last_hidden for r in requests])
                pool = self._draft(pending, last_hidden, slots, tables, context_lens - 1, settings)
            with phase("select"):
                select = select_tree if self.select_graphs is None else self.select_graphs
                tokens, tree, _ = select(
                    pool, len(requests), per_request=bole.draft_tokens, total=self._budget(requests)
                )
        else:
            tokens = pending
            tree = StepContext.single_tokens(slots, tables, context_lens).tree
        ctx = StepContext(slots, tables, context_lens, tree)
        scheme, (sampling, kind) = self._gdn_scheme(), self._sampling(requests, settings)
        if self.step_graphs is not None:
            with phase("verify_accept_commit"):
                inputs = (tokens, self._armed, *(sampling or ()))
                hidden, leaf, bonus = self.step_graphs(inputs, ctx, (scheme, kind))
        else:
            with phase("verify"):
                logits, hidden, verify_pending = model.verify(tokens, ctx, gdn_scheme=scheme)
            with phase("accept"):
                leaf, bonus = accept(tree, tokens, logits, sampling, filtered=kind == "filtered")
            with phase("commit"):  # the executor built the leaves, slots and tables: nothing to wait for
                model.commit(verify_pending, leaf, check=False)
        leaf_global = leaf + tree.cu_seqlens[:-1]
        queued = QueuedOutcome.of(tree, tokens, leaf_global, bonus)
        if bole.speculates:  # queued before the host waits: the GPU runs it while the host books the step
            with phase("mtp_follow"):
                self._mtp_follow(tree, tokens, hidden, leaf_global, last_hidden, slots, tables, context_lens)
        next_hidden = hidden[leaf_global]  # a copy: a replayed verify's hidden is reused
        return Launched(requests, queued, next_hidden)

    def _book(self, launched: Launched) -> list[StepEvent]:
        """The step's one wait for the device, for its outcome, then the host's booking."""
        with phase("outcome"):
            outcome = launched.outcome.wait()
            events = []
            for i, r in enumerate(launched.requests):
                accepted = outcome.accepted[i]
                r.stats.steps += 1
                r.stats.drafted += outcome.drafted[i]
                r.stats.accepted += len(accepted)
                r.context_len += len(accepted) + 1  # the pending token and the accepted drafts
                r.runtime.pending = outcome.bonus[i]
                r.runtime.last_hidden = launched.next_hidden[i]
                events.append(self._emit(r, [*accepted, outcome.bonus[i]]))
        return events

    def _mtp_follow(
        self,
        tree: TreeBatch,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        leaf_global: torch.Tensor,
        last_hidden: torch.Tensor,
        slots: torch.Tensor,
        tables: torch.Tensor,
        context_lens: torch.Tensor,
    ) -> None:
        """Write the MTP rows of each accepted path, built from the *target's* hidden states (as in
        prefill): row j pairs the hidden state before path node j with node j's token (row 0: the
        request's ``last_hidden``, the state that predicted its pending token). Every path is padded to
        the deepest a step can accept, a chain of ``max_depth + 1`` rows: the MTP computes the padding
        rows and writes only the path's (no per-request work on the host; the shapes are the batch's,
        replayed from a graph on a GPU)."""
        batch, width = leaf_global.numel(), self.bole.max_depth + 1
        paths = tree.paths[leaf_global]
        rows = torch.nn.functional.pad(paths, (0, width - paths.shape[1])).clamp(min=0)  # [B, width]
        inputs = torch.cat([last_hidden[:, None], hidden[rows[:, :-1]]], dim=1).flatten(0, 1)
        if batch not in self._chains:
            self._chains[batch] = TreeBatch.chains([width] * batch, device=leaf_global.device)
        ctx = StepContext(slots, tables, context_lens - 1, self._chains[batch])
        mtp_inputs = (inputs, tokens[rows].flatten())
        if self.mtp_graphs is not None:
            _, _, pending = self.mtp_graphs(mtp_inputs, ctx, "follow")
        else:
            _, _, pending = self.model.mtp.verify(*mtp_inputs, ctx)
        self.model.mtp.commit(pending, tree.depth[leaf_global] - 1, check=False)

    # ------------------------------------------------------------------------------------ #
    # Pieces                                                                                #
    # ------------------------------------------------------------------------------------ #

    def capture_graphs(self, batch_sizes: Sequence[int] | None = None, *, sampled: bool = False) -> int:
        """Capture, ahead of traffic, the CUDA graphs of these batch sizes (default: 1 .. max_batch_size):
        the greedy draft's, and the selection's and the greedy verify-accept-commit's of full trees (every
        request with its ``draft_tokens`` drafts and its pending token); returns how many were newly
        captured (none without graphs). ``sampled``: those of sampled batches too, with and without top-k
        or top-p (else captured when first met, so that greedy traffic holds none)."""
        with on_device(self.model.device):
            return len(self._capture_graphs(list(batch_sizes or range(1, self.max_batch_size + 1)), sampled))

    def _capture_graphs(self, sizes: list[int], sampled: bool) -> list:
        kinds, new = ("greedy", "sampled", "filtered") if sampled else ("greedy",), []
        if self.draft_graphs is not None:
            new += [b for kind in kinds for b in self.draft_graphs.capture(sizes, kind)]
        if self.select_graphs is not None:
            bole = self.bole
            shapes = [
                (b, b * bole.pool_size, bole.max_depth + 1, bole.branching, bole.draft_tokens) for b in sizes
            ]
            new += self.select_graphs.capture(shapes, budget=self._budgeted)
        if self.step_graphs is not None:
            per_request = self.bole.draft_tokens + 1
            shapes = [(b, b * per_request, per_request) for b in sizes]
            new += [key for k in kinds for key in self.step_graphs.capture(shapes, (self._gdn_scheme(), k))]
        if self.mtp_graphs is not None:
            width = self.bole.max_depth + 1
            new += self.mtp_graphs.capture([(b, b * width, width) for b in sizes], "follow")
        return new

    def release(self) -> None:
        """Drop the CUDA graphs and the model's cache (KV cache, GDN and conv states): the executor serves
        nothing afterwards (:meth:`~trtllm_bole.LLM.shutdown`). Their memory goes with them even where
        something else still holds the model or a graph set."""
        for graphs in self.graph_sets:
            if graphs is not None:
                graphs.release()
        self.model.release_cache()
        self.cache = None  # type: ignore[assignment]

    def _check_held(self) -> None:
        if self.cache is None:  # a step met the missing cache as an AttributeError; a request never ran
            raise RuntimeError("this executor was released (LLM.shutdown): it serves nothing any more")

    @property
    def graph_sets(self) -> tuple:
        """The executor's sets of CUDA graphs (None where a set is not used)."""
        return (self.draft_graphs, self.select_graphs, self.step_graphs, self.mtp_graphs,
                self.prefill_graphs, self.mtp_prefill_graphs)  # fmt: skip

    def _gdn_scheme(self) -> str:
        return "serial" if self.bole.mode in ("chain", "tree-serial") else "bole"

    def _draft(
        self,
        pending: torch.Tensor,
        last_hidden: torch.Tensor,
        slots: torch.Tensor,
        tables: torch.Tensor,
        mtp_context_lens: torch.Tensor,
        settings: DraftSettings,
    ) -> Any:
        """The step's candidate pool: replayed from a graph on a GPU, else drafted."""
        inputs = (pending, last_hidden, slots, tables, mtp_context_lens, settings)
        if self.draft_graphs is not None:
            return self.draft_graphs(*inputs)
        return draft(self.model.mtp, *inputs, top_k=self.bole.branching, depth=self.bole.max_depth)

    def _sampling(
        self, requests: list[Request], settings: DraftSettings | None
    ) -> tuple[Sampling | None, str]:
        """A batch's sampled acceptance inputs with the step's coins (None when every request is greedy),
        and the kind of its settings; ``settings``: the step's, when drafting made them."""
        if _all_greedy(requests):
            return None, "greedy"
        s = self._settings(requests) if settings is None else settings
        coins = draw_coins([r.runtime.generator for r in requests], self._coins_per_step, self.model.device)
        return Sampling(s.temperature, s.top_k, s.top_p, coins), s.kind

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """The first token of each request, from its prefill logits: the bonus token of a tree of no drafts
        (sampled ones on the request's own coins)."""
        sampling, kind = self._sampling(requests, None)
        if sampling is None:
            return logits.argmax(-1).tolist()
        batch, device = len(requests), logits.device
        roots = TreeBatch.chains([1] * batch, device=device)
        pending = torch.zeros(batch, dtype=torch.long, device=device)  # never read: a root is never tried
        _, first = accept(roots, pending, logits, sampling, filtered=kind == "filtered")
        return first.tolist()

    def _settings(self, requests: list[Request]) -> DraftSettings:
        params = [r.params for r in requests]
        return DraftSettings.of(
            [p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params],
            self.model.device,
        )  # fmt: skip

    @property
    def _budgeted(self) -> bool:
        """Whether steps select their trees under the budget table (only ``bole``'s do)."""
        return self.bole.mode == "bole" and self.budget is not None

    def _budget(self, requests: list[Request]) -> int | None:
        if not self._budgeted:
            return None
        context = max(r.context_len for r in requests)
        return self.budget.lookup(len(requests), context, epsilon=self.bole.epsilon)

    def _slots_and_tables(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.model.device
        tables = block_table([r.blocks for r in requests])
        return device_tensor([r.slot for r in requests], device), to_device(tables, device)

    def _emit(self, request: Request, new_tokens: list[int]) -> StepEvent:
        """Append tokens, stopping at max_tokens, a stop token or a stop string."""
        params, runtime = request.params, request.runtime
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops |= self.eos_token_ids
        emitted, reason = [], None
        for token in new_tokens:
            if token in stops:
                reason = "stop"
                break
            emitted.append(token)
            request.output_ids.append(token)
            if params.stop and _ends_in_stop(
                self.decode_text, request.prompt_ids, request.output_ids, params.stop
            ):
                reason = "stop"
                break
            if len(request.output_ids) >= runtime.max_new:
                reason = "length"
                break
        if reason is not None:
            self.scheduler.finish(request, reason)
        return StepEvent(request, emitted, reason is not None)


def _all_greedy(requests: list[Request]) -> bool:
    return all(r.params.temperature <= 0 for r in requests)


def _ends_in_stop(
    decode: Callable[[list[int]], str], prompt_ids: list[int], output_ids: list[int], stop: list[str]
) -> bool:
    """Whether the text now holds a stop string. Checked after every token, so a new match ends in the
    last token: only a tail that can hold the longest stop string is decoded (a character takes at
    most 4 byte-level tokens; 8 more keep a tokenizer's cleanup at the window's start clear of it),
    not the whole output, which would cost O(length) a token on the engine thread. Tokens that decode
    to no text (special ones, skipped) widen the window until its text before the last token is that
    long; a window that reaches the output's start reads it as :func:`output_text` does."""
    longest = max(map(len, stop))
    window = 4 * longest + 8
    while window < len(output_ids):  # a new match ends in the last token, so it starts in the text before it
        if len(decode(output_ids[-window:-1])) >= longest + 8:
            # A window from mid-character decodes its first bytes as U+FFFD.
            text = decode(output_ids[-window:])
            # A mid-character start leaves at most 3 lone continuation bytes (one U+FFFD each).
            text = text[min(3, len(text) - len(text.lstrip("\ufffd"))) :]
            break
        window *= 2
    else:
        text = output_text(decode, prompt_ids, output_ids)
    # A trailing U+FFFD may be half a character that the next tokens finish: not text yet.
    return any(s in text.removesuffix("\ufffd") for s in stop)
