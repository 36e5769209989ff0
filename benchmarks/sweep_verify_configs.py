"""Which verify config wins at other head dims, input precisions and tree shapes than the kernel bench's
(Qwen3.5-9B/27B heads, bf16 serving): every config of both kernels (the blocked kernel's ``CONFIGS``,
the explicit inverse's ``INVERSE_CONFIGS``) next to the launcher's default and tree-serial.

    python benchmarks/sweep_verify_configs.py --out DIR     # H200, about 3 minutes

Points: the embedded model's GDN heads (H = 2, HV = 4, dk = dv = 64) and Qwen3.5-9B's (H = 16, HV = 32,
dk = dv = 128); fp32 inputs (the fp32-exact ``ieee`` dots, how the float32 end-to-end runs verify) and
bf16 inputs (the serving precisions); top-4 trees of 64 nodes and depth 8 (a speculative step) and chains
of 64 (a prompt chunk: prefill verifies chains). Every config is checked against the float64 serial walk
first (relative RMS of ``o`` within 1e-4 for fp32 inputs, 1e-2 for bf16) and timed only if it passes;
times are CUDA-graph replays with the L2 flushed (``_bench_util.graph_timer``). Writes
``<out>/verify_configs_<device>.json``: per point the default's config and time, the winner, every time.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import _bench_util as U
import torch
import triton
from tqdm import tqdm

from trtllm_bole.kernels import gdn_tree_verify as K
from trtllm_bole.kernels.baselines import tree_serial as TS
from trtllm_bole.kernels.gdn_prefill import prefill_config
from trtllm_bole.testing import chain_parents, topk_parents

DIMS = {"tiny": (2, 4, 64, 64), "9b": (16, 32, 128, 128)}  # H, HV, dk, dv
SHAPES = {"tree": lambda: topk_parents(64, 4, 8), "chain": lambda: chain_parents(64)}
PLAN = (  # (dims, inputs dtype, shape, batch sizes), in priority order (the JSON is rewritten per point)
    ("tiny", torch.float32, "tree", (1, 8, 32)),
    ("tiny", torch.float32, "chain", (1, 8, 32)),
    ("9b", torch.bfloat16, "chain", (1, 8, 32)),
    ("tiny", torch.bfloat16, "tree", (8, 32)),
    ("tiny", torch.bfloat16, "chain", (8, 32)),
    ("9b", torch.float32, "tree", (1, 32)),
    ("9b", torch.float32, "chain", (1, 32)),
)
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


def candidates(dk: int, dv: int, dtype: torch.dtype) -> list[tuple]:
    """(config, precision) pairs the launcher accepts for these dims and inputs."""
    precisions = ("ieee",) if dtype == torch.float32 else ("bf16", "tf32")
    out = []
    for cfg in (*K.CONFIGS, *K.INVERSE_CONFIGS):
        if dk % cfg.bk or dv % cfg.bv:
            continue
        for p in precisions:
            if isinstance(cfg, K.InverseConfig) and p == "bf16" and K.bf16_refused(cfg):
                continue
            out.append((cfg, p))
    return out


def point(dims: str, dtype: torch.dtype, shape: str, batch: int, gen: torch.Generator, measure) -> dict:
    h, hv, dk, dv = DIMS[dims]
    tree = U.tree_of([SHAPES[shape]() for _ in range(batch)], "cuda")
    x = U.make_inputs(tree, h, hv, dk, dv, dtype, gen)
    ref = U.exact_outputs(x)[0]
    args = (x.q, x.k, x.v, x.g, x.beta, x.state, tree)
    times: dict[str, float | None] = {}

    def timed(name: str, fn) -> None:
        err = U.rel_rms(fn()[0], ref)
        times[name] = measure(fn) if err <= TOL[dtype] else None

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    default = K.default_plan(tree.num_nodes, batch, hv, dk, dv, x.q.dtype, x.v.dtype, num_sms=sms)  # as timed
    timed("default", lambda: K.gdn_tree_verify(*args, scale=x.scale))
    if shape == "chain":  # the prefill's config on one chunk a request, whatever the batch
        exact = dtype == torch.float32
        timed(
            "prefill", lambda: K.gdn_tree_verify(*args, scale=x.scale, config=prefill_config(dk, dv, exact))
        )
    timed("tree-serial", lambda: TS.gdn_tree_verify_serial(*args, scale=x.scale))
    for cfg, p in candidates(dk, dv, dtype):
        timed(f"{cfg} {p}", lambda c=cfg, p=p: K.gdn_tree_verify(*args, scale=x.scale, precision=p, config=c))
    baselines = ("tree-serial", "prefill")
    ranked = sorted((t, name) for name, t in times.items() if t is not None and name not in baselines)
    return {
        "dims": dims, "dtype": str(dtype).removeprefix("torch."), "shape": shape, "batch": batch,
        "default_config": " ".join(map(str, default)), "default_us": times["default"], "best": ranked[0][1],
        "best_us": ranked[0][0], "prefill_us": times.get("prefill"), "tree_serial_us": times["tree-serial"],
        "times_us": times,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rep-ms", type=int, default=40)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (the configs' times are the point)")
    gen = torch.Generator(device="cuda").manual_seed(0)
    measure = U.graph_timer(args.rep_ms)
    work = [(d, t, s, b) for d, t, s, batches in PLAN for b in batches]
    results = []
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / U.result_name("verify_configs")
    meta = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "command": " ".join(["python", *sys.argv]),
        "timing": "CUDA-graph replay, L2 flushed, median (triton do_bench)", "dims": DIMS,
    }  # fmt: skip
    for dims, dtype, shape, batch in tqdm(work, desc="points"):
        r = point(dims, dtype, shape, batch, gen, measure)
        results.append(r)
        tqdm.write(
            f"{dims} {r['dtype']} {shape} B{batch}: default {r['default_us'] or float('nan'):.1f} us, "
            f"best {r['best_us']:.1f} ({r['best']}), tree-serial {r['tree_serial_us'] or float('nan'):.1f}"
        )
        path.write_text(json.dumps({**meta, "points": results}, indent=1))
    print(f"wrote {path}")
    failed = [f"{r['dims']} {r['dtype']} {r['shape']} B{r['batch']}: {name}"
              for r in results for name, t in r["times_us"].items() if t is None]  # fmt: skip
    for line in failed:
        print(f"check FAILED, not timed: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
