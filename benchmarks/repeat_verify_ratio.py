"""The headline verify ratios, repeated: the launcher's default against SGLang's tree kernel.

    python benchmarks/repeat_verify_ratio.py --out DIR    # H200, about a minute

The focus run of bench_gdn_verify.py times every config once and reports the fastest; its batch-1
ratio sits within the run-to-run spread of the 10x target. This script times what a user gets (the
launcher's ``gdn_tree_verify`` with its default config and precision, Qwen3.5's raw gates on chip)
and SGLang 0.5.10.post1's tree verify kernel in ``--rounds`` interleaved rounds, each on freshly drawn
inputs (rotating sets, L2 flushed, CUDA-graph replays: the timer of bench_gdn_verify.py), at
Qwen3.5-9B and -27B GDN heads, T = 64, depth 8, batch 1 and 16. Before any timing, every round checks
both kernels' ``o`` against the float64 serial recurrence (relative RMS <= 1e-2); a round that fails
is reported and not timed, and its point gets no median (the run exits 1). Per point: every round's
times and ratio, their median and range, and the fraction of the memory floor (bytes the verify must
move at the copy bandwidth measured in this run).
Writes ``<out>/verify_ratio_repeats_<device>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import _bench_util as U
import _peers
import torch

from trtllm_bole.kernels.gdn_tree_verify import default_plan, gdn_tree_verify
from trtllm_bole.testing import topk_parents

SIZE, DEPTH, TOL = 64, 8, 1e-2
POINTS = (("qwen3.5-9b", 32, 1), ("qwen3.5-27b", 48, 1), ("qwen3.5-9b", 32, 16), ("qwen3.5-27b", 48, 16))


def bole(x: U.Inputs) -> torch.Tensor:
    """The launcher as a user calls it: default config and precision, raw gates applied on chip."""
    return gdn_tree_verify(
        x.q, x.k, x.v, x.a, x.b, x.state, x.tree, scale=x.scale, raw_gates=(x.a_log, x.dt_bias)
    )[0]


def one_round(sglang: _peers.Peer, make, measure, copy: dict, label: str) -> dict:
    """Checks both kernels on fresh inputs against float64, then times them (a failing round is not)."""
    sets = U.rotations(make)
    x = sets[0]
    ref = U.exact_outputs(x)[0]
    prepared = []
    for s in sets:
        si = _peers.sglang_inputs(s.q, s.k, s.v, s.a, s.b, s.a_log, s.dt_bias, s.state, s.tree, s.scale)
        prepared.append((si, si.buffer()))
    err = {"bole": U.rel_rms(bole(x), ref)}
    err["sglang"] = U.rel_rms(_peers.sglang_verify(sglang, *prepared[0])[0], ref)
    row: dict = {"rel_rms_o": err}
    if not U.passes(err.values(), TOL):
        row["failed"] = True
        print(f"{label}: check FAILED {err}, not timed", flush=True)
        return row
    row["bole_us"] = measure(U.Rotating(sets, bole))
    row["sglang_us"] = measure(U.Rotating(prepared, lambda p: _peers.sglang_verify(sglang, *p)))
    row["speedup"] = row["sglang_us"] / row["bole_us"]
    row["floor_fraction"] = U.verify_floor_bytes(x) / copy["bytes_per_s"] / (row["bole_us"] * 1e-6)
    print(f"{label}: bole {row['bole_us']:.1f} us, sglang {row['sglang_us']:.1f} us, {row['speedup']:.2f}x, "
          f"floor {row['floor_fraction']:.1%}", flush=True)  # fmt: skip
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep-ms", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("repeat_verify_ratio.py times GPU kernels: it needs CUDA", file=sys.stderr)
        return 2

    sglang = _peers.load_sglang()
    if not sglang.available:
        print(f"SGLang is not available: {sglang.reason}", file=sys.stderr)
        return 2
    measure = U.graph_timer(args.rep_ms)
    copy = U.copy_bandwidth("cuda", 2**30, args.rep_ms)
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    points = []
    for model, hv, batch in POINTS:
        tree = U.tree_of([topk_parents(SIZE, 4, DEPTH)] * batch, "cuda")
        cfg, precision = default_plan(
            tree.num_nodes, batch, hv, U.DK, U.DV, *(torch.bfloat16,) * 2, num_sms=sms
        )
        point = {"model": model, "hv": hv, "batch": batch, "config": f"{cfg} {precision}", "rounds": []}
        for r in range(args.rounds):

            def make(tree=tree, hv=hv):
                return U.make_inputs(tree, U.H, hv, U.DK, U.DV, torch.bfloat16, gen)

            point["rounds"].append(one_round(sglang, make, measure, copy, f"{model} B={batch} round {r}"))
        failed = sum("speedup" not in row for row in point["rounds"])
        if failed:  # a median of the rounds that passed would hide the ones that did not
            point["error"] = f"{failed} of {args.rounds} rounds failed their float64 check: no ratio"
        else:
            for key in ("bole_us", "sglang_us", "speedup", "floor_fraction"):
                values = [row[key] for row in point["rounds"]]
                point[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        points.append(point)
    meta = U.run_meta(
        sglang=sglang.version, copy_bandwidth=copy,
        shape={"tree_size": SIZE, "depth": DEPTH, "top_k": 4, "H": U.H, "dk": U.DK, "dv": U.DV},
    )  # fmt: skip
    U.write_result(args.out, U.result_name("verify_ratio_repeats"), {"meta": meta, "points": points})
    for p in points:
        if "error" in p:
            print(f"{p['model']} B={p['batch']}: {p['error']}", file=sys.stderr)
            continue
        s, f = p["speedup"], p["floor_fraction"]
        print(f"{p['model']} B={p['batch']}: {s['median']:.2f}x (range {s['min']:.2f}-{s['max']:.2f}), "
              f"floor {f['median']:.1%} ({f['min']:.1%}-{f['max']:.1%}), {p['config']}")  # fmt: skip
    return 1 if any("error" in p for p in points) else 0


if __name__ == "__main__":
    sys.exit(main())
