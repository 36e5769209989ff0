"""Qwen3.5-9B and -27B dimensions with random weights on one GPU (bf16): what a verify step costs
per scheme, how much of it is GDN verification, and where the budget should sit.

    python benchmarks/bench_real_dims.py --out DIR [--models qwen3.5-9b,qwen3.5-27b] [--quick]

1. Step latency: a full-model verify step (+ its commit) of draft-like trees (top-k 4, depth 9
   including the pending token) for ``bole`` (closed-form GDN, factored commit) and the serial
   scheme (``tree-serial``: node-by-node GDN with a state snapshot per node, then a copy), vs tree
   tokens per request and batch; ``chain`` (9-token chains, serial scheme) and a plain decode step.
2. GDN share: one profiled verify step per scheme at 64 nodes per request; the share is the CUDA
   time of the GDN verify kernels over the step's whole CUDA time.
3. Budget sweep (the paper's Figure 11 analogue): measured step latency of N tree tokens over a
   batch, combined with the embedded model's measured acceptance at N / batch draft tokens per
   request (``--acceptance``: the JSON of ``eval_acceptance.py``), gives an ESTIMATE of output
   tokens/s at real size — the trained small model stands in for Qwen3.5's MTP acceptance.

Exactness at these sizes is the kernels' business (``bench_gdn_verify.py`` checks them against
float64 at these dimensions); this script only times.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from trtllm_bole.models.config import load_config
from trtllm_bole.models.model import Qwen35Model
from trtllm_bole.models.presets import QWEN35_PRESETS
from trtllm_bole.spec.calibration import StepTimer, TimingSettings

HERE = Path(__file__).resolve().parent
GDN_VERIFY_KERNELS = ("_gdn_tree_verify_kernel", "_gdn_tree_verify_inverse_kernel", "_tree_serial_kernel")
GDN_COMMIT_KERNELS = ("_gdn_commit_kernel", "_snapshot_commit_kernel")


def random_model_on_device(preset: str, *, device: str, seed: int = 0) -> Qwen35Model:
    """Random bf16 weights drawn on the GPU (seconds at 27B scale), scaled like
    ``models.checkpoint.random_tensors``; for timing only."""
    config = load_config({**QWEN35_PRESETS[preset], "mtp_num_hidden_layers": 0})
    torch.manual_seed(seed)
    model = Qwen35Model(config, dtype=torch.bfloat16, device=device, mtp=False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(math.log(0.5), math.log(4.0))
            elif name.endswith("dt_bias"):
                p.normal_(-3.0, 0.5)
            elif name.endswith("mixer.norm"):
                p.normal_(1.0, 0.1)
            elif "norm" in name:
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    return model


def gdn_share(timer: StepTimer, batch: int, tokens: int, scheme: str) -> dict:
    """Share of one step's CUDA time spent in GDN verification (and in the GDN commit), profiled."""
    from torch.profiler import ProfilerActivity, profile

    timer.verify(batch, 0, tokens, scheme)  # warm
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        timer.verify(batch, 0, tokens, scheme)
    total, verify, commit = 0.0, 0.0, 0.0
    for event in prof.key_averages():
        t = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
        total += t
        verify += t if any(k in event.key for k in GDN_VERIFY_KERNELS) else 0.0
        commit += t if any(k in event.key for k in GDN_COMMIT_KERNELS) else 0.0
    return {
        "verify_share": verify / total if total else float("nan"),
        "commit_share": commit / total if total else float("nan"),
        "gdn_verify_us": verify,
        "gdn_commit_us": commit,
        "step_cuda_us": total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--models", default="qwen3.5-9b,qwen3.5-27b")
    parser.add_argument("--batches", default="1,8,16,32")
    parser.add_argument("--tokens-per-request", default="8,16,32,64,128")
    parser.add_argument("--kv-len", type=int, default=512)
    parser.add_argument("--acceptance", type=Path, default=None, help="MAT vs draft tokens (JSON)")
    parser.add_argument("--quick", action="store_true", help="fewer points, for a smoke run")
    parser.add_argument("--time-budget", type=float, default=420.0, help="seconds; later points skipped")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    started = time.perf_counter()
    batches = [int(b) for b in args.batches.split(",")]
    per_request = [int(t) for t in args.tokens_per_request.split(",")]
    if args.quick:
        batches, per_request = batches[:2], per_request[:2]
    mat_curve = json.loads(args.acceptance.read_text())["mat_by_draft_tokens"] if args.acceptance else None
    result = {
        "what": "verify-step latency at Qwen3.5 dims, random bf16 weights (timing only)",
        "command": "python benchmarks/bench_real_dims.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "kv_len": args.kv_len,
        "models": {},
    }
    for name in args.models.split(","):
        result["models"][name] = measure_model(name, args, batches, per_request, mat_curve, started)
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "real_dims_h200.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path} in {time.perf_counter() - started:.0f} s")
    return 0


def measure_model(
    name: str, args, batches: list[int], per_request: list[int], mat_curve, started: float
) -> dict:
    model = random_model_on_device(name, device="cuda")
    biggest = max(batches)

    def timer_for(top_k: int, max_tokens: int) -> StepTimer:
        timing = TimingSettings(warmup=2, repeats=5, top_k=top_k, depth=9)
        return StepTimer(
            model, max_batch=biggest, max_kv_len=args.kv_len, max_tokens=max_tokens, settings=timing
        )

    # One timer at a time: each allocates the model's cache. Chains (top-k 1) first.
    chain_timer = timer_for(1, biggest * 9)
    chain_ms = {b: chain_timer.verify(b, args.kv_len, 9 * b, "serial") * 1e3 for b in batches}
    del chain_timer
    timer = timer_for(4, biggest * max(*per_request, 64))
    rows, skipped = [], []
    for batch in batches:
        decode_ms = timer.decode(batch, args.kv_len) * 1e3
        for n in per_request:
            if time.perf_counter() - started > args.time_budget:
                skipped.append({"batch": batch, "tokens_per_request": n})
                continue
            row = {
                "batch": batch,
                "tokens_per_request": n,
                "decode_ms": decode_ms,
                "chain9_ms": chain_ms[batch],
            }
            for scheme, name in (("bole", "bole"), ("serial", "tree_serial")):
                try:
                    row[f"{name}_ms"] = timer.verify(batch, args.kv_len, n * batch, scheme) * 1e3
                except torch.OutOfMemoryError:  # per-node snapshots: N x HV x dk x dv fp32 per layer
                    torch.cuda.empty_cache()
                    row[f"{name}_ms"], row[f"{name}_error"] = None, "CUDA out of memory"
            if row["bole_ms"] and row["tree_serial_ms"]:
                row["serial_over_bole"] = row["tree_serial_ms"] / row["bole_ms"]
            rows.append(row)
            print(
                f"{name} b{batch:>2} T{n:>3}: decode {row['decode_ms']:7.2f} ms | "
                f"bole {_ms(row['bole_ms'])} | tree-serial {_ms(row['tree_serial_ms'])} | "
                f"chain9 {row['chain9_ms']:7.2f}",
                flush=True,
            )
    b16 = min(16, biggest)
    entry = {
        "steps": rows,
        "skipped": skipped,
        "gdn_share_b1_T64": {s: gdn_share(timer, 1, 64, s) for s in ("bole", "serial")},
        f"gdn_share_b{b16}_T64": {s: gdn_share(timer, b16, 64 * b16, s) for s in ("bole", "serial")},
    }
    shares = entry["gdn_share_b1_T64"]
    print(f"{name} GDN verify share, 64 nodes, batch 1: bole {shares['bole']['verify_share']:.1%}, "
          f"serial {shares['serial']['verify_share']:.1%}", flush=True)  # fmt: skip
    if mat_curve:
        entry["budget_sweep_estimate"] = budget_sweep(
            timer, mat_curve, batch=b16, kv_len=args.kv_len, per_request=per_request
        )
    return entry


def _ms(value: float | None) -> str:
    return "    OOM" if value is None else f"{value:7.2f}"


def budget_sweep(
    timer: StepTimer, mat_curve: dict, *, batch: int, kv_len: int, per_request: list[int]
) -> list:
    """ESTIMATED output tokens/s vs total tree tokens: measured bole step time at N tokens times the
    embedded model's measured MAT at N / batch tokens per request (draft tokens = that minus one)."""
    known = sorted((int(k), v) for k, v in mat_curve.items())
    rows = []
    for n in per_request:
        drafts = n - 1
        mat = max((v for k, v in known if k <= drafts), default=1.0)
        step = timer.verify(batch, kv_len, n * batch, "bole")
        rows.append({"total_tree_tokens": n * batch, "tokens_per_request": n, "mat_from_small_model": mat,
                     "step_ms": step * 1e3, "estimated_output_tokens_per_s": batch * mat / step})  # fmt: skip
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
