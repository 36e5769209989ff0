"""What the driver's PTX JIT makes of the plugins' verify kernels, against Triton's own ptxas.

    PYTHONPATH=$PWD python benchmarks/probe_aot_jit.py --out DIR    # H200, about 2 minutes

TensorRT embeds an AOT plugin's PTX and has it compiled for the GPU (its ``aot_impl`` returns PTX only);
the runtime launches the cubin that Triton's bundled ptxas made of the same PTX. At Qwen3.5-9B GDN heads,
batch 16, top-4 trees of 64 nodes, each verify payload (``bole::gdn_tree_factors`` and
``bole::gdn_tree_values`` under every tactic, ``bole::gdn_tree_verify`` under the engine's tactic) is
loaded three ways and timed alone on the same inputs: its PTX (ISA 8.0, as shipped) through the driver's
JIT, the PTX of Triton's default ISA through the JIT, and Triton's cubin. Each is checked against the
float64 truth first (o, u and log_p; a factor kernel's W' and C' through the o and u that the value
kernel's first tactic, Triton's cubin, makes of them; relative RMS <= 1e-2) and timed only if it
passes; registers and local (spill) bytes per thread come from the loaded function. Times: CUDA-graph
replays, L2 flushed (``_bench_util.graph_timer``). Writes ``<out>/probe_aot_jit_<device>.json``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import _bench_util as U
import torch
import triton
from bench_aot_plugins import HV, NODES, verify_inputs

import trtllm_bole.engine.aot as aot
import trtllm_bole.engine.ptx as ptx
from plugins.check_aot import SERVING, PTXKernel, inverse_io, port_io, verify_errors, verify_truth
from trtllm_bole.kernels.gdn_tree_verify import blocked_default_config

BATCH = 16
WRITES = {
    "bole::gdn_tree_factors": ("factors", "log_p"),
    "bole::gdn_tree_values": ("o", "u"),
    "bole::gdn_tree_verify": ("o", "u", "log_p"),
}


def payload(plugin: str, tensors: dict, attrs: dict, tactic: int, triton_isa: bool) -> aot.AOTPayload:
    spec = aot.SPECS[plugin]
    shapes, dtypes = port_io(tensors, spec)
    pinned = ptx.PTX_VERSION
    ptx.PTX_VERSION = {} if triton_isa else pinned  # {}: Triton's default ISA for its CUDA
    try:
        return aot.aot_payload(spec, shapes, dtypes, attrs, tactic, arch=90)
    finally:
        ptx.PTX_VERSION = pinned


def isa(ptx: str) -> str:
    return next(line.split()[1] for line in ptx.splitlines() if line.startswith(".version"))


def ptxas_version() -> str:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    run = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True)
    return run.stdout.strip().splitlines()[-1] if run.returncode == 0 else f"unavailable ({ptxas})"


def driver_version() -> int:
    from cuda.bindings import driver

    return driver.cuDriverGetVersion()[1]


def main(argv: list[str] | None = None) -> int:
    start = U.probe_start(__doc__, "probe_aot_jit.py", argv)
    if start is None:
        return 2
    args, measure, gen = start
    tree, x, inputs = verify_inputs(BATCH, gen)
    truth = verify_truth(inputs, tree, x.scale)
    pair = inverse_io(inputs, tree)
    blocked = {**inverse_io(inputs, tree), "q": x.q.float(), "k": x.k.float()}
    pair_attrs = {"scale": x.scale, "max_nodes": NODES, "max_depth": tree.max_depth}
    dims = {"q": x.q.shape, "v": x.v.shape}
    jobs = [("bole::gdn_tree_factors", t, pair, pair_attrs) for t in range(2)]
    jobs += [
        ("bole::gdn_tree_values", t, pair, pair_attrs)
        for t in range(len(aot.SPECS["bole::gdn_tree_values"].tactics(dims)))
    ]
    engine_tactic = (
        aot.SPECS["bole::gdn_tree_verify"].tactics(dims).index(blocked_default_config(BATCH, HV, U.DK, U.DV))
    )
    jobs.append(
        ("bole::gdn_tree_verify", engine_tactic, blocked, {"scale": x.scale, "max_depth": tree.max_depth})
    )
    # A factor image's W' and C' are read by no check of their own: this value kernel turns them into o and u.
    values = PTXKernel(payload("bole::gdn_tree_values", pair, pair_attrs, 0, triton_isa=False), cubin=True)
    rows = []
    for plugin, tactic, io, attrs in jobs:
        for way in ("ptx 8.0, driver JIT", "ptx default, driver JIT", "Triton cubin"):
            p = payload(plugin, io, attrs, tactic, triton_isa=way.startswith("ptx default"))
            kernel = PTXKernel(p, cubin=way == "Triton cubin")
            for name in WRITES[plugin]:  # poisoned again: each kernel must write its outputs itself
                io[name].fill_(float("nan"))
            kernel.launch(io)
            if plugin.endswith("factors"):
                io["o"].fill_(float("nan")), io["u"].fill_(float("nan"))
                values.launch(io)
            torch.cuda.synchronize()
            checked = verify_errors(io, truth)
            ok = U.passes([checked["o"], checked["u"]], SERVING) and checked["log_p"] <= 1e-4
            row = {
                "plugin": plugin, "tactic": tactic, "config": repr(aot.SPECS[plugin].tactics(dims)[tactic]),
                "image": way, "ptx_isa": isa(p.ptx), "registers": kernel.registers,
                "spill_bytes": kernel.spill_bytes, "errors": checked, "passed": ok,
            }  # fmt: skip
            row["us"] = measure(lambda k=kernel, io=io: k.launch(io)) if ok else None
            kernel.close()
            rows.append(row)
            verdict = f"{row['us']:.1f} µs" if ok else f"FAILED {checked}"
            print(
                f"{plugin} t{tactic} {way}: {kernel.registers} regs, {kernel.spill_bytes} B spill, {verdict}"
            )
    values.close()
    data = {
        "meta": U.run_meta(triton_ptxas=ptxas_version(), cuda_driver=driver_version()),
        "rows": rows,
    }
    print(f"wrote {U.write_result(args.out, U.result_name('probe_aot_jit'), data)}")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
