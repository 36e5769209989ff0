"""Launch each plugin's AOT payload exactly as TensorRT would, and check it against float64 truth.

For bole::gdn_tree_verify, the explicit-inverse pair (bole::gdn_tree_factors, then bole::gdn_tree_values
on its factors), bole::gdn_commit and bole::tree_conv1d: build the payload that
``@trtp.aot_impl`` returns (:func:`trtllm_bole.engine.aot.aot_payload`: kernel name, PTX, grid, block,
shared memory, int32 extra args), load the PTX with cuda-python (``cuModuleLoadData``), and launch it
with ``cuLaunchKernel`` on parameters in TensorRT's order — input pointers, extra int32 scalars,
output pointers, nothing else — on random inputs at Qwen3.5-9B GDN sizes (H=16, HV=32, dk=dv=128,
conv channels 8192). Outputs are compared with the float64 references (the serial recurrence for
verify and commit). No TensorRT needed. Writes ``<out>/check_aot.json`` and exits 1 on any failure.

    PYTHONPATH=$PWD python plugins/check_aot.py --out results/
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from trtllm_bole.engine.aot import INVERSE_TILE, SPECS, AOTPayload, aot_payload
from trtllm_bole.kernels.gdn_tree_verify import blocked_default_config
from trtllm_bole.reference import conv_tree, gdn_tree
from trtllm_bole.testing import forest, random_gdn_inputs, topk_parents

H, HV, DK, DV = 16, 32, 128, 128
CONV_CHANNELS, CONV_WIDTH = 2 * H * DK + HV * DV, 4
EXACT, SERVING = 1e-4, 1e-2  # fp32 with IEEE dots; bf16 activations with tensor-core dots
TORCH_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.int64: "int64",
}


# ------------------------------------------------------------------------------------------------ #
# cuda-python: load the PTX, launch with TensorRT's parameter layout                                #
# ------------------------------------------------------------------------------------------------ #


def _check(result):
    from cuda.bindings import driver

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"CUDA driver error {name.decode() if isinstance(name, bytes) else name}")
    return rest[0] if len(rest) == 1 else rest


class PTXKernel:
    """A payload's kernel loaded into the current (torch's) context: from its PTX, as TensorRT embeds it (the
    driver's JIT compiles it), or with ``cubin=True`` from the cubin Triton's own ptxas made of it (which
    declares Triton's scratch pointers after the launch's parameters: they are passed as nulls)."""

    def __init__(self, payload: AOTPayload, cubin: bool = False) -> None:
        from cuda.bindings import driver

        torch.cuda.init()
        self.payload = payload
        image = payload.kernel.cubin if cubin else payload.ptx.encode() + b"\0"
        self._image = np.frombuffer(image, dtype=np.uint8)  # alive while loading
        self.trailing_nulls = payload.kernel.cubin_num_params - payload.kernel.num_params if cubin else 0
        self.module = _check(driver.cuModuleLoadData(self._image.ctypes.data))
        self.function = _check(driver.cuModuleGetFunction(self.module, payload.kernel_name.encode()))
        attrs = driver.CUfunction_attribute
        self.registers = _check(driver.cuFuncGetAttribute(attrs.CU_FUNC_ATTRIBUTE_NUM_REGS, self.function))
        self.spill_bytes = _check(
            driver.cuFuncGetAttribute(attrs.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, self.function)
        )
        shared = payload.launch.shared_mem
        if shared > 48 * 1024:  # beyond the default window, as TensorRT and Triton's launcher do
            limit = attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(driver.cuFuncSetAttribute(self.function, limit, shared))

    def launch(self, tensors: dict[str, torch.Tensor]) -> None:
        """Parameters in ``payload.params`` order: tensors by name, extra args as int32; on torch's current
        stream, without waiting (a CUDA graph can capture it)."""
        from cuda.bindings import driver

        p = self.payload
        extras = dict(
            zip(p.params[p.num_inputs : p.num_inputs + len(p.extra_args)], p.extra_args, strict=True)
        )
        unaligned = [n for n in p.params if n not in extras and tensors[n].data_ptr() % 16]
        if unaligned:  # the PTX takes every pointer as 16-byte aligned (engine.ptx.compile_kernel)
            raise ValueError(f"{p.kernel_name}: tensors {unaligned} are not 16-byte aligned")
        holders = [
            np.array([int(extras[name])], dtype=np.int32)
            if name in extras
            else np.array([tensors[name].data_ptr()], dtype=np.uint64)
            for name in p.params
        ]
        holders += [np.zeros(1, dtype=np.uint64) for _ in range(self.trailing_nulls)]
        pointers = np.array([h.ctypes.data for h in holders], dtype=np.uint64)
        stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
        gx, gy, gz = (int(g) for g in p.launch.grid)
        bx, by, bz = p.launch.block
        _check(
            driver.cuLaunchKernel(
                self.function, gx, gy, gz, bx, by, bz, p.launch.shared_mem, stream, pointers.ctypes.data, 0
            )
        )

    def close(self) -> None:
        from cuda.bindings import driver

        _check(driver.cuModuleUnload(self.module))


def port_io(tensors: dict[str, torch.Tensor], spec) -> tuple[dict, dict]:
    """The shapes and dtype names of ``spec``'s inputs among ``tensors`` (what TensorRT hands the plugin)."""
    names = [port.name for port in spec.inputs]
    return {n: tuple(tensors[n].shape) for n in names}, {n: TORCH_NAMES[tensors[n].dtype] for n in names}


def _rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------------------------ #
# The plugins                                                                                       #
# ------------------------------------------------------------------------------------------------ #


def _tree(batch: int, nodes: int, depth: int):
    return forest([topk_parents(nodes, 4, depth) for _ in range(batch)], device="cuda")


def check_verify(arch: int, gen: torch.Generator, act: torch.dtype, tactics: list[int] | None) -> list[dict]:
    batch, nodes, depth, slots = 4, 64, 9, 8
    tree = _tree(batch, nodes, depth)
    n = tree.num_nodes
    x = random_gdn_inputs(n, slots, H, HV, DK, DV, generator=gen, device="cuda")
    state_indices = torch.tensor([5, 0, 7, 2], device="cuda")
    tensors = {
        "q": x.q.float(), "k": x.k.float(), "v": x.v.to(act), "g": x.g.float(), "beta": x.beta.to(act),
        "state": x.state.float(), "state_indices": state_indices, "cu_seqlens": tree.cu_seqlens,
        "dfs_order": tree.dfs_order, "subtree_size": tree.subtree_size,
    }  # fmt: skip
    truth = verify_truth(tensors, tree, x.scale)
    spec = SPECS["bole::gdn_tree_verify"]
    shapes, dtypes = port_io(tensors, spec)
    all_tactics = spec.tactics(shapes)
    if tactics is None:  # what the runtime launches at this size (if listed), and the widest tile
        runtime = blocked_default_config(batch, HV, DK, DV)
        tactics = sorted({all_tactics.index(runtime) if runtime in all_tactics else 0, len(all_tactics) - 1})
    tol = EXACT if act == torch.float32 else SERVING
    results = []
    for t in tactics:
        payload = aot_payload(spec, shapes, dtypes, {"scale": x.scale}, t, arch=arch)
        out = {
            "o": torch.full_like(tensors["v"], float("nan")),
            "u": torch.full(tensors["v"].shape, float("nan"), device="cuda"),
            "log_p": torch.full(tensors["g"].shape, float("nan"), device="cuda"),
        }
        state_before = tensors["state"].clone()
        _run(payload, {**tensors, **out})
        errors = verify_errors(out, truth)
        ok = verify_passed(errors, tol) and torch.equal(state_before, tensors["state"])  # never written
        results.append(_record(spec.plugin_id, payload, t, all_tactics[t], act, errors, tol, ok))
    return results


def verify_truth(tensors: dict[str, torch.Tensor], tree, scale: float) -> dict[str, torch.Tensor]:
    """o, u and log_p in float64 on exactly the values a verify kernel reads: o from the serial recurrence
    node by node, u and log_p from the closed form (they are its factors)."""
    args = (*(tensors[k].double() for k in ("q", "k", "v", "g", "beta", "state")), tree)
    slots = tensors["state_indices"]
    o, _ = gdn_tree.serial_tree_recurrence(*args, scale=scale, state_indices=slots)
    _, u, log_p = gdn_tree.closed_form_tree_verify(*args, scale=scale, state_indices=slots)
    return {"o": o, "u": u, "log_p": log_p}


def verify_errors(out: dict[str, torch.Tensor], truth: dict[str, torch.Tensor]) -> dict[str, float]:
    """Relative RMS of o and u, the largest absolute error of log_p (NaN where an output is unwritten)."""
    return {
        "o": _rel_rms(out["o"], truth["o"]),
        "u": _rel_rms(out["u"], truth["u"]),
        "log_p": float((out["log_p"].double() - truth["log_p"]).abs().max()),
    }


def verify_passed(errors: dict[str, float], tol: float) -> bool:
    return errors["o"] <= tol and errors["u"] <= tol and errors["log_p"] <= 1e-4


def inverse_io(tensors: dict[str, torch.Tensor], tree) -> dict[str, torch.Tensor]:
    """The explicit-inverse pair's tensors: ``tensors`` (the verify's inputs), the tree's depths and paths,
    and NaN-poisoned outputs of both launches (the factors, log_p, the scratch, o, u)."""
    n, hv, d = tree.num_nodes, tensors["v"].shape[1], tree.paths.shape[1]
    nan = float("nan")
    return {
        **tensors, "depth": tree.depth, "paths": tree.paths,
        "factors": torch.full((2, hv, n, d), nan, device="cuda"),
        "log_p": torch.full((n, hv), nan, device="cuda"),
        "scratch": torch.full((n, hv, 2 * INVERSE_TILE), nan, device="cuda"),
        "o": torch.full_like(tensors["v"], nan), "u": torch.full(tensors["v"].shape, nan, device="cuda"),
    }  # fmt: skip


def inverse_payloads(
    tensors: dict[str, torch.Tensor], attrs: dict, arch: int, factor_tactic: int = 0, value_tactic: int = 0
) -> tuple[AOTPayload, AOTPayload]:
    """The pair's payloads for these tensors: bole::gdn_tree_factors, then bole::gdn_tree_values."""
    out = []
    for plugin, tactic in (
        ("bole::gdn_tree_factors", factor_tactic),
        ("bole::gdn_tree_values", value_tactic),
    ):
        shapes, dtypes = port_io(tensors, SPECS[plugin])
        out.append(aot_payload(SPECS[plugin], shapes, dtypes, attrs, tactic, arch=arch))
    return out[0], out[1]


def check_inverse(arch: int, gen: torch.Generator, act: torch.dtype, tactics: list[int] | None) -> list[dict]:
    """The pair at 9B heads: factors (tactic 0), then the value tiles under each tactic asked for (default:
    the runtime's default first, and the widest tile), against the float64 truth of the same values."""
    batch, nodes, depth, slots = 4, 64, 9, 8
    tree = _tree(batch, nodes, depth)
    x = random_gdn_inputs(tree.num_nodes, slots, H, HV, DK, DV, generator=gen, device="cuda")
    inputs = {
        "q": x.q.to(act), "k": x.k.to(act), "v": x.v.to(act), "g": x.g.float(), "beta": x.beta.to(act),
        "state": x.state.float(), "state_indices": torch.tensor([5, 0, 7, 2], device="cuda"),
        "cu_seqlens": tree.cu_seqlens, "dfs_order": tree.dfs_order, "subtree_size": tree.subtree_size,
    }  # fmt: skip
    truth = verify_truth(inputs, tree, x.scale)
    attrs = {"scale": x.scale, "max_nodes": nodes, "max_depth": depth}
    values = SPECS["bole::gdn_tree_values"]
    all_tactics = values.tactics({"q": inputs["q"].shape, "v": inputs["v"].shape})
    tol = EXACT if act == torch.float32 else SERVING
    results = []
    for t in tactics if tactics is not None else [0, len(all_tactics) - 1]:
        io = inverse_io(inputs, tree)
        state_before = io["state"].clone()
        factors, apply = inverse_payloads(io, attrs, arch, 0, t)
        _run(factors, io)
        _run(apply, io)
        errors = verify_errors(io, truth)
        ok = verify_passed(errors, tol) and torch.equal(state_before, io["state"])
        record = _record(values.plugin_id, apply, t, all_tactics[t], act, errors, tol, ok)
        record["factors"] = {"entry": factors.kernel_name, "grid": [int(g) for g in factors.launch.grid]}
        results.append(record)
    return results


def check_commit(
    arch: int, gen: torch.Generator, k_dtype: torch.dtype, tactics: list[int] | None
) -> list[dict]:
    """Three layers of four requests (one rejected, slots shuffled) against the serial recurrence's node
    states in float64, k in ``k_dtype`` (the verify's: fp32, or the activations' dtype when serving), under
    ``tactics`` (default: all)."""
    batch, nodes, depth, slots, layers = 4, 64, 9, 8, 3
    tree = _tree(batch, nodes, depth)
    n = tree.num_nodes
    state_indices = torch.tensor([6, 1, 3, 4], device="cuda")
    accepted = torch.tensor([nodes - 1, -1, 8, 0], device="cuda")
    pool = torch.randn(layers, slots, HV, DK, DV, generator=gen).cuda() * 0.1
    ks, us, lps, truth = [], [], [], []
    for layer in range(layers):
        x = random_gdn_inputs(n, batch, H, HV, DK, DV, generator=gen, device="cuda")
        k = x.k.to(k_dtype)
        pre = pool[layer, state_indices].double()
        args = (x.q, k.double(), x.v, x.g, x.beta, pre, tree)
        _, states = gdn_tree.serial_tree_recurrence(*args, scale=x.scale)
        _, u, lp = gdn_tree.closed_form_tree_verify(*args, scale=x.scale)
        ks.append(k), us.append(u.float()), lps.append(lp.float())
        expected = pool[layer].double().clone()
        for b, node in enumerate(tree.accepted_nodes(accepted).tolist()):
            if node >= 0:
                expected[state_indices[b]] = states[node]
        truth.append(expected)
    truth = torch.stack(truth)
    tensors = {
        "k": torch.stack(ks), "u": torch.stack(us), "log_p": torch.stack(lps), "accepted_leaf": accepted,
        "state_indices": state_indices, "cu_seqlens": tree.cu_seqlens, "depth": tree.depth,
        "paths": tree.paths,
    }  # fmt: skip
    spec = SPECS["bole::gdn_commit"]
    results = []
    shapes, dtypes = port_io({"state": pool, **tensors, "state_out": pool}, spec)
    all_tactics = spec.tactics(shapes)
    for t in range(len(all_tactics)) if tactics is None else tactics:
        cfg = all_tactics[t]
        state = pool.clone()
        io = {"state": state, **tensors, "state_out": state}  # in place: the output aliases the input
        payload = aot_payload(spec, shapes, dtypes, {"max_depth": depth}, t, arch=arch)
        _run(payload, io)
        untouched = torch.equal(state[:, state_indices[1]], pool[:, state_indices[1]])
        others = [s for s in range(slots) if s not in state_indices.tolist()]
        untouched = untouched and torch.equal(state[:, others], pool[:, others])
        errors = {"state": _rel_rms(state, truth)}
        ok = errors["state"] <= 1e-5 and untouched
        results.append(_record(spec.plugin_id, payload, t, cfg, k_dtype, errors, 1e-5, ok))
    return results


def check_conv(arch: int, gen: torch.Generator, act: torch.dtype) -> list[dict]:
    batch, nodes, depth, slots = 4, 64, 9, 8
    tree = _tree(batch, nodes, depth)
    n, c = tree.num_nodes, CONV_CHANNELS
    tensors = {
        "x": torch.randn(n, c, generator=gen).to(act).cuda(),
        "weight": (torch.randn(c, CONV_WIDTH, generator=gen) / 2).to(act).cuda(),
        "conv_state": torch.randn(slots, c, CONV_WIDTH - 1, generator=gen).to(act).cuda(),
        "state_indices": torch.tensor([3, 7, 0, 5], device="cuda"),
        "request": tree.request, "depth": tree.depth, "global_parents": tree.global_parents,
    }  # fmt: skip
    ref = conv_tree.tree_conv1d(
        tensors["x"].double(), tensors["weight"].double(), tensors["conv_state"].double(), tree,
        state_indices=tensors["state_indices"],
    )  # fmt: skip
    spec = SPECS["bole::tree_conv1d"]
    shapes, dtypes = port_io(tensors, spec)
    payload = aot_payload(spec, shapes, dtypes, {"silu": 1}, 0, arch=arch)
    y = torch.full_like(tensors["x"], float("nan"))
    _run(payload, {**tensors, "y": y})
    tol = 1e-6 if act == torch.float32 else SERVING
    errors = {"y": _rel_rms(y, ref)}
    return [
        _record(spec.plugin_id, payload, 0, spec.tactics(shapes)[0], act, errors, tol, errors["y"] <= tol)
    ]


def _run(payload: AOTPayload, tensors: dict[str, torch.Tensor]) -> None:
    kernel = PTXKernel(payload)
    try:
        kernel.launch(tensors)
        torch.cuda.synchronize()
    finally:
        kernel.close()


def _record(plugin, payload: AOTPayload, tactic, cfg, act, errors, tol, ok) -> dict:
    return {
        "plugin": plugin,
        "tactic": tactic,
        "config": repr(cfg),
        "activation_dtype": TORCH_NAMES[act],
        "entry": payload.kernel_name,
        "ptx_bytes": len(payload.ptx),
        "ptx_version": next(
            (ln.split()[1] for ln in payload.ptx.splitlines() if ln.startswith(".version")), None
        ),
        "grid": [int(g) for g in payload.launch.grid],
        "block": list(payload.launch.block),
        "shared_mem": payload.launch.shared_mem,
        "extra_args": [int(a) for a in payload.extra_args],
        "params": list(payload.params),
        "errors": errors,
        "tolerance": tol,
        "passed": bool(ok),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for check_aot.json")
    ap.add_argument(
        "--all-verify-tactics", action="store_true", help="every tiling config of both verify paths, not two"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: check_aot.py needs a CUDA GPU (it launches the PTX)", file=sys.stderr)
        return 2
    import triton
    from cuda.bindings import driver

    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    gen = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    verify_tactics = inverse_tactics = None
    if args.all_verify_tactics:
        dims = {"q": (0, H, DK), "v": (0, HV, DV)}
        verify_tactics = list(range(len(SPECS["bole::gdn_tree_verify"].tactics(dims))))
        inverse_tactics = list(range(len(SPECS["bole::gdn_tree_values"].tactics(dims))))
    checks = [
        ("bole::gdn_tree_verify", lambda: check_verify(arch, gen, torch.float32, verify_tactics)),
        ("bole::gdn_tree_verify", lambda: check_verify(arch, gen, torch.bfloat16, None)),
        ("bole::gdn_tree_values", lambda: check_inverse(arch, gen, torch.float32, [0])),
        ("bole::gdn_tree_values", lambda: check_inverse(arch, gen, torch.bfloat16, inverse_tactics)),
        ("bole::gdn_commit", lambda: check_commit(arch, gen, torch.float32, None)),
        ("bole::gdn_commit", lambda: check_commit(arch, gen, torch.bfloat16, [0])),
        ("bole::tree_conv1d", lambda: check_conv(arch, gen, torch.float32)),
        ("bole::tree_conv1d", lambda: check_conv(arch, gen, torch.bfloat16)),
    ]
    results = []
    for plugin, check in checks:
        try:
            results += check()
        except Exception as e:  # one GPU run: record the failure and go on with the others
            results.append({"plugin": plugin, "passed": False, "error": f"{type(e).__name__}: {e}"})
    report = {
        "command": "python plugins/check_aot.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name(),
        "arch": f"sm_{arch}",
        "driver": _check(driver.cuDriverGetVersion()),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
        },
        "dims": {"H": H, "HV": HV, "dk": DK, "dv": DV, "conv_channels": CONV_CHANNELS},
        "seconds": round(time.perf_counter() - start, 1),
        "passed": all(r["passed"] for r in results),
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_aot.json").write_text(json.dumps(report, indent=2) + "\n")
    for r in results:
        verdict = "PASS" if r["passed"] else "FAIL"
        detail = r.get("error") or f"t{r['tactic']} {r['activation_dtype']} {r['errors']}"
        print(f"{verdict} {r['plugin']} {detail}")
    verdict = "all passed" if report["passed"] else "FAILED"
    print(f"{verdict} in {report['seconds']} s -> {args.out / 'check_aot.json'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
