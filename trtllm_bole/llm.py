"""The public API, in the style of TensorRT-LLM's LLM API::

from trtllm_bole import LLM, SamplingParams, BoleConfig

llm = LLM(model="path/to/checkpoint_or_engine", speculative_config=BoleConfig(mode="bole"))
for out in llm.generate(["def fib(n):"], SamplingParams(max_tokens=64)):
    print(out.outputs[0].text, out.stats.mean_accepted_tokens)
"""

from __future__ import annotations

import dataclasses
import numbers
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import torch
from pydantic import BaseModel
from tqdm import tqdm

from trtllm_bole.config import BoleConfig, SamplingParams, check_device, short_repr
from trtllm_bole.engine.load import Engine, is_engine_dir, load_engine
from trtllm_bole.models.config import eos_token_ids, load_config, load_json, read_generation_config
from trtllm_bole.models.loader import load_model, missing_mtp
from trtllm_bole.models.model import Qwen35Model
from trtllm_bole.spec.budget import BudgetTable
from trtllm_bole.spec.calibration import device_name
from trtllm_bole.spec.executor import Executor, no_mtp_error, token_id
from trtllm_bole.spec.scheduler import MAX_PREFILL_TOKENS, MIN_SEQ_LEN, Request, SpecStats, check_limits
from trtllm_bole.text import TextDelta, Tokenizer, cut_at_stop, output_text

DEFAULT_MODEL = Path(__file__).parent / "assets" / "qwen35-code-tiny"
"""The embedded default: a small Qwen3.5-architecture model trained on Python code (model card in
its folder)."""

Prompt = str | Sequence[int]


class Server(Protocol):
    """What steps an LLM's executor from its own thread (:class:`~trtllm_bole.serving.ServingEngine`)."""

    def close(self) -> None: ...


S = TypeVar("S", bound=Server)


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass(slots=True)
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    stats: SpecStats = field(default_factory=SpecStats)
    error: str | None = None


class LLM:
    """Load a Qwen3.5 checkpoint (or an engine built by ``build_scripts/build_engine.py``) and
    generate with the chosen speculative scheme.

    ``device``: ``"cpu"`` or ``"cuda"``; ``dtype``: ``"auto"`` (float32 on CPU, bfloat16 on CUDA),
    ``"float32"`` or ``"bfloat16"``. ``max_batch_size`` requests run at once (one GDN state slot
    each; default 8); ``max_seq_len`` bounds prompt + output (at most ``max_seq_len - 1`` tokens in
    every mode; default 1024); ``kv_cache_tokens`` sizes the paged KV cache (default: every slot can hold
    ``max_seq_len - 1`` tokens and the longest path a step accepts past them, ``max_depth + 1``). A cache
    smaller than one such request bounds each request to what it holds less that headroom, which a
    drafting mode needs and ``ar`` does not: there the same request ends sooner, or is refused, in the
    drafting modes (its tokens still those of plain decoding, as far as they go).
    ``max_prefill_tokens``: prompt tokens a step prefills at most, in one forward (default 8,192);
    prompts beyond it, a longer one included, go on over the next steps, each piece on top of the last,
    while the running requests decode in between.
    ``cuda_graphs``: on a GPU, drafting replays a CUDA graph per batch size, greedy or sampled
    (:mod:`trtllm_bole.spec.draft_graphs`), the tree selection one per pool shape, and the target's
    verify one per forest shape and kind of batch (greedy, sampled, sampled with top-k/top-p), with its
    acceptance and commit (:mod:`trtllm_bole.spec.verify_graphs`), the MTP's follow-up one per batch size,
    greedy ones captured by :meth:`warm_up` and sampled ones when first met, and the prefills one per number
    of prompts and padded token count (:mod:`trtllm_bole.spec.prefill_graphs`), captured when first met;
    ``False`` launches every kernel from Python. An engine supplies its own dtype, limits, draft settings
    and budget table, and refuses requests beyond its build.

    Thread-safe: calls from several threads (or interleaved streams) share the executor's steps, each
    returning its own requests' tokens; :class:`~trtllm_bole.serving.ServingEngine` serves many callers
    from one thread instead (:meth:`serve`: the LLM is then the server's). :meth:`shutdown` (or leaving
    a ``with LLM(...) as llm:`` block) frees the model, its caches and graphs.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        speculative_config: BoleConfig | None = None,
        device: str = "cpu",
        dtype: str = "auto",
        max_batch_size: int | None = None,
        max_seq_len: int | None = None,
        kv_cache_tokens: int | None = None,
        block_size: int = 16,
        cuda_graphs: bool = True,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS,
    ) -> None:
        if not isinstance(cuda_graphs, bool):  # None had been a TypeError from inside the executor
            raise ValueError(f"cuda_graphs must be True or False, got {short_repr(cuda_graphs)}")
        settings = resolve_settings(model, speculative_config, device, dtype, max_batch_size, max_seq_len,
                                    kv_cache_tokens, block_size, max_prefill_tokens)  # fmt: skip
        path = self.model_dir = settings.path
        self.engine, self.speculative_config = settings.engine, settings.speculative_config
        max_batch_size, max_seq_len = settings.max_batch_size, settings.max_seq_len
        if self.engine is not None:
            self.engine.check_files()
            self.model = self.engine.load_model(device=device, mtp=self.speculative_config.speculates)
            hf_config, generation_config = self.engine.hf_config, self.engine.generation_config
        else:
            self.model = load_model(
                path, dtype=settings.dtype, device=device, mtp=self.speculative_config.speculates
            )
            hf_config, generation_config = load_json(path / "config.json"), read_generation_config(path)
        self.tokenizer = Tokenizer.find(path, self.model.config.vocab_size)
        budget = _find_budget(self.speculative_config, self.engine, self.model)
        num_blocks = None if kv_cache_tokens is None else -(-kv_cache_tokens // block_size)
        self.executor = Executor(
            self.model,
            self.speculative_config,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            num_blocks=num_blocks,
            block_size=block_size,
            budget=budget,
            eos_token_ids=eos_token_ids(path, hf_config, generation_config),
            decode_text=self.tokenizer.decode if self.tokenizer else None,
            special_texts=self.tokenizer.special_texts if self.tokenizer else (),
            cuda_graphs=cuda_graphs,
            max_prefill_tokens=max_prefill_tokens,
        )
        self._lock = threading.Lock()  # the executor is one thread's at a time
        self._to_abort: list[Request] = []  # aborted by whoever next holds the lock
        self._shut_down = False
        self._servers: weakref.WeakSet[Server] = weakref.WeakSet()  # closed by shutdown, first
        self._served = False  # by a server (serve), whose thread alone steps the executor from then on

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Abort every unfinished request (a ``generate`` call returns them aborted, a stream ends; a
        :class:`~trtllm_bole.serving.ServingEngine` made from this LLM is closed first, its requests ending
        with final updates) and drop the model, its KV cache, GDN states and CUDA graphs, so that their
        GPU memory can go to the next model (``torch.cuda.empty_cache()`` hands torch's cached blocks back
        to the device). The graphs, their pool and the caches are released here, not left to the last
        reference to them. Later calls refuse; a second shutdown does nothing. What stays allocated is
        torch's: a cuBLAS workspace for each stream a GEMM ran on (README, Concurrency)."""
        for server in list(self._servers):
            server.close()
        with self._lock:
            if self._shut_down:
                return
            scheduler = self.executor.scheduler
            for request in [*scheduler.running, *scheduler.waiting]:
                self.executor.abort(request)
            self._shut_down = True
            self._to_abort.clear()
            self.executor.release()  # the graphs and caches, whoever else still holds the model
            self.executor = self.model = None  # type: ignore[assignment]  # refused from here on

    def serve(self, make_server: Callable[[Executor], S]) -> S:
        """``make_server(executor)``: a server that steps this LLM's executor from its own thread, closed by
        :meth:`shutdown` before the executor goes. Its thread steps without this LLM's lock, so from then
        on the LLM refuses to generate or warm up by itself (the two had stepped one executor at once,
        wrong tokens on both sides), and a second server; an LLM whose own requests still run is refused."""
        with self._lock:
            self._check_open()
            self._abort_queued()  # closed streams' requests
            own = len(self.executor.scheduler.running) + len(self.executor.scheduler.waiting)
            if own:
                raise RuntimeError(
                    f"this LLM still runs {own} request(s) of its own (a generate call, an unfinished "
                    "stream): serve it once they end"
                )
            server = make_server(self.executor)
            self._servers.add(server)
            self._served = True
            return server

    def _check_open(self) -> None:
        """Under the lock: refuse work once :meth:`shutdown` ran, or once a server steps the executor."""
        if self._shut_down:
            raise RuntimeError("this LLM was shut down: make a new LLM to generate")
        if self._served:
            raise RuntimeError(
                "this LLM is served (LLM.serve, ServingEngine.for_llm), whose thread steps its executor: "
                "submit requests to the server, or make another LLM to generate"
            )

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (strings, or lists of token ids), batched continuously.

        A prompt that cannot be served (too long, empty, ids out of range) gets an output with
        ``error`` set and ``finish_reason == "error"``; the others run to completion. A prompt that
        cannot be encoded raises before anything is submitted; settings the executor refuses, or a step
        that raises, abort this call's unfinished requests before the error propagates (none is left
        queued for a later call).
        """
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        prompt_ids = [self.encode(p) for p in prompts]
        requests: list[Request] = []
        try:
            with self._lock:  # a refused submission (stop strings without a tokenizer): abort those before it
                self._check_open()
                for ids, sp in zip(prompt_ids, params, strict=True):
                    requests.append(self.executor.submit(ids, sp))
            with tqdm(total=len(requests), desc="generating", unit="req", disable=not use_tqdm) as bar:
                done = sum(r.finished for r in requests)
                bar.update(done)
                while done < len(requests):  # other callers' requests may still run after this returns
                    self._step()
                    now = sum(r.finished for r in requests)
                    bar.update(now - done)
                    done = now
        finally:
            self._abort_unfinished(requests)
        return [self._output(r, p) for r, p in zip(requests, prompts, strict=True)]

    def generate_stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None
    ) -> Iterator[RequestOutput]:
        """Yield the request's output each time tokens are committed; the last one has
        ``finished=True``. ``outputs[0].token_ids`` and ``.text`` hold only what is new in that yield;
        the texts join up to :meth:`generate`'s (text that may still change, such as the start of a
        stop string or half of a multi-byte character, waits for the next yield)."""
        prompts = _as_prompt_list(prompt) or [prompt]  # [] is one empty prompt
        if len(prompts) != 1:
            raise ValueError(
                f"generate_stream takes one prompt, got {len(prompts)}: use generate for several"
            )
        params = _as_params_list(sampling_params, 1)[0]
        prompt_ids = self.encode(prompts[0])
        with self._lock:
            self._check_open()
            request = self.executor.submit(prompt_ids, params)
        text = TextDelta(self.tokenizer.decode if self.tokenizer else None, params.stop, prompt_ids)
        sent = 0
        try:
            while True:
                with self._lock:  # whoever stepped, the request's tokens are in it: one consistent view
                    finished, new_ids = request.finished, request.output_ids[sent:]
                    if new_ids or finished:
                        delta = text(request.output_ids, finished), new_ids
                        output = self._output(request, prompts[0], delta)
                        sent += len(new_ids)
                if new_ids or finished:
                    yield output
                if finished:
                    return
                self._step()
        finally:  # maybe run by the garbage collector, on a thread that holds the lock mid-step
            self._abort_unfinished([request], wait=False)

    def warm_up(
        self, batch_sizes: Sequence[int] | None = None, *, sampled: bool = False, use_tqdm: bool = True
    ) -> list[int]:
        """Serve short dummy requests at each batch size, untimed, before real traffic: on a GPU, Triton
        compiles a kernel variant the first time a step meets its shape class (the batch's config, a
        node count's divisibility), seconds each. Default: batch 1 on CPU (nothing to compile); on a
        GPU the powers of two up to ``max_batch_size`` and ``max_batch_size`` itself. Returns the batch
        sizes served (a cold first run on the H200 served 164 tokens/s against 258-275 warmed up:
        ``benchmarks/results/profile_step_h200_cold.json``).

        On a GPU it then captures the CUDA graphs of every batch size up to ``max_batch_size``
        (:meth:`Executor.capture_graphs`: a tenth of a second each, that a request would otherwise wait
        for): the greedy draft's, the selection's and the greedy verify step's of full trees, and the MTP's
        follow-up; ``sampled``: the draft's and the verify step's of sampled batches too (else captured
        when first met: a first sampled run of 32 requests at batch 32 on the H200 took 2.3 s, capturing
        them, against 0.6 s once they were there)."""
        with self._lock:  # the executor and model of now: a shutdown from here on refuses the generate below
            self._check_open()
            executor, model = self.executor, self.model
        limit = executor.max_batch_size
        if batch_sizes is None and model.device.type != "cuda":
            batch_sizes = [1]
        elif batch_sizes is None:
            batch_sizes = sorted({1 << i for i in range(limit.bit_length())} | {limit})
        try:
            batch_sizes = list(batch_sizes)
        except TypeError:  # warm_up(4): a TypeError from the loop below
            got = short_repr(batch_sizes)
            raise ValueError(f"warm-up batch sizes are a list of integers, got {got}") from None
        bad = [
            b
            for b in batch_sizes
            if isinstance(b, bool) or not isinstance(b, numbers.Integral) or not 1 <= b <= limit
        ]
        if bad:
            raise ValueError(
                f"warm-up batch sizes must be integers in [1, {limit}] (max_batch_size), got {bad}"
            )
        # Two speculative steps per request at the deepest tree; token ids 1-15 exist in any vocabulary.
        # Prompt lengths 4, 44 and 84 meet the prefill's chunk shapes: a lone partial chunk, and a full one
        # of 64 then a partial one (a prefill program walking one chunk and one walking two). Each request
        # must fit what one request may hold (a small KV cache holds fewer tokens than the context limit).
        scheduler = executor.scheduler
        most = scheduler.request_limit  # at least 2, or the executor would not have started
        params = SamplingParams(
            max_tokens=min(2 * (self.speculative_config.max_depth + 1), most - 1), ignore_eos=True
        )
        fits = [n for n in (4, 44, 84) if n <= scheduler.max_seq_len // 4 and n + params.max_tokens <= most]
        lengths = fits or [1]
        for b in tqdm(batch_sizes, desc="warming up", unit="batch", disable=not use_tqdm):
            prompts = [[1 + (i + j) % 15 for j in range(lengths[i % len(lengths)])] for i in range(b)]
            outputs = self.generate(prompts, [params] * b, use_tqdm=False)
            failed = next((o.error for o in outputs if o.error), None)
            if failed:
                raise RuntimeError(f"warm-up at batch {b} failed: {failed}")
        with self._lock:
            self._check_open()
            self.executor.capture_graphs(sampled=sampled)
        return list(batch_sizes)

    # ------------------------------------------------------------------------------------ #

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    f"{self.model_dir} has no tokenizer.json: pass prompts as lists of token ids"
                )
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as e:  # the tokenizer's TypeError said the str was not a str
                raise ValueError(
                    f"the prompt holds a lone surrogate {prompt[e.start]!r} at character {e.start}, which no "
                    "text encoding holds: decode its source with errors='replace' (or fix it)"
                ) from None
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, bytes | bytearray):  # a sequence of ints, but surely meant as text
            raise ValueError(
                f"a prompt is a string or token ids, got bytes {short_repr(prompt)}: decode it first"
            )
        try:
            return [token_id(t) for t in prompt]
        except TypeError:
            raise ValueError(
                f"a prompt is a string or a sequence of integer token ids, got {short_repr(prompt)}"
            ) from None

    def _step(self) -> None:
        """One executor step for every caller. A step that raises may have left any running request
        half-updated: they all end with an error, whoever submitted them. Streams closed while the step
        held the lock are aborted as it ends (their requests held their slots and blocks until some
        later step, which a stream with a slow reader may not take for long)."""
        try:
            with self._lock:
                if self._shut_down:  # shut down since the caller looked: its requests ended aborted
                    return
                self._abort_queued()
                try:
                    self.executor.step()
                except BaseException as e:
                    for r in list(self.executor.scheduler.running):
                        self.executor.scheduler.finish(r, "error", f"a step failed: {e!r}")
                    raise
        finally:
            if self._to_abort:  # queued before the release, so after it no other closer waits on us
                self._abort_unfinished([], wait=False)

    def _abort_unfinished(self, requests: list[Request], *, wait: bool = True) -> None:
        """Abort those of ``requests`` still unfinished: now, or, without ``wait`` while another holder
        has the lock, at the next step."""
        self._to_abort.extend(requests)  # atomic
        if self._lock.acquire(blocking=wait):
            try:
                self._abort_queued()
            finally:
                self._lock.release()

    def _abort_queued(self) -> None:
        if self._shut_down:  # every request ended with it
            self._to_abort.clear()
            return
        while self._to_abort:
            request = self._to_abort.pop()
            if not request.finished:
                self.executor.abort(request)

    def _output(
        self, request: Request, prompt: Prompt, delta: tuple[str, list[int]] | None = None
    ) -> RequestOutput:
        """The request's output: its whole text (cut at the first stop string) and tokens, or a
        stream's ``delta`` of them."""
        if delta is None:
            # No output, no decode: a refused prompt keeps ids the tokenizer cannot take (-5, 2**40).
            text = (
                output_text(self.tokenizer.decode, request.prompt_ids, request.output_ids)
                if self.tokenizer and request.output_ids
                else ""
            )
            delta = cut_at_stop(text, request.params.stop), list(request.output_ids)
        return RequestOutput(
            request.request_id,
            prompt if isinstance(prompt, str) else None,
            list(request.prompt_ids),  # the caller's: the request reads its own while it runs (stop strings)
            [CompletionOutput(0, *delta, request.finish_reason)],
            request.finished,
            dataclasses.replace(request.stats),  # a snapshot: the request's own keeps counting
            request.error,
        )


@dataclass(frozen=True)
class Settings:
    """An :class:`LLM`'s arguments resolved against its checkpoint or engine, before any weight loads."""

    path: Path
    engine: Engine | None  # its config read, its files not yet hashed
    speculative_config: BoleConfig
    max_batch_size: int
    max_seq_len: int
    dtype: torch.dtype | None  # a checkpoint's serving dtype; an engine's is its build's


def resolve_settings(
    model: str | Path | None = None,
    speculative_config: BoleConfig | None = None,
    device: str = "cpu",
    dtype: str = "auto",
    max_batch_size: int | None = None,
    max_seq_len: int | None = None,
    kv_cache_tokens: int | None = None,
    block_size: int = 16,
    max_prefill_tokens: int = MAX_PREFILL_TOKENS,
) -> Settings:
    """What :class:`LLM` checks before it loads any weight (minutes at 27B), with the same arguments: a
    setting refused here is refused without loading anything, so that a server's launcher can refuse it
    up front (the budget table and the KV cache's size are checked later, by the LLM itself)."""
    if model is not None and (not isinstance(model, str | Path) or not str(model)):
        raise ValueError(f"model must be a checkpoint's or an engine's directory, got {short_repr(model)}")
    path = Path(model) if model is not None else DEFAULT_MODEL
    _check_settings(device, max_batch_size, max_seq_len, kv_cache_tokens, block_size, max_prefill_tokens)
    if speculative_config is not None and not isinstance(speculative_config, BoleConfig):
        raise ValueError(
            f"speculative_config must be a BoleConfig or None, got {type(speculative_config).__name__} "
            f"{short_repr(speculative_config)}"
        )
    if not path.is_dir():
        raise ValueError(f"model {path} is not a directory (expected a checkpoint or an engine)")
    if is_engine_dir(path):  # built by build_scripts/build_engine.py: its config validated now
        engine = load_engine(path, device=device, check_files=False)
        max_batch_size, max_seq_len, bole = engine.runtime_settings(
            dtype, max_batch_size, max_seq_len, speculative_config
        )
        if bole.speculates and not engine.config["model"]["has_mtp"]:
            raise no_mtp_error(bole.mode, "the engine was built without one")
        return Settings(path, engine, bole, max_batch_size, max_seq_len, None)
    bole = speculative_config or BoleConfig()
    max_batch_size = 8 if max_batch_size is None else max_batch_size
    max_seq_len = 1024 if max_seq_len is None else max_seq_len
    torch_dtype = _resolve_dtype(dtype, device)
    config = load_config(path)
    config.check_seq_len(max_seq_len)
    missing = missing_mtp(path, config) if bole.speculates else None
    if missing is not None:
        raise no_mtp_error(bole.mode, missing)
    return Settings(path, None, bole, max_batch_size, max_seq_len, torch_dtype)


def _resolve_dtype(dtype: str, device: str) -> torch.dtype:
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if dtype not in choices:
        raise ValueError(f"dtype must be 'auto', 'float32' or 'bfloat16', got {dtype!r}")
    return choices[dtype]


def _find_budget(config: BoleConfig, engine: Engine | None, model: Qwen35Model) -> BudgetTable | None:
    """The table ``config`` names, else the one the engine's config lists (built with ``--calibrate``).
    A table calibrated for another tree depth, device or model architecture still loads (exactness does
    not depend on it) but warns: its budgets were measured for other costs. One that cannot give a
    budget at the ``epsilon`` asked (no timings to re-derive it from) is refused here, not at the first
    step, and so is an ``epsilon`` without a table."""
    path = config.budget_table or (engine.budget_path if engine is not None else None)
    if path is None:
        if config.epsilon is not None:  # it was dropped without a word
            raise ValueError(
                f"epsilon={config.epsilon} re-derives a budget table's budgets, and there is none: give "
                "budget_table=, or an engine built by build_scripts/build_engine.py --calibrate"
            )
        return None
    table = BudgetTable.load(path)
    for entry in table.entries:
        table.lookup(entry.batch_max, entry.kv_max, epsilon=config.epsilon)
    depth, here, arch = config.max_depth + 1, device_name(model.device), model.config.architecture_id
    other_model = table.model not in ("", arch)  # "": a table from before tables named their model
    if config.mode == "bole" and ((table.max_depth, table.device) != (depth, here) or other_model):
        of_model = f" of another model ({table.model}, this is {arch})" if other_model else ""
        warnings.warn(
            f"{path}: a budget calibrated{of_model} for trees of depth {table.max_depth} on {table.device}, "
            f"used for depth {depth} on {here}: its budgets may not fit this run's costs (recalibrate "
            "with build_scripts/build_engine.py --calibrate)",
            stacklevel=3,
        )
    return table


def _check_settings(
    device: str,
    max_batch_size: int | None,
    max_seq_len: int | None,
    kv_cache_tokens: int | None,
    block_size: int,
    max_prefill_tokens: int,
) -> None:
    check_device(device)
    optional = {  # None: the default
        "max_batch_size": (max_batch_size, 1),
        "max_seq_len": (max_seq_len, MIN_SEQ_LEN),
        "kv_cache_tokens": (kv_cache_tokens, 1),
    }
    check_limits(**{name: limit for name, limit in optional.items() if limit[0] is not None},
                 block_size=(block_size, 1), max_prefill_tokens=(max_prefill_tokens, 1))  # fmt: skip


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str | bytes | bytearray):
        return [prompts]  # bytes: one prompt, that encode refuses
    # A dict's keys became the prompts, a set's order is none, a SamplingParams' (field, value) pairs were
    # prompts ("got ('max_tokens', 64)").
    if isinstance(prompts, Mapping | Set | BaseModel):
        raise ValueError(
            f"prompts are a string, token ids or a list of them, got a {type(prompts).__name__}: "
            f"{short_repr(prompts)}"
        )
    try:
        prompts = list(prompts.tolist() if hasattr(prompts, "tolist") else prompts)  # tensors, arrays
    except TypeError:
        raise ValueError(
            f"prompts are a string, token ids or a list of them, got {short_repr(prompts)}"
        ) from None
    if prompts and all(_is_integer(t) for t in prompts):
        return [prompts]  # one prompt given as token ids
    return prompts


def _is_integer(t: object) -> bool:
    """An integer of any integer type, a tensor's items (0-d tensors: ``list(torch.tensor([5, 6]))``) too:
    a list of them is one prompt of token ids (each 0-d tensor had been a prompt, refused)."""
    return isinstance(t, numbers.Integral) or (isinstance(t, torch.Tensor) and t.ndim == 0)


def _as_params_list(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if isinstance(params, Mapping):  # its keys became the list: "got 'max_tokens'"
        raise ValueError(
            f"sampling_params must be SamplingParams or a list of them, got a dict: pass "
            f"SamplingParams(**{short_repr(params)})"
        )
    # A BoleConfig iterates as its (field, value) pairs: "got 6 sampling params".
    if isinstance(params, BaseModel) or not isinstance(params, Iterable):
        raise ValueError(
            f"sampling_params must be SamplingParams or a list of them, got {short_repr(params)}"
        )
    params = list(params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} sampling params for {n} prompts")
    bad = [p for p in params if not isinstance(p, SamplingParams)]
    if bad:
        raise ValueError(f"sampling_params must be SamplingParams, got {short_repr(bad[0])}")
    return params
