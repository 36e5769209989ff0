"""Triton kernels to PTX for a launch without Triton's launcher (a TensorRT AOT plugin, or cuda-python):
compiled for an explicit target (no GPU needed), with the entry's parameters trimmed to the runtime
arguments. :mod:`trtllm_bole.engine.aot` says what each plugin compiles."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

PTX_VERSION = {90: 80}
"""PTX ISA pinned per target arch: 8.0 is the first that knows sm_90a, so the PTX loads on every
driver from CUDA 12.0 on (Triton's default follows its bundled ptxas and can be newer than a
deployed driver accepts). Other targets keep Triton's default."""


@dataclass(frozen=True, slots=True)
class CompiledKernel:
    name: str  # PTX entry point
    ptx: str
    cubin: bytes
    num_warps: int
    shared: int  # bytes of shared memory per block
    arch: int  # compute capability, e.g. 90
    num_params: int  # parameters the PTX entry declares (after trimming Triton's scratch pointers)
    cubin_num_params: int  # parameters the cubin's entry declares: Triton's scratch pointers kept


def compile_kernel(
    fn: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    *,
    arch: int,
    num_warps: int,
    num_stages: int,
    maxnreg: int | None = None,
) -> CompiledKernel:
    """``triton.compile`` of ``fn`` for ``sm_<arch>``; ``signature`` maps every argument to a Triton type
    (``"*fp32"``, ``"i32"``, ``"constexpr"``), ``constexprs`` gives the constexpr values; ``maxnreg`` caps
    the registers per thread (a ``.maxnreg`` directive in the PTX).

    Every pointer argument is compiled as 16-byte aligned: the hint Triton's launcher gives the runtime's
    launches of the same kernels (it specializes each pointer on its alignment), which the allocations of
    TensorRT and torch satisfy (256-byte aligned); a launch on an unaligned view faults. Without it no load
    is vectorized (H200, Qwen3.5-9B heads, batch 16, benchmarks/results/probe_aot_jit_h200*.json: the
    explicit inverse's value tiles spilled 1,672 bytes a thread and took 166 µs, 38 µs with it).

    Triton appends scratch-buffer pointers to every kernel's parameters; the ones the kernel never
    reads are removed from the PTX, so that the entry declares exactly the runtime arguments (the
    launch TensorRT performs). A kernel that does use scratch memory is refused.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET") == "1" or not hasattr(fn, "arg_names"):
        raise RuntimeError(
            "ahead-of-time compilation needs Triton's compiler, but TRITON_INTERPRET=1 (the interpreter) "
            "is active; run it in a process without TRITON_INTERPRET"
        )
    missing = [a for a in fn.arg_names if a not in signature]
    if missing:
        raise ValueError(f"{fn.__name__}: no signature entry for {missing}")
    constants = {(fn.arg_names.index(k),): v for k, v in constexprs.items()}
    aligned = {
        (i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if signature[a].startswith("*")
    }
    options: dict[str, Any] = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    ptx_version = PTX_VERSION.get(arch)
    if ptx_version is not None:
        options["ptx_version"] = ptx_version
    compiled = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=aligned),
        target=GPUTarget("cuda", arch, 32),
        options=options,
    )
    meta = compiled.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise ValueError(f"{meta.name} needs Triton scratch memory, which an AOT launch does not provide")
    runtime_args = sum(1 for a in fn.arg_names if signature[a] != "constexpr")
    ptx = trim_params(compiled.asm["ptx"], meta.name, runtime_args)
    cubin_params = len(entry_params(compiled.asm["ptx"], meta.name))  # the cubin is Triton's, untrimmed
    return CompiledKernel(
        meta.name, ptx, compiled.asm["cubin"], meta.num_warps, meta.shared, arch, runtime_args, cubin_params,
    )  # fmt: skip


_PARAM = re.compile(r"^\s*\.param\s+[^\n]*?\b(\w+_param_(\d+))\s*,?\s*$", re.MULTILINE)


def entry_params(ptx: str, name: str) -> list[str]:
    """The parameter names of the ``.entry name(...)`` declaration, in order."""
    match = re.search(rf"\.entry\s+{re.escape(name)}\s*\((.*?)\)", ptx, re.DOTALL)
    if match is None:
        raise ValueError(f"no .entry {name} in the PTX")
    return [m.group(1) for m in _PARAM.finditer(match.group(1))]


def trim_params(ptx: str, name: str, keep: int) -> str:
    """Drop the entry's parameters after the first ``keep``, which must be unreferenced in the body."""
    params = entry_params(ptx, name)
    if len(params) < keep:
        raise ValueError(
            f"{name}: the PTX declares {len(params)} parameters, fewer than the {keep} arguments"
        )
    extra = params[keep:]
    if not extra:
        return ptx
    head, sep, body = ptx.partition(f".entry {name}(")
    decl, close, rest = body.partition(")")
    for p in extra:
        if re.search(rf"\b{p}\b", rest):
            raise ValueError(f"{name}: trailing parameter {p} is used by the kernel; cannot drop it")
    lines = [ln for ln in decl.split("\n") if not any(re.search(rf"\b{p}\b", ln) for p in extra)]
    last = max(i for i, ln in enumerate(lines) if ".param" in ln)
    lines[last] = lines[last].rstrip().rstrip(",")
    return head + sep + "\n".join(lines) + close + rest
