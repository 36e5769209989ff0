"""The TensorRT plugins' GDN verify as a plan launches it, against the runtime's launcher.

    PYTHONPATH=$PWD python benchmarks/bench_aot_verify.py --out DIR    # H200, about 2 minutes

(the repository root on the path: the script launches through ``plugins/check_aot.py``).

Each plugin's AOT payload (its PTX, grid and int32 scalars: what ``@trtp.aot_impl`` hands TensorRT) is
loaded with cuda-python and launched on TensorRT's parameter list (``plugins/check_aot.py``), captured
in CUDA graphs, at Qwen3.5-9B GDN heads (H = 16, HV = 32, dk = dv = 128), top-4 trees of 64 nodes and
depth 8, batch 1-32:

- ``blocked``: ``bole::gdn_tree_verify`` (the blocked kernel; q/k in fp32, as that plugin takes them) under
  the tactic an engine ships at that batch (``blocked_default_config``);
- ``inverse``: ``bole::gdn_tree_factors`` then ``bole::gdn_tree_values`` (bf16 q/k/v), the tactics of the
  runtime's default config where it picks two launches, tactic 0 where it picks one;
- ``runtime``: the runtime's launcher (``gdn_tree_verify``, default config and precision; one launch at
  small batches) on the same values: what the plugins are measured against.

Every variant's o, u and log_p are first checked against the float64 serial recurrence of the values it
reads (relative RMS <= 1e-2); a variant that fails is reported and not timed, and a batch's ratios are
given only where both sides passed (``inverse_vs_blocked``, ``inverse_vs_runtime``: the other's time over
the pair's, above 1 where the pair is faster). Times: CUDA-graph replays, the L2 flushed before each
(``_bench_util.graph_timer``). Writes ``<out>/aot_verify_h200.json``.
"""

from __future__ import annotations

import _bench_util as U
import torch
from tqdm import tqdm

from plugins.check_aot import (
    SERVING,
    PTXKernel,
    inverse_io,
    inverse_payloads,
    port_io,
    verify_errors,
    verify_passed,
    verify_truth,
)
from trtllm_bole.engine.aot import SPECS, FactorConfig, aot_payload
from trtllm_bole.kernels.gdn_tree_verify import blocked_default_config, default_config, gdn_tree_verify
from trtllm_bole.testing import topk_parents
from trtllm_bole.tree import TreeBatch

HV, NODES, DEPTH, BATCHES = 32, 64, 8, (1, 2, 4, 8, 16, 32)


def plugin_tactics(batch: int, dims: dict) -> dict[str, int]:
    """The tactic of each plugin that matches what the runtime (or an engine) picks at ``batch``."""
    blocked = SPECS["bole::gdn_tree_verify"].tactics(dims)
    values = SPECS["bole::gdn_tree_values"].tactics(dims)
    cfg = default_config(batch * NODES, batch, HV, U.DK, U.DV)
    key = (cfg.bk, cfg.bv, cfg.num_warps, cfg.maxnreg)
    value = next((i for i, t in enumerate(values) if (t.bk, t.bv, t.num_warps, t.maxnreg) == key), 0)
    factor = SPECS["bole::gdn_tree_factors"].tactics(dims).index(FactorConfig(values[value].warps1))
    return {
        "blocked": blocked.index(blocked_default_config(batch, HV, U.DK, U.DV)),
        "factors": factor,
        "values": value,
        "runtime": repr(cfg),
    }


def verify_inputs(batch: int, gen: torch.Generator) -> tuple[TreeBatch, U.Inputs, dict[str, torch.Tensor]]:
    """``batch`` top-4 trees of 64 nodes at Qwen3.5-9B GDN heads: the tree, the bench's inputs (bf16 q/k/v,
    fp32 gates and state) and the plugins' input tensors (beta rounded to bf16 as the runtime hands it on)."""
    tree = U.tree_of([topk_parents(NODES, 4, DEPTH)] * batch, "cuda")
    x = U.make_inputs(tree, U.H, HV, U.DK, U.DV, torch.bfloat16, gen)
    inputs = {
        "q": x.q, "k": x.k, "v": x.v, "g": x.g, "beta": x.beta.to(torch.bfloat16), "state": x.state,
        "state_indices": torch.arange(batch, device="cuda"), "cu_seqlens": tree.cu_seqlens,
        "dfs_order": tree.dfs_order, "subtree_size": tree.subtree_size,
    }  # fmt: skip
    return tree, x, inputs


def one_batch(batch: int, gen: torch.Generator, measure, arch: int) -> dict:
    tree, x, inputs = verify_inputs(batch, gen)
    truth = verify_truth(inputs, tree, x.scale)
    tactics = plugin_tactics(batch, {"q": x.q.shape, "v": x.v.shape})
    row: dict = {"batch": batch, "nodes": tree.num_nodes, "tactics": tactics, "errors": {}, "us": {}}

    spec = SPECS["bole::gdn_tree_verify"]
    blocked_io = {**inverse_io(inputs, tree), "q": x.q.float(), "k": x.k.float()}  # NaN-poisoned outputs
    shapes, dtypes = port_io(blocked_io, spec)
    attrs = {"scale": x.scale, "max_depth": tree.max_depth}
    blocked = PTXKernel(aot_payload(spec, shapes, dtypes, attrs, tactics["blocked"], arch=arch))
    variants = {"blocked": (blocked_io, lambda: blocked.launch(blocked_io))}

    pair_io = inverse_io(inputs, tree)
    attrs = {"scale": x.scale, "max_nodes": NODES, "max_depth": tree.max_depth}
    factors, values = (
        PTXKernel(p) for p in inverse_payloads(pair_io, attrs, arch, tactics["factors"], tactics["values"])
    )
    variants["inverse"] = (pair_io, lambda: (factors.launch(pair_io), values.launch(pair_io)))

    runtime_io: dict = {}

    def runtime() -> None:
        runtime_io["o"], runtime_io["u"], runtime_io["log_p"] = gdn_tree_verify(
            x.q, x.k, x.v, x.g, inputs["beta"], x.state, tree, scale=x.scale,
            state_indices=inputs["state_indices"],
        )  # fmt: skip

    variants["runtime"] = (runtime_io, runtime)
    for name, (io, launch) in variants.items():
        launch()
        torch.cuda.synchronize()
        row["errors"][name] = verify_errors(io, truth)
        if verify_passed(row["errors"][name], SERVING):
            row["us"][name] = measure(launch)
        else:
            print(f"batch {batch}: {name} FAILED its check {row['errors'][name]}, not timed", flush=True)
    for kernel in (blocked, factors, values):
        kernel.close()
    us = row["us"]
    if "inverse" in us:
        row["inverse_vs_blocked"] = us["blocked"] / us["inverse"] if "blocked" in us else None
        row["inverse_vs_runtime"] = us["runtime"] / us["inverse"] if "runtime" in us else None
    return row


def main(argv: list[str] | None = None) -> int:
    start = U.probe_start(__doc__, "bench_aot_verify.py", argv)
    if start is None:
        return 2
    args, measure, gen = start
    major, minor = torch.cuda.get_device_capability()
    rows = []
    for batch in tqdm(BATCHES, desc="batches", unit="batch"):
        rows.append(one_batch(batch, gen, measure, 10 * major + minor))
        r = rows[-1]
        print(f"batch {batch}: µs {', '.join(f'{k} {v:.1f}' for k, v in r['us'].items())}", flush=True)
    passed = all(len(r["us"]) == 3 for r in rows)
    meta = U.run_meta(
        dims={"H": U.H, "HV": HV, "dk": U.DK, "dv": U.DV}, tree={"nodes": NODES, "depth": DEPTH}
    )
    data = {
        "meta": meta,
        "timing": "CUDA-graph replays, L2 flushed before each (_bench_util.graph_timer), median",
        "tolerance": SERVING,
        "passed": passed,
        "rows": rows,
    }
    print(f"wrote {U.write_result(args.out, 'aot_verify_h200.json', data)}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
