"""Registers, stack (spills) and shared memory of the explicit-inverse verify kernels on sm_90, without a GPU.

    python benchmarks/kernel_resources.py                 # the default configs at Qwen3.5-9B heads
    python benchmarks/kernel_resources.py --all           # every config of INVERSE_CONFIGS

Each kernel the launcher would run (the factor kernel, the value-tile kernel, or the one-launch kernel)
is compiled for sm_90 with the argument types and the specialisations of a real launch (the arguments
come from ``inverse_launch_args`` on CPU tensors of Qwen3.5-9B's GDN heads, T = 64; pointers and
16-divisible integers get Triton's divisibility hint, as at run time), and the cubin's resource usage
is read with the ``cuobjdump`` bundled with Triton. No device time, no CUDA driver.

The counts depend on the Triton version. The H200 runs triton 3.6; with that wheel installed beside
this environment (``pip download --no-deps triton==3.6.0 -d DIR`` then ``pip install --no-deps
--target DIR/site DIR/triton-3.6.0-*.whl`` and ``PYTHONPATH=DIR/site``) the counts matched the H200's
(value-tile kernel 153 against 152 registers, factor and one-launch kernels 255 against 255; 2026-11-30).
Fewer registers than 65536 / (threads x programs) let one more program share an SM.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv
from trtllm_bole.kernels._common import VerifyCall
from trtllm_bole.kernels.gdn_tree_verify import default_plan
from trtllm_bole.testing import forest, topk_parents

H, HV, DK, DV, SIZE = 16, 32, 128, 128, 64
BATCHES = (1, 4, 16)


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return (
            "*"
            + {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32"}[
                value.dtype
            ]
        )
    return "fp32" if isinstance(value, float) else "i32"


def _inputs(batch: int, precision: str) -> VerifyCall:
    """CPU tensors shaped as one GDN layer's verify at Qwen3.5-9B heads (values are never read)."""
    tree = forest([topk_parents(SIZE, 4, 8)] * batch, device="cpu", max_depth=64)
    n = tree.num_nodes
    q, k = (torch.zeros(n, H, DK, dtype=torch.bfloat16) for _ in range(2))
    v = torch.zeros(n, HV, DV, dtype=torch.bfloat16)
    a, b = (torch.zeros(n, HV, dtype=torch.bfloat16) for _ in range(2))
    state = torch.zeros(batch, HV, DK, DV)
    slots = torch.arange(batch)
    gates = (torch.zeros(HV), torch.zeros(HV))
    return VerifyCall(q, k, v, a, b, state, slots, tree, gates, DK**-0.5, False, precision)


def resources(cfg: inv.InverseConfig, precision: str, batch: int) -> list[dict]:
    """Compiles the kernels the launcher runs for ``cfg`` (trees of one tile) and reads their usage."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _, args, consts = inv.inverse_launch_args(_inputs(batch, precision), cfg)
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    rows = []
    for phase in inv.phases(cfg):
        fn, _, constexprs, options = inv.phase_launch(phase, cfg, consts, HV, DV, batch)
        runtime = [name for name in fn.arg_names if name not in constexprs]
        signature = {name: _arg_type(value) for name, value in zip(runtime, args, strict=True)}
        signature.update(dict.fromkeys(constexprs, "constexpr"))
        hints = {
            (fn.arg_names.index(name),): [["tt.divisibility", 16]]
            for name, value in zip(runtime, args, strict=True)
            if isinstance(value, torch.Tensor) or (
                isinstance(value, int) and value % 16 == 0 and name not in fn.do_not_specialize
            )
        }  # fmt: skip
        source = ASTSource(
            fn=fn,
            signature=signature,
            constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()},
            attrs=hints,
        )
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(compiled.asm["cubin"])
            cubin.flush()
            usage = subprocess.run(
                [str(cuobjdump), "-res-usage", cubin.name], capture_output=True, text=True, check=True
            ).stdout
        found = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", usage))
        rows.append(
            {
                "phase": phase,
                "warps": options["num_warps"],
                "registers": int(found["REG"]),
                "stack_bytes": int(found["STACK"]),
                "shared_bytes": compiled.metadata.shared,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="every config of INVERSE_CONFIGS (bf16), batch 16")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("kernel_resources.py compiles for sm_90: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    import triton

    if args.all:
        plans = [(cfg, "tf32" if inv.bf16_refused(cfg) else "bf16", 16) for cfg in inv.INVERSE_CONFIGS]
    else:
        plans = []
        for batch in BATCHES:
            bf16 = torch.bfloat16
            cfg, precision = default_plan(batch * SIZE, batch, HV, DK, DV, bf16, bf16)
            if isinstance(cfg, inv.InverseConfig):
                plans.append((cfg, precision, batch))
    print(f"triton {triton.__version__}, sm_90, Qwen3.5-9B GDN heads, T = {SIZE}")
    for cfg, precision, batch in plans:
        for row in resources(cfg, precision, batch):
            print(
                f"B={batch:<3} {cfg} {precision} phase {row['phase']} ({row['warps']} warps): "
                f"{row['registers']} registers, {row['stack_bytes']} B stack, {row['shared_bytes']} B shared"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
