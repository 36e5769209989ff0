"""GDN prefill on the GPU: the one-launch kernel against rounds of the tree kernels, per GDN layer.

    python benchmarks/bench_prefill.py       # H200: ~1 min -> results/bench_prefill_<device>.json and .png
    python benchmarks/bench_prefill.py --plot-only benchmarks/results/bench_prefill_h200.json

``one-launch`` is :func:`trtllm_bole.kernels.gdn_prefill.gdn_prefill` (one program per value tile, head
and prompt walks the prompt's chunks, verifying and committing each). ``rounds`` is the scheme it
replaced (2026-12-02), rebuilt here from the public kernels: round ``c`` verifies chunk ``c`` of every
prompt that long as one packed forest of chains (``gdn_tree_verify``) and commits each chain's last node
(``gdn_commit``): a verify and a commit per chunk index, in the configs the rounds ran (fp32: the blocked
kernel's exact config; 16-bit: the explicit inverse in one tile of 64, two launches), the inputs gathered
round after round once per call.

Both schemes are first checked against the float64 serial recurrence (outputs and final states, fp32
within 1e-4, bf16 within 1e-2, on ragged prompts up to 130 tokens); a scheme that fails is not timed, and
at every timed point the two must agree (outputs and states) within the same tolerance. Per point (the
embedded model's and Qwen3.5-9B's GDN heads, fp32 and bf16 q/k/v, batches of prompts of 200-400 tokens
and one of 2048-token prompts): ``eager_us``, CUDA-event time per call launched from Python as a prefill
launches it (the host's launches included: a GPU left idle between them counts; both schemes' chunk
layouts cached, as the later layers of a prefill find them), and ``graph_us``, the same work replayed
from a CUDA graph (the GPU's time alone); and the rounds' time over the one launch's, plotted.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from _bench_util import graph_timer, passes, rel_rms, result_name, run_meta, timer, write_result

from trtllm_bole.kernels import gdn_prefill as prefill
from trtllm_bole.kernels._common import GDNTreeFactors, tile_dividing
from trtllm_bole.kernels.gdn_commit import gdn_commit
from trtllm_bole.kernels.gdn_tree_verify import InverseConfig, exact_config, gdn_tree_verify
from trtllm_bole.reference import gdn_tree
from trtllm_bole.testing import random_gdn_inputs
from trtllm_bole.tree import TreeBatch

DIMS = {"embedded": (2, 4, 64, 64), "qwen3.5-9b": (16, 32, 128, 128)}  # H, HV, dk, dv
CHUNK = 64
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


def prompt_lengths(batch: int, long: bool) -> list[int]:
    return [2048] * batch if long else [200 + (37 * i) % 201 for i in range(batch)]


@dataclass(frozen=True)
class Rounds:
    rows: torch.Tensor  # packed rows, round after round
    rounds: list[tuple[slice, torch.Tensor, TreeBatch, torch.Tensor]]  # rows, prompts, chains, last nodes


def rounds_plan(lengths: list[int], device: str) -> Rounds:
    starts, rows, rounds = [0, *itertools.accumulate(lengths)], [], []
    for lo in range(0, max(lengths), CHUNK):
        taking = [b for b, n in enumerate(lengths) if n > lo]
        sizes = [min(CHUNK, lengths[b] - lo) for b in taking]
        span = slice(len(rows), len(rows) + sum(sizes))
        rows += [starts[b] + lo + i for b, size in zip(taking, sizes, strict=True) for i in range(size)]
        tree = TreeBatch.chains(sizes, device=device, max_depth=CHUNK)
        last = torch.tensor([s - 1 for s in sizes], device=device)
        rounds.append((span, torch.tensor(taking, device=device), tree, last))
    return Rounds(torch.tensor(rows, device=device), rounds)


def run_rounds(plan: Rounds, q, k, v, g, beta, state, scale: float) -> torch.Tensor:
    dk, dv = q.shape[-1], v.shape[-1]
    fp32 = q.dtype == v.dtype == torch.float32
    cfg = exact_config(dk, dv)
    if not fp32:
        cfg = InverseConfig(64, tile_dividing(dk, 64), tile_dividing(dv, 64), launches=2, warps1=4)
    q, k, v, g, beta = (t[plan.rows] for t in (q, k, v, g, beta))
    outputs = []
    for span, prompts, tree, last in plan.rounds:
        o_r, u, log_p = gdn_tree_verify(
            q[span], k[span], v[span], g[span], beta[span], state, tree,
            scale=scale, state_indices=prompts, config=cfg,
        )  # fmt: skip
        gdn_commit(state, GDNTreeFactors(tree, k[span], u, log_p), last, state_indices=prompts)
        outputs.append(o_r)
    o = torch.empty_like(v)
    o[plan.rows] = torch.cat(outputs)
    return o


def schemes(lengths: list[int], device: str) -> dict:
    plan = rounds_plan(lengths, device)
    return {
        "one-launch": lambda q, k, v, g, beta, state, scale: prefill.gdn_prefill(
            q, k, v, g, beta, state, lengths, scale=scale, chunk_size=CHUNK
        ),
        "rounds": lambda *args: run_rounds(plan, *args),
    }


def inputs(lengths: list[int], dims: tuple[int, ...], dtype: torch.dtype, seed: int, device: str):
    h, hv, dk, dv = dims
    gen = torch.Generator().manual_seed(seed)
    x = random_gdn_inputs(sum(lengths), len(lengths), h, hv, dk, dv, generator=gen, device=device)
    q, k, v = (t.to(dtype) for t in (x.q, x.k, x.v))
    return (q, k, v, x.g.float(), x.beta.float()), x.state.float(), x.scale


def check_against_float64(dims, dtype, device: str) -> dict[str, dict[str, float]]:
    """Each scheme's relative RMS of its outputs and final states against the serial float64 recurrence."""
    lengths = [70, 3, 130]
    operands, state, scale = inputs(lengths, dims, dtype, 0, device)
    chains = TreeBatch.chains(lengths, device=device)
    o_ref, states = gdn_tree.serial_tree_recurrence(
        *(t.double() for t in operands), state.double(), chains, scale=scale
    )
    errors = {}
    for name, fn in schemes(lengths, device).items():
        s = state.clone()
        o = fn(*operands, s, scale)
        errors[name] = {"o": rel_rms(o, o_ref), "state": rel_rms(s, states[chains.cu_seqlens[1:] - 1])}
    return errors


def within_tolerance(errors: dict[str, dict[str, float]], dtype: torch.dtype) -> bool:
    """Every scheme's every error within ``dtype``'s tolerance: a NaN fails."""
    return passes([e for scheme in errors.values() for e in scheme.values()], TOL[dtype])


def plot(data: dict, png: Path) -> str:
    """The rounds' time over the one launch's at every point, eager and from a graph. Returns a note."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing: no PNG (run --plot-only <json> where it is installed)"
    timed = [p for p in data["points"] if "one-launch" in p]
    labels = [
        f"{p['dims']}\n{p['dtype'].removeprefix('torch.')}\n{p['prompts']} x {p['lengths']}" for p in timed
    ]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(timed)), 5))
    for offset, kind in ((-0.2, "eager"), (0.2, "graph")):
        ratios = [p[f"rounds_over_one_launch_{kind}"] for p in timed]
        ax.bar([i + offset for i in range(len(timed))], ratios, 0.4, label=kind)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(timed)), labels, fontsize=7)
    ax.set_ylabel("rounds' time / one launch's (log)")
    ax.set_title(f"GDN prefill, one layer: one launch vs rounds of verify + commit ({data['device']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return f"wrote {png}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--plot-only", type=Path, metavar="JSON", help="redraw the PNG of a result file")
    args = ap.parse_args(argv)
    if args.plot_only:
        print(plot(json.loads(args.plot_only.read_text()), args.plot_only.with_suffix(".png")))
        return 0
    if not torch.cuda.is_available():
        print("bench_prefill.py times the kernels on a CUDA GPU", file=sys.stderr)
        return 2
    device, eager, graph = "cuda", timer(True, args.rep_ms), graph_timer(args.rep_ms)
    checks, points = [], []
    for (dims_name, dims), dtype in itertools.product(DIMS.items(), (torch.float32, torch.bfloat16)):
        errors = check_against_float64(dims, dtype, device)
        passed = within_tolerance(errors, dtype)
        checks.append({"dims": dims_name, "dtype": str(dtype), "rel_vs_float64": errors, "passed": passed})
        print(checks[-1], flush=True)
        if not passed:
            continue
        shapes = [(1, False), (8, False), (32, False)] + ([(4, True)] if dims_name != "embedded" else [])
        for batch, long in shapes:
            lengths = prompt_lengths(batch, long)
            operands, state, scale = inputs(lengths, dims, dtype, 1, device)
            fns = schemes(lengths, device)
            states = {name: state.clone() for name in fns}
            outs = {name: fn(*operands, states[name], scale) for name, fn in fns.items()}
            agree = [
                rel_rms(outs["rounds"], outs["one-launch"]),
                rel_rms(states["rounds"], states["one-launch"]),
            ]
            point = {"dims": dims_name, "dtype": str(dtype), "prompts": batch, "tokens": sum(lengths),
                     "lengths": f"{min(lengths)}-{max(lengths)}", "rounds_vs_one_launch": agree}  # fmt: skip
            if not passes(agree, TOL[dtype]):
                point["error"] = "the schemes disagree: not timed"
            else:
                for name, fn in fns.items():
                    call = functools.partial(fn, *operands, state.clone(), scale)
                    point[name] = {"eager_us": eager(call), "graph_us": graph(call)}
                for kind in ("eager", "graph"):
                    ratio = point["rounds"][f"{kind}_us"] / point["one-launch"][f"{kind}_us"]
                    point[f"rounds_over_one_launch_{kind}"] = ratio
            points.append(point)
            print(point, flush=True)
    data = run_meta(chunk_size=CHUNK, checks=checks, points=points)
    path = write_result(args.out, result_name("bench_prefill"), data)
    print(f"wrote {path}\n{plot(data, path.with_suffix('.png'))}")
    return 0 if all(c["passed"] for c in checks) and not any("error" in p for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
