"""Which commit config to default to, by the length of the accepted paths.

    python benchmarks/probe_commit_paths.py --out DIR     # H200, about 2 minutes

The all-layer commit's default (the outer-product form, which walks an accepted path node by node) was
picked on 3-node paths; on 8-node paths the dot form, which loads the whole path at once, measured 18%
faster (benchmarks/README.md, "Commit"). Here every config of ``COMMIT_CONFIGS`` commits all 24 GDN
layers of 16 requests at Qwen3.5-9B heads in the serving layout (bf16 k, requests in shuffled state slots,
one request rejecting everything) for accepted paths of 1 to 9 nodes (every request accepts the first
node of its top-4 tree at that depth). Each config is checked at each length against the float64
factored commit first (relative RMS <= 1e-5) and timed only if it passes (CUDA-graph replays, L2 flushed;
a replay commits again: the values move, the traffic does not). Writes
``<out>/probe_commit_paths_<device>.json`` with, per length, every config's time and fraction of the copy
bandwidth measured in the run.
"""

from __future__ import annotations

import sys

import _bench_util as U
import torch
import torch.nn.functional as F

from trtllm_bole.kernels._common import GDNTreeFactors
from trtllm_bole.kernels.gdn_commit import COMMIT_CONFIGS, gdn_commit
from trtllm_bole.reference import gdn_tree
from trtllm_bole.testing import topk_parents

HV, LAYERS, BATCH, NODES, DEPTH, TOL = 32, 24, 16, 64, 9, 1e-5
DEVICE = "cuda"


def factors(gen: torch.Generator) -> GDNTreeFactors:
    """Every layer's factors of ``BATCH`` top-4 trees of 64 nodes: bf16 k, u, path log-decays."""
    tree = U.tree_of([topk_parents(NODES, 4, DEPTH)] * BATCH, DEVICE)
    n = tree.num_nodes
    g = -torch.rand(LAYERS, n, HV, generator=gen, device=DEVICE) * 0.1
    k = F.normalize(torch.randn(LAYERS, n, U.H, U.DK, generator=gen, device=DEVICE), dim=-1).bfloat16()
    u = torch.randn(LAYERS, n, HV, U.DV, generator=gen, device=DEVICE)
    log_p = torch.stack([gdn_tree.path_log_decay(g[i], tree) for i in range(LAYERS)]).float()
    return GDNTreeFactors(tree, k, u, log_p)


def truth(pool: torch.Tensor, f: GDNTreeFactors, leaves: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    out = pool.double()
    for layer in range(LAYERS):
        gdn_tree.factored_commit(out[layer], f.k[layer], f.u[layer], f.log_decay[layer], f.tree, leaves,
                                 state_indices=slots)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    start = U.probe_start(__doc__, "probe_commit_paths.py", argv)
    if start is None:
        return 2
    args, measure, gen = start
    f = factors(gen)
    slots = torch.randperm(BATCH, generator=gen, device=DEVICE)
    pool = torch.randn(LAYERS, BATCH, HV, U.DK, U.DV, generator=gen, device=DEVICE) * 0.1
    depths = f.tree.depth[:NODES].tolist()  # request 0's nodes (every request has the same tree)
    copy = U.copy_bandwidth(DEVICE, 2**30, 50)
    rows, failed = [], 0
    for length in range(1, DEPTH + 1):
        leaves = torch.full((BATCH,), depths.index(length), device=DEVICE)
        leaves[1] = -1  # one request keeps its state
        expected = truth(pool, f, leaves, slots)
        moved = 2 * (BATCH - 1) * LAYERS * HV * U.DK * U.DV * 4  # each committed state read and written
        row = {"path_nodes": length, "bytes": moved, "us": {}, "of_copy_bandwidth": {}, "errors": {}}
        for cfg in COMMIT_CONFIGS:
            state = pool.clone()

            def commit(state=state, cfg=cfg, leaves=leaves) -> None:
                gdn_commit(state, f, leaves, state_indices=slots, config=cfg)

            commit()  # its check reads the state back: the launch has run
            row["errors"][repr(cfg)] = error = U.rel_rms(state, expected)
            if not U.passes([error], TOL):
                failed += 1
                print(f"{length} nodes {cfg}: FAILED its check ({error}), not timed", file=sys.stderr)
                continue
            us = row["us"][repr(cfg)] = measure(commit)
            row["of_copy_bandwidth"][repr(cfg)] = moved / (us * 1e-6) / copy["bytes_per_s"]
        best = min(row["us"], key=row["us"].get) if row["us"] else None
        row["fastest"] = best
        rows.append(row)
        print(f"{length} nodes: fastest {best} {row['us'].get(best, float('nan')):.1f} µs", flush=True)
    data = {"meta": U.run_meta(layers=LAYERS, batch=BATCH, hv=HV), "copy_bandwidth": copy, "rows": rows}
    print(f"wrote {U.write_result(args.out, U.result_name('probe_commit_paths'), data)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
