"""What the ``bole::*`` operators cost the host, split in two: each public op (``trtllm_bole.ops``:
validation, then the operator) against the operator alone (PyTorch's dispatcher, then the implementation
for the device) against that implementation called directly (the Triton launcher on CUDA, the reference
on CPU; ``library.IMPLEMENTATIONS``).

    python benchmarks/op_dispatch.py --out DIR      # H200: ~20 s -> DIR/op_dispatch_<device>.json

Inputs are one decode step of the embedded model's shapes (8 requests, trees of 8 nodes), small enough
that the host, not the GPU, sets the pace of a loop of calls: the figure is host µs a call (a loop of
``--calls`` calls, then one synchronize; median of ``--rounds``). The three outputs must be equal bit
for bit (the same kernels), else nothing is reported. ``--device cpu`` smoke-runs it on the reference.
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _bench_util import run_meta, tagged_stem

from trtllm_bole import ops
from trtllm_bole.ops import library
from trtllm_bole.ops.library import IMPLEMENTATIONS, tree_args
from trtllm_bole.testing import forest, random_gdn_inputs, topk_parents


def _cases(device: str) -> dict:
    """``name: (public op, operator, implementation)``, each a no-argument call returning a tensor."""
    gen = torch.Generator().manual_seed(0)
    tree = forest([topk_parents(8, 2, 4)] * 8, device=device)
    x = random_gdn_inputs(tree.num_nodes, 8, 2, 4, 64, 64, generator=gen, device=device).cast(torch.bfloat16)
    hidden = torch.randn(tree.num_nodes, 256, device=device, dtype=torch.bfloat16)
    weight = torch.randn(256, device=device, dtype=torch.bfloat16)
    mixed = torch.randn(tree.num_nodes, 384, device=device, dtype=torch.bfloat16)
    conv_w, conv_state = torch.randn(384, 4, device=device), torch.randn(8, 384, 3, device=device)
    key = device.upper()
    gdn, t = (x.q, x.k, x.v, x.g, x.beta, x.state), tree_args(tree)
    conv = (mixed, conv_w, conv_state)
    return {
        "rms_norm": (
            lambda: ops.rms_norm(hidden, weight, 1e-6),
            lambda: library.rms_norm(hidden, weight, 1e-6),
            lambda: IMPLEMENTATIONS["rms_norm"][key](hidden, weight, 1e-6),
        ),
        "tree_conv1d": (
            lambda: ops.tree_conv1d(*conv, tree),
            lambda: library.tree_conv1d(*conv, *t),
            lambda: IMPLEMENTATIONS["tree_conv1d"][key](*conv, *t),
        ),
        "gdn_tree_verify": (
            lambda: ops.gdn_tree_verify(*gdn, tree, scale=x.scale)[0],
            lambda: library.gdn_tree_verify(*gdn, *t, scale=x.scale)[0],
            lambda: IMPLEMENTATIONS["gdn_tree_verify"][key](*gdn, *t, scale=x.scale)[0],
        ),
    }


def _host_us(fn: Callable[[], object], calls: int, rounds: int, device: str) -> float:
    runs = []
    for _ in range(rounds):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"]
    )
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    points = {}
    for name, calls in _cases(args.device).items():
        outputs = [call() for call in calls]  # also warms them (compiled, loaded)
        if not all(torch.equal(outputs[0], out) for out in outputs[1:]):
            print(f"{name}: the three calls' outputs differ; nothing reported", file=sys.stderr)
            return 1
        public, operator, direct = (_host_us(call, args.calls, args.rounds, args.device) for call in calls)
        points[name] = {"public_op_us": public, "operator_us": operator, "implementation_us": direct,
                        "validation_us": public - operator, "dispatch_us": operator - direct}  # fmt: skip
        times = f"public op {public:6.1f} µs, operator {operator:6.1f}, launcher {direct:6.1f}"
        print(f"{name:16s} {times}: validation {public - operator:+6.1f}, dispatch {operator - direct:+6.1f}")
    result = run_meta(
        device=args.device, calls=args.calls, rounds=args.rounds,
        what="host µs a call (a loop of calls, one sync; median of rounds); outputs equal bit for bit",
        points=points,
    )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{tagged_stem('op_dispatch', result['device'], None)}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
