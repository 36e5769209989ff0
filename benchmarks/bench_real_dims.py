"""Qwen3.5-9B and -27B dimensions with random weights on one GPU (bf16): what a verify step costs
per scheme, how much of it is GDN verification, and where the budget should sit.

    python benchmarks/bench_real_dims.py --out DIR [--models qwen3.5-9b,qwen3.5-27b] [--quick]

1. Step latency: a full-model verify step (+ its commit) of draft-like trees (top-k 4, depth 9
   including the pending token) for ``bole`` (closed-form GDN, factored commit) and the serial
   scheme (``tree-serial``: node-by-node GDN with a state snapshot per node, then a copy), vs tree
   tokens per request and batch; ``chain`` (9-token chains, serial scheme) and a plain decode step.
   Each point has the eager wall time (Python-bound at these sizes: ~50-200 ms whatever the GPU
   does) and the step's GPU kernel time from the profiler (what a captured CUDA graph approaches).
2. GDN share at every point: the GPU time of the GDN verify kernels over the step's GPU time.
3. Budget sweep (the paper's Figure 11 analogue): the bole step's GPU time at N tree tokens per
   request, combined with the embedded model's measured acceptance at N - 1 draft tokens
   (``--acceptance``: the JSON of ``eval_acceptance.py``), gives an ESTIMATE of output tokens/s at
   real size — the trained small model stands in for Qwen3.5's MTP acceptance.

Before Bole or tree-serial is timed at a point, one GDN layer's verify of that scheme runs as the model
calls it at that shape (bf16 q/k/v, fp32 state; for Bole the launcher's default config and precision) on
random inputs and is checked against the float64 reference (:func:`verify_check`, the serving tolerance
1e-2); a point that fails is recorded as an error, never timed or reported (nor is their ratio).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import triton
from _bench_util import rel_rms, result_name

from trtllm_bole.kernels import gdn_tree_verify, gdn_tree_verify_inverse
from trtllm_bole.models.config import load_config
from trtllm_bole.models.model import Qwen35Model
from trtllm_bole.models.presets import QWEN35_PRESETS
from trtllm_bole.spec.calibration import StepTimer, TimingSettings
from trtllm_bole.testing import chain_parents, topk_parents

HERE = Path(__file__).resolve().parent


def kernel_names(*modules) -> tuple[str, ...]:
    """The Triton kernels the modules define (every one is named ``_…_kernel`` here), so that a kernel
    added to the verify path is counted without editing this file."""
    return tuple(sorted({n for m in modules for n in vars(m) if n.startswith("_") and n.endswith("_kernel")}))


GDN_VERIFY_KERNELS = (*kernel_names(gdn_tree_verify, gdn_tree_verify_inverse), "_tree_serial_kernel")
GDN_COMMIT_KERNELS = ("_gdn_commit_kernel", "_snapshot_commit_kernel")
SWEEP_BATCH = 16  # the budget sweep's batch (the largest measured one below it when it was not run)
CHECK_TOL = 1e-2  # relative RMS against float64 in the serving precision (bf16 q/k/v, fp32 state)


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


def verify_check(
    trees: list[list[int]],
    h: int,
    hv: int,
    dk: int,
    dv: int,
    device: str,
    seed: int = 0,
    scheme: str = "bole",
) -> dict:
    """One GDN layer's verify of ``trees`` as the model runs it (bf16 q/k/v, fp32 gates and state): the
    closed form (``scheme="bole"``, the launcher's default config and precision for this shape) or the
    tree-serial kernel (``"serial"``), against the float64 reference closed form on the same rounded inputs
    (itself held to the serial recurrence node by node in CI; the serial walk would keep a float64 state
    per node, gigabytes at these sizes): relative RMS of ``o`` (and of ``u`` for the closed form), and
    whether they pass."""
    from trtllm_bole.kernels.baselines import tree_serial
    from trtllm_bole.kernels.gdn_tree_verify import gdn_tree_verify
    from trtllm_bole.reference import gdn_tree
    from trtllm_bole.testing import forest, random_gdn_inputs

    tree = forest(trees, device=device)
    gen = torch.Generator().manual_seed(seed)
    x = random_gdn_inputs(tree.num_nodes, tree.num_requests, h, hv, dk, dv, generator=gen, device=device)
    q, k, v = (t.to(torch.bfloat16) for t in (x.q, x.k, x.v))
    g, beta, state = (t.float() for t in (x.g, x.beta, x.state))
    exact = (q.double(), k.double(), v.double(), g.double(), beta.double(), state.double(), tree)
    o_ref, u_ref, _ = gdn_tree.closed_form_tree_verify(*exact, scale=x.scale)
    if scheme == "serial":
        o, _ = tree_serial.gdn_tree_verify_serial(q, k, v, g, beta, state, tree, scale=x.scale)
        errors = {"o": rel_rms(o, o_ref)}
    else:
        o, u, _ = gdn_tree_verify(q, k, v, g, beta, state, tree, scale=x.scale)
        errors = {"o": rel_rms(o, o_ref), "u": rel_rms(u, u_ref)}
    return {**errors, "tolerance": CHECK_TOL, "ok": all(e <= CHECK_TOL for e in errors.values())}


def kernel_breakdown(events: list[tuple[str, float]], steps: int) -> dict:
    """Per-step GPU kernel time (µs) from profiled ``(kernel name, total µs)`` pairs of ``steps`` steps,
    split into GDN verification, GDN commit and the rest."""
    total = sum(t for _, t in events)
    verify = sum(t for k, t in events if any(n in k for n in GDN_VERIFY_KERNELS))
    commit = sum(t for k, t in events if any(n in k for n in GDN_COMMIT_KERNELS))
    return {
        "gpu_us": total / steps,
        "gdn_verify_us": verify / steps,
        "gdn_commit_us": commit / steps,
        "verify_share": verify / total if total else float("nan"),
        "commit_share": commit / total if total else float("nan"),
    }


def device_events(events) -> list[tuple[str, float]]:
    """``(name, µs)`` of the device-side events (kernels, memcpy, memset) among profiler events. The
    host-side launch events carry their kernels' time too: summing every event counts each kernel twice."""
    from torch.autograd import DeviceType

    return [(e.name, e.device_time_total) for e in events if e.device_type == DeviceType.CUDA]


def profiled(run: Callable[[], float], steps: int) -> dict:
    """The GPU kernel time per step of ``run`` (``steps`` steps), from the profiler: what a captured
    CUDA graph of the step would approach, without the eager model's Python and launch overhead."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
    return kernel_breakdown(device_events(prof.events()), steps)


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
    parser.add_argument(
        "--time-budget", type=float, default=240.0, help="seconds per model; later points skipped"
    )
    parser.add_argument(
        "--plot-only", type=Path, default=None,
        help="redraw the PNG of a results JSON; with --acceptance, first redo its budget-sweep estimate "
        "from the stored step times (acceptance is the model's, measured anywhere)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.plot_only:
        result = json.loads(args.plot_only.read_text())
        if args.acceptance:
            reestimate(result, args.acceptance)
            args.plot_only.write_text(json.dumps(result, indent=2) + "\n")
        plot(result, args.plot_only.with_suffix(".png"))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    per_request = [int(t) for t in args.tokens_per_request.split(",")]
    if args.quick:
        batches, per_request = batches[:2], per_request[:2]
    acceptance = json.loads(args.acceptance.read_text()) if args.acceptance else None
    result = {
        "what": "verify-step latency at Qwen3.5 dims, random bf16 weights (timing only)",
        "command": "python benchmarks/bench_real_dims.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "kv_len": args.kv_len,
        "acceptance": str(args.acceptance) if args.acceptance else None,
        "models": {},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / result_name("real_dims")
    for name in args.models.split(","):
        result["models"][name] = measure_model(name, args, batches, per_request, acceptance)
        torch.cuda.empty_cache()
        path.write_text(json.dumps(result, indent=2) + "\n")  # after each model: a cut run keeps the first
        print(f"wrote {path}")
    plot(result, path.with_suffix(".png"))
    failed = [
        step
        for entry in result["models"].values()
        for row in entry["steps"]
        for step in (row["decode"], row["chain9"], row["bole"], row["tree_serial"])
        if "verify check failed" in step.get("error", "")
    ]
    return 1 if failed else 0


def measure_model(name: str, args, batches: list[int], per_request: list[int], acceptance) -> dict:
    started, kv = time.perf_counter(), args.kv_len
    model = random_model_on_device(name, device="cuda")
    c = model.config
    gdn_dims = (
        c.linear_num_key_heads,
        c.linear_num_value_heads,
        c.linear_key_head_dim,
        c.linear_value_head_dim,
    )
    biggest = max(batches)

    def timer_for(top_k: int, max_tokens: int) -> StepTimer:
        timing = TimingSettings(warmup=1, repeats=3, top_k=top_k, depth=9)
        return StepTimer(  # eager: each point's GPU time comes from the profiled kernels
            model, max_batch=biggest, max_kv_len=args.kv_len, max_tokens=max_tokens, settings=timing,
            cuda_graphs=False,
        )  # fmt: skip

    def checked(trees: list[list[int]], scheme: str, time_step) -> dict:
        """The step's GDN verify checked at this model's heads first; the step timed only if it passes."""
        check = verify_check(trees, *gdn_dims, device="cuda", scheme=scheme)
        return (
            {**step_point(timer, time_step), "check": check}
            if check["ok"]
            else {"error": f"verify check failed: {check}"}
        )

    # One timer at a time: each allocates the model's cache. Chains (top-k 1) first.
    timer = timer_for(1, biggest * 9)
    chain = {
        b: checked([chain_parents(9)] * b, "serial", partial(timer.verify, b, kv, 9 * b, "serial"))
        for b in batches
    }
    del timer
    timer = timer_for(4, biggest * max(per_request))
    rows, skipped = [], []
    for batch in batches:
        decode = checked([[-1]] * batch, "bole", partial(timer.decode, batch, kv))
        for n in per_request:
            if time.perf_counter() - started > args.time_budget:
                skipped.append({"batch": batch, "tokens_per_request": n})
                continue
            row = {"batch": batch, "tokens_per_request": n, "decode": decode, "chain9": chain[batch]}
            trees = [topk_parents(n, timer.settings.top_k, timer.settings.depth)] * batch
            row["bole_check"] = verify_check(trees, *gdn_dims, device="cuda")
            row["tree_serial_check"] = verify_check(trees, *gdn_dims, device="cuda", scheme="serial")
            for scheme, key in (("bole", "bole"), ("serial", "tree_serial")):
                if not row[f"{key}_check"]["ok"]:
                    row[key] = {"error": f"verify check failed: {row[f'{key}_check']}"}
                    continue
                row[key] = step_point(timer, partial(timer.verify, batch, kv, n * batch, scheme))
            if "error" not in row["bole"] and "error" not in row["tree_serial"]:
                row["serial_over_bole_gpu"] = row["tree_serial"]["gpu_us"] / row["bole"]["gpu_us"]
            rows.append(row)
            print(
                f"{name} b{batch:>2} T{n:>3}: decode {_point(decode)} | bole {_point(row['bole'])} | "
                f"tree-serial {_point(row['tree_serial'])} | chain9 {_point(row['chain9'])}",
                flush=True,
            )
    entry = {"steps": rows, "skipped": skipped}
    if acceptance:
        entry.update(estimates(rows, acceptance))
    return entry


def step_point(timer: StepTimer, run: Callable[[], float]) -> dict:
    """Wall time of an eager step (``run``: one ``StepTimer`` measurement, median ms) and its profiled
    GPU kernel breakdown; a scheme that runs out of memory (tree-serial keeps a state per node for
    every GDN layer until the commit) is recorded."""
    try:
        steps = timer.settings.warmup + timer.settings.repeats
        return {"wall_ms": run() * 1e3, **profiled(run, steps)}
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"error": "CUDA out of memory"}


def _point(p: dict) -> str:
    if "error" in p:
        return "            OOM" if "out of memory" in p["error"] else f"  {p['error'][:60]}"
    gpu_ms, share = p["gpu_us"] / 1e3, p["verify_share"]
    return f"{p['wall_ms']:6.1f} ms wall, {gpu_ms:6.2f} ms GPU, GDN verify {share:5.1%}"


def _sweep_batch(rows: list[dict]) -> int:
    return min(SWEEP_BATCH, max(r["batch"] for r in rows))


def budget_sweep(rows: list[dict], mat_curve: dict) -> list:
    """ESTIMATED output tokens/s vs total tree tokens at batch 16 (or the largest measured below it):
    the measured bole step's GPU kernel time at N tokens per request with the embedded model's best MAT
    measured at N - 1 draft tokens or fewer. The GPU time stands for a graph-captured step."""
    batch = _sweep_batch(rows)
    known = sorted((int(k), v) for k, v in mat_curve.items())
    sweep = []
    for row in rows:
        if row["batch"] != batch or "error" in row["bole"]:
            continue
        n = row["tokens_per_request"]
        mat = max((v for k, v in known if k <= n - 1), default=1.0)
        gpu_s = row["bole"]["gpu_us"] * 1e-6
        sweep.append(
            {
                "batch": batch,
                "total_tree_tokens": n * batch,
                "tokens_per_request": n,
                "mat_from_small_model": mat,
                "step_gpu_ms": gpu_s * 1e3,
                "estimated_output_tokens_per_s": batch * mat / gpu_s,
            }
        )
    return sweep


def chain_estimate(rows: list[dict], chain_mat: float) -> dict | None:
    """ESTIMATED output tokens/s of 8-token chains (9 tokens a request, the serial GDN scheme) at the
    sweep's batch: the measured chain step's GPU time with the embedded model's MAT on chains."""
    batch = _sweep_batch(rows)
    step = next((r["chain9"] for r in rows if r["batch"] == batch and "gpu_us" in r.get("chain9", {})), None)
    if step is None:
        return None
    gpu_s = step["gpu_us"] * 1e-6
    return {
        "batch": batch,
        "tokens_per_request": 9,
        "mat_from_small_model": chain_mat,
        "step_gpu_ms": gpu_s * 1e3,
        "estimated_output_tokens_per_s": batch * chain_mat / gpu_s,
    }


def estimates(rows: list[dict], acceptance: dict) -> dict:
    """The budget sweep and, where the acceptance JSON (eval_acceptance.py's) measured 8-token chains,
    the chain's point: what a tree budget has to beat."""
    out = {"budget_sweep_estimate": budget_sweep(rows, acceptance["mat_by_draft_tokens"])}
    shapes = {r["shape"]: r["mean_accepted_tokens"] for r in acceptance.get("rows", [])}
    if "chain d8" in shapes:
        out["chain8_estimate"] = chain_estimate(rows, shapes["chain d8"])
    return out


def reestimate(result: dict, acceptance: Path) -> None:
    """Redo every model's estimates in ``result`` with the acceptance measured in ``acceptance``."""
    measured = json.loads(acceptance.read_text())
    result["acceptance"] = str(acceptance)
    for entry in result["models"].values():
        entry.pop("chain8_estimate", None)
        entry.update(estimates(entry["steps"], measured))


def plot(result: dict, png: Path) -> None:
    """Per model: GPU step time vs tokens per request (bole and tree-serial, per batch) with the GDN
    verify share, and the budget sweep estimate."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (run --plot-only <json> where it is)")
        return
    models = result["models"]
    fig, axes = plt.subplots(len(models), 3, figsize=(15, 4 * len(models)), squeeze=False)
    for (name, entry), (ax_t, ax_s, ax_b) in zip(models.items(), axes, strict=True):
        for batch in sorted({r["batch"] for r in entry["steps"]}):
            rows = [r for r in entry["steps"] if r["batch"] == batch]
            for key, style in (("bole", "-o"), ("tree_serial", "--s")):
                pts = [(r["tokens_per_request"], r[key]) for r in rows if "error" not in r[key]]
                label = f"{key} b{batch}"
                ax_t.plot([n for n, _ in pts], [p["gpu_us"] / 1e3 for _, p in pts], style, label=label)
                ax_s.plot([n for n, _ in pts], [100 * p["verify_share"] for _, p in pts], style, label=label)
        nodes = "tree tokens per request"
        ax_t.set(title=f"{name}: verify step GPU time", xlabel=nodes, ylabel="ms", xscale="log")
        ax_s.set(title="GDN verify share of the step", xlabel=nodes, ylabel="%", xscale="log")
        ax_s.axhline(5, color="grey", lw=0.8, ls=":")
        sweep = entry.get("budget_sweep_estimate") or []
        ax_b.plot([r["total_tree_tokens"] for r in sweep],
                  [r["estimated_output_tokens_per_s"] for r in sweep], "-o", label="bole")  # fmt: skip
        batch = sweep[0]["batch"] if sweep else None
        decode = next((r["decode"] for r in entry["steps"] if r["batch"] == batch and "decode" in r), {})
        if "gpu_us" in decode:  # plain decoding: one token per request per step (measured, no estimate)
            ax_b.axhline(batch / (decode["gpu_us"] * 1e-6), color="grey", ls="--", label="ar (decode step)")
        chain = entry.get("chain8_estimate")
        if chain:
            ax_b.axhline(chain["estimated_output_tokens_per_s"], color="tab:orange", ls="-.",
                         label="chain of 8 (estimate)")  # fmt: skip
        ax_b.legend(fontsize=7)
        ax_b.set(title="ESTIMATE: output tokens/s vs verify budget", xlabel="total tree tokens in the batch",
                 ylabel="tokens/s", xscale="log")  # fmt: skip
        ax_b.set_xticks([r["total_tree_tokens"] for r in sweep], [str(r["total_tree_tokens"]) for r in sweep])
        ax_b.minorticks_off()
        for ax in (ax_t, ax_s):
            ax.legend(fontsize=7)
    fig.suptitle(f"{result['device']}, torch {result['torch']}: random bf16 weights, kv {result['kv_len']}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


if __name__ == "__main__":
    raise SystemExit(main())
