"""trtllm-bench-style runs of the four decoding schemes on one engine, side by side.

    python benchmarks/bench.py throughput --dataset data.jsonl [--engine DIR] [--device cuda] \\
        [--modes ar,chain,tree-serial,bole] [--batch-sizes 1,2,4,8,16,32]
    python benchmarks/bench.py latency --dataset data.jsonl [--engine DIR] [--modes ...]

``throughput``: every request is submitted at once and the executor batches them continuously
(``--batch-sizes`` bound how many run together). ``latency``: one request at a time.
Reported like trtllm-bench: request throughput, output tokens/s, per-user tokens/s, TTFT, TPOT and
inter-token (streaming event) latency percentiles, plus mean accepted tokens per step (MAT) and
acceptance rate. Requests ignore EOS so each produces exactly its ``output_tokens``.

Greedy outputs of every mode are compared with ``ar`` in the same run; a mode whose tokens differ in
any trial gets no speed-up, and the run exits 1. Each parting is examined (``partings``): a near-tie
when the two tokens are the top two of a cache-less forward over the prompt and ``ar``'s tokens, within
``NEAR_TIE_LOGITS`` (``exact_up_to_near_ties``: rounding, not a wrong token; still no speed-up).
``--repeats N`` times each (batch, mode) N times, the modes interleaved, and reports the median run with every
run's tokens/s beside it. Kernel variants Triton compiles inside a timed run are counted (``kernel_compiles``,
with a warning): a compile there is a latency spike of a tenth of a second or more that the warm-up should
have taken. So are the CUDA graphs captured inside it (``graph_captures``: greedy drafting's, one per new
batch size, and the selection's and verify's, one per new shape, e.g. as a run's last requests finish).
The modes share the target's graphs, so the first mode to meet a shape pays its capture: the medians
leave out, for every mode alike, the rounds in which any mode captured or compiled, where a round is
clean (``median_of_trials``; the first round usually pays, so ``--repeats 4`` keeps three).
Writes JSON (+ PNG) to ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
from _bench_util import check_tag, tagged_stem
from pydantic import ValidationError
from tqdm import tqdm

from trtllm_bole import LLM, BoleConfig, SamplingParams
from trtllm_bole.config import default_depth, one_line, short_repr, unused_drafts
from trtllm_bole.kernels.compiles import recording_compiles
from trtllm_bole.spec.calibration import device_name
from trtllm_bole.spec.executor import Executor

HERE = Path(__file__).resolve().parent


def load_dataset(path: Path, llm: LLM) -> list[tuple[list[int], int]]:
    """Every request of a dataset (JSON lines of ``input_ids`` or ``prompt``, and ``output_tokens``), or
    a ValueError that names the line and what is wrong: a request the executor would refuse or cut short
    fails here, before any timing, not as a failed request inside a run."""
    config = llm.model.config
    context = config.max_position_embeddings - 1  # prompt + output at the longest max_seq_len
    try:
        # "\n" only (read_text reads "\r\n" as "\n"): splitlines() also splits at U+2028, U+2029 and U+0085,
        # which JSON strings may hold unescaped.
        lines = path.read_text().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"dataset {path} cannot be read: {e}") from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"dataset {path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(row, dict) or not {"input_ids", "prompt"} & row.keys():
            raise ValueError(f"{where}: expected an object with input_ids or prompt, and output_tokens")
        n = row.get("output_tokens")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{where}: output_tokens must be an integer of 1 or more, got {n!r}")
        prompt = row["input_ids"] if "input_ids" in row else row["prompt"]
        if "input_ids" in row and not isinstance(prompt, list):  # a string would be tokenized as text
            raise ValueError(f"{where}: input_ids must be a list of token ids, got {short_repr(prompt)}")
        try:
            ids = llm.encode(prompt)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if not ids:
            raise ValueError(f"{where}: empty prompt")
        if bad := [t for t in ids if not 0 <= t < config.vocab_size]:
            raise ValueError(
                f"{where}: token ids {bad[:5]} are outside the vocabulary [0, {config.vocab_size})"
            )
        if len(ids) + n > context:
            raise ValueError(
                f"{where}: a prompt of {len(ids)} tokens and {n} output tokens exceed the model's context of "
                f"{context} tokens (max_position_embeddings {config.max_position_embeddings}); shorten the "
                "prompt or ask for fewer output_tokens"
            )
        out.append((ids, n))
    if not out:
        raise ValueError(f"dataset {path} holds no requests")
    return out


PROFILED_SPECULATION = {"max_depth": 8, "top_k": 4, "max_nodes": 63}
"""The speculation ``profile_step.py`` and ``profile_host.py`` serve with (``bench.py``'s defaults)."""


def profiling_parser(doc: str, *, modes: str, batch_sizes: str) -> argparse.ArgumentParser:
    """The command line of the tools that serve a dataset once per (mode, batch) and look inside the
    run (``profile_step.py``, ``profile_host.py``); they add their own options."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--engine", default=None, help="engine or checkpoint dir (default: embedded model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--modes", default=modes)
    parser.add_argument("--batch-sizes", default=batch_sizes)
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="> 0: sampled requests, request i seeded with i"
    )
    parser.add_argument("--out", type=Path, required=True)
    return parser


def open_profiling_run(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[LLM, list[tuple[list[int], int]]]:
    """The engine and the dataset of a :func:`profiling_parser` command line (bad modes or batch sizes, an
    --out that is no directory or a dataset it cannot serve end in the parser's error, before any run)."""
    check_runs(parser, args.modes, args.batch_sizes)
    check_out(parser, args.out)
    llm = LLM(args.engine, speculative_config=BoleConfig(), device=args.device, dtype=args.dtype)
    try:
        return llm, load_dataset(args.dataset, llm)
    except ValueError as e:
        parser.error(str(e))


def first_difference(out: list[int], ref: list[int]) -> int:
    """Index of the first token where ``out`` and ``ref`` differ (the shorter length if one is a prefix)."""
    return next(
        (i for i, (a, b) in enumerate(zip(out, ref, strict=False)) if a != b), min(len(out), len(ref))
    )


def divergence(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """How greedy outputs differ from plain decoding's: requests that differ, and the earliest
    differing token (index into the request's output) with its request and both tokens (None past
    the end of a shorter output)."""
    firsts = [
        (first_difference(out, ref), r)
        for r, (out, ref) in enumerate(zip(outputs, reference, strict=True))
        if out != ref
    ]
    token, request = min(firsts)

    def at(seq: list[int]) -> int | None:
        return seq[token] if token < len(seq) else None

    return {
        "requests_differing": len(firsts),
        "requests": len(reference),
        "first_differing_token": token,
        "request": request,
        "ar_token": at(reference[request]),
        "token": at(outputs[request]),
    }


NEAR_TIE_LOGITS = 1e-2
"""The widest logit gap at which a mode's greedy output may part from ``ar``'s. Float32 rounding of one
model through different kernels and batch groupings (a tree verify against a one-token step) moves the
embedded model's logits by ~1e-3: measured partings on the H200 at gaps of 1.4e-3 and 3.9e-3 (logits
~8), where ``ar`` itself picks differently at batch 2 and at batch 4. A wrong verify or commit moves
logits by far more than this."""

MAX_PARTINGS = 8  # more parted requests than this is no near-tie: not examined one by one


@torch.no_grad()
def parting(llm: LLM, prompt: list[int], ar_output: list[int], token: int, other: int | None) -> dict:
    """Where a mode's output parts from ``ar``'s at output index ``token`` (``other``: the mode's token
    there, None past its end): the target's logits after the prompt and ar's first ``token`` outputs,
    from one cache-less forward (a third computation, rounded differently from both modes). A near-tie
    (``NEAR_TIE_LOGITS``) if the two tokens are that forward's top two and that close; else an error."""
    ar_token = ar_output[token] if token < len(ar_output) else None
    record = {"token_index": token, "ar_token": ar_token, "token": other, "near_tie": False}
    if ar_token is None or other is None:
        return record  # an output shorter than the other's: a lost token, never rounding
    ids = torch.tensor([prompt + ar_output[:token]], device=llm.model.device)
    logits = llm.model.forward_sequences(ids)[1][0, -1].double()
    gap = float(logits[ar_token] - logits[other])
    top2 = set(logits.topk(2).indices.tolist())
    return record | {
        "logit_gap_ar_minus_mode": gap,
        "top_logit": float(logits.max()),
        "near_tie": top2 == {ar_token, other} and abs(gap) <= NEAR_TIE_LOGITS,
    }


def partings(
    llm: LLM, dataset, trial_outputs: list[list[list[int]]], reference: list[list[int]]
) -> list[dict]:
    """Every distinct (request, first differing token) over the trials, examined by :func:`parting`."""
    seen = {}
    for outputs in trial_outputs:
        for r, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
            if out != ref:
                token = first_difference(out, ref)
                seen.setdefault((r, token, out[token] if token < len(out) else None), None)
    if len(seen) > MAX_PARTINGS:
        return [{"request": r, "token_index": t, "near_tie": False} for r, t, _ in seen]
    return [{"request": r} | parting(llm, dataset[r][0], reference[r], t, o) for r, t, o in seen]


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return {"mean": statistics.fmean(values), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99)}


def max_seq_len_for(dataset, llm: LLM) -> int:
    """The executor's ``max_seq_len`` for a dataset: its longest prompt plus output, and some room, within
    the model's positions (a request that fits them is served whole: :func:`load_dataset`) and an engine's
    build (:func:`check_engine` refuses a dataset past it)."""
    limit = llm.engine.build["max_seq_len"] if llm.engine else llm.model.config.max_position_embeddings
    return min(max(len(p) + n for p, n in dataset) + 32, limit)


def check_engine(
    llm: LLM, dtype: str, batches: list[int], modes: list[str], bole_args: dict, dataset
) -> None:
    """An engine serves what it was built for, here as through :class:`LLM`: a larger batch, longer
    requests or deeper or larger trees raise the engine's ValueError, which names the build flag. Each
    mode's own config (a chain's --max-nodes is no tree's: it was checked as bole's)."""
    if llm.engine is not None:
        longest = max(len(p) + n for p, n in dataset) + 1  # + 1: a prompt leaves room for its first token
        for mode in modes:
            llm.engine.runtime_settings(dtype, max(batches), longest, BoleConfig.for_mode(mode, **bole_args))


def speculation(llm: LLM, given: dict) -> dict:
    """Every run's draft settings in full (the results record them): those ``given``, the unset tree size
    and depth the engine's where there is one (as ``generate --model ENGINE`` takes them: a default depth
    of 8 failed on an engine of shallower trees), else BoleConfig's defaults."""
    fields = BoleConfig.model_fields
    unset = {"max_depth": default_depth(given.get("max_nodes")), "top_k": fields["top_k"].default,
             "max_nodes": fields["max_nodes"].default}  # fmt: skip
    return {**unset, **(llm.engine.drafts(given) if llm.engine is not None else given)}


def executor_for(llm: LLM, mode: str, bole_args: dict, max_batch: int, max_seq_len: int) -> Executor:
    """A fresh executor of ``mode`` on the LLM's model (the model keeps its cache and draft graphs)."""
    return Executor(
        llm.model, BoleConfig.for_mode(mode, **bole_args), max_batch_size=max_batch, max_seq_len=max_seq_len,
        eos_token_ids=(), budget=llm.executor.budget,
    )  # fmt: skip


def run(
    llm: LLM,
    mode: str,
    bole_args: dict,
    dataset,
    max_batch: int,
    *,
    sequential: bool,
    max_seq_len: int = 0,
    temperature: float = 0.0,
) -> dict:
    """Serve the dataset once; returns metrics and every request's output tokens. ``max_seq_len``:
    default :func:`max_seq_len_for` of the dataset (a warm-up passes the timed dataset's: the same cache
    sizes and draft graphs as the timed runs). ``temperature > 0``: sampled, request ``i`` seeded with
    ``i`` (so that two runs of one mode draw the same tokens)."""
    executor = executor_for(llm, mode, bole_args, max_batch, max_seq_len or max_seq_len_for(dataset, llm))
    graphs = [g for g in executor.graph_sets if g is not None]
    captured_before = sum(g.captures for g in graphs)
    model_device = llm.model.device  # cuda:1 syncs GPU 1, not the current device
    sync = (lambda: torch.cuda.synchronize(model_device)) if model_device.type == "cuda" else (lambda: None)
    submitted, first, events = {}, {}, {}
    start = time.perf_counter()
    pending = list(dataset)
    requests = []
    with (
        tqdm(total=len(dataset), desc=f"{mode} b{max_batch}", unit="req", leave=False) as bar,
        recording_compiles() as compiles,
    ):
        while pending or executor.has_unfinished:
            while pending and (not sequential or not executor.has_unfinished):
                prompt, n = pending.pop(0)
                seed = len(requests) if temperature > 0 else None
                params = SamplingParams(max_tokens=n, ignore_eos=True, temperature=temperature, seed=seed)
                r = executor.submit(prompt, params)
                submitted[r.request_id] = time.perf_counter()
                requests.append(r)
            for event in executor.step():
                now = time.perf_counter()
                rid = event.request.request_id
                first.setdefault(rid, now)
                events.setdefault(rid, []).append((now, len(event.token_ids)))
                if event.finished:
                    bar.update()
    sync()
    wall = time.perf_counter() - start
    failed = [r for r in requests if r.error]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, e.g. {failed[0].error}")
    ttft, tpot, itl, per_user = [], [], [], []
    for r in requests:
        rid, times = r.request_id, events[r.request_id]
        ttft.append(first[rid] - submitted[rid])
        n = len(r.output_ids)
        if n > 1:
            span = times[-1][0] - first[rid]
            tpot.append(span / (n - 1))
            per_user.append((n - 1) / span if span > 0 else float("inf"))
        itl += [b[0] - a[0] for a, b in itertools.pairwise(times)]
    tokens = sum(len(r.output_ids) for r in requests)
    steps = sum(r.stats.steps for r in requests)
    drafted = sum(r.stats.drafted for r in requests)
    accepted = sum(r.stats.accepted for r in requests)
    return {
        "mode": mode,
        "max_batch_size": max_batch,
        "requests": len(requests),
        "output_tokens": tokens,
        "seconds": wall,
        "request_throughput": len(requests) / wall,
        "output_tokens_per_s": tokens / wall,
        "per_user_tokens_per_s": percentiles(per_user),
        "ttft_ms": {k: v * 1e3 for k, v in percentiles(ttft).items()},
        "tpot_ms": {k: v * 1e3 for k, v in percentiles(tpot).items()},
        "inter_event_latency_ms": {k: v * 1e3 for k, v in percentiles(itl).items()},
        "mean_accepted_tokens": (accepted + steps) / steps if steps else 1.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "kernel_compiles": dict(sorted(collections.Counter(compiles).items())),
        "graph_captures": sum(g.captures for g in graphs) - captured_before,
        "_outputs": [r.output_ids for r in requests],
    }


def warm_up(
    llm: LLM, mode: str, bole_args: dict, dataset, batch: int, tokens: int, temperature: float = 0.0
) -> None:
    """Serve ``batch`` requests of ``tokens`` tokens each, untimed, at this batch size: Triton compiles
    a kernel variant the first time it meets its shape class (a batch's node count, a tree depth), a
    second or more that must not land inside a timed run; then capture the CUDA graphs (drafting's, the
    verify step's of full trees; greedy, or sampled too at a ``temperature``) of every batch size up to
    ``batch`` (the timed runs' executors meet the same cache and graphs)."""
    limit = max_seq_len_for(dataset, llm)
    if tokens > 0:
        prompts = [prompt for prompt, _ in itertools.islice(itertools.cycle(dataset), batch)]
        warm = [(p, tokens) for p in prompts]
        run(llm, mode, bole_args, warm, batch, sequential=False, max_seq_len=limit, temperature=temperature)
    executor_for(llm, mode, bole_args, batch, limit).capture_graphs(sampled=temperature > 0)


def clean_rounds(trials: dict[str, list[dict]]) -> list[int]:
    """The rounds (a trial of every mode, interleaved) in which no mode captured a CUDA graph or compiled
    a kernel; every round where none is. The modes share the target's graphs, so the first mode to meet
    a shape pays its capture (on the H200 at 9f9154f: ``ar`` and the baselines in the first round, never
    ``bole``, which runs last): a round is left out for every mode alike."""
    rounds = range(len(next(iter(trials.values()))))
    clean = [
        i
        for i in rounds
        if not any(t[i]["graph_captures"] or any(t[i]["kernel_compiles"].values()) for t in trials.values())
    ]
    return clean or list(rounds)


def median_trial(trials: list[dict], rounds: list[int]) -> tuple[dict, list[list[list[int]]]]:
    """The trial of median output tokens/s among ``rounds`` (the lower middle one for an even count),
    with every trial's tokens/s beside it; and every trial's outputs."""
    speeds = [t["output_tokens_per_s"] for t in trials]
    outputs = [t.pop("_outputs") for t in trials]
    result = dict(trials[sorted(rounds, key=lambda i: speeds[i])[(len(rounds) - 1) // 2]])
    result["median_of_trials"] = rounds
    result["output_tokens_per_s_trials"] = speeds
    result["kernel_compiles_trials"] = [sum(t["kernel_compiles"].values()) for t in trials]
    result["graph_captures_trials"] = [t["graph_captures"] for t in trials]
    return result, outputs


def check_against_ar(llm: LLM, dataset, result: dict, outputs, reference: list[list[int]]) -> None:
    """``identical_to_ar``: every trial's tokens equal ``ar``'s. Else ``divergence`` (the earliest) and
    ``partings`` (each parted request), and ``exact_up_to_near_ties`` when every parting is a near-tie."""
    result["identical_to_ar"] = all(out == reference for out in outputs)
    result["exact_up_to_near_ties"] = result["identical_to_ar"]
    if not result["identical_to_ar"]:
        result["divergence"] = divergence(next(out for out in outputs if out != reference), reference)
        result["partings"] = partings(llm, dataset, outputs, reference)
        result["exact_up_to_near_ties"] = all(p["near_tie"] for p in result["partings"])


MODES = ("ar", "chain", "tree-serial", "bole")


SPECULATION_FLAGS = {"max_depth": "--depth", "top_k": "--branching", "max_nodes": "--max-nodes"}


def check_runs(parser: argparse.ArgumentParser, modes: str, batch_sizes: str) -> tuple[list[str], list[int]]:
    """The modes and batch sizes of a command line, or its error. Each at most once: a second run of a
    batch size took the first one's ``ar`` run as its reference."""
    listed = modes.split(",")
    if not set(listed) <= set(MODES) or len(set(listed)) < len(listed):
        parser.error(f"--modes {modes}: each of {', '.join(MODES)} at most once, comma-separated")
    sizes = batch_sizes.split(",")
    if not all(b.isdecimal() and int(b) > 0 for b in sizes) or len({int(b) for b in sizes}) < len(sizes):
        parser.error(f"--batch-sizes {batch_sizes}: comma-separated integers of 1 or more, each at most once")
    return listed, [int(b) for b in sizes]


def check_out(parser: argparse.ArgumentParser, out: Path) -> None:
    """The results' directory, created before any run: an --out that cannot be one failed after every
    timed run, the results lost."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"--out {out}: not a directory that can be created ({e.strerror})")


def check_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[str], list[int], dict]:
    """The modes, batch sizes and speculation of the command line, or its error (before the model loads);
    and the output directory, created."""
    modes, batches = check_runs(parser, args.modes, args.batch_sizes)
    if args.repeats < 1 or args.warmup < 0:
        parser.error(f"--repeats {args.repeats} (1 or more), --warmup {args.warmup} (0 or more)")
    flags = {"max_depth": args.depth, "top_k": args.branching, "max_nodes": args.max_nodes}
    bole_args = {name: value for name, value in flags.items() if value is not None}
    if unused := [name for name in bole_args if all(name in unused_drafts(m, bole_args)[0] for m in modes)]:
        # Each executor takes only the settings its mode uses: one that no listed mode uses went unseen.
        given = ", ".join(SPECULATION_FLAGS[name] for name in unused)
        parser.error(f"{given}: used by none of --modes {args.modes}")
    try:
        for mode in ["ar", *modes]:  # the executors' configs: ar always runs
            BoleConfig.for_mode(mode, **bole_args)
    except ValidationError as e:
        given = ", ".join(f"{SPECULATION_FLAGS[name]} {value}" for name, value in bole_args.items())
        parser.error(f"{given}: {one_line(e, SPECULATION_FLAGS)}")
    check_tag(parser, args.tag)
    check_out(parser, args.out)
    return modes, [1] if args.kind == "latency" else batches, bole_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=["throughput", "latency"])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--engine", default=None, help="engine or checkpoint dir (default: embedded model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="auto: bfloat16 on a GPU, float32 on CPU")  # fmt: skip
    parser.add_argument(
        "--modes",
        default="ar,chain,tree-serial,bole",
        help="ar always runs (the reference), reported if listed",
    )
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="throughput only (latency: 1)")
    parser.add_argument(
        "--depth", type=int, help="draft tree depth (unset: the engine's, else 8; --max-nodes where fewer)"
    )
    parser.add_argument("--branching", type=int, help="draft top-k a node (unset: 4)")
    parser.add_argument(
        "--max-nodes", type=int, help="draft tokens (unset: the engine's, else 63; +1 pending: 64)"
    )
    parser.add_argument("--warmup", type=int, default=16,
                        help="tokens per request of the untimed run before each (batch, mode)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed runs per (batch, mode), modes interleaved; median kept")  # fmt: skip
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--tag", default=None, help="names the run: bench_<kind>_<device>_<tag>.json")
    args = parser.parse_args(argv)

    modes, batches, bole_args = check_args(parser, args)
    try:  # a missing engine, a device this torch does not see: one line, as for the flags above
        llm = LLM(args.engine, speculative_config=BoleConfig(), device=args.device, dtype=args.dtype,
                  max_batch_size=1)  # fmt: skip
        bole_args = speculation(llm, bole_args)
        dataset = load_dataset(args.dataset, llm)
        check_engine(llm, args.dtype, batches, ["ar", *modes], bole_args, dataset)
    except ValueError as e:  # a tree given deeper than the engine's nodes: pydantic's, in one line
        parser.error(one_line(e, SPECULATION_FLAGS) if isinstance(e, ValidationError) else str(e))
    # Prompts of every prefill chunk shape first: the per-(batch, mode) warm-ups serve only the dataset's
    # first prompts, and a commit variant met first inside a timed run compiled there (ar, batch 1).
    llm.warm_up(use_tqdm=False)
    runs = []
    for batch in batches:
        order = ["ar"] + [m for m in modes if m != "ar"]
        # The drafting modes first: their executors need the larger KV cache (a tree's headroom past each
        # request), which `ar`'s then serves as it is. Warmed up the other way round, the first drafting
        # executor replaced the cache, and with it every CUDA graph `ar` had captured on it, so that
        # `ar`'s first timed run captured them again (2026-12-02: 8,426 tok/s at batch 32 against 11,006
        # and 12,344 for its other two runs, bench_throughput_h200_session26.json).
        for mode in sorted(order, key=lambda m: m == "ar"):
            warm_up(llm, mode, bole_args, dataset, batch, args.warmup)
        trials = {mode: [] for mode in order}
        for _ in range(args.repeats):  # interleaved: drift of the machine hits every mode alike
            for mode in order:
                trials[mode].append(
                    run(llm, mode, bole_args, dataset, batch, sequential=args.kind == "latency")
                )
        reference, rounds = trials["ar"][0]["_outputs"], clean_rounds(trials)
        for mode in [m for m in order if m in modes]:
            result, outputs = median_trial(trials[mode], rounds)
            check_against_ar(llm, dataset, result, outputs, reference)
            runs.append(result)
            ttft, tpot = result["ttft_ms"]["p50"], result["tpot_ms"].get("p50", 0.0)
            exact = (
                "True"
                if result["identical_to_ar"]
                else "near-ties"
                if result["exact_up_to_near_ties"]
                else "False"
            )
            print(
                f"{mode:<12} batch {batch:>3}: {result['output_tokens_per_s']:9.1f} tok/s, "
                f"TTFT p50 {ttft:7.1f} ms, TPOT p50 {tpot:6.2f} ms, "
                f"MAT {result['mean_accepted_tokens']:.2f}, identical to ar: {exact}"
            )
            if any(result["kernel_compiles_trials"]):
                print(f"  warning: kernels compiled in the timed runs: {result['kernel_compiles_trials']}")
            if any(result["graph_captures_trials"]):
                print(f"  note: CUDA graphs captured in timed runs: {result['graph_captures_trials']}")
    if "ar" in modes:
        add_speedups(runs)

    device = device_name(llm.model.device)  # the GPU asked for (cuda:1 named GPU 0), or "cpu"
    stem = tagged_stem(f"bench_{args.kind}", device, args.tag)
    result = {
        "kind": args.kind,
        "command": "python benchmarks/bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": str(llm.model.dtype).removeprefix("torch."),
        "engine": str(args.engine or "embedded qwen35-code-tiny"),
        "dataset": {
            "path": str(args.dataset),
            "requests": len(dataset),
            "input_tokens_mean": statistics.fmean(len(p) for p, _ in dataset),
            "output_tokens_mean": statistics.fmean(n for _, n in dataset),
        },
        "speculation": bole_args,
        "warmup_tokens": args.warmup,
        "repeats": args.repeats,
        "all_identical_to_ar": all(r["identical_to_ar"] for r in runs),
        "all_exact_up_to_near_ties": all(r["exact_up_to_near_ties"] for r in runs),
        "near_tie_logits": NEAR_TIE_LOGITS,
        "runs": runs,
    }
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out / f'{stem}.json'}")
    plot(runs, modes, args.out / f"{stem}.png", device)
    return 0 if result["all_identical_to_ar"] else 1


def add_speedups(runs: list[dict]) -> None:
    """``speedup_vs_ar``: tokens/s against ``ar``'s at the same batch size, for a run whose every trial's
    tokens equal ``ar``'s, where ``ar``'s own trials all decoded alike; None, with the reason in
    ``error``, for any other (near-ties included)."""
    for r in runs:
        base = next(x for x in runs if x["mode"] == "ar" and x["max_batch_size"] == r["max_batch_size"])
        if r["identical_to_ar"] and base["identical_to_ar"]:
            r["speedup_vs_ar"] = r["output_tokens_per_s"] / base["output_tokens_per_s"]
        elif r["identical_to_ar"]:  # ar's first trial, the reference, is not what its timed trials decoded
            r["speedup_vs_ar"] = None
            r["error"] = "ar's own trials decoded differently: no reference, no speed-up reported"
        else:
            r["speedup_vs_ar"] = None
            kind = "at near-ties only" if r["exact_up_to_near_ties"] else "beyond near-ties"
            r["error"] = f"greedy output parts from ar ({kind}): no speed-up reported"


def plot(runs: list[dict], modes: list[str], path: Path, device: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for mode in modes:
        rows = [r for r in runs if r["mode"] == mode and r["identical_to_ar"]]
        ax.plot(
            [r["max_batch_size"] for r in rows],
            [r["output_tokens_per_s"] for r in rows],
            marker="o",
            label=mode,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max batch size")
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"Throughput by decoding scheme ({device})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
