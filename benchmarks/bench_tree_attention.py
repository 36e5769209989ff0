"""Full attention of a verify step at Qwen3.5 sizes: the Triton kernel against the torch path.

    python benchmarks/bench_tree_attention.py --out DIR     # H200, about a minute

One full-attention layer of Qwen3.5-9B (16 query heads, 4 KV heads) and 27B (24, 4), head dim 256, bf16;
top-4 trees of 64 nodes and depth 8 per request over a paged cache (blocks of 16, scattered), every
request with the same committed context. Both sides are ``bole::tree_attention``'s implementations:
the kernel (:mod:`trtllm_bole.kernels.tree_attention`) and the torch path
(:mod:`trtllm_bole.reference.attention_tree`: the block table's window gathered, a dense mask, SDPA),
whose table is as wide as the context (the executor's is as wide as the largest reservation, which only
makes the torch path slower). At every point the kernel is first checked against the torch path in
float64 (relative RMS under 2e-2) and nothing is timed if it fails. Times: CUDA-graph replays with the L2
flushed (``_bench_util.graph_timer``), inputs rotating; peak transient memory of each side
(``torch.cuda.max_memory_allocated`` above the inputs). Writes ``<out>/tree_attention_<device>.json``.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import _bench_util as U
import torch

from trtllm_bole.kernels.tree_attention import tree_attention
from trtllm_bole.reference import attention_tree
from trtllm_bole.testing import forest, topk_parents

MODELS = {"qwen3.5-9b": (16, 4), "qwen3.5-27b": (24, 4)}
D, PAGE, TOL = 256, 16, 2e-2


def inputs(hq: int, kvh: int, batch: int, context: int, gen: torch.Generator) -> tuple:
    tree = forest([topk_parents(64, 4, 8)] * batch, device="cuda")
    width = -(-context // PAGE)
    num_blocks = batch * width

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)

    n = tree.num_nodes
    tables = torch.randperm(num_blocks, generator=gen, device="cuda").view(batch, width).int()
    lens = torch.full((batch,), context, device="cuda")
    caches = randn(num_blocks, PAGE, kvh, D), randn(num_blocks, PAGE, kvh, D)
    return randn(n, hq, D), randn(n, kvh, D), randn(n, kvh, D), *caches, tables, lens, tree


def torch_path(*args: object) -> torch.Tensor:
    return attention_tree.tree_attention(*args, D**-0.5)


def kernel(*args: object) -> torch.Tensor:
    return tree_attention(*args, D**-0.5)


def point(
    model: str, hq: int, kvh: int, batch: int, context: int, gen: torch.Generator, measure, splits: list[int]
) -> dict:
    """Check the kernel against the torch path in float64, then time both (nothing timed if it fails);
    then the kernel with each of ``splits`` splits of the context (each checked first), the launcher's
    choice being the one it made above."""
    x = inputs(hq, kvh, batch, context, gen)
    nbytes = sum(t.numel() * t.element_size() for t in x[:5])
    sets = [x] + [inputs(hq, kvh, batch, context, gen) for _ in range(min(3, 4 * U.L2_BYTES // nbytes))]
    exact = torch_path(*(t.double() for t in x[:5]), *x[5:])
    row = {"model": model, "batch": batch, "context": context, "rel_rms": U.rel_rms(kernel(*x), exact)}
    if not U.passes([row["rel_rms"]], TOL):
        print(f"{model} B={batch} ctx={context}: check FAILED ({row['rel_rms']:.2e}), not timed")
        return row
    for name, fn in (("kernel", kernel), ("torch", torch_path)):
        row[f"{name}_us"] = measure(U.Rotating(sets, lambda s, fn=fn: fn(*s)))
        row[f"{name}_peak_bytes"] = U.peak_bytes(lambda fn=fn: fn(*x))
    row["speedup"] = row["torch_us"] / row["kernel_us"]
    by_splits, failed = {}, []
    for count in splits:
        split = partial(tree_attention, scale=D**-0.5, splits=count)
        if U.passes([U.rel_rms(split(*x), exact)], TOL):
            by_splits[count] = measure(U.Rotating(sets, lambda s, split=split: split(*s)))
        else:
            failed.append(count)
    if failed:  # recorded, and the run exits 1
        row["failed_splits"] = failed
        print(f"  splits {failed}: check FAILED, not timed", flush=True)
    if by_splits:
        row["kernel_us_by_splits"] = by_splits
        print(f"  splits: {', '.join(f'{c}: {t:.1f}' for c, t in by_splits.items())} us", flush=True)
    print(
        f"{model} B={batch} ctx={context}: kernel {row['kernel_us']:.1f} us, torch {row['torch_us']:.1f} us "
        f"({row['speedup']:.1f}x), rel {row['rel_rms']:.1e}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--batches", default="1,8,16,32")
    ap.add_argument("--contexts", default="1024,4096,16384")
    ap.add_argument("--rep-ms", type=int, default=25)
    ap.add_argument("--splits", default="", help="also time the kernel at these split counts, e.g. 1,2,4,8")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_tree_attention.py times GPU kernels: it needs CUDA", file=sys.stderr)
        return 2
    measure = U.graph_timer(args.rep_ms)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = [
        point(model, hq, kvh, batch, context, gen, measure, [int(c) for c in args.splits.split(",") if c])
        for model, (hq, kvh) in MODELS.items()
        for context in (int(c) for c in args.contexts.split(","))
        for batch in (int(b) for b in args.batches.split(","))
    ]
    shape = {"head_dim": D, "page": PAGE, "tree": {"size": 64, "top_k": 4, "depth": 8}, "dtype": "bf16"}
    path = U.write_result(
        args.out, U.result_name("tree_attention"), {"meta": U.run_meta(shape=shape), "rows": rows}
    )
    print(f"wrote {path}")
    return 1 if any("speedup" not in row or "failed_splits" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
