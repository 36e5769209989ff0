"""What limits the two kernels of the verify's launcher default past one wave: Nsight Compute's reading.

    ncu --clock-control none -k "regex:inverse|path_factors" --launch-skip 2 --launch-count 2 --set full \\
        --import-source yes -o DIR/phases python benchmarks/ncu_verify_phases.py launch
    ncu -i DIR/phases.ncu-rep --page details --csv > DIR/details.csv
    ncu -i DIR/phases.ncu-rep --page source --csv --print-source sass > DIR/source.csv
    python benchmarks/ncu_verify_phases.py summarize DIR/details.csv DIR/source.csv --out DIR

(``bash benchmarks/h200.sh ncu`` runs the four.) ``launch`` runs the factor kernel and the value-tile
kernel of the launcher's default at Qwen3.5-9B GDN heads, batch 16, top-4 trees of 64 nodes (bf16 q/k/v,
raw gates): twice to compile and warm up, then once each for ncu to profile (it flushes the caches
before each, as the benchmark's timer does). ``summarize`` keeps, per kernel, the speed-of-light,
occupancy and scheduler figures, the share of each stall reason over all warp samples, and the SASS
instructions that gathered the most samples with their main reasons; writes
``<out>/ncu_verify_phases_<device>.json``. Diagnostic only: ncu's replays time each kernel alone.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import sys
from pathlib import Path

SECTIONS = {
    "GPU Speed Of Light Throughput": (
        "Duration", "Memory Throughput", "DRAM Throughput", "L1/TEX Cache Throughput", "L2 Cache Throughput",
        "Compute (SM) Throughput",
    ),
    "Launch Statistics": (
        "Grid Size", "Block Size", "Registers Per Thread", "Dynamic Shared Memory Per Block", "Waves Per SM",
    ),
    "Occupancy": (
        "Theoretical Occupancy", "Achieved Occupancy", "Block Limit Registers", "Block Limit Shared Mem",
    ),
    "Scheduler Statistics": (
        "Issued Warp Per Scheduler", "No Eligible", "Active Warps Per Scheduler",
        "Eligible Warps Per Scheduler",
    ),
    "Memory Workload Analysis": ("L1/TEX Hit Rate", "L2 Hit Rate", "Local Memory Spilling Requests"),
}  # fmt: skip
SAMPLES = "Warp Stall Sampling (All Samples)"
PROFILED = "bash benchmarks/h200.sh ncu (ncu --set full on `launch`, then this summary)"


def launch(batch: int) -> None:
    import _bench_util as U
    import torch

    from trtllm_bole.kernels import gdn_tree_verify_inverse as inv
    from trtllm_bole.kernels.gdn_tree_verify import default_plan
    from trtllm_bole.testing import topk_parents

    hv, bf16 = 32, torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = U.make_inputs(U.tree_of([topk_parents(64, 4, 8)] * batch, "cuda"), U.H, hv, U.DK, U.DV, bf16, gen)
    cfg, precision = default_plan(x.tree.num_nodes, batch, hv, U.DK, U.DV, bf16, bf16)
    if not isinstance(cfg, inv.InverseConfig) or cfg.launches != 2:
        raise SystemExit(f"the default at batch {batch} is {cfg}: not the two-launch path this profiles")
    prepared, run = inv.inverse_launch_args(x.call(precision), cfg), U.path_launcher(inv, cfg, hv, batch)
    for _ in range(2):
        run(prepared)
        torch.cuda.synchronize()
    print(f"launched {cfg} {precision} at batch {batch}")


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _kernels_of_source(path: Path) -> list[list[dict]]:
    """The source page's CSV: one block per profiled kernel, each opened by a "Kernel Name" line."""
    blocks: list[list[str]] = []
    for line in path.read_text().splitlines():
        if line.startswith('"Kernel Name"'):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    return [list(csv.DictReader(block)) for block in blocks]


def _shared_wavefronts(rows: list[dict]) -> dict[str, int]:
    """Shared-memory wavefronts of the L1 data pipe by SASS opcode (the tensor cores' operand reads from
    shared memory count under their HGMMA), largest first."""
    totals = collections.Counter()
    for row in rows:
        words = row["Source"].split()
        op = words[1] if words and words[0].startswith("@") else (words[0] if words else "")
        totals[op] += int(_number(row["L1 Wavefronts Shared"]))
    return {op: n for op, n in totals.most_common() if n}


def summarize(details: Path, source: Path, top: int = 12) -> list[dict]:
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(details.open()):
        wanted = SECTIONS.get(row["Section Name"], ())
        if row["Metric Name"] in wanted:
            entry = kernels.setdefault(row["ID"], {"kernel": int(row["ID"]) + 1})
            entry[row["Metric Name"]] = f"{row['Metric Value']} {row['Metric Unit']}".strip()
    out = [kernels[k] for k in sorted(kernels, key=int)]
    for entry, rows in zip(out, _kernels_of_source(source), strict=True):
        reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
        totals = collections.Counter()
        for row in rows:
            for c in reasons:
                totals[c] += _number(row[c])
        all_samples = sum(totals.values())
        entry["stall_share"] = {c[6:]: round(v / all_samples, 3) for c, v in totals.most_common() if v}
        samples = sum(_number(r[SAMPLES]) for r in rows)
        entry["shared_wavefronts_by_op"] = _shared_wavefronts(rows)
        entry["top_instructions"] = [
            {
                "sass": row["Source"].strip(),
                "share": round(_number(row[SAMPLES]) / samples, 3),
                "reasons": [c[6:] for c in sorted(reasons, key=lambda c, r=row: -_number(r[c]))[:2]],
            }
            for row in sorted(rows, key=lambda r: -_number(r[SAMPLES]))[:top]
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("launch").add_argument("--batch", type=int, default=16)
    s = sub.add_parser("summarize")
    s.add_argument("details", type=Path)
    s.add_argument("source", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--stem", default="ncu_verify_phases", help="the JSON's name before the GPU's tag")
    s.add_argument("--profiled", default=PROFILED, help="the run the CSVs come from, for the JSON's meta")
    args = ap.parse_args(argv)
    if args.command == "launch":
        launch(args.batch)
        return 0
    import platform

    import _bench_util as U
    import torch
    import triton

    meta = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
        "command": args.profiled,
    }  # fmt: skip
    summary = {"meta": meta, "phases": summarize(args.details, args.source)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / U.result_name(args.stem)).write_text(json.dumps(summary, indent=1))
    for entry in summary["phases"]:
        print(json.dumps({k: v for k, v in entry.items() if k != "top_instructions"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
