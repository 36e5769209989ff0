"""A thread-safe serving engine: one background thread owns an :class:`Executor` and runs it.

Any thread may :meth:`ServingEngine.submit` requests (it only queues them) and close the engine (at
once, or draining: :meth:`ServingEngine.close`, :func:`close_on_drain_file`). The engine thread is the
only one that touches the executor (which is not thread-safe): it starts the queued requests, aborts
those whose ``is_cancelled`` predicate turns true, runs :meth:`Executor.step` while there is work (every
running request advances in the same batched step: continuous batching), and hands each request's
committed tokens to its callback as an :class:`Update`. With nothing to do it sleeps on a condition
variable. After each step it publishes an :class:`EngineStats` snapshot (:meth:`ServingEngine.stats`),
and keeps each ended request's :class:`RequestLatency` (:meth:`ServingEngine.take_latencies`), which the
Triton model turns into metrics.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_bole.config import SamplingParams
from trtllm_bole.spec.executor import Executor
from trtllm_bole.spec.scheduler import Request, SpecStats
from trtllm_bole.text import TextDelta

if TYPE_CHECKING:  # the LLM module imports the whole stack; the engine needs only its executor
    from trtllm_bole.llm import LLM


@dataclass(slots=True)
class Update:
    """What one request gained since its previous update; ``finished`` on the last one.

    ``token_ids`` and ``text`` are deltas; ``stats`` are running totals. ``finish_reason`` is
    ``"length"``, ``"stop"``, ``"abort"`` (cancelled, or the engine shut down: then ``error`` says so,
    which the protocol answers as UNAVAILABLE rather than CANCELLED) or ``"error"`` (``error`` says why).
    """

    key: int
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    stats: SpecStats = field(default_factory=SpecStats)


OnUpdate = Callable[[Update], None]

FINISH_REASONS = ("length", "stop", "abort", "error")
REFUSED_BEFORE_SUBMIT = ("invalid", "internal")  # by a server, counted through note_refused
REJECT_REASONS = ("queue_full", "shut_down", *REFUSED_BEFORE_SUBMIT)  # EngineStats' rejected_<reason>


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The engine as its thread last saw it (after each step), for metrics
    (:mod:`trtllm_bole.serving.metrics`): the batch and the KV cache now, and totals since the engine
    started, a request's counted when it ends."""

    serving: int = 1  # 1 while the engine takes requests; 0 once it closes or its thread has stopped
    iterations: int = 0  # executor steps run
    active: int = 0  # requests in the batch: prefilling or decoding
    waiting: int = 0  # submitted, not in the batch yet (no free slot or KV blocks, or not picked up yet)
    max_batch_size: int = 0
    kv_blocks_used: int = 0
    kv_blocks_max: int = 0
    kv_tokens_per_block: int = 0
    finished_length: int = 0  # requests ended, by finish reason
    finished_stop: int = 0
    finished_abort: int = 0
    finished_error: int = 0
    rejected_queue_full: int = 0  # requests submit() refused, by reason
    rejected_shut_down: int = 0
    rejected_invalid: int = 0  # requests a server refused before submitting them (note_refused)
    rejected_internal: int = 0
    prompt_tokens: int = 0  # of the requests ended, those prefilled (not of one aborted while queued)
    generated_tokens: int = 0
    draft_tokens: int = 0  # verified (SpecStats.drafted)
    accepted_draft_tokens: int = 0
    verify_steps: int = 0  # target forwards that verified drafts (SpecStats.steps)
    prefill_forwards: int = 0


@dataclass(frozen=True, slots=True)
class RequestLatency:
    """An ended request's times from its submission, in seconds: to its first token (None: it had none),
    and to its end; how many tokens it generated, and why it ended."""

    first_token_s: float | None
    total_s: float
    output_tokens: int
    finish_reason: str


WAITING_POLL_S = 1.0
"""How often the requests further back in the queue than the batch's free places are asked whether
they were cancelled (those in the batch or next in line for it are asked every step, so a cancelled
request is never admitted). An ask is the client's round trip (~50 µs to Triton's server process): a
long queue asked every step would slow every step of the batch."""

LATENCY_BACKLOG = 65536
"""Ended requests' latencies kept until :meth:`ServingEngine.take_latencies` takes them (the oldest go
first where nobody does)."""


@dataclass(slots=True, eq=False)
class _Live:
    key: int
    on_update: OnUpdate
    is_cancelled: Callable[[], bool] | None
    text: TextDelta
    request: Request | None = None
    sent: int = 0  # output tokens already handed to on_update
    submitted: float = field(default_factory=time.monotonic)
    first_token: float | None = None  # when its first token was handed to on_update


class ServingEngine:
    """Run ``executor`` on a background thread for many concurrent callers.

    ``decode`` turns token ids into text (the tokenizer's); without it updates carry ids only.
    ``max_queue_size``: requests that may wait beyond the batch's free places before :meth:`submit`
    refuses more (TensorRT-LLM backend's parameter of that name; None: no bound); while the head of the
    queue waits for KV blocks, free places take no one and every waiting request counts.
    Callbacks run on the engine thread: they must be quick and must not call back into the engine
    synchronously except through :meth:`submit`, which only queues.
    """

    def __init__(
        self,
        executor: Executor,
        *,
        decode: Callable[[list[int]], str] | None = None,
        max_queue_size: int | None = None,
    ) -> None:
        if max_queue_size is not None and (isinstance(max_queue_size, bool) or max_queue_size < 1):
            raise ValueError(f"max_queue_size must be a positive integer or None, got {max_queue_size!r}")
        self.executor = executor
        self.decode = decode
        self.max_queue_size = max_queue_size
        self._cv = threading.Condition()
        self._inbox: list[tuple[_Live, list[int], SamplingParams]] = []  # submitted, not started
        self._starting: list[tuple[_Live, list[int], SamplingParams]] = []  # taken from it, being started
        self._live: dict[int, _Live] = {}  # by key; engine thread only
        self._by_request: dict[int, _Live] = {}  # by the executor's request id; engine thread only
        self._keys = itertools.count()
        self._closing = False
        self._deadline = 0.0  # closing: when the requests still running are aborted (time.monotonic)
        self._totals: dict[str, int] = {}  # EngineStats' totals; engine thread only
        # By submit(), and by a server before it (note_refused); under self._cv.
        self._rejected = dict.fromkeys(REJECT_REASONS, 0)
        self._latencies: deque[RequestLatency] = deque(maxlen=LATENCY_BACKLOG)
        self._iterations = 0
        self._next_waiting_poll = 0.0  # when the whole queue is next asked (_poll_cancellations)
        self._stats: EngineStats  # published by the engine thread (_publish), read by any thread
        self._publish()
        self._thread = threading.Thread(target=self._run, name="bole-engine", daemon=True)
        self._thread.start()

    @classmethod
    def for_llm(cls, llm: LLM, *, max_queue_size: int | None = None) -> ServingEngine:
        """The engine of an :class:`~trtllm_bole.LLM`; the LLM must not generate by itself afterwards, and
        its :meth:`~trtllm_bole.LLM.shutdown` closes the engine."""
        decode = llm.tokenizer.decode if llm.tokenizer else None
        return llm.serve(lambda executor: cls(executor, decode=decode, max_queue_size=max_queue_size))

    # ------------------------------------------------------------------------------------ #
    # Any thread                                                                            #
    # ------------------------------------------------------------------------------------ #

    @property
    def max_batch_size(self) -> int:
        return self.executor.max_batch_size

    @property
    def request_limit(self) -> int:
        """Most prompt + output tokens one request may hold (:attr:`Scheduler.request_limit`): its
        ``context_limit``, ``max_seq_len - 1`` in every mode, unless the whole KV cache holds fewer."""
        return self.executor.scheduler.request_limit

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_update: OnUpdate,
        *,
        is_cancelled: Callable[[], bool] | None = None,
    ) -> int:
        """Queue a request and return its key. ``on_update`` gets every :class:`Update` (the last
        has ``finished=True``), ``is_cancelled`` is polled once per step while the request is in the
        batch or next in line for it (every ``WAITING_POLL_S`` further back in the queue) and aborts the
        request when it returns true. Raises :class:`RuntimeError` once the engine is closed, or while
        ``max_queue_size`` requests wait (retry later). ``params`` is copied here: the executor took its
        copy only when the request started, so a caller reusing the object changed requests it had queued."""
        params = params.model_copy(deep=True)
        live = _Live(0, on_update, is_cancelled, TextDelta(self.decode, params.stop, prompt_ids))
        with self._cv:
            if self._closing or not self.alive:
                self._rejected["shut_down"] += 1
                raise RuntimeError("the serving engine is shut down")
            if self.max_queue_size is not None and (queued := self._queued()) >= self.max_queue_size:
                self._rejected["queue_full"] += 1
                raise RuntimeError(
                    f"the serving engine's queue is full: {queued} of max_queue_size {self.max_queue_size} "
                    "waiting for a place in the batch; retry later"
                )
            live.key = next(self._keys)
            self._inbox.append((live, list(prompt_ids), params))
            self._cv.notify()
        return live.key

    def _waiting(self) -> int:
        """Requests submitted and not in the batch yet (from any thread: each length is one atomic read;
        one moving from the inbox to the scheduler's queue at that moment may be missed)."""
        return len(self._inbox) + len(self.executor.scheduler.waiting)

    def _queued(self) -> int:
        """Requests waiting beyond those the next step admits (a place in the batch and, in order, their
        KV blocks: :meth:`Scheduler.admissible`). Under ``self._cv``; the scheduler's queue is copied in
        one step (``list`` of a deque runs no Python code, so the engine thread cannot interleave). Not
        under the scheduler's own updates: while the engine thread admits (requests off the queue, then
        into the batch and their slots and blocks taken, in several steps), a submit may see them in
        neither place and their places still free, so the bound can be passed for that moment by up to
        ``max_batch_size`` requests (never lost: they wait their turn)."""
        scheduler = self.executor.scheduler
        sizes = [(len(r.prompt_ids), r.params.max_tokens) for r in list(scheduler.waiting)]
        # Then those the engine thread is handing to the scheduler: out of the inbox, not yet in its queue
        # (or just now, counted twice for that moment: a refusal a moment early).
        starting = [(ids, params) for live, ids, params in self._starting if live.request is None]
        sizes += [(len(ids), params.max_tokens) for ids, params in starting]
        sizes += [(len(ids), params.max_tokens) for _, ids, params in self._inbox]
        return len(sizes) - scheduler.admissible(sizes, self.executor.max_batch_size)

    def close(self, timeout: float = 30.0, *, grace: float = 0.0) -> None:
        """Refuse new requests, let those already submitted run for up to ``grace`` seconds, abort the
        rest (final updates with ``finish_reason="abort"``) and stop the thread (waiting up to
        ``grace + timeout`` seconds). Closing again changes nothing."""
        with self._cv:
            if not self._closing:
                self._closing, self._deadline = True, time.monotonic() + grace
            self._cv.notify()
        self._thread.join(grace + timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stats(self) -> EngineStats:
        """What the engine thread last published (after each step, and when it stops), with the refusals
        :meth:`submit` counted up to now: once the thread has stopped it publishes nothing, and every
        request is refused."""
        with self._cv:
            rejected = {f"rejected_{reason}": count for reason, count in self._rejected.items()}
        return replace(self._stats, **rejected)

    def note_refused(self, reason: str) -> None:
        """Count a request its server refused before :meth:`submit`: ``invalid`` input (the client's to
        fix) or an ``internal`` error, so that the metrics show every refusal, not submit's alone."""
        if reason not in REFUSED_BEFORE_SUBMIT:
            raise ValueError(f"a refusal before submit is 'invalid' or 'internal', got {reason!r}")
        with self._cv:
            self._rejected[reason] += 1

    def take_latencies(self) -> list[RequestLatency]:
        """The latencies of the requests ended since the last call, oldest first."""
        taken = []
        with contextlib.suppress(IndexError):  # emptied (by another caller, too)
            while True:
                taken.append(self._latencies.popleft())  # a deque's ends are thread-safe
        return taken

    # ------------------------------------------------------------------------------------ #
    # Engine thread                                                                         #
    # ------------------------------------------------------------------------------------ #

    def _run(self) -> None:
        reason, error = "abort", "the serving engine shut down"
        try:
            self._serve()
        except Exception as e:  # a bug outside a step: no request may wait forever for it
            traceback.print_exc(file=sys.stderr)
            reason, error = "error", f"the serving engine failed: {e!r}"
        finally:
            with self._cv:
                self._closing = True  # submit() refuses from now on
                inbox, self._inbox = self._inbox, []
            queued = [live for live, _, _ in inbox]
            for live in queued + list(self._live.values()):
                self._end(live, reason, error)
            self._publish()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not (self._inbox or self._closing or self.executor.has_unfinished):
                    self._cv.wait()
                self._starting, self._inbox = self._inbox, []  # still queued for submit()'s bound
                closing = self._closing
            for submitted in self._starting:
                self._start(*submitted)
            self._starting = []
            if closing and (not self.executor.has_unfinished or time.monotonic() >= self._deadline):
                return  # _run aborts what is left
            self._poll_cancellations()
            if self.executor.has_unfinished:
                self._step()
                self._iterations += 1
            self._publish()

    def _publish(self) -> None:
        """A new :class:`EngineStats` (one reference assignment: readers on other threads see the old
        snapshot or the new one, never a mix)."""
        scheduler = self.executor.scheduler
        blocks = scheduler.blocks
        self._stats = EngineStats(
            serving=int(not self._closing),
            iterations=self._iterations,
            active=len(scheduler.running),
            waiting=self._waiting(),
            max_batch_size=self.executor.max_batch_size,
            kv_blocks_used=blocks.num_blocks - blocks.num_free,
            kv_blocks_max=blocks.num_blocks,
            kv_tokens_per_block=blocks.block_size,
            **self._totals,
        )

    def _count(self, live: _Live, reason: str) -> None:
        """Add an ended request to the totals, and its latency (none where it never reached the executor)."""
        totals, request = self._totals, live.request
        totals[f"finished_{reason}"] = totals.get(f"finished_{reason}", 0) + 1
        if request is None:
            return
        first = None if live.first_token is None else live.first_token - live.submitted
        total = time.monotonic() - live.submitted
        self._latencies.append(RequestLatency(first, total, len(request.output_ids), reason))
        stats = request.stats
        for name, value in (
            ("prompt_tokens", min(request.context_len, len(request.prompt_ids))),  # prefilled ones
            ("generated_tokens", len(request.output_ids)),
            ("draft_tokens", stats.drafted),
            ("accepted_draft_tokens", stats.accepted),
            ("verify_steps", stats.steps),
            ("prefill_forwards", stats.prefills),
        ):
            totals[name] = totals.get(name, 0) + value

    def _end(self, live: _Live, reason: str, error: str) -> None:
        """Finish ``live`` for a failure or the shutdown: finished in the executor (unless it already
        was: then it gets its own ending), then its final update (a bare one where even that fails)."""
        try:
            if live.request is not None:
                self.executor.scheduler.finish(live.request, reason, error)
                self._finish(live)
                return
        except Exception:
            traceback.print_exc(file=sys.stderr)
            self._forget(live)
        self._count(live, reason)
        self._deliver(live, Update(live.key, [], "", True, reason, error))

    def _start(self, live: _Live, prompt_ids: list[int], params: SamplingParams) -> None:
        try:
            live.request = self.executor.submit(prompt_ids, params)
        except Exception as e:  # refused (ValueError) or a bug: either way only this request fails
            message = str(e) if isinstance(e, ValueError) else f"submission failed: {e!r}"
            self._count(live, "error")
            self._deliver(live, Update(live.key, [], "", True, "error", message))
            return
        self._live[live.key] = live
        self._by_request[live.request.request_id] = live
        if live.request.finished:  # refused at submission (empty, too long, ids out of range)
            self._finish(live)

    def _poll_cancellations(self) -> None:
        """Abort the requests whose client cancelled: those in the batch, and the waiting ones that its
        free places could take, every step; the rest of the queue every ``WAITING_POLL_S``."""
        scheduler = self.executor.scheduler
        for request in list(scheduler.running):
            self._abort_if_cancelled(request)
        now = time.monotonic()
        everyone = now >= self._next_waiting_poll
        if everyone:
            self._next_waiting_poll = now + WAITING_POLL_S
        free = self.executor.max_batch_size - len(scheduler.running)
        for request in list(scheduler.waiting):
            if free <= 0 and not everyone:
                break
            if not self._abort_if_cancelled(request):
                free -= 1

    def _abort_if_cancelled(self, request: Request) -> bool:
        """Ask the request's client whether it cancelled, and abort the request if it did."""
        live = self._by_request.get(request.request_id)  # None: forgotten after a failed ending
        if live is None or live.is_cancelled is None:
            return False
        try:
            cancelled = live.is_cancelled()
        except Exception:  # a vanished client counts as cancelled
            cancelled = True
        if cancelled:
            self.executor.abort(request)
            self._finish(live)
        return cancelled

    def _step(self) -> None:
        try:
            events = self.executor.step()
        except Exception as e:  # never let one bad step take the server down: fail that batch
            traceback.print_exc(file=sys.stderr)
            # The batch fails; a request that ended earlier in this step (its prefill) keeps its ending.
            for live in [x for x in self._live.values() if x.request.finished or x.request.slot >= 0]:
                self._end(live, "error", f"engine step failed: {e!r}")
            return
        for event in events:
            live = self._by_request.get(event.request.request_id)
            if live is None:
                continue
            if event.finished:
                self._finish(live)
            else:
                self._deliver(live, self._update(live, finished=False))

    def _forget(self, live: _Live) -> None:
        """Drop ``live`` from both lookups (wherever an ending failed halfway, from what is left)."""
        self._live.pop(live.key, None)
        if live.request is not None:
            self._by_request.pop(live.request.request_id, None)

    def _finish(self, live: _Live) -> None:
        self._forget(live)
        update = self._update(live, finished=True)  # first: its tokens may be the request's first
        delivered = self._deliver(live, update)
        self._count(live, live.request.finish_reason if delivered else "error")

    def _update(self, live: _Live, *, finished: bool) -> Update:
        """The request's output tokens not yet handed out (a step's committed tokens, or those of a
        step that failed after committing them), with the matching text delta."""
        r = live.request
        token_ids, live.sent = r.output_ids[live.sent :], len(r.output_ids)
        if token_ids and live.first_token is None:
            live.first_token = time.monotonic()
        return Update(
            live.key,
            token_ids,
            live.text(r.output_ids, finished),
            finished,
            r.finish_reason if finished else None,
            r.error if finished else None,
            replace(r.stats),  # a copy: the request's own goes on counting
        )

    def _deliver(self, live: _Live, update: Update) -> bool:
        """Hand ``update`` to the request's consumer; whether it took it. A consumer that raises loses
        its request, never the engine: a running request is aborted (counted as an error), and either
        is told so in a final ``"error"`` update where it can still listen (a client that has gone
        cannot; one whose reply failed to build can)."""
        try:
            live.on_update(update)
            return True
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            error = f"the request's reply failed ({type(e).__name__}: {e})"
        if not update.finished:
            self.executor.abort(live.request)
            self._forget(live)
            self._count(live, "error")
            error += "; it was aborted"
        with contextlib.suppress(Exception):
            live.on_update(Update(live.key, [], "", True, "error", error, update.stats))
        return False


def close_on_drain_file(engine: ServingEngine, path: Path, *, poll: float = 0.1) -> threading.Thread:
    """Watch for ``path`` (a daemon thread, every ``poll`` seconds) and close ``engine`` when it appears,
    with the grace in seconds that the file holds (``triton_server/launch.py`` writes it on SIGTERM:
    Triton neither unloads a model nor calls its ``finalize`` while requests are in flight). The file
    must appear whole (written elsewhere, then renamed): one without a grace closes at once. A file
    already there is an earlier server's, removed first."""

    def watch() -> None:
        while engine.alive and not path.exists():
            time.sleep(poll)
        if not engine.alive:
            return
        try:
            text = path.read_text().strip()
            grace = float(text)
        except (OSError, UnicodeError, ValueError) as e:
            text, grace = repr(e), float("nan")
        if not 0 <= grace < float("inf"):
            print(f"bole: drain file {path}: {text}, not a grace in seconds: closing now", file=sys.stderr)
            grace = 0.0
        engine.close(grace=grace)

    path.unlink(missing_ok=True)  # an earlier server's: the launcher writes it only to stop this one
    thread = threading.Thread(target=watch, name="bole-drain-watch", daemon=True)
    thread.start()
    return thread
