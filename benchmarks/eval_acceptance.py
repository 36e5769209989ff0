"""How much speculation the embedded model really gets: MAT, acceptance rate and tokens per target
forward on held-out code prompts, for chain and tree drafting of several shapes (greedy).

    python benchmarks/eval_acceptance.py [--device cpu|cuda] [--prompts 32] [--max-tokens 64]

Every mode's greedy output is compared with plain autoregressive decoding (``ar``) in the same run;
the script refuses to report a shape whose output differs. Writes
``benchmarks/results/acceptance_<device>.json`` (and a PNG when matplotlib is available).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import triton
from _bench_util import tagged_stem
from bench import divergence  # this folder's bench.py (scripts run with it on sys.path)

from trtllm_bole import LLM, BoleConfig, SamplingParams
from trtllm_bole.spec.calibration import device_name

HERE = Path(__file__).resolve().parent
PROMPTS = HERE / "data" / "heldout_code_prompts.jsonl"

# (name, mode, depth, branching, max draft nodes per request)
SHAPES = [
    ("chain d4", "chain", 4, 1, 4),
    ("chain d8", "chain", 8, 1, 8),
    ("tree d4 k2", "bole", 4, 2, 16),
    ("tree d6 k3", "bole", 6, 3, 32),
    ("tree d8 k2", "bole", 8, 2, 32),
    ("tree d8 k4", "bole", 8, 4, 64),
]


def run(llm: LLM, prompts: list[str], max_tokens: int) -> tuple[list[list[int]], dict, float]:
    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens), use_tqdm=False)
    seconds = time.perf_counter() - start
    steps = sum(o.stats.steps for o in outs)
    drafted = sum(o.stats.drafted for o in outs)
    accepted = sum(o.stats.accepted for o in outs)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    stats = {
        "mean_accepted_tokens": (accepted + steps) / steps if steps else 1.0,  # --max-tokens 1: no step
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "tokens_per_target_forward": tokens / (steps + len(outs)),  # + one prefill per request
        "steps": steps,
        "drafted": drafted,
        "accepted": accepted,
        "output_tokens": tokens,
    }
    return [o.outputs[0].token_ids for o in outs], stats, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="checkpoint or engine dir (default: embedded)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="auto: bfloat16 on a GPU, float32 on CPU")  # fmt: skip
    parser.add_argument("--prompts", type=int, default=32, help="the first N of --prompt-file")
    parser.add_argument(
        "--prompt-file", type=Path, default=PROMPTS, help="JSONL of prompts (default: held out)"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", type=Path, default=HERE / "results", help="folder for the JSON and PNG")
    parser.add_argument(
        "--curve", default="1,2,4,8,16,32,64",
        help="draft tokens per request for the MAT curve of tree d8 k4 (empty: skip)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    held_out = [json.loads(line)["prompt"] for line in args.prompt_file.read_text().splitlines()]
    if not 1 <= args.prompts <= len(held_out) or args.max_tokens < 1 or args.batch < 1:
        parser.error(
            f"--prompts {args.prompts} (1 to the {len(held_out)} held out), --max-tokens {args.max_tokens} "
            f"and --batch {args.batch} (1 or more)"
        )
    prompts = held_out[: args.prompts]

    def llm_for(mode: str, depth: int, branching: int, nodes: int) -> LLM:
        bole = BoleConfig.for_mode(mode, max_depth=depth, top_k=branching, max_nodes=nodes)
        return LLM(args.model, speculative_config=bole, device=args.device, dtype=args.dtype,
                   max_batch_size=args.batch)  # fmt: skip

    ar = llm_for("ar", 1, 1, 1)
    dtype = str(ar.model.dtype).removeprefix("torch.")  # what --dtype auto resolved to on this device
    reference, ar_stats, ar_seconds = run(ar, prompts, args.max_tokens)
    del ar  # one model loaded at a time
    rows = [{"shape": "ar", "mode": "ar", "identical_to_ar": True, "seconds": ar_seconds, **ar_stats}]
    print(f"{'shape':<12}{'MAT':>7}{'accept':>8}{'tok/fwd':>9}{'same as ar':>12}")
    for name, mode, depth, branching, nodes in SHAPES:
        outputs, stats, seconds = run(llm_for(mode, depth, branching, nodes), prompts, args.max_tokens)
        same = outputs == reference
        row = {"shape": name, "mode": mode, "depth": depth, "branching": branching, "max_nodes": nodes,
               "identical_to_ar": same, "seconds": seconds}  # fmt: skip
        if same:
            row.update(stats)
        else:
            row["error"] = "greedy output differs from ar: statistics withheld"
            row["divergence"] = divergence(outputs, reference)
        rows.append(row)
        if same:  # a differing shape's statistics are withheld here as in the JSON
            shown = f"{stats['mean_accepted_tokens']:7.2f}{stats['acceptance_rate']:8.2f}"
            shown += f"{stats['tokens_per_target_forward']:9.2f}"
        else:
            shown = f"{'-':>7}{'-':>8}{'-':>9}"
        print(f"{name:<12}{shown}{same!s:>12}")

    curve, curve_errors = {}, {}
    for nodes in [int(n) for n in args.curve.split(",") if n]:
        outputs, stats, _ = run(llm_for("bole", min(8, nodes), 4, nodes), prompts, args.max_tokens)
        if outputs != reference:
            curve_errors[nodes] = divergence(outputs, reference)
            print(f"tree k4, {nodes:>2} draft tokens/request: greedy output differs from ar (withheld)")
            continue
        curve[nodes] = stats["mean_accepted_tokens"]
        print(f"tree k4, {nodes:>2} draft tokens/request: MAT {curve[nodes]:.2f}")

    device = device_name(torch.device(args.device))
    result = {
        "what": "greedy speculation on held-out code prompts "
        f"({os.path.relpath(args.prompt_file, HERE.parent)})",
        "command": "python benchmarks/eval_acceptance.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": dtype,
        "model": str(args.model or "embedded qwen35-code-tiny"),
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "rows": rows,
        "mat_by_draft_tokens": curve,
        "mat_curve_withheld": curve_errors,
    }
    # Named by the device, and by the prompt file where it is not the default one.
    stem = tagged_stem("acceptance", device, None if args.prompt_file == PROMPTS else args.prompt_file.stem)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    plot(rows, args.out / f"{stem}.png")
    return 0 if all(r["identical_to_ar"] for r in rows) and not curve_errors else 1


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    shown = [r for r in rows if "mean_accepted_tokens" in r]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    colors = [
        "#999999" if r["mode"] == "ar" else "#4c72b0" if r["mode"] == "chain" else "#dd8452" for r in shown
    ]
    ax.bar([r["shape"] for r in shown], [r["mean_accepted_tokens"] for r in shown], color=colors)
    ax.set_ylabel("mean accepted tokens / step")
    ax.set_title("Greedy speculation on held-out code (chain: blue, tree: orange)")
    ax.axhline(3.0, color="black", lw=0.8, ls="--")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
