"""Requests, state slots, KV blocks and admission: the bookkeeping of continuous batching.

A request is admitted only when a GDN/conv state slot is free and enough KV blocks can be reserved
for its whole life (prompt + max_tokens + the longest path a step can accept, ``max_depth + 1`` tokens:
only the accepted path's K/V is written), so a running request can never run out of cache mid-generation
and nothing has to be preempted. Slots and blocks return to their pools the moment a request finishes,
is aborted or fails.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


class RequestState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class SpecStats:
    steps: int = 0  # target forwards (verify steps) after prefill
    drafted: int = 0  # draft tokens verified (tree nodes minus the pending token)
    accepted: int = 0  # draft tokens verification accepted (the last step's may pass a stop or max_tokens)
    prefills: int = 0  # target forwards that prefilled the prompt (one a piece of max_prefill_tokens)

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens verification accepted per step: accepted drafts plus the bonus token (MAT). A request's
        output can be shorter: its last step's tokens past a stop or ``max_tokens`` are dropped."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(slots=True, eq=False)
class Request:
    request_id: int
    prompt_ids: list[int]
    params: Any  # trtllm_bole.config.SamplingParams
    state: RequestState = RequestState.WAITING
    output_ids: list[int] = field(default_factory=list)
    slot: int = -1
    blocks: list[int] = field(default_factory=list)
    context_len: int = 0  # tokens committed to the target's caches
    finish_reason: str | None = None  # "length" | "stop" | "abort" | "error"
    error: str | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    runtime: Any = None  # per-request executor state (pending token, hidden, generator)

    @property
    def finished(self) -> bool:
        return self.state is RequestState.FINISHED


class BlockManager:
    """A free list of fixed-size KV blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise ValueError(f"asked for {count} KV blocks, {len(self._free)} free")
        return [self._free.pop() for _ in range(count)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


class SlotPool:
    """Indices of GDN / conv state slots."""

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots must be positive, got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise ValueError("no free state slot")
        return self._free.pop()

    def free(self, slot: int) -> None:
        self._free.append(slot)


MIN_SEQ_LEN = 3
"""The least ``max_seq_len`` that serves a request: a context of ``max_seq_len - 1`` tokens (the limit in
every mode) holding a prompt token and the token its prefill emits."""


def check_limits(**limits: tuple[int, int]) -> None:
    """Each ``name=(value, least)``: ``value`` an integer of at least ``least`` (None too is refused: a caller
    leaves an unset limit out)."""
    for name, (value, least) in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")


def kv_tokens(max_seq_len: int, tree_tokens: int) -> int:
    """Most KV positions one request may use: a context of at most ``max_seq_len - 1`` tokens (the
    limit in every mode, so that speculation stops where plain decoding does) and, past it, the deepest
    tree a step verifies (drafts beyond the limit are written, never kept)."""
    return max_seq_len - 1 + tree_tokens


MAX_PREFILL_TOKENS = 8192
"""Prompt tokens a step prefills by default, in one forward: its activations grow with them (a forward of
the embedded model holds ~20 KB a token at its peak in float32), and the running requests wait for it.
Prompts beyond the bound go on over the next steps (:func:`prefill_rounds`' first round each step)."""


def prefill_rounds(lengths: Sequence[int], max_tokens: int) -> list[list[tuple[int, int, int]]]:
    """The prefill forwards of prompts of ``lengths``: each a list of pieces ``(prompt, start, stop)`` of at
    most ``max_tokens`` tokens in all. Prompts in order, each cut where a forward fills up and carried
    on in the next, so a prompt's pieces run in order (each on top of the ones before it) and a prompt
    has at most one piece a forward (one chain each)."""
    rounds: list[list[tuple[int, int, int]]] = [[]]
    room = max_tokens
    for i, n in enumerate(lengths):
        start = 0
        while start < n:
            if room == 0:
                rounds.append([])
                room = max_tokens
            stop = min(n, start + room)
            rounds[-1].append((i, start, stop))
            room -= stop - start
            start = stop
    return [r for r in rounds if r]


class Scheduler:
    """FIFO admission of waiting requests into a bounded running batch."""

    def __init__(self, blocks: BlockManager, slots: SlotPool, *, max_seq_len: int, tree_tokens: int) -> None:
        self.blocks = blocks
        self.slots = slots
        self.max_seq_len = max_seq_len
        self.tree_tokens = tree_tokens  # the deepest tree a step may verify (KV headroom)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @property
    def context_limit(self) -> int:
        """Most prompt + output tokens one request may hold: ``max_seq_len - 1`` whatever the mode, so that
        speculation stops where plain decoding does."""
        return self.max_seq_len - 1

    @property
    def prompt_limit(self) -> int:
        """Longest prompt a request may have: its prefill emits a token, whatever ``max_tokens`` says."""
        return self.context_limit - 1

    @property
    def request_limit(self) -> int:
        """Most prompt + output tokens one request can be served: the context limit, or fewer where the
        whole KV cache cannot hold that many and a tree's headroom past them."""
        return min(self.context_limit, self.blocks.num_blocks * self.blocks.block_size - self.tree_tokens)

    def add(self, request: Request) -> None:
        """Queue a request, or finish it at once with an error if it can never fit."""
        limit = self.prompt_limit
        if not request.prompt_ids:
            self._fail(request, "empty prompt")
        elif len(request.prompt_ids) > limit:
            self._fail(
                request,
                f"prompt of {len(request.prompt_ids)} tokens exceeds the context limit: "
                f"max_seq_len {self.max_seq_len} holds {self.context_limit} prompt + output tokens, so a "
                f"prompt of at most {limit}",
            )
        elif len(request.prompt_ids) >= self.request_limit:
            self._fail(
                request,
                f"prompt of {len(request.prompt_ids)} tokens exceeds what the KV cache holds for one "
                f"request: {self.blocks.num_blocks} blocks of {self.blocks.block_size} hold "
                f"{self.request_limit} prompt + output tokens and {self.tree_tokens} of tree headroom, so a "
                f"prompt of at most {self.request_limit - 1}",
            )
        else:
            self.waiting.append(request)

    def admit(self, max_batch: int) -> list[Request]:
        """Move waiting requests into the running batch while a slot and their blocks are free."""
        taken = self.admissible(((len(r.prompt_ids), r.params.max_tokens) for r in self.waiting), max_batch)
        admitted = [self.waiting.popleft() for _ in range(taken)]
        for request in admitted:
            request.slot = self.slots.allocate()
            request.blocks = self.blocks.allocate(self._reservation(request))
            request.state = RequestState.RUNNING
            self.running.append(request)
        return admitted

    def admissible(self, sizes: Iterable[tuple[int, int]], max_batch: int) -> int:
        """How many requests of these ``(prompt length, max_tokens)``, in this order at the head of the
        queue, :meth:`admit` takes now: while a place in the batch, a slot and their KV blocks are free
        (FIFO: the head waits for blocks rather than starve; no one behind it is taken)."""
        places = min(max_batch - len(self.running), self.slots.num_free)
        free, taken = self.blocks.num_free, 0
        for prompt, max_tokens in sizes:
            needed = self.reservation(prompt, max_tokens)
            if taken >= places or needed > free:
                break
            free, taken = free - needed, taken + 1
        return taken

    def finish(self, request: Request, reason: str, error: str | None = None) -> None:
        """Finish a request for any reason and return its slot and blocks at once."""
        if request.finished:
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        if request.slot >= 0:
            self.slots.free(request.slot)
            request.slot = -1
        if request.blocks:
            self.blocks.free(request.blocks)
            request.blocks = []
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        request.error = error

    def reservation(self, prompt: int, max_tokens: int) -> int:
        """KV blocks a request of ``prompt`` tokens and ``max_tokens`` holds from its admission on: its
        context up to the request limit (where its output stops), and a tree's headroom past it."""
        return self.blocks.blocks_for(min(prompt + max_tokens, self.request_limit) + self.tree_tokens)

    def _reservation(self, request: Request) -> int:
        return self.reservation(len(request.prompt_ids), request.params.max_tokens)

    def _fail(self, request: Request, message: str) -> None:
        request.state = RequestState.FINISHED
        request.finish_reason = "error"
        request.error = message
