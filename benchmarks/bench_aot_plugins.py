"""The TensorRT plugins as a plan launches them, against the runtime's launches of the same kernels.

    PYTHONPATH=$PWD python benchmarks/bench_aot_plugins.py --out DIR    # H200, about 2 minutes

(the repository root on the path: the script launches through ``plugins/check_aot.py``).

Each plugin's AOT payload (its PTX, grid and int32 scalars: what ``@trtp.aot_impl`` hands TensorRT) is
loaded with cuda-python and launched on TensorRT's parameter list (``plugins/check_aot.py``), captured
in CUDA graphs, at Qwen3.5-9B GDN sizes (H = 16, HV = 32, dk = dv = 128, conv channels 8,192, 24 GDN
layers), top-4 trees of 64 nodes and depth 8:

- verify, batch 1-32: ``blocked`` is ``bole::gdn_tree_verify`` (the blocked kernel; q/k in fp32, as that
  plugin takes them) under the tactic an engine ships at that batch (``blocked_default_config``);
  ``inverse`` is ``bole::gdn_tree_factors`` then ``bole::gdn_tree_values`` (bf16 q/k/v) under the tactics
  of the runtime's default config where it picks two launches, tactic 0 where it picks one; ``runtime``
  is the runtime's launcher (``gdn_tree_verify``, default config and precision; one launch at small
  batches) on the same values. Ratios (``inverse_vs_blocked``, ``inverse_vs_runtime``) are the other's
  time over the pair's, above 1 where the pair is faster;
- conv, batch 1, 16, 32: ``bole::tree_conv1d`` (bf16) against the runtime's ``tree_conv1d``;
- commit, batch 16, accepted paths of 8 nodes: ``bole::gdn_commit`` of all 24 layers in one launch
  against the runtime's ``gdn_commit`` (each the runtime's default config), with the bytes moved a second
  against the copy bandwidth measured in this run; then every tactic of the plugin.

Every variant is first checked against float64 (the serial recurrence for the verify, the references of
``trtllm_bole.reference`` for the conv and the commit; relative RMS <= 1e-2 in the serving precisions,
1e-5 for the fp32 commit); one that fails is reported and not timed, and ratios are given only where both
sides passed. Times: CUDA-graph replays, the L2 flushed before each (``_bench_util.graph_timer``). Writes
``<out>/aot_plugins_<device>.json``.
"""

from __future__ import annotations

import _bench_util as U
import torch
import torch.nn.functional as F
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
from trtllm_bole.engine.aot import SPECS, FactorConfig, aot_payload, value_tiles
from trtllm_bole.kernels._common import GDNTreeFactors
from trtllm_bole.kernels.gdn_commit import gdn_commit
from trtllm_bole.kernels.gdn_tree_verify import blocked_default_config, default_config, gdn_tree_verify
from trtllm_bole.kernels.tree_conv1d import tree_conv1d
from trtllm_bole.reference import conv_tree, gdn_tree
from trtllm_bole.testing import topk_parents
from trtllm_bole.tree import TreeBatch

HV, NODES, DEPTH, BATCHES = 32, 64, 8, (1, 2, 4, 8, 16, 32)
CONV_CHANNELS, CONV_WIDTH, CONV_BATCHES = 2 * U.H * U.DK + HV * U.DV, 4, (1, 16, 32)
GDN_LAYERS, COMMIT_BATCH, COMMIT_TOL = 24, 16, 1e-5


def plugin_tactics(batch: int, dims: dict) -> dict[str, int]:
    """The tactic of each plugin that matches what the runtime (or an engine) picks at ``batch``."""
    blocked = SPECS["bole::gdn_tree_verify"].tactics(dims)
    values = SPECS["bole::gdn_tree_values"].tactics(dims)
    cfg = default_config(batch * NODES, batch, HV, U.DK, U.DV)
    value = next((i for i, t in enumerate(values) if value_tiles(t) == value_tiles(cfg)), 0)
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
    row: dict = {"batch": batch, "nodes": tree.num_nodes, "tactics": tactics}

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

    def check(name: str) -> tuple[dict, bool]:
        errors = verify_errors(variants[name][0], truth)
        return errors, verify_passed(errors, SERVING)

    check_then_time(row, {name: launch for name, (_, launch) in variants.items()}, check, measure)
    for kernel in (blocked, factors, values):
        kernel.close()
    row["inverse_vs_blocked"] = ratio(row, "blocked", "inverse")
    row["inverse_vs_runtime"] = ratio(row, "runtime", "inverse")
    return row


def conv_batch(batch: int, gen: torch.Generator, measure, arch: int) -> dict:
    """``bole::tree_conv1d`` from its PTX against the runtime's ``tree_conv1d`` on the same bf16 values."""
    tree = U.tree_of([topk_parents(NODES, 4, DEPTH)] * batch, "cuda")
    c, width = CONV_CHANNELS, CONV_WIDTH
    io = {
        "x": torch.randn(tree.num_nodes, c, generator=gen, device="cuda").bfloat16(),
        "weight": (torch.randn(c, width, generator=gen, device="cuda") / 2).bfloat16(),
        "conv_state": torch.randn(batch, c, width - 1, generator=gen, device="cuda").bfloat16(),
        "state_indices": torch.arange(batch, device="cuda"), "request": tree.request, "depth": tree.depth,
        "global_parents": tree.global_parents,
        "y": torch.full((tree.num_nodes, c), float("nan"), device="cuda", dtype=torch.bfloat16),
    }  # fmt: skip
    truth = conv_tree.tree_conv1d(
        io["x"].double(),
        io["weight"].double(),
        io["conv_state"].double(),
        tree,
        state_indices=io["state_indices"],
    )
    spec = SPECS["bole::tree_conv1d"]
    shapes, dtypes = port_io(io, spec)
    kernel = PTXKernel(aot_payload(spec, shapes, dtypes, {"silu": 1}, 0, arch=arch))
    out: dict = {}

    def runtime() -> None:
        out["y"] = tree_conv1d(
            io["x"], io["weight"], io["conv_state"], tree, state_indices=io["state_indices"]
        )

    outputs = {"plugin": io, "runtime": out}

    def check(name: str) -> tuple[float, bool]:
        error = U.rel_rms(outputs[name]["y"], truth)
        return error, U.passes([error], SERVING)

    row = check_then_time(
        {"batch": batch, "nodes": tree.num_nodes}, {"plugin": lambda: kernel.launch(io), "runtime": runtime},
        check, measure,
    )  # fmt: skip
    kernel.close()
    row["plugin_vs_runtime"] = ratio(row, "runtime", "plugin")
    return row


def commit_case(gen: torch.Generator) -> tuple[TreeBatch, dict[str, torch.Tensor], torch.Tensor]:
    """All 24 GDN layers of ``COMMIT_BATCH`` requests: a state pool (requests in reversed slots), factors
    of every layer (normalised k in bf16, the verify's k when serving; u, the path log-decays of random
    gates), the accepted leaves (one request keeps its state), and the float64 truth of the committed pool."""
    tree = U.tree_of([topk_parents(NODES, 4, DEPTH)] * COMMIT_BATCH, "cuda")
    n, layers = tree.num_nodes, GDN_LAYERS
    g = -torch.rand(layers, n, HV, generator=gen, device="cuda") * 0.1
    io = {
        "state": torch.randn(layers, COMMIT_BATCH, HV, U.DK, U.DV, generator=gen, device="cuda") * 0.1,
        "k": F.normalize(torch.randn(layers, n, U.H, U.DK, generator=gen, device="cuda"), dim=-1).bfloat16(),
        "u": torch.randn(layers, n, HV, U.DV, generator=gen, device="cuda"),
        "log_p": torch.stack([gdn_tree.path_log_decay(g[i], tree) for i in range(layers)]).float(),
        "accepted_leaf": torch.full((COMMIT_BATCH,), NODES - 1, device="cuda"),
        "state_indices": torch.arange(COMMIT_BATCH, device="cuda").flip(0), "cu_seqlens": tree.cu_seqlens,
        "depth": tree.depth, "paths": tree.paths,
    }  # fmt: skip
    io["accepted_leaf"][1] = -1
    truth = io["state"].double()
    for layer in range(layers):
        gdn_tree.factored_commit(
            truth[layer], io["k"][layer], io["u"][layer], io["log_p"][layer], tree, io["accepted_leaf"],
            state_indices=io["state_indices"],
        )  # fmt: skip
    return tree, io, truth


def commit_row(gen: torch.Generator, measure, arch: int, copy: dict) -> dict:
    """``bole::gdn_commit`` from its PTX against the runtime's ``gdn_commit``, each from the same pool;
    then each timed on its own pool (a replay commits again: the values move, the traffic does not)."""
    tree, io, truth = commit_case(gen)
    pool = io["state"]
    spec = SPECS["bole::gdn_commit"]
    shapes, dtypes = port_io(io, spec)
    kernel = PTXKernel(aot_payload(spec, shapes, dtypes, {"max_depth": tree.max_depth}, 0, arch=arch))
    plugin_io = {**io, "state": pool.clone()}
    plugin_io["state_out"] = plugin_io["state"]  # in place: the output aliases the input
    runtime_state = pool.clone()
    factors = GDNTreeFactors(tree, io["k"], io["u"], io["log_p"])

    def runtime() -> None:
        gdn_commit(runtime_state, factors, io["accepted_leaf"], state_indices=io["state_indices"])

    states = {"plugin": plugin_io["state"], "runtime": runtime_state}

    def check(name: str) -> tuple[float, bool]:
        error = U.rel_rms(states[name], truth)
        return error, U.passes([error], COMMIT_TOL)

    committed = int((io["accepted_leaf"] >= 0).sum()) * GDN_LAYERS * HV * U.DK * U.DV * 4
    launches = {"plugin": lambda: kernel.launch(plugin_io), "runtime": runtime}
    row = check_then_time(
        {"batch": COMMIT_BATCH, "layers": GDN_LAYERS, "bytes": 2 * committed},  # each state read, written
        launches, check, measure,
    )  # fmt: skip
    eager = U.timer(True, 50)  # launched from the host, as the first full run timed the commit (89%)
    row["eager_us"] = {name: eager(launches[name]) for name in row["us"]}  # the checked ones
    kernel.close()
    row["tactics_us"], row["tactics_failed"] = {}, []  # every tactic, each checked on a fresh pool first
    for t, cfg in enumerate(spec.tactics(shapes)):
        other = PTXKernel(aot_payload(spec, shapes, dtypes, {"max_depth": tree.max_depth}, t, arch=arch))
        tactic_io = {**io, "state": pool.clone()}
        tactic_io["state_out"] = tactic_io["state"]
        other.launch(tactic_io)
        torch.cuda.synchronize()
        if U.passes([U.rel_rms(tactic_io["state"], truth)], COMMIT_TOL):
            row["tactics_us"][repr(cfg)] = measure(lambda k=other, io=tactic_io: k.launch(io))
        else:  # recorded, and the run fails
            row["tactics_failed"].append(repr(cfg))
        other.close()
    for name, us in row["us"].items():
        row[f"{name}_of_copy_bandwidth"] = row["bytes"] / (us * 1e-6) / copy["bytes_per_s"]
        row[f"{name}_of_copy_bandwidth_eager"] = (
            row["bytes"] / (row["eager_us"][name] * 1e-6) / copy["bytes_per_s"]
        )
    row["plugin_vs_runtime"] = ratio(row, "runtime", "plugin")
    return row


def check_then_time(row: dict, variants: dict, check, measure) -> dict:
    """Launches each variant once, checks what it wrote (``check(name) -> (errors, passed)``), then times
    those that pass; a failing one is reported and left untimed."""
    row.update(errors={}, us={})
    for name, launch in variants.items():
        launch()
        torch.cuda.synchronize()
        row["errors"][name], passed = check(name)
        if passed:
            row["us"][name] = measure(launch)
        else:
            print(f"{name} FAILED its check ({row['errors'][name]}), not timed", flush=True)
    return row


def ratio(row: dict, slower: str, faster: str) -> float | None:
    """``slower``'s time over ``faster``'s where both were timed."""
    us = row["us"]
    return us[slower] / us[faster] if slower in us and faster in us else None


def main(argv: list[str] | None = None) -> int:
    start = U.probe_start(__doc__, "bench_aot_plugins.py", argv)
    if start is None:
        return 2
    args, measure, gen = start
    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    verify, conv = [], []
    for batch in tqdm(BATCHES, desc="verify", unit="batch"):
        verify.append(one_batch(batch, gen, measure, arch))
        print(f"verify batch {batch}: µs {fmt_us(verify[-1])}", flush=True)
    for batch in CONV_BATCHES:
        conv.append(conv_batch(batch, gen, measure, arch))
        print(f"conv batch {batch}: µs {fmt_us(conv[-1])}", flush=True)
    copy = U.copy_bandwidth("cuda", 2**30, 50)
    commit = commit_row(gen, measure, arch, copy)
    print(f"commit batch {COMMIT_BATCH}: µs {fmt_us(commit)}", flush=True)
    passed = (
        all(len(r["us"]) == 3 for r in verify)
        and all(len(r["us"]) == 2 for r in (*conv, commit))
        and not commit["tactics_failed"]
    )
    meta = U.run_meta(
        dims={"H": U.H, "HV": HV, "dk": U.DK, "dv": U.DV, "conv_channels": CONV_CHANNELS,
              "gdn_layers": GDN_LAYERS},
        tree={"nodes": NODES, "depth": DEPTH},
    )  # fmt: skip
    data = {
        "meta": meta,
        "timing": "CUDA-graph replays, L2 flushed before each (_bench_util.graph_timer), median",
        "tolerance": {"verify": SERVING, "conv": SERVING, "commit": COMMIT_TOL},
        "passed": passed,
        "copy_bandwidth": copy,
        "verify": verify,
        "conv": conv,
        "commit": commit,
    }
    print(f"wrote {U.write_result(args.out, U.result_name('aot_plugins'), data)}")
    return 0 if passed else 1


def fmt_us(row: dict) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in row["us"].items())


if __name__ == "__main__":
    raise SystemExit(main())
