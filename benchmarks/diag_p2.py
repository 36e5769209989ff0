"""TEMPORARY diagnostic (not committed): value-tile kernel pipelining variants. Writes $OUT/diag_p2.json."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _bench_util as U
import torch

from trtllm_bole.kernels import gdn_tree_verify_inverse as cur
from trtllm_bole.kernels._common import slot_indices
from trtllm_bole.testing import topk_parents

SIZE, DEPTH = 64, 8
VARIANTS = [  # (cfg fields, phase-1 maxnreg)
    ((64, 64, 64, 4, 2, 4), None),
    ((64, 64, 64, 4, 2, 4), 168),
    ((64, 64, 64, 4, 2, 4), 192),
    ((64, 64, 64, 4, 2, 8), 128),
    ((64, 64, 64, 4, 2, 8), 168),
]


def launch(mod, x, fields, maxnreg):
    cfg = mod.InverseConfig(*fields)
    slots = slot_indices(None, x.tree.num_requests, x.state.device)
    outputs, args, consts = mod.inverse_launch_args(
        x.q, x.k, x.v, x.a, x.b, x.state, slots, x.tree, (x.a_log, x.dt_bias), x.scale, False, "bf16", cfg
    )
    hv, dv, batch = x.v.shape[1], x.v.shape[2], x.tree.num_requests
    k = mod._gdn_tree_verify_inverse_kernel
    grid = (dv // cfg.bv, hv, batch)
    if cfg.launches == 2:
        k[(1, hv, batch)](
            *args,
            **{**consts, **mod.PHASE1_CONSTS},
            PHASE=1,
            BLOCKED=False,
            num_warps=cfg.warps1,
            num_stages=1,
            maxnreg=maxnreg,
        )
        k[grid](*args, **consts, PHASE=2, BLOCKED=False, num_warps=cfg.num_warps, num_stages=1)
    else:
        k[grid](*args, **consts, PHASE=3, BLOCKED=False, num_warps=cfg.num_warps, num_stages=1)
    return outputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/out")
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    measure = U.graph_timer(20)
    rows = []
    for hv, batch in ((32, 16), (32, 32), (48, 16)):

        def make(b=batch, h=hv):
            return U.make_inputs(
                U.tree_of([topk_parents(SIZE, 4, DEPTH)] * b, "cuda"), U.H, h, U.DK, U.DV, torch.bfloat16, gen
            )

        sets = U.rotations(make)
        ref = U.exact_outputs(sets[0])
        row = {"hv": hv, "batch": batch}
        for fields, stages in VARIANTS:
            key = f"{fields} r{stages}"
            mod = cur
            try:
                outs = launch(mod, sets[0], fields, stages)
                torch.cuda.synchronize()
                err = [U.rel_rms(outs[i], ref[j]) for i, j in ((0, 0), (1, 2), (2, 3))]
                if not max(err) < 1e-2:
                    row[key] = {"err": err, "failed": True}
                    print(hv, batch, key, "FAILED", err, flush=True)
                    continue
                us = measure(U.Rotating(sets, lambda x, m=mod, f=fields, s=stages: launch(m, x, f, s)))
                row[key] = {"err": err, "us": us}
                print(f"HV={hv} B={batch} {key}: {us:.1f} us err {max(err):.1e}", flush=True)
            except Exception as e:
                row[key] = {"error": repr(e)[:300]}
                print(hv, batch, key, "ERROR", repr(e)[:300], flush=True)
        rows.append(row)
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "diag_p2.json").write_text(json.dumps(rows, indent=1))
    for row in rows:
        best = sorted(((r["us"], k) for k, r in row.items() if isinstance(r, dict) and "us" in r))[:4]
        print(row["hv"], row["batch"], [(round(t, 1), k) for t, k in best])
    return 0


if __name__ == "__main__":
    sys.exit(main())
