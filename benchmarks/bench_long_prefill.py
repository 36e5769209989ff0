"""Long prompts through the whole model's prefill on the GPU: peak memory and time, checked first.

    python benchmarks/bench_long_prefill.py --out DIR [--tag NAME] [--bounds 32000,8192,2048]  # H200: ~1 min
    python benchmarks/bench_long_prefill.py --out DIR --compare BEFORE.json AFTER.json  # the PNG

The embedded checkpoint (6 GDN and 2 attention layers, 4,096-token context, float32) prefills batches of
prompts of 512 to 4,096 tokens through ``Qwen35Model.prefill``, as the executor admits them (one chain a
prompt, slots and KV blocks of their own). Per point: ``peak_mib``, the device memory that the prompts'
context (``StepContext.chains``) and the prefill allocate above what was live before them (the caches and
weights are); ``ms``, the median wall time of three such (synchronised; the host's launches and checks
included). Before timing, every point's logits at the prompts' last tokens are checked against the
training forward (``forward_sequences``, the chunked closed form in torch, no cache) of each prompt
alone: relative RMS within 1e-3; a point that fails is reported and not timed. Run from two checkouts
(``--tag before`` in the first), it records what a change did to the same points.

``--bounds``: the executor (``ar``) admits ``--serve`` prompts at once under each ``max_prefill_tokens``
and steps until every request has its first token (a step prefills at most the bound; the requests
whose prompts are in decode in between): the peak memory of those steps above the executor's caches,
their count and time. Every bound's outputs (four tokens a request) must equal the first bound's, or
its figures are dropped. Writes ``<out>/bench_long_prefill_<device>[_<tag>].json`` (``h200``, ``cpu``, else
the GPU's name).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from _bench_util import DEVICES, check_tag, rel_rms, run_meta, tagged_stem, write_result

from trtllm_bole.config import BoleConfig, SamplingParams
from trtllm_bole.llm import DEFAULT_MODEL
from trtllm_bole.models.cache import StepContext
from trtllm_bole.models.loader import load_model
from trtllm_bole.spec.calibration import device_name
from trtllm_bole.spec.executor import Executor

POINTS = "1x4096,8x512,8x2048,8x4096"  # prompts x tokens each
BLOCK = 64
TOL = 1e-3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the JSON")
    p.add_argument(
        "--tag",
        default=None,
        help="names the run, after the device: bench_long_prefill_<device>_<tag>.json",
    )
    p.add_argument(
        "--device", default="cuda", choices=DEVICES, help="cuda, or cpu for a smoke run (no memory figures)"
    )
    p.add_argument(
        "--points", default=POINTS, help=f"prompts x tokens each, comma-separated (default {POINTS})"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bounds", default="", help="max_prefill_tokens values for the executor's part (e.g. "
                   "32768,8192,2048; none: skipped)")  # fmt: skip
    p.add_argument(
        "--serve", default="8x4000", help="prompts x tokens each the executor's part admits at once"
    )
    p.add_argument(
        "--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="plot two runs' JSONs, run nothing"
    )
    args = p.parse_args(argv)
    check_tag(p, args.tag)
    return args


def fresh_cache(model, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A new cache with a slot and ``length`` positions of KV blocks per prompt (slots reversed, blocks
    interleaved across prompts); returns the block tables and slots."""
    per = -(-length // BLOCK)
    cache = model.allocate_cache(num_slots=batch, num_blocks=batch * per, block_size=BLOCK)
    device = cache.k_cache.device
    tables = torch.arange(batch * per, dtype=torch.int32).view(per, batch).T.contiguous().to(device)
    return tables, torch.arange(batch, device=device).flip(0)


def prefill(model, ids: torch.Tensor, tables: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """What the executor does for admitted prompts: their context (one chain each), then the prefill."""
    batch, length = ids.shape
    fresh = torch.zeros(batch, dtype=torch.long, device=ids.device)
    return model.prefill(ids.flatten(), StepContext.chains([length] * batch, slots, tables, fresh))[1]


def point(model, batch: int, length: int, gen: torch.Generator, repeats: int) -> dict:
    cuda = model.embed_tokens.is_cuda
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ids = torch.randint(model.config.vocab_size, (batch, length), generator=gen).to(model.embed_tokens.device)
    logits = prefill(model, ids, *fresh_cache(model, batch, length))
    with torch.no_grad():
        want = torch.cat([model.forward_sequences(row[None])[1][0, -1:] for row in ids])
    err = rel_rms(logits, want)
    out = {"prompts": batch, "tokens_each": length, "logits_rel_rms": err}
    if not err <= TOL:
        return {**out, "error": f"logits off the training forward by {err:.2e} (> {TOL}): not timed"}
    times, peaks = [], []
    for _ in range(repeats):
        cache = fresh_cache(model, batch, length)  # each prefill starts from empty caches
        sync()
        if cuda:
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        prefill(model, ids, *cache)
        sync()
        times.append(time.perf_counter() - start)
        if cuda:
            peaks.append(torch.cuda.max_memory_allocated() - base)
    return {**out, "ms": statistics.median(times) * 1e3, "peak_mib": max(peaks) / 2**20 if peaks else None}


def admission(model, bound: int, ids: torch.Tensor) -> dict:
    """Executor steps (``ar``) from the admission of every prompt at once until each has its first token,
    the prefill bounded to ``bound`` tokens a step (the requests whose prompts are in decode in between):
    their peak memory above the executor's caches, their count and time; then the requests run to the
    end (four tokens each) for their outputs."""
    cuda = ids.is_cuda
    batch, length = ids.shape
    executor = Executor(model, BoleConfig(mode="ar"), max_batch_size=batch, max_seq_len=length + 5,
                        cuda_graphs=False, max_prefill_tokens=bound)  # fmt: skip
    requests = [executor.submit(row.tolist(), SamplingParams(max_tokens=4)) for row in ids]
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    start, steps = time.perf_counter(), 0
    while not all(r.output_ids or r.finished for r in requests):
        executor.step()
        steps += 1
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - start) * 1e3
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else None
    while executor.has_unfinished:
        executor.step()
    outputs = [r.output_ids for r in requests]
    return {"max_prefill_tokens": bound, "steps_to_first_tokens": steps, "ms_to_first_tokens": ms,
            "peak_mib": peak, "outputs": outputs}  # fmt: skip


COMPARED = ("device", "model", "dtype")  # what two runs must share for their bars to stand side by side


def paired(before: dict, after: dict) -> list[tuple[dict, dict]]:
    """Each point of ``after`` with ``before``'s of the same prompts and tokens, or a ValueError where the
    runs are no like for like: another device, model or dtype, or other points (bars were paired by
    position, so that a run's 8 x 4096 stood beside the other's 1 x 4096 as its "before")."""
    if differs := [k for k in COMPARED if before.get(k) != after.get(k)]:
        raise ValueError(
            "runs of other " + ", ".join(f"{k}s ({before.get(k)}, {after.get(k)})" for k in differs)
        )
    points = {(p["prompts"], p["tokens_each"]): p for p in before["points"]}
    if sorted(points) != sorted((p["prompts"], p["tokens_each"]) for p in after["points"]):
        raise ValueError("the runs measured other points: run both with the same --points")
    return [(points[p["prompts"], p["tokens_each"]], p) for p in after["points"]]


def plot(before: dict, after: dict, png: Path) -> str:
    """Peak memory and time of each point, two runs side by side (e.g. before and after a change)."""
    pairs = paired(before, after)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing: no PNG"
    labels = [f"{p['prompts']} x {p['tokens_each']}" for _, p in pairs]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, unit in ((axes[0], "peak_mib", "peak memory above the caches, MiB"), (axes[1], "ms", "ms")):
        for offset, side, run in ((-0.2, 0, before), (0.2, 1, after)):
            # A point that failed its check has no figure: no bar (a bar of 0 would read as the best).
            values = [float("nan") if pair[side].get(key) is None else pair[side][key] for pair in pairs]
            ax.bar([i + offset for i in range(len(values))], values, 0.4, label=run["tag"])
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("prompts x tokens each")
        ax.set_ylabel(unit)
        ax.legend()
    fig.suptitle(f"Prefill of long prompts, embedded model, float32 ({after['device']})")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return f"wrote {png}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compare:
        before, after = (json.loads(Path(f).read_text()) for f in args.compare)
        try:
            print(plot(before, after, Path(args.out) / f"{Path(args.compare[1]).stem}.png"))
        except ValueError as e:
            print(f"--compare {' '.join(args.compare)}: {e}", file=sys.stderr)
            return 2
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: pass --device cpu for a smoke run", file=sys.stderr)
        return 2
    points = [tuple(int(n) for n in p.split("x")) for p in args.points.split(",")]
    model = load_model(DEFAULT_MODEL, dtype=torch.float32, device=args.device, mtp=False, progress=False)
    gen = torch.Generator().manual_seed(0)
    point(model, 2, 100, gen, 1)  # warm-up: compiles, allocations, cuBLAS handles
    stem = tagged_stem("bench_long_prefill", device_name(torch.device(args.device)), args.tag)
    label = stem.removeprefix("bench_long_prefill_")  # the comparison plot's legend: h200_before, h200
    meta = run_meta(device=args.device, model=DEFAULT_MODEL.name, dtype="float32", tag=label)
    results = [point(model, b, n, gen, args.repeats) for b, n in points]
    served = []
    if args.bounds:
        batch, length = (int(n) for n in args.serve.split("x"))
        ids = torch.randint(model.config.vocab_size, (batch, length), generator=gen).to(
            model.embed_tokens.device
        )
        admission(model, 64, ids[:2, :100])  # warm-up: the executor's kernels compile here
        served = [admission(model, int(bound), ids) for bound in args.bounds.split(",")]
        for run in served[1:]:  # the same tokens whatever the bound, or no figure of it is kept
            if run["outputs"] != served[0]["outputs"]:
                run.update(
                    ms_to_first_tokens=None, peak_mib=None, error="outputs differ from the first bound's"
                )
    data = {**meta, "points": results, "admission": {"prompts x tokens": args.serve, "runs": served}}
    path = write_result(args.out, f"{stem}.json", data)
    for r in [*results, *served]:
        print({k: v for k, v in r.items() if k != "outputs"})
    print(f"wrote {path}")
    return 0 if all("error" not in r for r in [*results, *served]) else 1


if __name__ == "__main__":
    sys.exit(main())
