"""Which factor kernel for which depth: the compact one (path tiles) against the dense one (squarings).

    python benchmarks/factor_depth.py --out DIR    # H200, about a minute

Qwen3.5-9B GDN heads (H = 16, HV = 32, dk = dv = 128), bf16 q/k/v, raw gates, fp32 state; single-tile
trees of up to 64 nodes at several depths: chains of 16, 32 and 64 (the prefill's chunks) and top-k
trees of depth 8, 9 and 16; the two-launch path at the prefill's config (64/64/64, value tiles at 4
warps) with either factor kernel forced (``COMPACT_MAX_DEPTH``) at 4 and 8 warps. Each variant is
checked against the float64 serial recurrence (``o`` and ``u``) before it is timed (CUDA-graph
replays, L2 flushed). Writes ``<out>/factor_depth_<device>.json``; ``COMPACT_MAX_DEPTH`` follows it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import _bench_util as U
import torch

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv
from trtllm_bole.testing import chain_parents, topk_parents

HV, TOL = 32, 1e-2
SHAPES = (
    ("chain16", chain_parents(16), 16),
    ("chain32", chain_parents(32), 16),
    ("chain64", chain_parents(64), 1),
    ("chain64", chain_parents(64), 4),
    ("chain64", chain_parents(64), 16),
    ("top2_d16", topk_parents(64, 2, 16), 16),
    ("top4_d9", topk_parents(64, 4, 9), 16),
    ("top4_d8", topk_parents(64, 4, 8), 16),
)


def _verify(x: U.Inputs, cfg: inv.InverseConfig):
    return inv.launch_inverse(x.call("bf16"), cfg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("factor_depth.py times GPU kernels: it needs CUDA", file=sys.stderr)
        return 2

    measure = U.graph_timer(20)
    gen = torch.Generator(device="cuda").manual_seed(0)
    kept, rows = inv.COMPACT_MAX_DEPTH, []
    try:
        for name, parents, batch in SHAPES:
            sets = U.rotations(
                lambda p=parents, b=batch: U.make_inputs(
                    U.tree_of([p] * b, "cuda"), U.H, HV, U.DK, U.DV, torch.bfloat16, gen
                )
            )
            ref = U.exact_outputs(sets[0])
            row = {"shape": name, "batch": batch, "max_depth": sets[0].tree.max_depth}
            for kind, limit in (("compact", 64), ("dense", 0)):
                inv.COMPACT_MAX_DEPTH = limit
                for warps1 in (4, 8):
                    cfg = inv.InverseConfig(64, 64, 64, 4, 2, warps1)
                    o, u, _ = _verify(sets[0], cfg)
                    errors = U.rel_rms(o, ref[0]), U.rel_rms(u, ref[2])
                    entry = {"rel_rms": max(errors) if not any(map(math.isnan, errors)) else math.nan}
                    if U.passes(errors, TOL):
                        entry["us"] = measure(U.Rotating(sets, lambda x, c=cfg: _verify(x, c)))
                    row[f"{kind}_w{warps1}"] = entry
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        inv.COMPACT_MAX_DEPTH = kept
    path = U.write_result(args.out, U.result_name("factor_depth"), {"meta": U.run_meta(), "rows": rows})
    print(f"wrote {path}")
    return 1 if any("us" not in e for row in rows for e in row.values() if isinstance(e, dict)) else 0


if __name__ == "__main__":
    sys.exit(main())
