"""Top-k / top-p at a real vocabulary: the floor found by radix select (the CUDA ``bole::filter_floor``)
against the sorting reference run on the same GPU, alone and inside a verify's sampled acceptance.

    python benchmarks/bench_filter_floor.py --out DIR     # H200, about two minutes

A verify's rows (64 a request, the drafted tokens made likely at their parents) at Qwen3's vocabulary
(151,936), temperature 0.8 (``bench_sampled_accept.inputs``), with top-p 0.9, top-k 50 and top-p 0.9, or
top-k 50. Every point first checks the kernel's floors against the reference
(``trtllm_bole.testing.floor_agreement``: every row within float32 rounding of the float64 definition,
every row that rounding cannot decide equal bit for bit) and ``accept`` with either floor for the same
leaves and bonus tokens on the same coins; a point that fails is not timed and the run reports nothing.
Times: CUDA-graph replays, the L2 flushed (``_bench_util.graph_timer``); memory: the peak allocated by
one call above what was live before it. ``--sweep`` also times the kernel's block sizes and warps.
Writes ``<out>/filter_floor_<device>.json`` and a PNG; ``TRITON_INTERPRET=1 ... --device cpu`` smoke-runs
the checks alone (a small ``--vocab``).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import _bench_util as U
import torch
from bench_sampled_accept import inputs

from trtllm_bole import ops
from trtllm_bole.kernels import filter_floor as kernel
from trtllm_bole.reference import sampling as reference
from trtllm_bole.spec.acceptance import Sampling, accept
from trtllm_bole.testing import floor_agreement, floors_agree

SETTINGS = {"top-p 0.9": (0, 0.9), "top-k 50, top-p 0.9": (50, 0.9), "top-k 50": (50, 1.0)}
SWEEP = ((256, 4), (512, 4), (256, 8), (512, 8), (1024, 8), (1024, 16), (2048, 8), (2048, 16), (4096, 16))


@contextmanager
def sorting_floor():
    """``ops.filter_floor`` answered by the sorting reference, whatever the device (the old side)."""
    radix = ops.filter_floor
    ops.filter_floor = reference.filter_floor
    try:
        yield
    finally:
        ops.filter_floor = radix


def floor_args(tree, logits, sampling: Sampling) -> tuple:
    """What ``process_logits`` hands ``filter_floor``: the logits and each row's settings."""
    rows = tree.request
    return logits, sampling.temperature[rows], sampling.top_k[rows], sampling.top_p[rows]


def point(batch: int, vocab: int, setting: str, device: str, gen: torch.Generator, measure) -> dict:
    k, p = SETTINGS[setting]
    tree, tokens, logits, sampling, _ = inputs(batch, vocab, p, device, gen, top_k=k)
    args = floor_args(tree, logits, sampling)
    row = {"batch": batch, "rows": tree.num_nodes, "vocab": vocab, "setting": setting}
    row["agreement"] = floor_agreement(kernel.filter_floor(*args), *args)
    row["floors_ok"] = floors_agree(row["agreement"])
    radix = accept(tree, tokens, logits, sampling)
    with sorting_floor():
        by_sort = accept(tree, tokens, logits, sampling)
    row["same_outcome"] = all(torch.equal(a, b) for a, b in zip(radix, by_sort, strict=True))
    print(f"B={batch} {setting}: {row['agreement']} same outcome {row['same_outcome']}", flush=True)
    if measure is None or not (row["floors_ok"] and row["same_outcome"]):
        return row
    row["radix_us"] = measure(lambda: kernel.filter_floor(*args))
    row["radix_peak_bytes"] = U.peak_bytes(lambda: kernel.filter_floor(*args))
    row["sort_us"] = measure(lambda: reference.filter_floor(*args))
    row["sort_peak_bytes"] = U.peak_bytes(lambda: reference.filter_floor(*args))
    row["accept_radix_us"] = measure(lambda: accept(tree, tokens, logits, sampling))
    with sorting_floor():
        row["accept_sort_us"] = measure(lambda: accept(tree, tokens, logits, sampling))
    row["speedup"] = row["sort_us"] / row["radix_us"]
    row["accept_speedup"] = row["accept_sort_us"] / row["accept_radix_us"]
    print(
        f"  floor: sort {row['sort_us'] / 1e3:.2f} ms, radix {row['radix_us'] / 1e3:.2f} ms "
        f"({row['speedup']:.1f}x); accept: {row['accept_sort_us'] / 1e3:.2f} -> "
        f"{row['accept_radix_us'] / 1e3:.2f} ms",
        flush=True,
    )
    return row


def sweep(batches: list[int], vocab: int, gen: torch.Generator, measure) -> list[dict]:
    """The kernel's time by block size and warps (its floors checked at each); at batch 1 also on 4 of
    its rows (a drafting level's)."""
    rows = []
    for batch in batches:
        for setting in ("top-p 0.9", "top-k 50, top-p 0.9"):
            k, p = SETTINGS[setting]
            tree, _, logits, sampling, _ = inputs(batch, vocab, p, "cuda", gen, top_k=k)
            full = floor_args(tree, logits, sampling)
            for count in (len(full[0]), 4) if batch == 1 else (len(full[0]),):
                args = tuple(a[:count] for a in full)
                for block, warps in SWEEP:
                    run = partial(kernel.filter_floor, *args, shape=(block, warps))
                    ok = floors_agree(floor_agreement(run(), *args))
                    us = measure(run) if ok else None
                    rows.append(
                        {
                            "batch": batch,
                            "rows": count,
                            "setting": setting,
                            "block": block,
                            "warps": warps,
                            "us": us,
                        }
                    )
                    print(
                        f"sweep B={batch} rows {count} {setting} block {block} warps {warps}: {us}",
                        flush=True,
                    )
    return rows


def plot(rows: list[dict], png: Path, device: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing: no PNG"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for setting, style in zip(SETTINGS, ("-o", "--s", ":^"), strict=True):
        timed = sorted(
            (r for r in rows if r["setting"] == setting and "radix_us" in r), key=lambda r: r["batch"]
        )
        batches = [r["batch"] for r in timed]
        for ax, prefix in zip(axes, ("", "accept_"), strict=True):
            for side, color in (("sort", "C3"), ("radix", "C0")):
                times = [r[f"{prefix}{side}_us"] / 1e3 for r in timed]
                ax.plot(batches, times, style, color=color, label=f"{side}, {setting}")
    for ax, title in zip(axes, ("the floor alone", "a verify's sampled acceptance"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (64 rows a request)")
        ax.set_ylabel("ms (log)")
        ax.set_title(f"{title}, 151,936 tokens ({device})", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return f"wrote {png}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--device", default="cuda", choices=U.DEVICES)
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--sweep", action="store_true", help="also time the kernel's block sizes and warps")
    args = ap.parse_args(argv)
    if U.cuda_missing("bench_filter_floor.py", args.device):
        return 2
    cuda = args.device == "cuda"
    gen = torch.Generator(device=args.device).manual_seed(0)
    measure = U.graph_timer(args.rep_ms) if cuda else None
    batches = [int(b) for b in args.batches.split(",")]
    rows = [point(b, args.vocab, s, args.device, gen, measure) for b in batches for s in SETTINGS]
    if not all(r["floors_ok"] and r["same_outcome"] for r in rows):
        print(
            "the radix floors or the acceptance disagreed with the sort's: nothing reported", file=sys.stderr
        )
        return 1
    if not cuda:
        return 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for row in rows:
        row["block"], row["warps"] = kernel.launch_shape(row["rows"], sms)
    data = {
        "meta": U.run_meta(sms=sms, shapes=kernel.SHAPES),
        "rows": rows,
    }
    if args.sweep:
        data["sweep"] = sweep(batches, args.vocab, gen, measure)
    path = U.write_result(args.out, U.result_name("filter_floor"), data)
    print(f"wrote {path}")
    print(plot(rows, Path(args.out) / U.result_name("filter_floor", "png"), data["meta"]["device"]))
    failed = [r for r in data.get("sweep", []) if r["us"] is None]  # a shape whose floors were wrong
    if failed:
        print(f"{len(failed)} swept shapes failed their check (us: null in the JSON)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
