"""Where the explicit-inverse verify spends its GPU time: each phase alone, registers.

    python benchmarks/profile_verify.py --out DIR    # H200, about a minute

Qwen3.5-9B GDN dims (H = 16, HV = 32, dk = dv = 128), top-4 trees of 64 nodes and depth 8, bf16 q/k/v,
raw gates, fp32 state; batch 1 and 16. For each config of :data:`CONFIGS` it times, as CUDA-graph
replays with the L2 flushed (the timer of bench_gdn_verify.py):

- ``verify``: the launcher's call, checked first against the float64 serial recurrence (a config that
  fails is not timed at all);
- ``phase1``: the factor kernel alone (one program per (request, value head)), at 4 and 8 warps;
- ``phase2``: the value-tile kernel alone (state products, two factor products) on an unfilled factor
  buffer (a time only);
- ``phase3``: the one-launch kernel capped at 128 registers (one-launch configs);
- ``*_warm``: the verify and, for two launches, each kernel, replayed back to back on one input set with
  the L2 not flushed (:func:`_bench_util.warm_graph_timer`): how much of each time is DRAM traffic
  (fully so at batch 1; at batch 16 the ~78 MB a verify touches exceed the 50 MB L2, so part of it
  still comes from DRAM);

and the time to copy the batch's states (the state read's floor), with every kernel's registers and spills.
Writes ``<out>/profile_verify_<device>.json``. Diagnostic only: it reports times, not speed-ups.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _bench_util as U
import torch

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv
from trtllm_bole.testing import topk_parents

HV, SIZE, DEPTH, TOL = 32, 64, 8, 1e-2
CONFIGS = (
    (inv.InverseConfig(64, 128, 64, 8, 1, 8), "bf16"),
    (inv.InverseConfig(64, 128, 32, 4, 1, 4), "tf32"),
    (inv.InverseConfig(64, 64, 128, 8, 1, 8), "bf16"),
    (inv.InverseConfig(64, 128, 128, 8, 1, 8), "bf16"),
    (inv.InverseConfig(64, 64, 64, 4, 2, 8, 128), "bf16"),  # the launcher's default past one wave
    (inv.InverseConfig(64, 64, 64, 4, 2, 8), "bf16"),  # its value-tile kernel uncapped
    (inv.InverseConfig(64, 64, 64, 4, 2, 4), "bf16"),  # its factor kernel at 4 warps
    (inv.InverseConfig(64, 128, 128, 8, 2, 4), "bf16"),
)


def _launch(x: U.Inputs, cfg, precision: str, phase: int, warps: int, maxnreg=None):
    """One kernel of the inverse path, as launch_inverse launches it (trees of at most ``bt`` nodes)."""
    outputs, args, consts = inv.inverse_launch_args(x.call(precision), cfg)
    kernel, grid, constexprs, _ = inv.phase_launch(
        phase, cfg, consts, x.v.shape[1], x.v.shape[2], x.tree.num_requests
    )
    compiled = kernel[grid](*args, **constexprs, num_warps=warps, num_stages=1, maxnreg=maxnreg)
    return outputs, compiled


def _regs(kernel) -> dict:
    return {"regs": getattr(kernel, "n_regs", None), "spills": getattr(kernel, "n_spills", None)}


def _verify(x: U.Inputs, cfg, precision: str):
    """The launcher's inverse path, as gdn_tree_verify runs it for ``cfg``."""
    return inv.launch_inverse(x.call(precision), cfg)


def _check(x: U.Inputs, cfg, precision: str) -> float:
    """Relative RMS of the verify's ``o`` against the float64 serial recurrence."""
    return U.rel_rms(_verify(x, cfg, precision)[0], U.exact_outputs(x)[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--rep-ms", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_verify.py times GPU kernels: it needs CUDA", file=sys.stderr)
        return 2

    measure, warm = U.graph_timer(args.rep_ms), U.warm_graph_timer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        tree_parents = [topk_parents(SIZE, 4, DEPTH)] * batch

        def make(tree_parents=tree_parents):
            return U.make_inputs(U.tree_of(tree_parents, "cuda"), U.H, HV, U.DK, U.DV, torch.bfloat16, gen)

        sets = U.rotations(make)
        state_bytes = sets[0].state.numel() * 4
        copy = U.timer(True, args.rep_ms)  # eager: a copy captured in a graph runs on the copy engine
        row = {"batch": batch, "state_bytes": state_bytes,
               "state_copy_us": copy(U.Rotating(sets, lambda x: x.state.clone()))}  # fmt: skip
        for cfg, precision in CONFIGS:
            key = f"{cfg} {precision}"
            err = _check(sets[0], cfg, precision)
            entry = {"rel_rms_o": err}
            if not U.passes([err], TOL):
                entry["failed"] = True
                row[key] = entry
                print(f"B={batch} {key}: check FAILED ({err:.2e}), not timed", flush=True)
                continue
            entry["verify_us"] = measure(U.Rotating(sets, lambda x, c=cfg, p=precision: _verify(x, c, p)))
            variants = [(1, w, r) for w in (4, 8) for r in (None, 128)]
            variants += [(2, cfg.num_warps, r) for r in (None, 128)]
            variants += [(3, cfg.num_warps, 128)] if cfg.launches == 1 else []
            for phase, warps, maxnreg in variants:
                name = f"phase{phase}_w{warps}" + (f"_r{maxnreg}" if maxnreg else "")
                _, kern = _launch(sets[0], cfg, precision, phase, warps, maxnreg=maxnreg)
                entry[name] = _regs(kern)
                entry[f"{name}_us"] = measure(
                    U.Rotating(sets, lambda x, c=cfg, p=precision, a=phase, w=warps, r=maxnreg: _launch(
                        x, c, p, a, w, maxnreg=r))
                )  # fmt: skip
            entry["verify_warm_us"] = warm(lambda x=sets[0], c=cfg, p=precision: _verify(x, c, p))
            if cfg.launches == 2:
                for phase, warps in ((1, cfg.warps1), (2, cfg.num_warps)):
                    entry[f"phase{phase}_w{warps}_warm_us"] = warm(
                        lambda x=sets[0], c=cfg, p=precision, a=phase, w=warps: _launch(x, c, p, a, w)
                    )
            row[key] = entry
            print(f"B={batch} {key}: {json.dumps(entry)}", flush=True)
        rows.append(row)
    meta = U.run_meta(shape={"model": "qwen3.5-9b", "hv": HV, "tree_size": SIZE, "depth": DEPTH, "top_k": 4})
    path = U.write_result(args.out, U.result_name("profile_verify"), {"meta": meta, "rows": rows})
    print(f"wrote {path}")
    return 1 if any(isinstance(e, dict) and e.get("failed") for row in rows for e in row.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
